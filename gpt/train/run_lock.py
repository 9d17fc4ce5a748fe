"""One run per --out_dir at a time: rank 0 holds an exclusive flock on OUT_DIR/run.lock for the whole run (the lock
itself, and why a kernel lock: gpt/runtime/lock_file.py). Every rank checks before anything else that no other run
holds it; rank 0 then takes it and checks the out_dir again under it."""
import os
import time
from pathlib import Path

from gpt.console import BadInput, launched_rank
from gpt.runtime import lock_file
from gpt.train import extend
from gpt.train.out_dir import check_fresh_out_dir
from gpt.train.resume import check_resume_target

LOCK_FILE = "run.lock"
WHAT = "the run's lock file"


def this_launch():
    """What tells this launch's ranks apart from another launch's: its rendezvous address (two live launches
    cannot share one); None for a single process."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return None
    return f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"


def refusal(out_dir, path):
    return BadInput(f"--out_dir {out_dir}: another run is using it: {lock_file.holder(path)}; wait for it to end, or "
                    f"use another --out_dir")


def check_unlocked(out_dir, tries=10):
    """BadInput if a live run other than this launch holds out_dir; writes nothing. Checked on every rank
    before anything else about out_dir, so that a run started beside a live one says so (rather than that
    out_dir holds an earlier run), on every rank alike. A rank may look after its own rank 0 took the lock:
    that holder is not another run (its record, written just after it locked, is waited for a moment)."""
    path = Path(out_dir) / LOCK_FILE
    if lock_file.lock_file_problem(path, WHAT):
        raise BadInput(lock_file.lock_file_problem(path, WHAT))
    if not lock_file.held_by_another(path):
        return
    for _ in range(tries if this_launch() else 0):
        if lock_file.record_of(path).get("launch") == this_launch():
            return
        time.sleep(0.1)
    raise refusal(out_dir, path)


def acquire(out_dir, tries=5):
    """Take out_dir's lock (making out_dir) and record this process and launch in it; returns the open file, which
    holds the lock until it is closed or the process ends. BadInput if a live run holds it."""
    path = Path(out_dir) / LOCK_FILE
    try:
        return lock_file.acquire(path, WHAT, f"a second run into --out_dir {out_dir} would not be stopped",
                                 record={"launch": this_launch()}, tries=tries)
    except lock_file.Held:
        raise refusal(out_dir, path) from None


def lock_out_dir(out_dir, resume, resume_from, max_steps):
    """Rank 0 takes out_dir's run lock (acquire), then checks again, under it, that out_dir holds nothing this run
    would overwrite (resume: --resume; resume_from: the checkpoint it found; max_steps: --max_steps): a run that
    checked before another took the lock may find it written to now. A wsd run extended in its own out_dir moves its
    finished cooldown aside here, before anything else is written (gpt/train/extend.py; the other ranks wait for it in
    the process group's first collective). Returns (the lock or None, why this run is refused or None); other ranks
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
            cooldown = check_resume_target(resume_from, out_dir, max_steps)
            if cooldown:
                extend.move_aside(cooldown)
    except BadInput as e:
        lock.close()
        return None, e
    return lock, None
