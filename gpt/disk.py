"""Full and read-only disks, said in one line: up front (before a run that could not save starts) and where a
write fails mid-run.

Why free space is measured, not only errno read: DeepSpeed's save and torch.save write through C++ streams,
whose failure on a full disk arrives as `RuntimeError: basic_ios::clear: iostream error` with no errno."""
import contextlib
import errno
import os
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NEARLY_FULL = 1 << 20  # bytes: a failed write that leaves less than this free filled the disk


@contextlib.contextmanager
def atomic_write(path):
    """Yield the temporary path (PATH.tmp) to write path's contents to; renamed over path when the block completes
    (readers see the old file or the new one, never a part), removed when anything raises (the error goes on).
    Nested, they commit several files together: each is renamed only once every block is through, innermost first."""
    tmp = Path(f"{path}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a cleanup that fails too must not hide why the write failed
            tmp.unlink(missing_ok=True)
        raise


def nearest_existing(path):
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


def free_bytes(path):
    """The bytes this process may still write on path's file system (root may use the blocks reserved for it)."""
    stats = os.statvfs(nearest_existing(path))
    return (stats.f_bfree if os.geteuid() == 0 else stats.f_bavail) * stats.f_frsize


def megabytes(size):
    return f"{size / 1e6:.1f} MB"


def write_problem(path, error):
    """'PATH: no space left on the device (...)' or 'PATH: not writable (...)' when writing under path failed
    because of its disk; None when the disk is not why (the error is then a bug to show whole)."""
    code = getattr(error, "errno", None)
    try:
        free = free_bytes(path)
    except OSError:
        free = None
    if code in NO_SPACE or (code is None and free is not None and free < NEARLY_FULL):
        return f"{path}: no space left on the device"
    if code in NOT_WRITABLE or (code is None and not os.access(nearest_existing(path), os.W_OK)):
        return f"{path}: not writable" + (f" ({os.strerror(code)})" if code else "")
    return None


def space_problem(flag, path, needed, what):
    """Why `needed` bytes (`what`, for the message) will not fit on path's file system, or None."""
    free = free_bytes(path)
    if free < needed:
        return f"{flag} {path}: no space left on the device: {megabytes(free)} free, {what} needs {megabytes(needed)}"
    return None


def os_error_line(error, default_path):
    """One line for an OSError while writing: write_problem's where the disk is why, else the file and the system's
    words (`[Errno 21] Is a directory: 'a' -> 'b'` names no file first, as the project's lines do)."""
    path = error.filename2 or error.filename or default_path  # os.replace(tmp, target): the target is the user's
    return write_problem(path, error) or f"{path}: {error.strerror or error}"
