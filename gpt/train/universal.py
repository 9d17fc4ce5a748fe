"""Universal checkpoints: a ZeRO-1/2 checkpoint in DeepSpeed's world-size-independent form, for a resume on
another number of ranks with the optimizer state (a plain load needs the saving world size's partitions), and
the weights of any checkpoint for the console scripts (read_weights: a BF16_Optimizer step's fp32 masters are
read through its universal form).

    step_00000100/universal/             made inside the step it converts (pruning the step removes it too)
        zero/<param name>/fp32.pt        {'param': the whole fp32 master weight, 'cat_dim': 0}
        zero/<param name>/exp_avg.pt     likewise Adam's moments, exp_avg_sq.pt; step.pt: Adam's step count
        zero/optimizer_state.pt          the optimizer's global state: param_groups (lr, betas, weight decay,
                                         ...), clip_grad, and for fp16 the loss scaler (rank 0's, copied)
        mp_rank_00_model_states.pt       the step's, copied: lr scheduler, global/skipped steps, client state

It is built by DeepSpeed's own converter (deepspeed.checkpoint.ds_to_universal) in step_NNNNNNNN/universal.tmp/
and renamed to universal/ only when complete: universal/ existing means complete, and a later resume reuses it.
Only rank 0 converts (universal_dir), before the other ranks load; no process group is needed. Every rank then
loads it (load) into an engine built with "checkpoint": {"load_universal": true}.

What loading restores (DeepSpeed 0.19.8; ZeRO-1/2 and BF16_Optimizer alike, in either direction; each checked in
tests/integration/test_universal.py): the fp32 master weights, and the module's weights from them; exp_avg and exp_avg_sq; Adam's
step count; the param groups' hyperparameters (lr, betas, eps, weight decay: the saved ones); the lr scheduler's
state; the engine's global_steps and skipped_steps; with fp16 the dynamic loss scaler whole (its scale, iteration
and last-overflow counters, and also its window, hysteresis and minimum: the saved run's settings, not the new
JSON's). Not restored: any RNG state (each rank's stream belongs to the old world size); the module weights saved
in mp_rank_00_model_states.pt (ignored: zero/'s fp32 weights are the source). BF16_Optimizer has no loss scaler.
The client state (step, loader, run_config) comes back as saved: the data position is the saving ranks' to
translate."""
import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from gpt.train.checkpoint import (MODEL_STATES, RUN_CONFIG, UNIVERSAL, UNIVERSAL_TEMPORARY, UNREADABLE, ZERO, brief,
                                  is_universal, model_states, read_fp32_weights, remove, unreadable_file)
from gpt.train.resume import find_checkpoint, read_run_config
from gpt.console import BadInput, free_bytes, megabytes, say, warn, write_problem
from gpt.model.model import GPTConfig, state_dict_mismatch

__all__ = ["UNIVERSAL", "convert_problem", "convert_once", "universal_dir", "is_universal", "load", "read_weights"]

OPTIM_FILES = "*zero_pp_rank_*_optim_states.pt"  # ZeRO's partitions (bf16_zero_pp_rank_*: BF16_Optimizer's)


def conversion_bytes(step_dir):
    """What the conversion writes at its peak: DeepSpeed's fragments of every optimizer partition (as large as
    the partitions) beside the merged states (as large again), and the model-states file's copy."""
    optim = sum(p.stat().st_size for p in Path(step_dir).glob(OPTIM_FILES))
    return 2 * optim + (Path(step_dir) / MODEL_STATES).stat().st_size


