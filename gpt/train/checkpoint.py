"""Checkpoints: DeepSpeed's own save/load on every rank, plus what makes them safe to resume from.

Layout under OUT_DIR/checkpoints/:
    step_00000100/            DeepSpeed's files (model, optimizer partitions, scheduler) + client state
        rng_rank00000.pt      each rank's RNG states
        run_config.json       the settings the run had, to refuse an incompatible resume up front
        complete.json         written last, after every rank finished, with every file's size: only
                              such checkpoints are loaded, and only while their files are all there whole
        universal/            made later, on a resume on another world size: the same checkpoint in DeepSpeed's
                              universal form (gpt/train/universal.py); not one of the checkpoint's own files
    latest                    the newest complete tag (moved after complete.json exists)
    step_00000200.damaged/    a complete checkpoint found damaged at resume, set aside (kept, never loaded)"""
import json
import os
import random
import re
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from gpt.runtime import ranks
from gpt.console import BadInput, directory_problem, out_dir_problem, regular_file_problem, warn
from gpt.data.shards import data_changes, describe_changes
from gpt.console import NEARLY_FULL, atomic_write, nearest_existing, space_problem
from gpt.train.metrics import TENSORBOARD_DIR

CHECKPOINTS = "checkpoints"
COMPLETE = "complete.json"
RUN_CONFIG = "run_config.json"
LATEST = "latest"
TAG_PATTERN = re.compile(r"^step_(\d{8})$")
RNG_PATTERN = re.compile(r"^rng_rank\d{5}\.pt$")
# What a checkpoint records since issue 25: a data position in global batches of a step's windows, which any
# world size and micro-batch continue, and DeepSpeed's universal_checkpoint_info, which a conversion needs.
# Checkpoints without "format" in run_config.json are format 1.
FORMAT = 2
UNIVERSAL = "universal"  # a step's universal form, step_NNNNNNNN/universal/ (gpt/train/universal.py)
UNIVERSAL_TEMPORARY = f"{UNIVERSAL}.tmp"  # where it is built, renamed to UNIVERSAL when complete
MODEL_STATES = "mp_rank_00_model_states.pt"
ZERO = "zero"  # DeepSpeed's directory of per-parameter states in a universal checkpoint
# Settings a checkpoint's weights and optimizer states only fit with; everything else may change on resume.
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")



def checkpoint_dir(out_dir):
    return Path(out_dir) / CHECKPOINTS


def tag_for(step):
    return f"step_{step:08d}"


def rng_state():
    from deepspeed.accelerator import get_accelerator
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "accelerator": get_accelerator().get_rng_state()}


def set_rng_state(state):
    from deepspeed.accelerator import get_accelerator
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    get_accelerator().set_rng_state(state["accelerator"])


def file_sizes(path):
    """name -> bytes of every file in a checkpoint directory but its completion marker and its universal form
    (universal/ and the universal.tmp/ it is built in: made from the checkpoint later, not part of it). Those are
    not walked at all: rank 0 may be renaming and removing them while the other ranks sum the files."""
    try:
        own = [p for p in Path(path).iterdir() if p.name not in (UNIVERSAL, UNIVERSAL_TEMPORARY)]
    except (FileNotFoundError, NotADirectoryError):  # none, or pruned meanwhile: no files, as rglob found none
        return {}
    files = sorted(own + [p for folder in own if folder.is_dir() for p in folder.rglob("*")])
    return {str(p.relative_to(path)): p.stat().st_size for p in files if p.is_file() and p.name != COMPLETE}


def json_kind(value):
    """JSON's name for a parsed value's type: 'an array', 'a string', ..."""
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null", dict: "an object"}.get(type(value), type(value).__name__)


def not_regular(path):
    """regular_file_problem without the path in front: 'a FIFO (named pipe), not a regular file', or None."""
    problem = regular_file_problem(path)
    return problem and problem.removeprefix(f"{path}: ")


def marker_problem(marker):
    """Why a parsed complete.json is not one save() writes: {"step": N, "files": {name: bytes}} ("files" is
    absent in markers written before sizes were recorded), or None."""
    if not isinstance(marker, dict):
        return f"{json_kind(marker)}, not an object"
    if type(marker.get("step")) is not int or marker["step"] < 0:
        return f"'step' {json.dumps(marker.get('step'))} is not a step number"
    files = marker.get("files", {})
    if not (isinstance(files, dict) and all(type(size) is int and size >= 0 for size in files.values())):
        return "'files' is not an object of file sizes"
    return None


