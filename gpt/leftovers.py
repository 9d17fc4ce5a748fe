"""What killed runs leave on a machine, removed at start-up once nothing alive holds it.

- DeepSpeed's CPU shared-memory allreduce: a 66 MB /dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}
  per rank, unlinked by nobody (gpt.host_fixes removes a rank's own at a normal exit; a SIGKILLed rank leaks it).
- torch's JIT extension builds (DeepSpeed's FusedAdam, its shm allreduce op): a `lock` file in the build
  directory, created with O_EXCL and held open by the builder until the build ends; a killed build leaves
  it, and every later build of that op waits for it forever, silently (torch's FileBaton).

"Alive holds it": a process of this machine has the file open or mapped (/proc/PID/fd, /proc/PID/maps).
DeepSpeed keeps its buffer open and mapped from creation to exit, and the builder holds its lock from
creation to release, so an unheld file is a dead process's. Processes of other users are skipped: they
cannot open this user's 0600 shm files; a lock in this user's cache is this user's too. The blind spot:
processes in another PID namespace that share the directory, and, for locks, other machines on a
network file system: there a lock is only reported, never removed."""
import os
import sys
import time
from pathlib import Path

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
