"""What the machine under the run can do, and the settings that follow from it: whether this CPU has
bf16 units, TORCH_CUDA_ARCH_LIST in the form DeepSpeed's op builder parses, and deterministic kernels.

    python -m gpt.commands.hardware    # prints the DeepSpeed config a CPU run should use here, and why"""
import functools
import os
import re
import time

import torch

CPU_FP32_CONFIG = "ds_configs/zero2_fp32.json"  # the CPU config where bf16 would be emulated
CPU_BF16_CONFIG = "ds_configs/zero2_bf16.json"

# Whether this CPU has bf16 units is read from what it declares, so that every process on a machine (the demo, the
# trainer's warning, the bench, the tests) gets the same answer: a measured ratio landed on both sides of one
# threshold on a Cascade Lake Xeon (2.86x one hour, 4.48x the next, 2026-11-26), where bf16 runs 3-5x slower than fp32.
# Measured: AMX Xeons run bf16 matmuls 3-5x faster than fp32; AVX-512 without bf16 (Cascade Lake) 3-5x slower;
# AVX2 only (AMD EPYC) ~90x slower.
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16", "sve_bf16", "svebf16")  # x86 AMX and AVX-512; Arm (cpuinfo, /proc)
ISA_FLAGS = ("sse2", "avx2", "neon", "asimd", "fp")  # a flag list that names any of these was read from a real CPU
# oneDNN (bf16 matmuls on CPU) capped below its first ISA with bf16 instructions (AVX512_CORE_BF16) emulates them
# whatever the CPU has: the tests' stand-in for a CPU without bf16 units (tests/integration/conftest.py)
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
# Where nothing can be read (no flag list, or a CPU that declares only bf16 conversions): measured, bf16 then taken only
# when a bf16 matmul is clearly not slower than fp32. Between this and the emulated CPUs' 3x lies a dead band that
# noise does not cross, and the band's side is fp32: correct everywhere, bf16 only ever a speed-up.
FAST_BF16_MAX_SLOWDOWN = 1.5


def cpu_flags(proc_cpuinfo="/proc/cpuinfo"):
    """This CPU's feature flags as a set of names, or None where none can be read: torch's own query
    (torch.cpu.get_capabilities, torch >= 2.9), else Linux's /proc/cpuinfo (x86 'flags', Arm 'Features')."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        flags = {name for name, value in capabilities().items() if value is True}
        if flags & set(ISA_FLAGS):
            return flags
    try:
        with open(proc_cpuinfo) as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features") and set(value.split()) & set(ISA_FLAGS):
                    return set(value.split())
    except OSError:
        pass
    return None


@functools.cache
def cpu_bf16_units():
    """(whether bf16 matmuls run on bf16 units here, why): the one bf16 decision on CPU, the same in every process
    of a machine. In order: oneDNN capped below bf16 (ONEDNN_MAX_CPU_ISA) -> no; the CPU declares AMX-BF16,
    AVX512-BF16 or Arm's BF16 -> yes; it declares its ISA without them -> no; nothing readable (or bf16 conversions
    alone, AVX-NE-CONVERT) -> measured, yes only at most FAST_BF16_MAX_SLOWDOWN x the time of fp32."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if cap and cap.strip().upper() in ONEDNN_ISAS_WITHOUT_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} leaves oneDNN no bf16 instructions"
    flags = cpu_flags()
    if flags is not None:
        declared = [flag for flag in BF16_FLAGS if flag in flags]
        if declared:
            return True, f"the CPU declares {', '.join(declared)}"
        if "avx_ne_convert" not in flags:
            return False, "the CPU declares no amx_bf16, avx512_bf16 or Arm bf16 flag"
    slowdown = cpu_bf16_slowdown()
    fast = slowdown <= FAST_BF16_MAX_SLOWDOWN
    return fast, (f"no bf16 flag could be read; a bf16 matmul took {slowdown:.2f}x the time of fp32 here (measured; "
                  f"bf16 at most {FAST_BF16_MAX_SLOWDOWN}x)")


@functools.cache
def cpu_bf16_slowdown():
    """How many times slower a bf16 matmul runs than an fp32 one on this CPU (measured; < 1: faster). Decides
    only where the CPU declares nothing (cpu_bf16_units)."""
    # up to 512^2: enough to tell 3x faster from 80x slower, and ~0.6 s where bf16 is emulated
    return measure_cpu_peak_flops(torch.float32, max_size=512) / measure_cpu_peak_flops(torch.bfloat16, max_size=512)


def cpu_has_fast_bf16():
    """False where bf16 matmuls are emulated: train in fp32 there."""
    return cpu_bf16_units()[0]


def cpu_bf16_warning():
    """One line for a bf16 run on a CPU without bf16 units, or None where bf16 is fine."""
    fast, why = cpu_bf16_units()
    if fast:
        return None
    return (f"warning: this CPU has no bf16 units: {why}; bf16 matmuls are emulated, several to ~100x slower than "
            f"fp32, so this run will be many times slower than in fp32; use {CPU_FP32_CONFIG}")


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


# The peak FLOP/s that MFU is measured against: the vendors' datasheets for known GPUs; on CPU what the CPU declares
# (cpu_peak_flops below). A measured matmul peak remains for the bench and for a CPU that declares nothing of bf16.
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


def matmul_flops(size, dtype, generator, repeats):
    """(FLOP/s, seconds spent) of a size x size matmul in dtype: the fastest of `repeats` after a warm-up."""
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    a @ b  # warm up
    seconds = []
    for _ in range(repeats):  # the fastest of several: on a busy 2-core machine single timings swing 50x
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 / min(seconds), sum(seconds)


