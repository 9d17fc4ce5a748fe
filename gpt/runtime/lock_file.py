"""One process at a time in a directory: an exclusive flock on a lock file in it, held while the process works there.
The trainer's OUT_DIR/run.lock (gpt/train/run_lock.py) and gpt-prepare's OUT_DIR/prepare.lock (gpt/data/prepare.py).

Why a kernel lock and not a marker file: the kernel drops the lock when the process ends however it ends (a SIGKILL,
an out-of-memory kill), so a dead process's lock file blocks nothing; the file only records who held it last. flock
belongs to the open file, not the process, so two holders in one process (tests, bench) exclude each other too. Why a
file, opened for writing, and not the directory itself: on NFS Linux maps flock to a byte-range lock that other nodes
see, which an exclusive lock takes only on a file open for writing (a directory's flock fails there)."""
import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from gpt.console import BadInput, regular_file_problem, warn
from gpt.runtime.links import link_problem, open_no_follow


class Held(Exception):
    """Another live process holds the lock."""


def lock_file_problem(path, what):
    """Why an existing lock file cannot be opened as the lock (a symbolic link, whose target the record would
    overwrite; a directory; a FIFO, whose open would block forever), or None. Decided by stat, before any open.
    what: the file's role, for the message."""
    if not os.path.lexists(path):
        return None
    problem = regular_file_problem(path)
    return link_problem(path, what) or (problem and f"{problem} ({what}): move it away, or use another --out_dir")


def record_of(path):
    """What the lock file's last holder recorded of itself (acquire's `record`), or {}."""
    if regular_file_problem(path):  # never open a FIFO: it would block
        return {}
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def holder(path):
    """'pid N on HOST (since TIME)' of the lock file's last holder, as it recorded itself."""
    record = record_of(path)
    try:
        return f"pid {record['pid']} on {record['host']} (since {record['since']})"
    except (KeyError, TypeError):
        return "a process that has not recorded itself yet"


def held_by_another(path):
    """Whether a live process holds the lock at path; takes nothing (a shared lock for an instant). False where there
    is no lock file, none readable, or no file locks on its file system."""
    try:
        probe = open(path)
    except OSError:
        return False
    with probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when closed
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False


def acquire(path, what, unguarded, record=None, tries=5):
    """Take the lock at path (making its directory) and record this process in the file (pid, host, since, and
    `record`'s items); returns the open file, which holds the lock until it is closed or the process ends. Raises Held
    if a live process holds it (a few tries 0.1 s apart: a held_by_another probe holds it for an instant), BadInput if
    the path cannot be a lock file. Where the file system has no file locks (Lustre without -o flock): a warning,
    `unguarded` saying what then goes unstopped, and the file unlocked rather than no work at all."""
    if lock_file_problem(path, what):
        raise BadInput(lock_file_problem(path, what))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(tries):
        # not "w": truncating would erase the holder's record before we know we hold it
        lock = open_no_follow(path, "a+", what)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            if attempt == tries - 1:
                raise Held(path) from None
            time.sleep(0.1)
            continue
        except OSError as e:
            warn(f"{path}: this file system has no file locks ({e.strerror}): {unguarded}")
        if still_at(lock, path):
            break
        lock.close()  # its holder removed the file (release) after we opened it: lock the one there now
    else:
        raise Held(path)
    write_record(lock, {"pid": os.getpid(), "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **(record or {})})
    return lock


def still_at(lock, path):
    """Whether the open file `lock` is still the file at path (not one removed, and perhaps made anew, since)."""
    try:
        return os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
    except OSError:
        return False


def write_record(lock, record):
    try:
        lock.truncate(0)
        lock.write(json.dumps(record) + "\n")
        lock.flush()
    except OSError:  # a full disk: the lock itself needs no space; the record is only for the refusal's message
        pass


def release(lock, remove=False):
    """Give the lock up; remove: delete its file first (while still held, so no other process can take the lock on
    the removed file: acquire checks that the file it locked is still there)."""
    if remove:
        try:
            os.unlink(lock.name)
        except OSError:
            pass
    lock.close()


@contextlib.contextmanager
def holding(out_dir, name, who):
    """A command's one-at-a-time in its --out_dir (gpt-prepare's, gpt-export's): the lock at OUT_DIR/name held for the
    block, its file removed when the block ends, and an --out_dir made for it and left empty removed again. Held by
    another: BadInput naming that holder (who: the command, for the messages)."""
    out_dir = Path(out_dir)
    made, path = not out_dir.exists(), out_dir / name
    try:
        lock = acquire(path, f"{who}'s lock file", f"a second {who} into --out_dir {out_dir} would not be stopped")
    except Held:
        raise BadInput(f"--out_dir {out_dir}: another {who} is writing there: {holder(path)}; wait for it to end, or "
                       f"use another --out_dir") from None
    try:
        yield
    finally:
        release(lock, remove=True)
        if made and not any(out_dir.iterdir()):
            out_dir.rmdir()
