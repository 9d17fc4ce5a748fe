"""Checkpoints on disk: DeepSpeed's own save/load on every rank, the markers that make them safe to load, damage
found and set aside, pruning, a universal checkpoint's files read. Which checkpoint a run resumes, and whether it
may: gpt/train/resume.py; what --out_dir may hold: gpt/train/out_dir.py.

Layout under OUT_DIR/checkpoints/:
    step_00000100/            DeepSpeed's files (model, optimizer partitions, scheduler) + client state
        rng_rank00000.pt      each rank's RNG states
        run_config.json       the settings the run had, to refuse an incompatible resume up front
        complete.json         written last, after every rank finished, with every file's size and CRC-32:
                              only such checkpoints are loaded, and only while their files are all there whole,
                              with the bytes they were saved with
        universal/            made later, on a resume on another world size: the same checkpoint in DeepSpeed's
                              universal form (gpt/train/universal.py); not one of the checkpoint's own files
    latest                    the newest complete tag (moved after complete.json exists)
    step_00000200.damaged/    a complete checkpoint found damaged at resume, set aside (kept, never loaded)"""
import concurrent.futures
import json
import mmap
import os
import random
import re
import pickle
import shutil
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from gpt.console import BadInput, atomic_write, regular_file_problem, warn
from gpt.runtime import ranks

CHECKPOINTS = "checkpoints"
COMPLETE = "complete.json"
RUN_CONFIG = "run_config.json"
LATEST = "latest"
TAG_PATTERN = re.compile(r"^step_(\d{8})$")
RNG_PATTERN = re.compile(r"^rng_rank\d{5}\.pt$")
# What a checkpoint records: a data position in global batches of a step's windows, which any
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


def step_of(tag):
    """The step a tag (step_NNNNNNNN) was saved after."""
    return int(TAG_PATTERN.match(tag)[1])


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


# A file's checksum: the CRC-32 of each CHUNK_BYTES piece of it (zlib's CRC-32, ~4 GB/s on one core, with the GIL
# released): the pieces of every file are summed at once on the machine's cores, so that a d12 checkpoint's 1.7 GB
# cost a fraction of its save; the bytes just written are still in the page cache, and are summed where they lie
# (mmap): reading each piece into a new buffer first took 3.5x as long (0.83 s against 0.24 s for 1.75 GB on 2
# cores). Against corruption (a failing disk, a bad copy), not tampering.
CHUNK_BYTES = 64 * 2**20


def _chunk_crc(path, offset):
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return zlib.crc32(b"")  # an empty file cannot be mapped
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view, \
                view[offset:offset + CHUNK_BYTES] as piece:
            return zlib.crc32(piece)


