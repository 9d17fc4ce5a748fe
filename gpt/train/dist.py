"""Ranks and the process group: what the launcher set, joining the group (NCCL on GPUs, gloo on CPU, with the
host fixes below applied around it), a mean over ranks, a lost rank told apart, a step timed on
the device, a free port."""
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
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

# DeepSpeed's logger writes to the sys.stdout it finds when deepspeed is first imported, and there, on a
# machine without DS_ACCELERATOR, says which accelerator it picked. stdout is ours (the trainer's lines, the
# console scripts' output: gpt-plan --json), so DeepSpeed logs to stderr; gpt modules import gpt.train.dist first.
from gpt.console import exit_with  # noqa: E402

try:
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed
except ValueError as error:  # DeepSpeed picks its accelerator while it is imported, and raises on an unknown one
    known = getattr(sys.modules.get("deepspeed.accelerator.real_accelerator"), "SUPPORTED_ACCELERATOR_LIST", None)
    if "DS_ACCELERATOR" not in str(error) or known is None:
        raise
    exit_with(f"DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')!r} is not an accelerator DeepSpeed knows: one of "
              f"{', '.join(known)}, or unset to let DeepSpeed detect the device", status=2)
from deepspeed.accelerator import get_accelerator  # noqa: E402


def _import_deepspeeds_muon_uncompiled():
    """DeepSpeed 0.19 imports its Muon optimizer while it builds every ZeRO engine (to ask whether ours is one), and
    that module's @torch.compile decorators import Inductor: ~2 CPU-s of every rank's start on a 2-core EPYC (18% of
    a tiny run's process), for kernels this trainer never runs (it trains with AdamW). So it is imported here with
    torch.compile a no-op; a run that compiles its model imports Inductor anyway."""
    compile_ = torch.compile
    torch.compile = lambda model=None, **options: model if model is not None else (lambda function: function)
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    finally:
        torch.compile = compile_


_import_deepspeeds_muon_uncompiled()

# DeepSpeed 0.19's ZeRO calls torch.distributed.all_gather_into_tensor, deprecated from torch 2.13: a FutureWarning on
# every rank of every run, about DeepSpeed's code, which a user can do nothing about
warnings.filterwarnings("ignore", message="`torch.distributed.all_gather_into_tensor` is deprecated",
                        category=FutureWarning)
# A one-GPU NCCL group is not bound to its GPU (DeepSpeed binds only larger ones, DeepSpeed #8248), so torch warns
# at the first barrier, DeepSpeed's or ours, that it uses the current device: the one setup_distributed sets first
warnings.filterwarnings("ignore", message=r"barrier\(\): using the device under current context", category=UserWarning)


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