def convert_problem(step_dir):
    """Why this checkpoint cannot be converted, or None; cheap, and before anything is written: ZeRO stage 0
    (its optimizer state is whole in the model-states file: no conversion needed, nor possible), saved before
    checkpoints recorded universal_checkpoint_info (DeepSpeed's converter requires it), the step directory not
    writable (the universal form is made inside it), or no room on its disk."""
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return f"{step_dir}: {'not a directory' if step_dir.exists() else 'not found'}"
    if not any(step_dir.glob(OPTIM_FILES)):
        return (f"{step_dir}: a ZeRO stage 0 checkpoint (no zero_pp_rank_*_optim_states.pt): its optimizer state is "
                f"whole in {MODEL_STATES}, with nothing to convert")
    try:
        state = model_states(step_dir)
    except BadInput as e:
        return str(e)
    if UNIVERSAL_CHECKPOINT_INFO not in state:
        return (f"{step_dir}: saved before checkpoints recorded {UNIVERSAL_CHECKPOINT_INFO}, which DeepSpeed's "
                f"converter requires (`python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state` can "
                f"convert it by hand)")
    if not os.access(step_dir, os.W_OK | os.X_OK):
        return f"{step_dir}: not writable, and its universal form is made inside it"
    needed, free = conversion_bytes(step_dir), free_bytes(step_dir)
    if free < needed:
        return (f"{step_dir}: no space left on the device for its universal form: {megabytes(free)} free, the "
                f"conversion needs {megabytes(needed)}")
    return None


def converter_args(step_dir, output_folder):
    """ds_to_universal's parse_arguments() defaults, in this process (one worker each: no process pool), strict,
    without --inject_missing_state (our checkpoints record universal_checkpoint_info)."""
    return argparse.Namespace(input_folder=str(step_dir), output_folder=str(output_folder), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=False)


def universal_dir(step_dir):
    """step_dir/universal, converted from the checkpoint first unless it is there already (then reused as it
    is). Rank 0 only, before the ranks load it: it needs no process group. DeepSpeed's progress goes to stderr
    (stdout is the run's log). On any failure the temporary directory is removed, the checkpoint's own files are
    untouched, and a BadInput says in one line which checkpoint and why."""
    from deepspeed.checkpoint import ds_to_universal

    step_dir = Path(step_dir)
    target, temporary = step_dir / UNIVERSAL, step_dir / UNIVERSAL_TEMPORARY
    if os.path.isdir(target):
        shutil.rmtree(temporary, ignore_errors=True)  # a crash right after the rename below leaves it
        return target
    problem = convert_problem(step_dir)
    if problem:
        raise BadInput(f"{step_dir}: cannot convert it to a universal checkpoint: "
                       f"{problem.removeprefix(f'{step_dir}: ')}")
    # The converter writes `latest_universal` beside its output folder: a folder inside the temporary one keeps
    # that file out of the step directory too.
    output = temporary / UNIVERSAL
    try:
        remove(temporary)  # a crash mid-conversion left it
        temporary.mkdir()
        with contextlib.redirect_stdout(sys.stderr):
            ds_to_universal.main(converter_args(step_dir, output))
        if not is_universal(output):
            raise RuntimeError(f"the converter finished without writing {ZERO}/ and {MODEL_STATES}")
        os.replace(output, target)
    except Exception as e:  # AssertionError, ValueError, RuntimeError, pickle's, OSError...: each one line
        disk = write_problem(temporary, e) if isinstance(e, (OSError, RuntimeError)) else None
        shutil.rmtree(temporary, ignore_errors=True)
        why = disk.removeprefix(f"{temporary}: ") if disk else brief(e)
        raise BadInput(f"{step_dir}: could not convert it to a universal checkpoint ({why}); the checkpoint "
                       f"is untouched") from None
    except BaseException:  # KeyboardInterrupt, SystemExit: leave nothing half-made either
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    shutil.rmtree(temporary, ignore_errors=True)
    return target


def load(engine, step_dir):
    """Load step_dir/universal (or step_dir itself when it is a universal checkpoint) into an engine built with
    "checkpoint": {"load_universal": true}, on every rank; returns the client state save() wrote (step, loader,
    run_config, ...). What is restored and what not: this module's docstring. No RNG state."""
    step_dir = Path(step_dir)
    path = step_dir if is_universal(step_dir) else step_dir / UNIVERSAL
    if not engine.load_universal_checkpoint():
        raise BadInput(f"{path}: the engine was built without \"checkpoint\": {{\"load_universal\": true}} "
                       f"in its DeepSpeed config, so it cannot load a universal checkpoint")
    if not engine.zero_optimization_stage():  # DeepSpeed would load nothing into it, silently
        raise BadInput(f"{path}: a universal checkpoint loads into a ZeRO stage 1 or 2 engine, not stage 0")
    if not is_universal(path):
        raise BadInput(f"{path}: not a universal checkpoint (no {ZERO}/ and {MODEL_STATES})")
    try:
        loaded, client_state = engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                                      load_lr_scheduler_states=True)
    except (AssertionError, ValueError, *UNREADABLE) as e:
        raise BadInput(f"{path}: DeepSpeed could not load this universal checkpoint ({brief(e)})") from None
    if loaded is None:
        raise BadInput(f"{path}: DeepSpeed could not load this universal checkpoint")
    return client_state


