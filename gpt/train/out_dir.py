"""What an --out_dir may hold before a run writes there: the paths the run writes are free, it is neither --data nor
another run's checkpoints, the disk has room for the next checkpoint, and a run without --resume finds no earlier
run in it (rank 0 checks that again under the run lock: gpt/train/run_lock.py, gpt/train/start.py)."""
import os
from pathlib import Path

from gpt.console import (NEARLY_FULL, BadInput, directory_problem, nearest_existing, out_dir_problem,
                         regular_file_problem, space_problem)
from gpt.runtime.links import link_problem
from gpt.train.checkpoint import CHECKPOINTS, COMPLETE, LATEST, RUN_CONFIG, TAG_PATTERN, checkpoint_dir, file_sizes
from gpt.train.metrics import METRICS, METRICS_WHAT, PROFILE_DIR, TENSORBOARD_DIR, events_dir


# The paths a run writes under its out_dir, what each must be if it is there already, and what it is for. The
# TensorBoard events (events.out.tfevents.*, a new name per run) go into tensorboard/<out_dir's name>/.
RUN_FILES = (("run.lock", "the run's lock file"), (METRICS, METRICS_WHAT),
             (f"{CHECKPOINTS}/{LATEST}", "the name of the newest checkpoint"))
RUN_MARKERS = {"run.lock", METRICS}  # the first files a run writes: a run that has not saved yet is one
IN_PLACE = RUN_MARKERS  # written in place (locked, appended to): never through a link (gpt/runtime/links.py)
RUN_DIRS = ((CHECKPOINTS, "where the run saves its checkpoints"),
            (TENSORBOARD_DIR, "where the run writes its TensorBoard events"))


def run_path_problems(out_dir):
    """What is in the way of the files and directories a run writes under out_dir: a directory, a FIFO (which
    would block the open forever), a dangling link where a file goes; a file where a directory goes. Found
    only when the run wrote there (an IsADirectoryError at the first save), or never (a hang). And what would take
    the run's writes elsewhere: a symbolic link where a file written in place goes, a directory linked into another
    run (foreign_link_problem)."""
    problems = []
    for name, what in RUN_FILES:
        path = Path(out_dir) / name
        if name in IN_PLACE and link_problem(path, what):
            problems.append(link_problem(path, what))
        elif os.path.lexists(path) and regular_file_problem(path):
            problems.append(f"{regular_file_problem(path)} ({what}): move it away, or use another --out_dir")
    for name, what in RUN_DIRS:
        problem = directory_problem(Path(out_dir) / name)
        if problem:
            problems.append(f"{problem} ({what}): move it away, or use another --out_dir")
    for name, what in (*RUN_DIRS, (events_dir(out_dir).relative_to(out_dir), "where this run's events go"),
                       (PROFILE_DIR, "where --profile writes its traces")):
        problems.append(foreign_link_problem(out_dir, Path(out_dir) / name, what))
    return [problem for problem in problems if problem]


def foreign_link_problem(out_dir, path, what):
    """Why the directory `path` under out_dir would take the run's writes into another run's files: through a
    symbolic link (path's or a parent's) it leads into a directory that holds another run; or None. A link
    elsewhere (checkpoints/ on another disk) is the user's choice and is followed."""
    real, own = Path(os.path.realpath(path)), Path(os.path.realpath(out_dir))  # a link that loops: no error here
    if real.is_relative_to(own):
        return None
    other = next((a for a in (real, *real.parents) if holds_a_run(a)), None)
    return other and (f"{path} leads through a symbolic link to {real}, among the files of the run in {other} "
                      f"({what}): this run would write into that run's; remove the link, or use another --out_dir")


def check_writable(out_dir, data_dir=None):
    """--out_dir and its checkpoints/ can be made and written (the nearest existing ancestor of each is a
    writable directory: a read-only checkpoints/ would fail only at the first save), nothing is in the way of
    the files the run writes there (run_path_problems), --out_dir is not --data (the run's files would land among
    the shards), and it is neither a run's checkpoints/ directory or one of its checkpoints (the run would mix
    its files into them) nor anywhere inside them (that run's pruning would delete this one's): check_not_nested."""
    problem = out_dir_problem("--out_dir", out_dir)
    if problem:
        raise BadInput(problem)
    if data_dir and os.path.isdir(out_dir) and os.path.isdir(data_dir) and os.path.samefile(out_dir, data_dir):
        raise BadInput(f"--out_dir {out_dir} is the --data directory: the run's checkpoints, metrics and lock "
                       f"file would land among its shards; use another --out_dir")
    problems = run_path_problems(out_dir)
    if problems:
        raise BadInput("\n".join(problems))
    check_not_nested(out_dir)
    ckpt_dir = nearest_existing(checkpoint_dir(out_dir))
    if ckpt_dir.is_dir() and not os.access(ckpt_dir, os.W_OK | os.X_OK):
        raise BadInput(f"--out_dir {out_dir}: {ckpt_dir} is not writable")


def check_not_nested(out_dir):
    """--out_dir, its symbolic links resolved (a link into another run's checkpoints leads there all the same), is
    neither a run's checkpoint nor its checkpoints/ directory, nor anywhere inside a run's checkpoints/: that run's
    pruning (--keep_last) would delete this one with the step it lies in, and once that run saves, this one's
    --resume is refused. A run that has not saved yet counts by its run.lock or metrics.jsonl. The reverse too:
    this run's own checkpoints/ holds no other run."""
    real = Path(out_dir).resolve()
    linked = f" (through a symbolic link: {real})" if str(real) != os.path.abspath(out_dir) else ""
    if (real / COMPLETE).exists() or (real / RUN_CONFIG).exists():
        raise BadInput(f"--out_dir {out_dir} is a checkpoint of the run in {real.parent.parent}{linked}: to "
                       f"continue that run, use --out_dir {real.parent.parent} --resume auto")
    if is_checkpoints_dir(real):
        raise BadInput(f"--out_dir {out_dir} is the checkpoints directory of the run in {real.parent}{linked}: to "
                       f"continue that run, use --out_dir {real.parent} --resume auto")
    inside = next((a for a in real.parents
                   if a.name == CHECKPOINTS and (is_checkpoints_dir(a) or holds_a_run(a.parent))), None)
    if inside is not None:
        raise BadInput(f"--out_dir {out_dir} is inside the checkpoints of the run in {inside.parent}{linked}, whose "
                       f"pruning (--keep_last) deletes its old steps with whatever lies in them: use an --out_dir "
                       f"outside {inside}")
    inner = run_inside(checkpoint_dir(real))
    if inner is not None:
        raise BadInput(f"--out_dir {out_dir}: its checkpoints directory holds the run in {inner}, which this run's "
                       f"pruning (--keep_last) would delete with the steps around it: move that run out of "
                       f"{checkpoint_dir(real)}, or use another --out_dir")


def is_checkpoints_dir(path):
    """Whether path holds a run's checkpoints: `latest`, or a step directory."""
    return (path / LATEST).is_file() or any(TAG_PATTERN.match(p.name) for p in path.glob("step_*"))


def holds_a_run(path):
    """Whether a run has written into path (its lock file or metrics log), saved or not."""
    return any(os.path.lexists(Path(path) / name) for name in RUN_MARKERS)


def run_inside(path):
    """The first directory under path (symbolic links not followed) that holds a run, or None."""
    for directory, _, files in os.walk(path):
        if RUN_MARKERS & set(files):
            return Path(directory)
    return None


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
