"""The host fixes a run needs on this machine, apart from the process group they are applied around
(gpt.runtime.ranks.setup_distributed, and py-cpuinfo's answer when gpt.runtime.accelerator imports DeepSpeed):
py-cpuinfo answered from /proc/cpuinfo, build locks of killed JIT builds removed, glibc malloc keeping freed memory
in the heap (and handing it back on request), torch's extensions directory checked (for a config whose optimizer
DeepSpeed builds), the exit's collection of garbage skipped. Nothing here imports deepspeed but to ask whether its
ops were prebuilt."""
import atexit
import contextlib
import ctypes
import functools
import gc
import os
import platform
import sys
import time
from pathlib import Path

from gpt.console import nearest_existing


def cpu_info_from_proc():
    """What DeepSpeed reads of py-cpuinfo's answer (the architecture, the SIMD flags, the vendor), from
    /proc/cpuinfo on x86-64 Linux in a millisecond; None elsewhere. Written by hand because py-cpuinfo answers
    by starting a Python process (0.7-1.3 s on 2 cores), and DeepSpeed asks it in every rank, as it imports and
    before each op it loads (FusedAdam, where a config asks for it)."""
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


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def _mallopt(settings):
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    for parameter, value in settings.items():
        libc.mallopt(parameter, value)


def keep_freed_memory_in_heap():
    """CPU tensors come from glibc malloc, which serves every block over 32 MB (logits, activations,
    gradient buffers) with fresh mmap pages and unmaps them on free: each step page-faults its whole
    working set again, and the kernel time rivalled the compute (sys ~ user). Keep freed memory in the
    heap for reuse instead, as CUDA's caching allocator does on GPUs: 1.99x faster d4 bf16 steps
    (python bench/train.py --only allocator). The price: RSS stays at its peak."""
    _mallopt({M_MMAP_MAX: 0,  # large blocks from the heap, not mmap
              M_TRIM_THRESHOLD: 2**31 - 1})  # and never handed back to the kernel mid-run


def return_freed_memory():
    """Hand the heap's free memory back to the kernel (keep_freed_memory_in_heap never does by itself):
    for a process that builds one engine after another, such as bench/train.py."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def unmap_freed_memory():
    """Undo keep_freed_memory_in_heap once a run is over, for a process that goes on to other work (the tests'
    in-process runs): large blocks mmapped and unmapped when freed again, the heap's top trimmed above 128 KiB
    (glibc's initial values), and what the heap holds free handed back now."""
    _mallopt({M_MMAP_MAX: 65536, M_TRIM_THRESHOLD: 128 * 1024})
    return_freed_memory()


def skip_the_collection_at_exit():
    """At exit the interpreter walks every object for garbage, several times over: with torch._dynamo and DeepSpeed
    imported (an optimizer's construction imports dynamo) that took 1.5-2 s of CPU after a command had finished
    (~0.3 s with the objects frozen; 2-core AMD EPYC, 2026-11-28), in every rank and every command. Freezing them
    at exit leaves them to the OS, which takes the memory back anyway. The first handler registered runs last."""
    atexit.register(gc.freeze)


# What killed JIT builds leave on a machine, removed at start-up once nothing alive holds it: torch's builds
# (DeepSpeed's FusedAdam, where a config asks for it) take a `lock` file in the build directory, created with O_EXCL
# and held open by the builder until the build ends; a killed build leaves it, and every later build of that op waits
# for it forever, silently (torch's FileBaton).
#
# "Alive holds it": a process of this machine has the file open or mapped (/proc/PID/fd, /proc/PID/maps): the builder
# holds its lock from creation to release, so an unheld lock is a dead process's. A lock in this user's cache is this
# user's. The blind spot: processes in another PID namespace that share the directory, and other machines on a
# network file system: there a lock is only reported, never removed.
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


def jit_locks():
    """torch's build locks: TORCH_EXTENSIONS_DIR/OP/lock, or under the default root (one folder per Python and
    accelerator: py311_cu128/OP/lock)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return sorted(Path(root).glob("*/lock"))
    from torch.utils.cpp_extension import get_default_build_root
    return sorted(Path(get_default_build_root()).glob("*/*/lock"))


def extensions_dir_problem():
    """Why DeepSpeed could not JIT-build or load an op (FusedAdam, where a config asks for it) under torch's
    extensions directory, or None: loading takes a lock file there even when the op is built. None where DeepSpeed
    was installed with its ops prebuilt (DS_BUILD_OPS=1)."""
    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import get_default_build_root

    if any(installed_ops.values()):
        return None
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    existing = nearest_existing(root)
    if os.access(existing, os.W_OK):  # also EROFS for root, whom permissions do not stop
        return None
    variable = "TORCH_EXTENSIONS_DIR" if os.environ.get("TORCH_EXTENSIONS_DIR") else \
        "XDG_CACHE_HOME or TORCH_EXTENSIONS_DIR"
    return (f"{root}: not writable ({existing} is read-only or not yours), and DeepSpeed builds and loads its "
            f"FusedAdam there: set {variable} to a writable directory, or use torch's AdamW "
            f"(optimizer.params.torch_adam true, as ds_configs/ do)")


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
