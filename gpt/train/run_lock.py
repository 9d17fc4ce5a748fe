"""One run per --out_dir at a time: rank 0 holds an exclusive flock on OUT_DIR/run.lock for the whole run.

Why a kernel lock and not a marker file: the kernel drops the lock when the process ends however it ends (a
SIGKILL, an out-of-memory kill), so a dead run's lock file blocks nothing; the file stays, and only records
who held it last. flock belongs to the open file, not the process, so two runs in one process (tests, bench)
exclude each other too; on NFS Linux maps it to a byte-range lock that other nodes see."""
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from gpt.console import BadInput, launched_rank, regular_file_problem, warn
from gpt.train.out_dir import check_fresh_out_dir
from gpt.train.resume import check_resume_target

LOCK_FILE = "run.lock"



def lock_file_problem(path):
    """Why an existing run.lock cannot be opened as the lock (a directory; a FIFO, whose open would block
    forever; a dangling link), or None. Decided by stat, before any open."""
    if not os.path.lexists(path):
        return None
    problem = regular_file_problem(path)
    return problem and f"{problem} (the run's lock file): move it away, or use another --out_dir"


def this_launch():
    """What tells this launch's ranks apart from another launch's: its rendezvous address (two live launches
    cannot share one); None for a single process."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return None
    return f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"


def record_of(path):
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


def refusal(out_dir, path):
    return BadInput(f"--out_dir {out_dir}: another run is using it: {holder(path)}; wait for it to end, or use "
                    f"another --out_dir")


def check_unlocked(out_dir, tries=10):
    """BadInput if a live run other than this launch holds out_dir; writes nothing. Checked on every rank
    before anything else about out_dir, so that a run started beside a live one says so (rather than that
    out_dir holds an earlier run), on every rank alike. A rank may look after its own rank 0 took the lock:
    that holder is not another run (its record, written just after it locked, is waited for a moment)."""
    path = Path(out_dir) / LOCK_FILE
    if lock_file_problem(path):
        raise BadInput(lock_file_problem(path))
    try:
        probe = open(path)
    except OSError:
        return  # no lock file (or none readable): no run has held it
    with probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when closed
            return
        except BlockingIOError:
            pass
        except OSError:
            return  # a file system without locks: acquire() says so
    for _ in range(tries if this_launch() else 0):
        if record_of(path).get("launch") == this_launch():
            return
        time.sleep(0.1)
    raise refusal(out_dir, path)


def acquire(out_dir, tries=5):
    """Take out_dir's lock (making out_dir) and record this process in it; returns the open file, which holds
    the lock until it is closed or the process ends. BadInput if a live run holds it. A few tries 0.1 s
    apart: another run's check_unlocked holds a shared lock for an instant."""
    path = Path(out_dir) / LOCK_FILE
    if lock_file_problem(path):
        raise BadInput(lock_file_problem(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "a+")  # not "w": truncating would erase the holder's record before we know we hold it
    for attempt in range(tries):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == tries - 1:
                lock.close()
                raise refusal(out_dir, path) from None
            time.sleep(0.1)
        except OSError as e:  # e.g. Lustre mounted without -o flock: train, unguarded, rather than not at all
            warn(f"{path}: this file system has no file locks ({e.strerror}): a second run into --out_dir "
                 f"{out_dir} would not be stopped")
            break
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "launch": this_launch()}
    try:
        lock.truncate(0)
        lock.write(json.dumps(record) + "\n")
        lock.flush()
    except OSError:  # a full disk: the lock itself needs no space; the record is only for the message above
        pass
    return lock


def lock_out_dir(out_dir, resume, resume_from):
    """Rank 0 takes out_dir's run lock (acquire), then checks again, under it, that out_dir holds nothing this run
    would overwrite (resume: --resume; resume_from: the checkpoint it found): a run that checked before another took
    the lock may find it written to now. Returns (the lock or None, why this run is refused or None); other ranks
    take nothing."""
    if launched_rank() != 0:
        return None, None
    try:
        lock = acquire(out_dir)
    except BadInput as e:
        return None, e
    try:
        if not resume:
            check_fresh_out_dir(out_dir)
        elif resume_from is not None:
            check_resume_target(resume_from, out_dir)
    except BadInput as e:
        lock.close()
        return None, e
    return lock, None