def read_universal_weights(path):
    """read_fp32_weights, lm_head tied to the embedding as in the model (its own file holds the module's 16-bit
    copy)."""
    state = read_fp32_weights(path)
    if "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def bf16_optimizer_masters(step_dir):
    """The fp32 master weights of a BF16_Optimizer checkpoint, read from its universal form (step_dir/universal,
    made by DeepSpeed's converter and kept for a later resume too), or None with a warning when it cannot be made
    (a read-only or full disk): the module's bf16 weights then stand in."""
    try:
        return read_universal_weights(universal_dir(step_dir))
    except BadInput as e:
        warn(f"{e}; reading the module's bf16 weights instead of the fp32 master weights")
        return None


def read_weights(path):
    """(fp32 state dict, GPTConfig) of a checkpoint (or the newest under a checkpoints/ directory, or a universal
    checkpoint: gpt/train/universal.py): the optimizer's fp32 master weights via DeepSpeed's zero_to_fp32 reader where
    it can read them (ZeRO 1/2), from zero/<name>/fp32.pt in a universal one, from the step's universal form
    for BF16_Optimizer (zero1_bf16.json, the default: zero_to_fp32 refuses it), else the module's weights."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    path = find_checkpoint(str(path), None)
    run = read_run_config(path)
    config = GPTConfig(**run["model"])
    state = None
    if is_universal(path):
        state = read_universal_weights(path)
    elif run["zero_stage"] > 0:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # its progress prints: stdout is gpt-eval --json's
                state = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
        except ValueError:  # BF16_Optimizer (bf16 + ZeRO-1 + fp32 accumulation): zero_to_fp32 cannot read it
            state = bf16_optimizer_masters(path)
        except UNREADABLE as e:  # a garbled or cut file: name it, not zero_to_fp32's insides
            raise BadInput(unreadable_file(path, e)) from None
    if state is None:  # the module's own weights (16-bit in half-precision runs)
        model_file = path / MODEL_STATES
        try:
            state = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
        except UNREADABLE as e:
            raise BadInput(f"{model_file}: unreadable ({brief(e)})") from None
        if not isinstance(state, dict):
            raise BadInput(f"{model_file}: unreadable (its 'module' is not a state dict)")
    if "transformer.wte.weight" in state:
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    if config.n_embd % config.n_head:
        raise BadInput(f"{path}: its {RUN_CONFIG} says n_head {config.n_head}, which does not divide its "
                       f"n_embd {config.n_embd}")
    wrong = state_dict_mismatch(state, config)
    if wrong:  # run_config.json edited, or copied from another run: an export would describe other weights
        raise BadInput(f"{path}: the weights do not fit its {RUN_CONFIG} (n_layer {config.n_layer}, n_embd "
                       f"{config.n_embd}, block_size {config.block_size}, vocab_size {config.vocab_size}; "
                       f"missing, extra or misshapen: {wrong})")
    return {k: v.float() for k, v in state.items()}, config


def convert_once(path):
    """Rank 0, before the process group exists: the checkpoint's universal form for a resume on another world size
    or ZeRO stage, converted once (universal_dir) and reused by any later resume. Returns why it failed, or None."""
    target = Path(path) / UNIVERSAL
    if target.is_dir():
        say(f"reusing {target}, converted by an earlier resume")
        return None
    start = time.perf_counter()
    try:
        universal_dir(path)
    except BadInput as e:
        return e
    say(f"converted {path} to DeepSpeed's universal form in {time.perf_counter() - start:.1f}s ({target})")
    return None
