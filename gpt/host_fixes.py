"""The host fixes a run needs on this machine, apart from the process group they are applied around
(gpt/dist.py's setup_distributed, and py-cpuinfo's answer when gpt.dist is imported): py-cpuinfo answered from
/proc/cpuinfo, leftovers of killed runs removed, glibc malloc keeping freed memory in the heap (and handing it
back on request), DeepSpeed's CPU allreduce buffer in /dev/shm removed at exit, fp16 on DeepSpeed's CPU
accelerator. Nothing here imports deepspeed at import time."""
import contextlib
import ctypes
import functools
import os
import platform
import sys
from pathlib import Path

from gpt import leftovers
from gpt.console import exit_with


def cpu_info_from_proc():
    """What DeepSpeed reads of py-cpuinfo's answer (the architecture, the SIMD flags, the vendor), from
    /proc/cpuinfo on x86-64 Linux in a millisecond; None elsewhere. Written by hand because py-cpuinfo answers
    by starting a Python process (0.7-1.3 s on 2 cores), and DeepSpeed asks it in every rank, before each op it
    loads (FusedAdam and the shared-memory allreduce on CPU)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    first_cpu = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            first_cpu.setdefault(key.strip(), value.strip())
    if "flags" not in first_cpu:
        return None
    return {"arch": "X86_64", "bits": 64, "arch_string_raw": "x86_64", "count": os.cpu_count(),
            "vendor_id_raw": first_cpu.get("vendor_id", ""), "brand_raw": first_cpu.get("model name", ""),
            "flags": sorted(first_cpu["flags"].split())}


def answer_cpuinfo_fast():
    """py-cpuinfo's get_cpu_info, as DeepSpeed calls it: from /proc/cpuinfo where it can be, else py-cpuinfo's
    own answer, asked once per process."""
    try:
        import cpuinfo
    except ImportError:
        return
    if hasattr(cpuinfo.get_cpu_info, "cache_info"):
        return
    slow = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = functools.cache(lambda: cpu_info_from_proc() or slow())


def remove_leftovers(device_type):
    """Before DeepSpeed loads its ops and joins the group (gpt/leftovers.py): torch's JIT build locks left by
    killed builds (every rank, before its own load), and on CPU the /dev/shm buffers of killed runs (once per
    machine)."""
    leftovers.handle_stale_jit_locks()
    if device_type == "cpu" and os.environ.get("LOCAL_RANK", "0") == "0":
        removed = leftovers.remove_stale_shm_buffers()
        if removed:
            print(f"removed {len(removed)} DeepSpeed allreduce buffer(s) of killed runs from /dev/shm",
                  file=sys.stderr, flush=True)


def keep_freed_memory_in_heap():
    """CPU tensors come from glibc malloc, which serves every block over 32 MB (logits, activations,
    gradient buffers) with fresh mmap pages and unmaps them on free: each step page-faults its whole
    working set again, and the kernel time rivalled the compute (sys ~ user). Keep freed memory in the
    heap for reuse instead, as CUDA's caching allocator does on GPUs: 1.99x faster d4 bf16 steps
    (python bench/train.py --only allocator). The price: RSS stays at its peak."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
    libc.mallopt(M_MMAP_MAX, 0)  # large blocks from the heap, not mmap
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # and never handed back to the kernel mid-run


def return_freed_memory():
    """Hand the heap's free memory back to the kernel (keep_freed_memory_in_heap never does by itself):
    for a process that builds one engine after another, such as bench/train.py."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def release_cpu_comm_buffer():
    """DeepSpeed's CPU shared-memory allreduce creates a 66 MB buffer per rank in /dev/shm and never
    unlinks it (its shared_close is not called at exit), so every run would leak RAM: remove ours."""
    env = os.environ
    for rank_key in ("RANK", "LOCAL_RANK"):
        name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR')}_{env.get('MASTER_PORT')}"
                f"_{env.get(rank_key)}")
        Path("/dev/shm", name).unlink(missing_ok=True)


def enable_cpu_fp16():
    """Let DeepSpeed run fp16 configs on its CPU accelerator, which refuses fp16 where oneDNN lacks fp16
    kernels. Only for exercising the fp16 loss-scaling path without a GPU; refused on anything else."""
    from deepspeed.accelerator import get_accelerator  # here: gpt.dist imports deepspeed, its logs sent to stderr

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        exit_with(f"--cpu_fp16 is only for the CPU accelerator, not {accelerator.device_name()}")
    accelerator.is_fp16_supported = lambda: True
