"""What an --out_dir may hold before a run writes there: the paths the run writes are free, it is neither --data nor
another run's checkpoints, the disk has room for the next checkpoint, and a run without --resume finds no earlier
run in it (rank 0 checks that again under the run lock: gpt/train/run_lock.py, gpt/train/start.py)."""
import os
from pathlib import Path

from gpt.console import (NEARLY_FULL, BadInput, directory_problem, nearest_existing, out_dir_problem,
                         regular_file_problem, space_problem)
from gpt.train.checkpoint import CHECKPOINTS, COMPLETE, LATEST, RUN_CONFIG, TAG_PATTERN, checkpoint_dir, file_sizes
from gpt.train.metrics import TENSORBOARD_DIR


# The paths a run writes under its out_dir, what each must be if it is there already, and what it is for. The
# TensorBoard events (events.out.tfevents.*, a new name per run) go into tensorboard/<out_dir's name>/.
RUN_FILES = (("run.lock", "the run's lock file"), ("metrics.jsonl", "the run's metrics log"),
             (f"{CHECKPOINTS}/{LATEST}", "the name of the newest checkpoint"))
RUN_DIRS = ((CHECKPOINTS, "where the run saves its checkpoints"),
            (TENSORBOARD_DIR, "where the run writes its TensorBoard events"))


def run_path_problems(out_dir):
    """What is in the way of the files and directories a run writes under out_dir: a directory, a FIFO (which
    would block the open forever), a dangling link where a file goes; a file where a directory goes. Found
    only when the run wrote there (an IsADirectoryError at the first save), or never (a hang)."""
    problems = []
    for name, what in RUN_FILES:
        path = Path(out_dir) / name
        if os.path.lexists(path) and regular_file_problem(path):
            problems.append(f"{regular_file_problem(path)} ({what}): move it away, or use another --out_dir")
    for name, what in RUN_DIRS:
        problem = directory_problem(Path(out_dir) / name)
        if problem:
            problems.append(f"{problem} ({what}): move it away, or use another --out_dir")
    return problems


def check_writable(out_dir, data_dir=None):
    """--out_dir and its checkpoints/ can be made and written (the nearest existing ancestor of each is a
    writable directory: a read-only checkpoints/ would fail only at the first save), nothing is in the way of
    the files the run writes there (run_path_problems), --out_dir is not --data (the run's files would land among
    the shards), and it is neither a run's checkpoints/ directory or one of its checkpoints (the run would mix
    its files into them) nor anywhere inside them (that run's pruning would delete this one's)."""
    problem = out_dir_problem("--out_dir", out_dir)
    if problem:
        raise BadInput(problem)
    if data_dir and os.path.isdir(out_dir) and os.path.isdir(data_dir) and os.path.samefile(out_dir, data_dir):
        raise BadInput(f"--out_dir {out_dir} is the --data directory: the run's checkpoints, metrics and lock "
                       f"file would land among its shards; use another --out_dir")
    problems = run_path_problems(out_dir)
    if problems:
        raise BadInput("\n".join(problems))
    out_dir = Path(out_dir)
    if (out_dir / COMPLETE).exists() or (out_dir / RUN_CONFIG).exists():
        raise BadInput(f"--out_dir {out_dir} is a checkpoint of the run in {out_dir.parent.parent}: to "
                       f"continue that run, use --out_dir {out_dir.parent.parent} --resume auto")
    if is_checkpoints_dir(out_dir):
        raise BadInput(f"--out_dir {out_dir} is the checkpoints directory of the run in {out_dir.parent}: to "
                       f"continue that run, use --out_dir {out_dir.parent} --resume auto")
    inside = next((a for a in out_dir.absolute().parents if a.name == CHECKPOINTS and is_checkpoints_dir(a)), None)
    if inside is not None:
        raise BadInput(f"--out_dir {out_dir} is inside the checkpoints of the run in {inside.parent}, whose pruning "
                       f"(--keep_last) deletes its old steps with whatever lies in them: use an --out_dir outside "
                       f"{inside}")
    ckpt_dir = nearest_existing(checkpoint_dir(out_dir))
    if ckpt_dir.is_dir() and not os.access(ckpt_dir, os.W_OK | os.X_OK):
        raise BadInput(f"--out_dir {out_dir}: {ckpt_dir} is not writable")


def is_checkpoints_dir(path):
    """Whether path holds a run's checkpoints: `latest`, or a step directory."""
    return (path / LATEST).is_file() or any(TAG_PATTERN.match(p.name) for p in path.glob("step_*"))


def check_space(out_dir, resume_from):
    """Room on the disk for the run's next checkpoint: as large as the one resumed from (the older ones are
    pruned only after it is complete); for a fresh run, the size is unknown: a disk not already full."""
    if resume_from is not None:
        needed, what = sum(file_sizes(resume_from).values()), f"a checkpoint like {Path(resume_from).name}"
    else:
        needed, what = NEARLY_FULL, "a run"
    problem = space_problem("--out_dir", out_dir, needed, what)
    if problem:
        raise BadInput(problem)


def check_fresh_out_dir(out_dir):
    """A run without --resume must not write into an earlier run's out_dir: its checkpoints would be
    overwritten step by step (and `latest` moved) and metrics.jsonl would mix the two runs."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out_dir {out_dir} is a file, not a directory")
    steps = sorted(p.name for p in checkpoint_dir(out_dir).glob("step_*")) if checkpoint_dir(out_dir).is_dir() else []
    metrics = out_dir / "metrics.jsonl"
    held = ([f"checkpoints up to {steps[-1]}"] if steps else []) + (
        ["metrics.jsonl"] if metrics.is_file() and metrics.stat().st_size else [])
    if held:
        raise BadInput(f"--out_dir {out_dir} holds an earlier run ({' and '.join(held)}): continue it with "
                       f"--resume auto, or start afresh with another --out_dir")