def leave_process_group():
    """Destroy the process group, after a run that ended normally: without it NCCL warns at the exit of every GPU
    run that resources may leak. Not on the error paths: they exit at once, and a peer may be gone."""
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_rank():
    """A CPU rank's thread count: OMP_NUM_THREADS where it is set (by the user, or by DeepSpeed's
    --bind_cores_to_rank), else this machine's cores shared among the ranks on it (one thread per core each
    would oversubscribe). The count is part of the arithmetic: some CPU kernels sum per-thread partials
    (LayerNorm's weight and bias gradients), so runs are bit-equal only with equal threads per rank
    (docs/multinode.md)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
    return max(1, (os.cpu_count() or 1) // local_ranks)


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
        torch.set_num_threads(threads_per_rank())
        # once, however many runs this process makes (tests, bench)
        atexit.unregister(release_cpu_comm_buffer)
        atexit.register(release_cpu_comm_buffer)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    accelerator.set_device(local_rank)  # before the group: NCCL's communicator is made on the current device
    with contextlib.redirect_stdout(sys.stderr):  # on CPU DeepSpeed prints that it built its shared-memory op
        deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name(),
                                   timeout=datetime.timedelta(seconds=timeout_s))
    return torch.device(accelerator.device_name(local_rank))


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


# The host fixes a run needs on this machine, apart from the process group they are applied around
# (gpt/train/dist.py's setup_distributed, and py-cpuinfo's answer when gpt.train.dist is imported): py-cpuinfo answered from
# /proc/cpuinfo, leftovers of killed runs removed, glibc malloc keeping freed memory in the heap (and handing it
# back on request), DeepSpeed's CPU allreduce buffer in /dev/shm removed at exit, fp16 on DeepSpeed's CPU
# accelerator. Nothing here imports deepspeed at import time.
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
    """Before DeepSpeed loads its ops and joins the group (gpt/train/dist.py): torch's JIT build locks left by
    killed builds (every rank, before its own load), and on CPU the /dev/shm buffers of killed runs (once per
    machine)."""
    handle_stale_jit_locks()
    if device_type == "cpu" and os.environ.get("LOCAL_RANK", "0") == "0":
        removed = remove_stale_shm_buffers()
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
    from deepspeed.accelerator import get_accelerator  # here: gpt.train.dist imports deepspeed, its logs sent to stderr

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        exit_with(f"--cpu_fp16 is only for the CPU accelerator, not {accelerator.device_name()}")
    accelerator.is_fp16_supported = lambda: True


# What killed runs leave on a machine, removed at start-up once nothing alive holds it.
#
# - DeepSpeed's CPU shared-memory allreduce: a 66 MB /dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}
#   per rank, unlinked by nobody (gpt.train.dist removes a rank's own at a normal exit; a SIGKILLed rank leaks it).
# - torch's JIT extension builds (DeepSpeed's FusedAdam, its shm allreduce op): a `lock` file in the build
#   directory, created with O_EXCL and held open by the builder until the build ends; a killed build leaves
#   it, and every later build of that op waits for it forever, silently (torch's FileBaton).
#
# "Alive holds it": a process of this machine has the file open or mapped (/proc/PID/fd, /proc/PID/maps).
# DeepSpeed keeps its buffer open and mapped from creation to exit, and the builder holds its lock from
# creation to release, so an unheld file is a dead process's. Processes of other users are skipped: they
# cannot open this user's 0600 shm files; a lock in this user's cache is this user's too. The blind spot:
# processes in another PID namespace that share the directory, and, for locks, other machines on a
# network file system: there a lock is only reported, never removed.
SHM_DIR = Path("/dev/shm")
SHM_BUFFER = "deepspeed_allreduce_buffer"
LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "overlay", "bcachefs", "jfs",
                      "reiserfs", "ramfs"}
LOCK_SECOND_LOOK_S = 0.5  # a builder closes its lock a moment before it removes it: look again after this


def file_key(stat):
    return stat.st_dev, stat.st_ino


def held_files(keys):
    """The (device, inode) pairs among keys that a live process has open or mapped."""
    held, uid = set(), os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if uid != 0 and entry.stat().st_uid != uid:
                continue
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    key = file_key(os.stat(fd.path))
                except OSError:
                    continue
                if key in keys:
                    held.add(key)
            with open(f"/proc/{entry.name}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) >= 5 and fields[4] != "0":
                        major, minor = fields[3].split(":")
                        key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                        if key in keys:
                            held.add(key)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return held


def stat_or_none(path):
    try:
        return path.stat()
    except OSError:
        return None


def remove_stale_shm_buffers(shm_dir=SHM_DIR):
    """Remove this user's DeepSpeed allreduce buffers that no live process holds; returns their paths.
    Each is renamed away first and removed only if no process held it then: a run that opened it in between
    keeps it (it is renamed back), and one that looks for it by name meanwhile waits until it exists
    (DeepSpeed retries shm_open while the file is missing), so a live run never loses its buffer."""
    uid = os.getuid()
    candidates = {}
    for path in shm_dir.glob(f"{SHM_BUFFER}_{uid}_*"):
        stat = stat_or_none(path)
        if stat is not None and stat.st_uid == uid:
            candidates[file_key(stat)] = path
    if not candidates:
        return []
    held = held_files(set(candidates))
    removed = []
    for key, path in candidates.items():
        if key in held:
            continue
        aside = path.with_name(f"{path.name}.stale{os.getpid()}")
        try:
            path.rename(aside)
        except OSError:  # another process cleaning up took it first
            continue
        if file_key(aside.stat()) in held_files({file_key(aside.stat())}):
            aside.rename(path)
        else:
            aside.unlink()
            removed.append(path)
    return removed


def jit_locks():
    """torch's build locks: TORCH_EXTENSIONS_DIR/OP/lock, or under the default root (one folder per Python and
    accelerator: py311_cu128/OP/lock)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return sorted(Path(root).glob("*/lock"))
    from torch.utils.cpp_extension import get_default_build_root
    return sorted(Path(get_default_build_root()).glob("*/*/lock"))


def file_system_type(path):
    """The type of the file system that holds path ('ext4', 'nfs4', ...), from /proc/mounts."""
    path, best, kind = os.path.realpath(path), "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                mount_point = fields[1].replace("\\040", " ")
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):  # the innermost mount wins
                    best, kind = mount_point, fields[2]
    except OSError:
        pass
    return kind


def unheld_locks(locks):
    """{lock: (device, inode)} of the locks that no live process holds."""
    stats = {lock: stat_or_none(lock) for lock in locks}
    keys = {lock: file_key(stat) for lock, stat in stats.items() if stat is not None}
    held = held_files(set(keys.values())) if keys else set()
    return {lock: key for lock, key in keys.items() if key not in held}


def handle_stale_jit_locks(say=lambda line: print(line, file=sys.stderr, flush=True)):
    """Before DeepSpeed loads its ops: a lock that no process holds, and that is still the same file a moment
    later, was left by a killed build. On a local file system remove it (the op is then built again), with
    one line; on another (NFS, Lustre: builders on other machines are invisible from here) say what to do.
    Returns the locks removed."""
    stale = unheld_locks(jit_locks())
    if not stale:
        return []
    time.sleep(LOCK_SECOND_LOOK_S)
    still = unheld_locks(stale)
    removed = []
    for lock, key in still.items():
        if key != stale[lock]:
            continue
        kind = file_system_type(lock)
        if kind not in LOCAL_FILE_SYSTEMS:
            say(f"warning: {lock} is on a {kind} file system and no process on this machine holds it: a build on "
                f"another machine, or one that was killed. If none is running, delete it: torch waits for it silently")
            continue
        try:
            lock.unlink()
        except FileNotFoundError:
            continue  # another rank removed it
        except OSError as e:
            say(f"warning: {lock} was left by a killed JIT build and cannot be removed ({e.strerror}): delete it, "
                f"or torch waits for it forever")
            continue
        say(f"warning: removed {lock}: left by a JIT build of {lock.parent.name} that was killed (no process "
            f"holds it); it is built again")
        removed.append(lock)
    return removed


answer_cpuinfo_fast()  # for DeepSpeed's op builders, in every gpt process