def damage(path):
    """Why a complete checkpoint cannot be loaded, or None: its complete.json is not a regular file (a FIFO
    would block the read forever) or not one save() writes, or a file written at save is missing or no longer
    its recorded size. RNG files are left to load(), which says when one is missing. Markers written before
    sizes were recorded are trusted."""
    marker = Path(path) / COMPLETE
    problem = not_regular(marker)
    if problem:
        return f"unreadable {COMPLETE} ({problem})"
    try:
        parsed = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable {COMPLETE} ({e})"
    problem = marker_problem(parsed)
    if problem:
        return f"unreadable {COMPLETE} ({problem})"
    if "files" not in parsed:
        return None
    recorded = parsed["files"]
    actual = file_sizes(path)
    for name, size in recorded.items():
        if RNG_PATTERN.match(name):
            continue
        if name not in actual:
            return f"{name} is {not_regular(Path(path) / name) if os.path.lexists(Path(path) / name) else 'missing'}"
        if actual[name] != size:
            return f"{name} has {actual[name]} bytes, {size} were written"
    return None


def complete_tags(ckpt_dir):
    """Tags of complete checkpoints, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p.name for p in ckpt_dir.iterdir() if TAG_PATTERN.match(p.name) and (p / COMPLETE).exists())


def save(engine, out_dir, step, client_state, run_config, keep_last, keep_every):
    """Save on every rank (DeepSpeed requires it). `latest` moves only once every rank has written its
    part and the checkpoint is marked complete, so a crash mid-save leaves the previous one loadable."""
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    ckpt_dir = checkpoint_dir(out_dir)
    tag = tag_for(step)
    # UNIVERSAL_CHECKPOINT_INFO: what DeepSpeed's ds_to_universal requires to convert it (gpt/train/universal.py; empty:
    # no tensor-parallel layouts here). DeepSpeed refuses it in client_state (a reserved key) and saves it from this
    # module attribute instead. run_config: the model's shape also in the universal form, which copies this file
    # but not run_config.json.
    if getattr(engine.module, UNIVERSAL_CHECKPOINT_INFO, None) is None:
        setattr(engine.module, UNIVERSAL_CHECKPOINT_INFO, {})
    client_state = {**client_state, "run_config": run_config}
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), ckpt_dir / tag / f"rng_rank{ranks.rank():05d}.pt")
    ranks.barrier()  # every rank's files are on disk
    if ranks.rank() == 0:
        with atomic_write(ckpt_dir / tag / RUN_CONFIG) as tmp:
            tmp.write_text(json.dumps(run_config, indent=1))
        with atomic_write(ckpt_dir / tag / COMPLETE) as tmp:
            tmp.write_text(json.dumps({"step": step, "files": file_sizes(ckpt_dir / tag)}))
        with atomic_write(ckpt_dir / LATEST) as tmp:
            tmp.write_text(tag)
        prune(ckpt_dir, keep_last, keep_every)
    ranks.barrier()
    return ckpt_dir / tag


def prune(ckpt_dir, keep_last, keep_every):
    """Keep the newest keep_last complete checkpoints and every step that is a multiple of keep_every;
    incomplete ones older than the newest complete one are leftovers of a crash and go too."""
    tags = complete_tags(ckpt_dir)
    keep = set(tags[-keep_last:]) if keep_last > 0 else set(tags)
    keep |= {t for t in tags if keep_every and int(TAG_PATTERN.match(t)[1]) % keep_every == 0}
    newest = tags[-1] if tags else None
    for path in Path(ckpt_dir).iterdir():
        if not TAG_PATTERN.match(path.name) or path.name in keep:
            continue
        if (path / COMPLETE).exists() or (newest and path.name < newest):
            shutil.rmtree(path)


def newest_intact(ckpt_dir):
    """The newest complete checkpoint whose files are whole, warning about each newer damaged one; None if
    there is no complete checkpoint at all."""
    tags = complete_tags(ckpt_dir)
    for tag in reversed(tags):
        problem = damage(Path(ckpt_dir) / tag)
        if problem is None:
            return Path(ckpt_dir) / tag
        if tag != tags[0]:  # the oldest has none before it: the error below says so
            warn(f"{Path(ckpt_dir) / tag}: damaged checkpoint ({problem}); falling back to the one before it")
    if tags:
        raise BadInput(f"{ckpt_dir}: every complete checkpoint is damaged (the oldest, {tags[0]}: {problem})")
    return None


def find_checkpoint(resume, out_dir):
    """The checkpoint directory to resume from, or None for a fresh start ('auto' with nothing saved).
    `resume` is 'auto' (the newest intact one under out_dir) or a path to a checkpoint or its parent; with
    out_dir None (the console scripts) it is always a path."""
    if resume == "auto" and out_dir is not None:  # without a run's out_dir (gpt-export, gpt-eval) 'auto' is a path
        return newest_intact(checkpoint_dir(out_dir))
    path = Path(resume)
    if is_universal(path):  # STEP/universal, or one made with `python -m deepspeed.checkpoint.ds_to_universal`
        if out_dir is not None:
            step = path.parent if (path.parent / COMPLETE).exists() else None
            raise BadInput(f"{path}: a universal checkpoint: --resume takes "
                           + (f"the checkpoint it was made from, {step}" if step else
                              "one of this trainer's checkpoints (a step_NNNNNNNN directory)"))
        return path  # the console scripts read its weights (read_weights)
    if (path / COMPLETE).exists():
        problem = damage(path)
        if problem:
            raise BadInput(f"{path}: damaged checkpoint ({problem}); give its parent directory to take "
                           f"the newest intact one")
        return path
    for parent in (path, path / CHECKPOINTS):
        found = newest_intact(parent)
        if found:
            return found
    if path.is_dir() and TAG_PATTERN.match(path.name):
        raise BadInput(f"{path}: incomplete checkpoint (no {COMPLETE}: the save was interrupted)")
    raise BadInput(f"{path}: {'no complete checkpoint found' if path.exists() else 'not found'}")


def check_resume_target(resume_from, out_dir):
    """Where the resumed run will write must hold nothing it would overwrite or mix with: resuming an
    older step of out_dir's own run would overwrite its later checkpoints step by step and prune the new
    ones in their favour (damaged later steps are set aside instead); resuming another directory's
    checkpoint into an out_dir holding a run of its own would do the same to that run."""
    ckpt_dir = checkpoint_dir(out_dir)
    if not ckpt_dir.is_dir() or Path(resume_from).parent.resolve() != ckpt_dir.resolve():
        return check_fresh_out_dir(out_dir)
    later = [t for t in complete_tags(ckpt_dir) if t > Path(resume_from).name and not damage(ckpt_dir / t)]
    if later:
        raise BadInput(f"--resume {resume_from}: {ckpt_dir} holds later checkpoints (up to {later[-1]}) "
                       f"that this run would overwrite: resume it into another --out_dir")


def saved_step(path):
    """The step after which a complete checkpoint was saved."""
    return json.loads((Path(path) / COMPLETE).read_text())["step"]


def check_steps_left(resume_from, max_steps):
    """A resume with nothing left to train would print 'resumed', train nothing and exit 0."""
    step = saved_step(resume_from)
    if max_steps <= step + 1:
        raise BadInput(f"--max_steps {max_steps}: nothing left to train: {resume_from} was saved after step "
                       f"{step}, and --max_steps {max_steps} ends after step {max_steps - 1}; raise --max_steps "
                       f"to train on")


def set_aside_damaged(ckpt_dir):
    """Rename each damaged complete checkpoint to <tag>.damaged (kept for inspection, never loaded, never
    pruned), so the run's own saves neither collide with it nor get pruned in its favour. Rank 0 only."""
    for tag in complete_tags(ckpt_dir):
        path = Path(ckpt_dir) / tag
        if damage(path):
            target, n = path.with_name(f"{tag}.damaged"), 1
            while target.exists():
                target, n = path.with_name(f"{tag}.damaged{n}"), n + 1
            os.replace(path, target)
            warn(f"{path}: damaged checkpoint set aside as {target.name}")


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
    the shards), and it is not itself a run's checkpoints/ directory or one of its checkpoints (the run would mix
    its files into them)."""
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
    if (out_dir / LATEST).is_file() or any(TAG_PATTERN.match(p.name) for p in out_dir.glob("step_*")):
        raise BadInput(f"--out_dir {out_dir} is the checkpoints directory of the run in {out_dir.parent}: to "
                       f"continue that run, use --out_dir {out_dir.parent} --resume auto")
    ckpt_dir = nearest_existing(checkpoint_dir(out_dir))
    if ckpt_dir.is_dir() and not os.access(ckpt_dir, os.W_OK | os.X_OK):
        raise BadInput(f"--out_dir {out_dir}: {ckpt_dir} is not writable")


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


# run_config.json's keys read by the trainer's resume and the console scripts, and what each must hold
RUN_CONFIG_ARGS = {"warmup_steps": (int,), "micro_batch": (int,), "seq_len": (int,), "seed": (int,),
                   "max_steps": (int,), "lr": (int, float), "min_lr_ratio": (int, float)}


def run_config_problems(run):
    """What in a parsed run_config.json is not as save() writes it, by dotted key (the first problem)."""
    if not isinstance(run, dict):
        return f"{json_kind(run)}, not a JSON object"
    if not isinstance(run.get("model"), dict):
        return f"'model' must be an object of the model's shape, got {json.dumps(run.get('model'))}"
    for key in SHAPE_KEYS:
        value = run["model"].get(key)
        if type(value) is not int or value <= 0:
            return f"model.{key} must be a positive whole number, got {json.dumps(value)}"
    extra = sorted(set(run["model"]) - set(SHAPE_KEYS))
    if extra:
        return f"model.{extra[0]}: unknown key (the model's shape is {', '.join(SHAPE_KEYS)})"
    if "format" in run and (type(run["format"]) is not int or not 1 <= run["format"] <= FORMAT):
        return f"format must be a checkpoint format this trainer reads (1 to {FORMAT}), got {json.dumps(run['format'])}"
    if type(run.get("world_size")) is not int or run["world_size"] <= 0:
        return f"world_size must be a positive whole number, got {json.dumps(run.get('world_size'))}"
    if run.get("precision") not in ("fp32", "bf16", "fp16"):
        return f"precision must be \"fp32\", \"bf16\" or \"fp16\", got {json.dumps(run.get('precision'))}"
    if type(run.get("zero_stage")) is not int or not 0 <= run["zero_stage"] <= 3:
        return f"zero_stage must be 0, 1, 2 or 3, got {json.dumps(run.get('zero_stage'))}"
    if not isinstance(run.get("args"), dict):
        return f"'args' must be an object of the run's flags, got {json.dumps(run.get('args'))}"
    for key, types in RUN_CONFIG_ARGS.items():
        value = run["args"].get(key)
        if type(value) not in types:
            return f"args.{key} must be a number, got {json.dumps(value)}"
    return None


def read_run_config(path):
    """A checkpoint's run_config.json, checked to be as save() wrote it: BadInput naming the file and
    the key otherwise (an edited or foreign file used to raise a TypeError wherever it was read). For a universal
    checkpoint (gpt/train/universal.py), the one of the step it was made in, or else the one its model-states file
    records."""
    if is_universal(path):
        return read_universal_run_config(path)
    file = Path(path) / RUN_CONFIG
    problem = regular_file_problem(file)
    if problem:
        raise BadInput(problem)
    try:
        run = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: unreadable {RUN_CONFIG} ({e})") from None
    problem = run_config_problems(run)
    if problem:
        raise BadInput(f"{file}: {problem}")
    return run


def check_init_from(path, saved, init_from):
    """--init_from with a resume: the checkpoint's weights would replace --init_from's without a word. Allowed
    only when the checkpoint's run itself started from that directory (a relaunch with the same command)."""
    if not init_from:
        return
    started_from = saved["args"].get("init_from")
    same = started_from is not None and (str(started_from) == str(init_from) or (
        os.path.exists(started_from) and os.path.exists(init_from) and os.path.samefile(started_from, init_from)))
    if not same:
        raise BadInput(f"--init_from {init_from}: --resume continues {path}, whose weights would replace "
                       f"--init_from's (its run did not start from {init_from}): drop --init_from to continue "
                       f"that run, or --resume (and use a fresh --out_dir) to start from {init_from}")


def format_of(run):
    """A run_config's checkpoint format: FORMAT, or 1 for checkpoints saved before it was recorded."""
    return run.get("format", 1)


def resume_kind(saved, current):
    """How a checkpoint loads into this run (both run_configs):
    'exact'      the same world size and ZeRO stage: everything, each rank's RNG too;
    'universal'  another world size or ZeRO stage (1 <-> 2): ZeRO's optimizer partitions fit only the layout that
                 saved them, so the checkpoint is converted to DeepSpeed's universal form, which loads on any;
    'whole'      ZeRO 0 on another world size: its optimizer state is whole in the checkpoint and loads as it is;
    'weights'    another world size, saved before checkpoints recorded what a conversion needs: the weights only.
    The last three restore no RNG state (one per rank) and keep the data position (gpt/data/shards.py)."""
    if (saved["world_size"], saved["zero_stage"]) == (current["world_size"], current["zero_stage"]):
        return "exact"
    if format_of(saved) < FORMAT:
        return "weights"
    return "whole" if saved["zero_stage"] == 0 else "universal"


def check_compatible(path, saved, current):
    """Refuse a resume whose weights or data position would not fit this run, naming every mismatch."""
    problems = [f"{key} {saved['model'].get(key)} in the checkpoint, {current['model'][key]} now"
                for key in SHAPE_KEYS if saved["model"].get(key) != current["model"][key]]
    if saved.get("precision") != current.get("precision"):
        problems.append(f"precision {saved.get('precision')} in the checkpoint, {current.get('precision')} now")
    stages = {saved.get("zero_stage"), current.get("zero_stage")}
    if len(stages) > 1 and not (stages == {1, 2} and format_of(saved) >= FORMAT):
        problems.append(f"zero_stage {saved.get('zero_stage')} in the checkpoint, {current.get('zero_stage')} now" + (
            " (ZeRO 1 <-> 2 converts only checkpoints saved since they record what a conversion needs)"
            if stages == {1, 2} else " (only ZeRO 1 <-> 2 converts)"))
    if not current["args"].get("reset_data_position"):
        order = [f"--{key} {saved['args'].get(key)} in the checkpoint, {current['args'][key]} now"
                 for key in ("seq_len", "seed") if saved["args"].get(key) != current["args"][key]]
        if order:
            problems.append("; ".join(order) + " (the data position depends on them: --reset_data_position starts the "
                            "next epoch in the new order)")
    if problems:
        raise BadInput(f"{path}: cannot resume: " + "; ".join(problems))


def check_same_data(path, saved, current, data_dir, reset_position):
    """A resume continues at the saved data position, which means the same tokens only in the same train shards:
    refuse one whose shards changed since the save (run_config.json records their fingerprints), or with
    reset_position (--reset_data_position, the position restarts anyway) say what changed. Checkpoints saved
    before fingerprints were recorded: said, not checked."""
    if "data" not in saved:
        warn(f"{path}: saved before checkpoints recorded their shards' fingerprints: whether --data {data_dir} holds "
             f"the same train shards is not checked")
        return
    changes = data_changes(saved["data"], current["data"])
    if changes and reset_position:
        warn(f"--data {data_dir}: the train shards changed since {path} was saved ({describe_changes(changes)}); "
             f"--reset_data_position: training continues from the start of the next epoch")
    elif changes:
        raise BadInput(f"--data {data_dir}: the train shards changed since {path} was saved "
                       f"({describe_changes(changes)}): its data position would point into other data; "
                       f"restore them, or resume with --reset_data_position (from the next epoch's start)")


def load(engine, path, load_optimizer_states=True, restore_rng=True):
    """Load a checkpoint into the engine; returns (client state, why this rank's RNG state was not restored
    or None). With load_optimizer_states False only the weights are taken (a weights-only restart on another
    world size). restore_rng False: no RNG state (saved per rank: another world size has others)."""
    path = Path(path)
    try:
        loaded, client_state = engine.load_checkpoint(
            str(path.parent), tag=path.name, load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_optimizer_states, load_module_only=not load_optimizer_states)
    except (AssertionError, OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as e:
        raise BadInput(f"{path}: DeepSpeed could not load this checkpoint "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no message'})") from None
    if loaded is None:
        raise BadInput(f"{path}: DeepSpeed could not load this checkpoint")
    if not (load_optimizer_states and restore_rng):
        return client_state, None
    rng_file = path / f"rng_rank{ranks.rank():05d}.pt"
    if os.path.lexists(rng_file) and not_regular(rng_file):  # a FIFO would block torch.load forever
        return client_state, f"{rng_file.name} is {not_regular(rng_file)}"
    try:
        set_rng_state(torch.load(rng_file, weights_only=False))
    except FileNotFoundError:
        return client_state, f"{rng_file.name} is missing"
    except (OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as e:
        return client_state, f"{rng_file.name} is unreadable ({type(e).__name__})"
    return client_state, None


# What torch.load (pickle, its zip reader) and zero_to_fp32 raise on a garbled, cut or foreign file
UNREADABLE = (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, IndexError, TypeError, AttributeError,
              OSError, UnicodeDecodeError, ImportError, zipfile.BadZipFile)


def brief(error):
    """'Type: the first sentence of the message' (torch's zip reader appends a paragraph of advice)."""
    text = str(error).splitlines()[0] if str(error) else "no message"
    return f"{type(error).__name__}: {text.split('. ')[0][:200]}"


def unreadable_file(path, error):
    """'FILE: unreadable (Type: message)' for the first of the checkpoint's .pt files zero_to_fp32 reads that
    torch.load cannot read (tried only after it failed), else the same about the checkpoint directory."""
    for file in sorted(Path(path).glob("*_model_states.pt")) + sorted(Path(path).glob("*_optim_states.pt")):
        try:
            torch.load(file, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(file))
        except UNREADABLE as e:
            return f"{file}: unreadable ({brief(e)})"
    return f"{path}: unreadable ({brief(error)})"


# A universal checkpoint's files, read here for read_weights and read_run_config; made and loaded by gpt/train/universal.py
def is_universal(path):
    """Whether path is a universal checkpoint: a directory holding zero/ and mp_rank_00_model_states.pt
    (DeepSpeed's layout: ours, step_N/universal, or one made with `python -m deepspeed.checkpoint.ds_to_universal`)."""
    path = Path(path)
    return (path / ZERO).is_dir() and (path / MODEL_STATES).is_file()


def model_states(path):
    """The dict in path/mp_rank_00_model_states.pt, its tensors memory-mapped (cheap: nothing large is read)."""
    file = Path(path) / MODEL_STATES
    problem = not_regular(file) if os.path.lexists(file) else "missing"
    if problem:  # a FIFO would block torch.load forever
        raise BadInput(f"{file}: {problem}")
    try:
        state = torch.load(file, map_location="cpu", mmap=zipfile.is_zipfile(file), weights_only=False)
    except UNREADABLE as e:
        raise BadInput(f"{file}: unreadable ({brief(e)})") from None
    if not isinstance(state, dict):
        raise BadInput(f"{file}: unreadable (not a DeepSpeed model-states file)")
    return state


def read_fp32_weights(path):
    """{parameter name: fp32 tensor} of a universal checkpoint: zero/<name>/fp32.pt's 'param' (for ZeRO 1/2 the
    optimizer's fp32 master weights; a parameter the optimizer had none of, the module's weights in fp32)."""
    state = {}
    for param_dir in sorted(p for p in (Path(path) / ZERO).iterdir() if p.is_dir()):
        file = param_dir / "fp32.pt"
        if not os.path.lexists(file):
            continue
        problem = not_regular(file)
        if problem:
            raise BadInput(f"{file}: {problem}")
        try:
            saved = torch.load(file, map_location="cpu", weights_only=False)
        except UNREADABLE as e:
            raise BadInput(f"{file}: unreadable ({brief(e)})") from None
        if not (isinstance(saved, dict) and torch.is_tensor(saved.get("param"))):
            raise BadInput(f"{file}: unreadable (not a universal checkpoint's {{'param': tensor}})")
        state[param_dir.name] = saved["param"]
    return state


def read_universal_run_config(path):
    """The run_config of a universal checkpoint: run_config.json of the directory holding it (our layout:
    step_N/universal), or else the one save() records in its mp_rank_00_model_states.pt (a copy moved away)."""
    path = Path(path)
    if os.path.lexists(path.parent / RUN_CONFIG):
        return read_run_config(path.parent)
    run = model_states(path).get("run_config")
    if run is None:
        raise BadInput(f"{path}: a universal checkpoint whose model shape is unknown: no {RUN_CONFIG} beside "
                       f"it in {path.parent}, and its {MODEL_STATES} records none (saved before checkpoints "
                       f"did): copy the {RUN_CONFIG} of the checkpoint it was made from into {path.parent}")
    problem = run_config_problems(run)
    if problem:
        raise BadInput(f"{path / MODEL_STATES}: its run_config: {problem}")
    return run
