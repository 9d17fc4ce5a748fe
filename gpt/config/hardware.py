"""What the machine under the run can do, and the settings that follow from it: whether this CPU has
bf16 units, TORCH_CUDA_ARCH_LIST in the form DeepSpeed's op builder parses, and deterministic kernels.

    python -m gpt.commands.hardware    # prints the DeepSpeed config a CPU run should use here, and why"""
import functools
import os
import re
import time

import torch

# A bf16 matmul slower than fp32 by more than this is emulated (no AVX512-BF16/AMX): ~100x on an AVX2-only
# AMD EPYC, where AMX Xeons run bf16 3-5x *faster* than fp32 and AVX-512 CPUs without bf16 units about as
# fast (oneDNN converts in registers).
EMULATED_BF16_SLOWDOWN = 4.0
CPU_FP32_CONFIG = "ds_configs/zero2_fp32.json"  # the CPU config where bf16 would be emulated
CPU_BF16_CONFIG = "ds_configs/zero2_bf16.json"


@functools.cache
def cpu_bf16_slowdown():
    """How many times slower a bf16 matmul runs than an fp32 one on this CPU (measured; < 1: faster)."""
    # up to 512^2: enough to tell 3x faster from 80x slower, and ~0.6 s where bf16 is emulated
    return measure_cpu_peak_flops(torch.float32, max_size=512) / measure_cpu_peak_flops(torch.bfloat16, max_size=512)


def cpu_has_fast_bf16():
    """False where bf16 matmuls are emulated: train in fp32 there."""
    return cpu_bf16_slowdown() <= EMULATED_BF16_SLOWDOWN


def cpu_bf16_warning():
    """One line for a bf16 run on a CPU without bf16 units, or None where bf16 is fine."""
    if cpu_has_fast_bf16():
        return None
    return (f"warning: this CPU has no bf16 units: bf16 matmuls run {cpu_bf16_slowdown():.0f}x slower than fp32 "
            f"here (measured), so this run will be many times slower than in fp32; use {CPU_FP32_CONFIG}")


def cpu_ds_config():
    """The DeepSpeed config for a CPU run on this machine: bf16 where the CPU has bf16 units, else fp32."""
    return CPU_BF16_CONFIG if cpu_has_fast_bf16() else CPU_FP32_CONFIG


# "9.0a" (Hopper arch-specific features), "10.0f" (family), "8.6+PTX" (also embed PTX): DeepSpeed 0.19's op
# builder reads the minor version with int() and fails on the letter.
_ARCH = re.compile(r"^(\d+)\.(\d+)[a-z]?(\+PTX)?$")


def normalize_cuda_arch_list(value):
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder parses it: arch-specific suffixes dropped
    ("9.0a" -> "9.0"; its kernels use no sm_90a instructions), "+PTX" kept. None where a token is not a
    compute capability (e.g. "Hopper"): then the builder should probe the GPUs instead."""
    tokens = value.replace(";", " ").split()
    matches = [_ARCH.match(token) for token in tokens]
    if not tokens or not all(matches):
        return None
    return ";".join(f"{m.group(1)}.{m.group(2)}{m.group(3) or ''}" for m in matches)


def fix_cuda_arch_list(environ=os.environ):
    """Make TORCH_CUDA_ARCH_LIST safe for deepspeed.initialize's FusedAdam JIT build; returns the one log
    line saying what changed, or None."""
    value = environ.get("TORCH_CUDA_ARCH_LIST")
    if value is None:
        return None
    normalized = normalize_cuda_arch_list(value)
    if normalized is None:
        del environ["TORCH_CUDA_ARCH_LIST"]
        return (f"TORCH_CUDA_ARCH_LIST={value!r} is not a list of compute capabilities DeepSpeed can build for: "
                f"unset, DeepSpeed builds for the GPUs it finds")
    if normalized == value:
        return None
    environ["TORCH_CUDA_ARCH_LIST"] = normalized
    return f"TORCH_CUDA_ARCH_LIST {value!r} -> {normalized!r} for DeepSpeed's op builder"


def make_deterministic(device_type, environ=os.environ):
    """Bit-reproducible runs on GPUs (CPU kernels here already are): PyTorch's deterministic algorithms
    (strict: a kernel without a deterministic version raises instead of running), cuBLAS's fixed
    workspace, and for attention only the flash and math SDPA kernels, whose backward is deterministic in
    strict mode (cuDNN's and the memory-efficient kernel's are not). Call before CUDA's first matmul."""
    if device_type == "cuda":
        environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS: a fixed reduction order
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


# The peak FLOP/s that MFU is measured against: the vendors' datasheets for known GPUs, a measured matmul peak
# on CPU (once per process and dtype).
# Dense peak FLOP/s per GPU from the vendors' datasheets (no sparsity). 'fp32' on Ampere/Hopper is TF32,
# which the trainer enables for fp32 matmuls.
GPU_PEAK_FLOPS = {
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "A800": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H800": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
}


@functools.cache
def measure_cpu_peak_flops(dtype, max_size=2048, repeats=4, budget_s=1.0):
    """This CPU's matmul peak in the training dtype, the roofline MFU is measured against: the best
    throughput over square matmuls of doubling sizes (small ones under-use AMX/AVX-512 units). A size is
    skipped once it would cost over budget_s (8x the last): where bf16 is emulated (~1 GFLOP/s, no bf16
    units) a single 2048 matmul takes 15 s. Measured once per process and dtype (a process may train many runs:
    tests, bench)."""
    generator = torch.Generator().manual_seed(0)  # leaves the global RNG, and so training, untouched
    best, size, elapsed = 0.0, 256, 0.0
    while size <= max_size and 8 * elapsed < budget_s:
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        a @ b  # warm up
        seconds = []
        for _ in range(repeats):  # the fastest of several: on a busy 2-core machine single timings swing 50x
            start = time.perf_counter()
            a @ b
            seconds.append(time.perf_counter() - start)
        elapsed = sum(seconds)
        best = max(best, 2 * size**3 / min(seconds))
        size *= 2
    return best


def peak_flops(device_type, dtype_name):
    """(peak FLOP/s per device, label) for MFU: the datasheet for known GPUs, a measurement on CPU."""
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
        for gpu, table in GPU_PEAK_FLOPS.items():
            if gpu in name and dtype_name in table:
                return table[dtype_name], gpu
        return None, name
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_name, torch.float32)
    return measure_cpu_peak_flops(dtype), f"cpu matmul ({dtype_name}, measured)"
