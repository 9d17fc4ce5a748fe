"""A training step's peak memory, as the trainer reports it: reset at the step's start, read at its end; on
CUDA the caching allocator's peaks, on CPU the resident set's."""
import sys

import torch

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
