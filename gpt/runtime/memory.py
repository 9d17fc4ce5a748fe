"""Device memory as runs read it: a step's peak (reset at its start, read at its end), an allocation that failed
told apart, freed memory handed back."""
import gc
import sys

import torch

from gpt.runtime.accelerator import get_accelerator


def is_out_of_memory(error):
    """Whether `error` is an allocation that failed: torch's OutOfMemoryError, a library's RuntimeError saying the
    same (cuBLAS, NCCL allocations), the CPU allocator's ("DefaultCPUAllocator: can't allocate memory"), Python's
    MemoryError."""
    text = str(error).lower()
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


def release_memory():
    """Return what freed tensors held to the device, the caching allocator's blocks too (after an engine is dropped)."""
    gc.collect()
    get_accelerator().empty_cache()


# A training step's peak memory, as the trainer reports it: reset at the step's start, read at its end; on
# CUDA the caching allocator's peaks, on CPU the resident set's.
GiB = 2**30


def reset_peak_memory(device_type):
    """Start a new peak: on CUDA the caching allocator's, on CPU the resident set's (Linux's VmHWM, reset
    through /proc/self/clear_refs; elsewhere the lifetime peak stays)."""
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def peak_memory(device_type):
    """This process's peak memory (GiB) since reset_peak_memory: on CUDA what the caching allocator
    allocated and reserved; on CPU the resident set."""
    if device_type == "cuda":
        return {"peak_alloc_gib": torch.cuda.max_memory_allocated() / GiB,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB}
    try:
        with open("/proc/self/status") as status:
            peak_bytes = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB
    return {"peak_rss_gib": peak_bytes / GiB}
