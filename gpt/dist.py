"""Ranks and the process group: what the launcher set, joining the group (NCCL on GPUs, gloo on CPU),
a mean over ranks, a free port; and the CPU host fixes a CPU run needs (glibc malloc, DeepSpeed's
/dev/shm buffer, fp16 on the CPU accelerator)."""
import atexit
import contextlib
import ctypes
import datetime
import functools
import os
import platform
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# DeepSpeed's logger writes to the sys.stdout it finds when deepspeed is first imported, and there, on a
# machine without DS_ACCELERATOR, says which accelerator it picked. stdout is ours (the trainer's lines, the
# console scripts' output: gpt-plan --json), so DeepSpeed logs to stderr; gpt modules import gpt.dist first.
with contextlib.redirect_stdout(sys.stderr):
    import deepspeed
from deepspeed.accelerator import get_accelerator  # noqa: E402

from gpt import leftovers  # noqa: E402


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


answer_cpuinfo_fast()


def device_type():
    """'cuda' or 'cpu': the accelerator DeepSpeed picked (DS_ACCELERATOR, else what it detects)."""
    return get_accelerator().device_name()


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier():
    """Wait for every rank; a no-op without a process group."""
    if dist.is_initialized():
        dist.barrier()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed(allow_cpu_fp16=False, timeout_s=600):
    """Join the process group (NCCL on GPUs, gloo on CPU) and return this rank's device. A plain
    `python train_ds.py` becomes a one-rank group, so the same code path serves every launch. A collective
    that waits longer than timeout_s for another rank (one that died) fails instead of hanging."""
    if "RANK" not in os.environ:  # no launcher: a single local process
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    accelerator = get_accelerator()
    if allow_cpu_fp16:
        enable_cpu_fp16()
    remove_leftovers(accelerator.device_name())
    if accelerator.device_name() == "cpu":
        if os.environ.get("DSGPT_MALLOC_CACHE", "1") != "0":  # 0: glibc's defaults (bench/train.py's baseline)
            keep_freed_memory_in_heap()
        # Each rank would otherwise start one thread per core: 2 ranks on 2 cores oversubscribe.
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
        atexit.unregister(release_cpu_comm_buffer)  # once, however many runs this process makes (tests, bench)
        atexit.register(release_cpu_comm_buffer)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name(),
                               timeout=datetime.timedelta(seconds=timeout_s))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    accelerator.set_device(local_rank)
    return torch.device(accelerator.device_name(local_rank))


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
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        raise SystemExit(f"error: --cpu_fp16 is only for the CPU accelerator, not {accelerator.device_name()}")
    accelerator.is_fp16_supported = lambda: True


def lost_a_rank(error):
    """Whether a collective failed because another rank is gone or stuck: torch's distributed errors
    (NCCL, the store, timeouts), and gloo's RuntimeErrors when a peer's connection closed."""
    text = str(error)
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and (
        "gloo" in text and ("Connection" in text or "Timed out" in text or "timed out" in text)))


def timed_on_device(work):
    """(work(), the seconds it took on the device): a GPU runs kernels asynchronously, so the clock is read
    only after the device has finished (the trainer's one host sync, the loss .item(), comes before its last
    backward and optimizer step); the work queued before it is finished first. No-ops on CPU."""
    get_accelerator().synchronize()
    start = time.perf_counter()
    result = work()
    get_accelerator().synchronize()
    return result, time.perf_counter() - start


def mean_over_ranks(tensor):
    if dist.is_initialized() and dist.get_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor
