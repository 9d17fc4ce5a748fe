"""Checkpoints: DeepSpeed's own save/load on every rank, plus what makes them safe to resume from.

Layout under OUT_DIR/checkpoints/:
    step_00000100/            DeepSpeed's files (model, optimizer partitions, scheduler) + client state
        rng_rank00000.pt      each rank's RNG states
        run_config.json       the settings the run had, to refuse an incompatible resume up front
        complete.json         written last, after every rank finished, with every file's size: only
                              such checkpoints are loaded, and only while their files are all there whole
    latest                    the newest complete tag (moved after complete.json exists)
    step_00000200.damaged/    a complete checkpoint found damaged at resume, set aside (kept, never loaded)
"""
import contextlib
import json
import os
import random
import re
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from gpt import dist
from gpt.args import out_dir_problem
from gpt.data import data_changes, describe_changes
from gpt.disk import NEARLY_FULL, nearest_existing, space_problem
from gpt.metrics import say
from gpt.model import GPTConfig, state_dict_mismatch

CHECKPOINTS = "checkpoints"
COMPLETE = "complete.json"
RUN_CONFIG = "run_config.json"
LATEST = "latest"
TAG_PATTERN = re.compile(r"^step_(\d{8})$")
RNG_PATTERN = re.compile(r"^rng_rank\d{5}\.pt$")
# Settings a checkpoint's weights and optimizer states only fit with; everything else may change on resume.
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from, with the reason."""


def checkpoint_dir(out_dir):
    return Path(out_dir) / CHECKPOINTS


def tag_for(step):
    return f"step_{step:08d}"


def _write_atomically(path, text):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def warn(line):
    """A warning on stderr, once (rank 0) however many ranks read the same checkpoints."""
    if dist.launched_rank() == 0:
        say(f"warning: {line}", sys.stderr)


def file_sizes(path):
    """name -> bytes of every file in a checkpoint directory but its completion marker."""
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(Path(path).rglob("*"))
            if p.is_file() and p.name != COMPLETE}


def damage(path):
    """Why a complete checkpoint cannot be loaded, or None: a file written at save is missing or no longer
    its recorded size. RNG files are left to load(), which says when one is missing. Markers written before
    sizes were recorded are trusted."""
    try:
        recorded = json.loads((Path(path) / COMPLETE).read_text())["files"]
    except KeyError:
        return None
    except (OSError, ValueError, TypeError) as e:
        return f"unreadable {COMPLETE} ({e})"
    actual = file_sizes(path)
    for name, size in recorded.items():
        if RNG_PATTERN.match(name):
            continue
        if name not in actual:
            return f"{name} is missing"
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
    ckpt_dir = checkpoint_dir(out_dir)
    tag = tag_for(step)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), ckpt_dir / tag / f"rng_rank{dist.rank():05d}.pt")
    dist.barrier()  # every rank's files are on disk
    if dist.rank() == 0:
        _write_atomically(ckpt_dir / tag / RUN_CONFIG, json.dumps(run_config, indent=1))
        _write_atomically(ckpt_dir / tag / COMPLETE, json.dumps({"step": step, "files": file_sizes(ckpt_dir / tag)}))
        _write_atomically(ckpt_dir / LATEST, tag)
        prune(ckpt_dir, keep_last, keep_every)
    dist.barrier()
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
        warn(f"{Path(ckpt_dir) / tag}: damaged checkpoint ({problem}); falling back to the one before it")
    if tags:
        raise CheckpointError(f"{ckpt_dir}: every complete checkpoint is damaged (the oldest, {tags[0]}: {problem})")
    return None


def find_checkpoint(resume, out_dir):
    """The checkpoint directory to resume from, or None for a fresh start ('auto' with nothing saved).
    `resume` is 'auto' (the newest intact one under out_dir) or a path to a checkpoint or its parent; with
    out_dir None (the console scripts) it is always a path."""
    if resume == "auto" and out_dir is not None:  # without a run's out_dir (gpt-export, gpt-eval) 'auto' is a path
        return newest_intact(checkpoint_dir(out_dir))
    path = Path(resume)
    if (path / COMPLETE).exists():
        problem = damage(path)
        if problem:
            raise CheckpointError(f"{path}: damaged checkpoint ({problem}); give its parent directory to take "
                                  f"the newest intact one")
        return path
    for parent in (path, path / CHECKPOINTS):
        found = newest_intact(parent)
        if found:
            return found
    if path.is_dir() and TAG_PATTERN.match(path.name):
        raise CheckpointError(f"{path}: incomplete checkpoint (no {COMPLETE}: the save was interrupted)")
    raise CheckpointError(f"{path}: {'no complete checkpoint found' if path.exists() else 'not found'}")


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
        raise CheckpointError(f"--resume {resume_from}: {ckpt_dir} holds later checkpoints (up to {later[-1]}) "
                              f"that this run would overwrite: resume it into another --out_dir")


def saved_step(path):
    """The step after which a complete checkpoint was saved."""
    return json.loads((Path(path) / COMPLETE).read_text())["step"]


def check_steps_left(resume_from, max_steps):
    """A resume with nothing left to train would print 'resumed', train nothing and exit 0."""
    step = saved_step(resume_from)
    if max_steps <= step + 1:
        raise CheckpointError(f"--max_steps {max_steps}: nothing left to train: {resume_from} was saved after step "
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


def check_writable(out_dir):
    """--out_dir and its checkpoints/ can be made and written (the nearest existing ancestor of each is a
    writable directory: a read-only checkpoints/ would fail only at the first save), and --out_dir is not
    itself a run's checkpoints/ directory or one of its checkpoints (the run would mix its files into them)."""
    problem = out_dir_problem("--out_dir", out_dir)
    if problem:
        raise CheckpointError(problem)
    out_dir = Path(out_dir)
    if (out_dir / COMPLETE).exists() or (out_dir / RUN_CONFIG).exists():
        raise CheckpointError(f"--out_dir {out_dir} is a checkpoint of the run in {out_dir.parent.parent}: to "
                              f"continue that run, use --out_dir {out_dir.parent.parent} --resume auto")
    if (out_dir / LATEST).is_file() or any(TAG_PATTERN.match(p.name) for p in out_dir.glob("step_*")):
        raise CheckpointError(f"--out_dir {out_dir} is the checkpoints directory of the run in {out_dir.parent}: to "
                              f"continue that run, use --out_dir {out_dir.parent} --resume auto")
    ckpt_dir = nearest_existing(checkpoint_dir(out_dir))
    if ckpt_dir.is_dir() and not os.access(ckpt_dir, os.W_OK | os.X_OK):
        raise CheckpointError(f"--out_dir {out_dir}: {ckpt_dir} is not writable")


def check_space(out_dir, resume_from):
    """Room on the disk for the run's next checkpoint: as large as the one resumed from (the older ones are
    pruned only after it is complete); for a fresh run, the size is unknown: a disk not already full."""
    if resume_from is not None:
        needed, what = sum(file_sizes(resume_from).values()), f"a checkpoint like {Path(resume_from).name}"
    else:
        needed, what = NEARLY_FULL, "a run"
    problem = space_problem("--out_dir", out_dir, needed, what)
    if problem:
        raise CheckpointError(problem)


def check_fresh_out_dir(out_dir):
    """A run without --resume must not write into an earlier run's out_dir: its checkpoints would be
    overwritten step by step (and `latest` moved) and metrics.jsonl would mix the two runs."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"--out_dir {out_dir} is a file, not a directory")
    steps = sorted(p.name for p in checkpoint_dir(out_dir).glob("step_*")) if checkpoint_dir(out_dir).is_dir() else []
    metrics = out_dir / "metrics.jsonl"
    held = ([f"checkpoints up to {steps[-1]}"] if steps else []) + (
        ["metrics.jsonl"] if metrics.is_file() and metrics.stat().st_size else [])
    if held:
        raise CheckpointError(f"--out_dir {out_dir} holds an earlier run ({' and '.join(held)}): continue it with "
                              f"--resume auto, or start afresh with another --out_dir")


def read_run_config(path):
    try:
        return json.loads((Path(path) / RUN_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable {RUN_CONFIG} ({e})") from None


def check_compatible(path, saved, current):
    """Refuse a resume whose weights would not fit this run, naming every mismatch."""
    problems = [f"{key} {saved['model'].get(key)} in the checkpoint, {current['model'][key]} now"
                for key in SHAPE_KEYS if saved["model"].get(key) != current["model"][key]]
    for key in ("precision", "zero_stage"):
        if saved.get(key) != current.get(key):
            problems.append(f"{key} {saved.get(key)} in the checkpoint, {current.get(key)} now")
    if saved.get("world_size") == current["world_size"]:  # an exact resume: the data position must fit too
        order = [f"--{key} {saved['args'].get(key)} in the checkpoint, {current['args'][key]} now"
                 for key in ("micro_batch", "seq_len", "seed") if saved["args"].get(key) != current["args"][key]]
        if order:
            problems.append("; ".join(order) + " (the data order of an exact resume depends on them)")
    if problems:
        raise CheckpointError(f"{path}: cannot resume: " + "; ".join(problems))


def check_same_data(path, saved, current, data_dir, reset_position):
    """An exact resume continues at the saved data position, which means the same tokens only in the same train
    shards: refuse one whose shards changed since the save (run_config.json records their fingerprints), or with
    reset_position (--reset_data_position, the position restarts anyway) say what changed. A resume on another
    world size restarts the position too. Checkpoints saved before fingerprints were recorded: said, not checked."""
    if saved.get("world_size") != current["world_size"]:
        return
    if "data" not in saved:
        warn(f"{path}: saved before checkpoints recorded their shards' fingerprints: whether --data {data_dir} holds "
             f"the same train shards is not checked")
        return
    changes = data_changes(saved["data"], current["data"])
    if changes and reset_position:
        warn(f"--data {data_dir}: the train shards changed since {path} was saved ({describe_changes(changes)}); "
             f"--reset_data_position: training continues from the start of the next epoch")
    elif changes:
        raise CheckpointError(f"--data {data_dir}: the train shards changed since {path} was saved "
                              f"({describe_changes(changes)}): its data position would point into other data; "
                              f"restore them, or resume with --reset_data_position (from the next epoch's start)")


def load(engine, path, load_optimizer_states=True):
    """Load a checkpoint into the engine; returns (client state, why this rank's RNG state was not restored
    or None). With load_optimizer_states False only the weights are taken (a weights-only restart, e.g. on
    another world size), and no RNG state."""
    path = Path(path)
    try:
        loaded, client_state = engine.load_checkpoint(
            str(path.parent), tag=path.name, load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_optimizer_states, load_module_only=not load_optimizer_states)
    except (AssertionError, OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path}: DeepSpeed could not load this checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no message'})") from None
    if loaded is None:
        raise CheckpointError(f"{path}: DeepSpeed could not load this checkpoint")
    if not load_optimizer_states:
        return client_state, None
    rng_file = path / f"rng_rank{dist.rank():05d}.pt"
    try:
        set_rng_state(torch.load(rng_file, weights_only=False))
    except FileNotFoundError:
        return client_state, f"{rng_file.name} is missing"
    except (OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as e:
        return client_state, f"{rng_file.name} is unreadable ({type(e).__name__})"
    return client_state, None


def read_weights(path):
    """(fp32 state dict, GPTConfig) of a checkpoint (or the newest under a checkpoints/ directory): the
    optimizer's fp32 master weights via DeepSpeed's zero_to_fp32 reader where it can read them (ZeRO 1/2),
    else the module's weights."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    path = find_checkpoint(str(path), None)
    run = read_run_config(path)
    config = GPTConfig(**run["model"])
    state = None
    if run["zero_stage"] > 0:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # its progress prints: stdout is gpt-eval --json's
                state = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
        except ValueError:  # BF16_Optimizer (bf16 + ZeRO-1 + fp32 accumulation): zero_to_fp32 cannot read it
            state = None
    if state is None:  # the module's own weights (16-bit in half-precision runs)
        state = torch.load(path / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    if "transformer.wte.weight" in state:
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    if config.n_embd % config.n_head:
        raise CheckpointError(f"{path}: its {RUN_CONFIG} says n_head {config.n_head}, which does not divide its "
                              f"n_embd {config.n_embd}")
    wrong = state_dict_mismatch(state, config)
    if wrong:  # run_config.json edited, or copied from another run: an export would describe other weights
        raise CheckpointError(f"{path}: the weights do not fit its {RUN_CONFIG} (n_layer {config.n_layer}, n_embd "
                              f"{config.n_embd}, block_size {config.block_size}, vocab_size {config.vocab_size}; "
                              f"missing, extra or misshapen: {wrong})")
    return {k: v.float() for k, v in state.items()}, config