def checksums(path, names):
    """{name: [CRC-32 of each CHUNK_BYTES piece]} of the files `names` under path, read in parallel."""
    pieces = [(name, offset) for name in names for offset in range(0, max((Path(path) / name).stat().st_size, 1),
                                                                     CHUNK_BYTES)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        crcs = list(pool.map(lambda piece: _chunk_crc(Path(path) / piece[0], piece[1]), pieces))
    found = {name: [] for name in names}
    for (name, _), crc in zip(pieces, crcs):
        found[name].append(crc)
    return found


def json_kind(value):
    """JSON's name for a parsed value's type: 'an array', 'a string', ..."""
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null", dict: "an object"}.get(type(value), type(value).__name__)


def not_regular(path):
    """regular_file_problem without the path in front: 'a FIFO (named pipe), not a regular file', or None."""
    problem = regular_file_problem(path)
    return problem and problem.removeprefix(f"{path}: ")


def marker_problem(marker):
    """Why a parsed complete.json is not one save() writes: {"step": N, "files": {name: bytes}, "crc32": {name:
    [CRC-32 per CHUNK_BYTES]}} ("files" is absent in markers written before sizes were recorded, "crc32" before
    checksums were), or None."""
    if not isinstance(marker, dict):
        return f"{json_kind(marker)}, not an object"
    if type(marker.get("step")) is not int or marker["step"] < 0:
        return f"'step' {json.dumps(marker.get('step'))} is not a step number"
    files = marker.get("files", {})
    if not (isinstance(files, dict) and all(type(size) is int and size >= 0 for size in files.values())):
        return "'files' is not an object of file sizes"
    crcs = marker.get("crc32", {})
    if not (isinstance(crcs, dict) and all(isinstance(pieces, list) and all(type(crc) is int and 0 <= crc < 2**32
                                                                            for crc in pieces)
                                           for pieces in crcs.values())):
        return "'crc32' is not an object of CRC-32 checksums"
    return None


def damage(path, contents=False):
    """Why a complete checkpoint cannot be loaded, or None: its complete.json is not a regular file (a FIFO
    would block the read forever) or not one save() writes, or a file written at save is missing or no longer
    its recorded size; with contents, also a file whose bytes are not those saved (checksums: the checkpoint is
    read whole). RNG files are left to load(), which says when one is missing. Markers written
    before sizes (checksums) were recorded are trusted for them (unverified())."""
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
    recorded = {name: crc for name, crc in parsed.get("crc32", {}).items() if name in actual} if contents else {}
    found = checksums(path, list(recorded))
    for name, crc in recorded.items():
        if found[name] != crc:
            piece = next(i for i, (now, then) in enumerate(zip(found[name], crc)) if now != then)
            return (f"{name} does not hold the bytes it was saved with (the CRC-32 of its bytes from "
                    f"{piece * CHUNK_BYTES:,} on: {found[name][piece]:08x}, {crc[piece]:08x} at save)")
    return None


def unverified(path):
    """Whether path was saved with its files' sizes but before checkpoints recorded their checksums: it loads, its
    bytes unverified. (Markers older still, without sizes, are trusted as damage() trusts them.)"""
    marker = json.loads((Path(path) / COMPLETE).read_text())
    return "files" in marker and "crc32" not in marker


def complete_tags(ckpt_dir):
    """Tags of complete checkpoints, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p.name for p in ckpt_dir.iterdir() if TAG_PATTERN.match(p.name) and (p / COMPLETE).exists())


def save(engine, out_dir, step, client_state, run_config, keep_last, keep_every, kept=None):
    """Save on every rank (DeepSpeed requires it). `latest` moves only once every rank has written its
    part and the checkpoint is marked complete, so a crash mid-save leaves the previous one loadable. kept: why
    pruning must never remove this one (its complete.json says so), or None."""
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
    if ranks.rank() == 0:
        remove(ckpt_dir / tag)  # a crash's leftover: made afresh
    ranks.barrier()
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), ckpt_dir / tag / f"rng_rank{ranks.rank():05d}.pt")
    ranks.barrier()  # every rank's files are on disk
    if ranks.rank() == 0:
        with atomic_write(ckpt_dir / tag / RUN_CONFIG) as tmp:
            tmp.write_text(json.dumps(run_config, indent=1))
        sizes = file_sizes(ckpt_dir / tag)
        crcs = checksums(ckpt_dir / tag, list(sizes))
        with atomic_write(ckpt_dir / tag / COMPLETE) as tmp:
            tmp.write_text(json.dumps({"step": step, "files": sizes, "crc32": crcs} | ({"kept": kept} if kept else {})))
        with atomic_write(ckpt_dir / LATEST) as tmp:
            tmp.write_text(tag)
        prune(ckpt_dir, keep_last, keep_every)
    ranks.barrier()
    return ckpt_dir / tag


def prune(ckpt_dir, keep_last, keep_every):
    """Keep the newest keep_last complete checkpoints, every step that is a multiple of keep_every and those saved
    to be kept (a wsd run's cooldown start); incomplete ones older than the newest complete one are leftovers of a
    crash and go too."""
    tags = complete_tags(ckpt_dir)
    keep = set(tags[-keep_last:]) if keep_last > 0 else set(tags)
    keep |= {t for t in tags if keep_every and int(TAG_PATTERN.match(t)[1]) % keep_every == 0}
    keep |= {t for t in tags if kept_because(Path(ckpt_dir) / t)}
    newest = tags[-1] if tags else None
    for path in Path(ckpt_dir).iterdir():
        if not TAG_PATTERN.match(path.name) or path.name in keep:
            continue
        if (path / COMPLETE).exists() or (newest and path.name < newest):
            remove(path)


def remove(path):
    """Remove what is at path (a directory, a file, a symbolic link), never what a link leads to. Where a step is
    saved, what a crash left there goes first: another world size's files would be counted as this checkpoint's, and
    DeepSpeed's writes follow links (a run copied as a tree of links, `cp -rs`, holds links to the original's)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # it removes the links inside, not their targets
    elif os.path.lexists(path):
        os.unlink(path)


def kept_because(path):
    """Why a complete checkpoint is never pruned (saved with `kept`), or None; None too for an unreadable marker
    (damage() says what is wrong with it)."""
    try:
        marker = json.loads((Path(path) / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return marker.get("kept") if isinstance(marker, dict) else None


def newest_intact(ckpt_dir):
    """The newest complete checkpoint whose files are whole, warning about each newer damaged one; None if
    there is no complete checkpoint at all."""
    tags = complete_tags(ckpt_dir)
    for tag in reversed(tags):
        problem = damage(Path(ckpt_dir) / tag, contents=True)
        if problem is None:
            return Path(ckpt_dir) / tag
        if tag != tags[0]:  # the oldest has none before it: the error below says so
            warn(f"{Path(ckpt_dir) / tag}: damaged checkpoint ({problem}); falling back to the one before it")
    if tags:
        raise BadInput(f"{ckpt_dir}: every complete checkpoint is damaged (the oldest, {tags[0]}: {problem})")
    return None


def set_aside_damaged(ckpt_dir, resumed):
    """Rename each damaged complete checkpoint to <tag>.damaged (kept for inspection, never loaded, never
    pruned), so the run's own saves neither collide with it nor get pruned in its favour. Rank 0 only. Those newer
    than `resumed` (the checkpoint loaded), which the resume passed over, have their bytes checked too."""
    for tag in complete_tags(ckpt_dir):
        path = Path(ckpt_dir) / tag
        if damage(path, contents=tag > Path(resumed).name):
            target, n = path.with_name(f"{tag}.damaged"), 1
            while target.exists():
                target, n = path.with_name(f"{tag}.damaged{n}"), n + 1
            os.replace(path, target)
            warn(f"{path}: damaged checkpoint set aside as {target.name}")


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


# A universal checkpoint's files, read for read_weights and read_run_config; made and loaded by gpt/train/universal.py
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