@functools.cache
def measure_cpu_peak_flops(dtype, max_size=2048, repeats=4, budget_s=1.0, gain=1.1):
    """This CPU's matmul peak in the training dtype, the roofline MFU is measured against: the best
    throughput over square matmuls of doubling sizes from 256 (small ones under-use AMX/AVX-512 units), doubling
    while the last doubling gained over `gain` (on an AVX-512 EPYC 512 is at the peak already; 2048 took 0.4-0.8 s
    of the 0.6-0.9 s this took in every run's start). A size is also skipped once it would cost over budget_s
    (8x the last): where bf16 is emulated (~1 GFLOP/s, no bf16 units) a single 2048 matmul takes 15 s.
    Measured once per process and dtype (a process may train many runs: tests, bench)."""
    generator = torch.Generator().manual_seed(0)  # leaves the global RNG, and so training, untouched
    rates, size, elapsed = [], 256, 0.0
    while size <= max_size and 8 * elapsed < budget_s and (len(rates) < 2 or rates[-1] > gain * rates[-2]):
        rate, elapsed = matmul_flops(size, dtype, generator, repeats)
        rates.append(rate)
        size *= 2
    return max(rates)


# A CPU's peak is a property of the machine, read from what it declares: the cores a rank runs on x the clock x the
# FLOPs per cycle of the widest units its ISA has for the dtype that really does the matmuls. A measured peak read MFU
# 0.47 and 0.29 for two runs at the same speed beside a busy neighbour, and above 1 where bf16 was emulated.
# FLOPs per cycle per core, first match: two 512-bit FMA units (16 fp32 lanes x 2 FLOPs x 2), two 256-bit, ...;
# Arm's four 128-bit pipes. Where a CPU has fewer units the peak is overstated: MFU is low, never above 1.
FP32_FLOPS_PER_CYCLE = ((("avx512f", "avx512_f"), 64), (("fma", "fma3", "avx2"), 32), (("avx",), 16),
                        (("asimd", "neon"), 32), (("sse2",), 8))
# 16-bit units: AMX tiles (1024 FLOPs per cycle per core, Intel's figure), AVX-512's dot products (2x fp32's), Arm's
# BFMMLA. Without them oneDNN converts to fp32 and the fp32 units do the matmuls: fp32's peak.
HALF_FLOPS_PER_CYCLE = {"bf16": ((("amx_bf16",), 1024), (("avx512_bf16",), 128),
                                 (("bf16", "sve_bf16", "svebf16"), 128)),
                        "fp16": ((("amx_fp16",), 1024), (("avx512_fp16",), 128))}


def _first_match(table, flags):
    return next(((names[0], flops) for names, flops in table if set(names) & flags), None)


def cpu_flops_per_cycle(dtype_name, flags):
    """(the units that do dtype_name's matmuls, their FLOPs per cycle per core) from the CPU's flags: its 16-bit
    units where it has them (and, for bf16, oneDNN may use them: cpu_bf16_units), else its fp32 units; None if the
    flags name none."""
    half = _first_match(HALF_FLOPS_PER_CYCLE.get(dtype_name, ()), flags)
    if half and (dtype_name != "bf16" or cpu_bf16_units()[0]):
        return half
    return _first_match(FP32_FLOPS_PER_CYCLE, flags)


@functools.cache
def cpu_clock_hz(proc_cpuinfo="/proc/cpuinfo", cpufreq="/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"):
    """This CPU's clock as it declares it: its highest (turbo) frequency where Linux's cpufreq says, else the
    model name's nominal "@ 2.40GHz", else the clock /proc/cpuinfo reports (a VM's host clock); None if none."""
    try:
        with open(cpufreq) as f:
            return int(f.read()) * 1e3  # kHz
    except (OSError, ValueError):
        pass
    try:
        with open(proc_cpuinfo) as f:
            lines = [line.partition(":") for line in f]
    except OSError:
        return None
    named = [re.search(r"@\s*([\d.]+)\s*GHz", value) for key, _, value in lines if key.strip() == "model name"]
    if named and named[0]:
        return float(named[0].group(1)) * 1e9
    reported = [float(value) for key, _, value in lines if key.strip() == "cpu MHz"]
    return max(reported) * 1e6 if reported else None


def cpu_peak_flops(dtype_name, threads):
    """(peak FLOP/s of `threads` cores of this CPU in dtype_name, its label), or (None, why) where the CPU does not
    say its clock or its units: cores x clock x FLOPs per cycle, never a timing."""
    flags, clock = cpu_flags(), cpu_clock_hz()
    units = cpu_flops_per_cycle(dtype_name, flags) if flags is not None else None
    if clock is None or units is None:
        return None, "nothing (this CPU declares no " + ("clock)" if clock is None else "matmul units)")
    return threads * clock * units[1], (f"cpu peak ({dtype_name}): {threads} core(s) x {clock / 1e9:.2f} GHz x "
                                        f"{units[1]} FLOP/cycle ({units[0]})")


def peak_flops(device_type, dtype_name):
    """(peak FLOP/s per device, label) for MFU: the datasheet for known GPUs; on CPU what the CPU declares
    (cpu_peak_flops) for the threads a rank runs on."""
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
        for gpu, table in GPU_PEAK_FLOPS.items():
            if gpu in name and dtype_name in table:
                return table[dtype_name], gpu
        return None, name
    return cpu_peak_flops(dtype_name, torch.get_num_threads())
