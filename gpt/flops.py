"""The peak FLOP/s that MFU is measured against: the vendors' datasheets for known GPUs, a measured matmul peak
on CPU (once per process and dtype)."""
import functools
import time

import torch

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
