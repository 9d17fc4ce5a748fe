"""A checkpoint loaded into a resumed run (load), with the run's own settings put back over it. The checkpoint gives
the run's state (weights, Adam's moments, the schedule's position, fp16's current loss scale); the command line and the
JSON give every setting. But DeepSpeed loads the optimizer's param groups, the gradient clipping and fp16's loss scaler
as the checkpoint saved them, in place of what this run built from its flags and JSON: built() takes what the run
built before the load, reapply() puts it back after, one line per setting changed. A key removed from the JSON means
its default, which the built optimizer holds like any other value. (The lr schedule's flags:
gpt.train.trainer.Trainer._schedule_changes.)"""
import contextlib
import copy
import json
from dataclasses import dataclass

import torch

from gpt.config.ds_config import fp16_config
from gpt.train import checkpoint, muon, universal
from gpt.train.engine import settle_adam_state

# Param-group entries that are not settings: the tensors, the schedule's (lr, LambdaLR's initial_lr: the schedule's
# flags decide them) and FusedAdam's step count.
NOT_SETTINGS = {"params", "param_names", "lr", "initial_lr", "step"}
# torch's Adam entries that the optimizer type fixes (AdamW: decoupled weight decay), not a JSON key: a checkpoint of
# the other Adam (FusedAdam) has none, and torch fills them in as it loads; put back as built, without a line.
BY_TYPE = {"decoupled_weight_decay", "maximize", "capturable", "differentiable"}
# fp16's dynamic loss scaler: its attribute -> the fp16 block's key
SCALER_KEYS = {"scale_window": "loss_scale_window", "min_scale": "min_loss_scale", "delayed_shift": "hysteresis",
               "consecutive_hysteresis": "consecutive_hysteresis"}


def load(engine, path, kind):
    """Load the checkpoint at path as resume_kind chose (gpt/train/resume.py: 'exact', 'universal', 'whole' or
    'weights'), then, unless only its weights were taken, this run's settings put back and Adam's state settled
    (gpt.train.engine.settle_adam_state). Returns (its client state, why this rank's RNG state was not restored or
    None, one line per setting put back)."""
    asked = built(engine)
    with loading(engine):
        if kind == "universal":
            state, rng_problem = universal.load(engine, path), None
        else:
            state, rng_problem = checkpoint.load(engine, path, load_optimizer_states=kind != "weights",
                                                 restore_rng=kind == "exact")
    if kind == "weights":
        return state, rng_problem, []
    notes = reapply(engine, asked, state.get("ds_config"))
    settle_adam_state(engine)  # e.g. a FusedAdam checkpoint's step count as torch's AdamW keeps it
    return state, rng_problem, notes


@dataclass(frozen=True)
class Built:
    """What the engine was built with, before a checkpoint's load replaced it."""
    groups: list  # each param group's settings (NOT_SETTINGS left out)
    scaler: object  # fp16's loss scaler (a copy), or None


def built(engine):
    """The settings the engine holds now: call before the checkpoint is loaded."""
    groups = [{key: copy.deepcopy(value) for key, value in group.items() if key not in NOT_SETTINGS}
              for group in engine.basic_optimizer.param_groups]
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    return Built(groups, copy.copy(scaler) if engine.fp16_enabled() and scaler is not None else None)


@contextlib.contextmanager
def loading(engine):
    """Around the checkpoint's load: DeepSpeed's ZeRO optimizer refuses a checkpoint saved with gradient clipping into
    a run with compute_grad_norm false (a ValueError from its _load_global_state), though such a run has clipping 0,
    which reapply() puts back right after: the refusal is lifted for the load only."""
    optimizer = engine.optimizer
    if getattr(optimizer, "compute_grad_norm", True):
        yield
        return
    optimizer.compute_grad_norm = True
    try:
        yield
    finally:
        optimizer.compute_grad_norm = False


def reapply(engine, built, saved_ds_config=None):
    """After the checkpoint's optimizer state is loaded: every param group's settings as built (--weight_decay, the
    JSON's Adam parameters or their defaults), AMSGrad's maximum where the checkpoint has none, gradient_clipping and
    fp16's loss scaling. saved_ds_config: the DeepSpeed config the checkpoint's run had (DeepSpeed saves it), None if
    unknown. Returns one line per setting changed."""
    notes = [f"{name} {value} applied (the checkpoint's run had {had})"
             for name, (value, had) in group_changes(engine, built.groups).items()]
    notes += amsgrad_maximum(engine.basic_optimizer) + muon.muon_lr_change(engine)
    optimizer = engine.optimizer
    if hasattr(optimizer, "clip_grad") and optimizer.clip_grad != engine.gradient_clipping():
        notes.append(f"gradient_clipping {engine.gradient_clipping()} applied (the checkpoint's run had "
                     f"{optimizer.clip_grad})")
        optimizer.clip_grad = engine.gradient_clipping()
    if built.scaler is not None:
        notes += scaler_changes(engine, built.scaler, saved_ds_config)
    return notes


def shown(value):
    """A setting as the JSON writes it: betas' tuple as a list, true/false, null."""
    value = list(value) if isinstance(value, tuple) else value
    return json.dumps(value) if isinstance(value, (bool, list, type(None))) else str(value)


def group_changes(engine, groups):
    """Put each group's built settings back; {name: (value, the checkpoint's)} of those that differed, the first group's
    naming it (weight_decay is --weight_decay's or a Muon JSON's; the others the JSON's optimizer.params, or their
    default)."""
    in_json, changed = engine.optimizer_params(), {}
    for group, asked in zip(engine.basic_optimizer.param_groups, groups):
        for key, value in asked.items():
            had, missing = group.get(key), key not in group  # missing: a checkpoint of the other Adam
            if shown(had) == shown(value):
                continue
            group[key] = copy.deepcopy(value)
            if key in BY_TYPE or missing:
                continue
            name = muon.setting_name(engine, key) if key == "weight_decay" else f"optimizer.params.{key}"
            default = "" if key == "weight_decay" or key in in_json else " (its default)"
            changed.setdefault(name, (shown(value) + default, shown(had)))
    return changed


def amsgrad_maximum(adam):
    """AMSGrad on a checkpoint saved without it: torch's Adam raised KeyError 'max_exp_avg_sq' at the first resumed
    step. Its running maximum of exp_avg_sq starts as torch starts it, at zero, from the resumed step on."""
    started = False
    for group in adam.param_groups:
        for param in group["params"] if group.get("amsgrad") else ():
            state = adam.state.get(param, {})
            if "exp_avg_sq" in state and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = torch.zeros_like(state["exp_avg_sq"], memory_format=torch.preserve_format)
                started = True
    return ["optimizer.params.amsgrad: the checkpoint holds no maximum of exp_avg_sq (its run ran without AMSGrad): "
            "AMSGrad's maximum starts from the resumed step"] if started else []


def scaler_changes(engine, asked, saved_ds_config):
    """fp16's loss scaler as this run's JSON has it, where DeepSpeed put the checkpoint's in its place: another kind
    (static or dynamic: this run's scaler, from its start), another static scale, or the dynamic one's settings;
    a changed initial_scale_power restarts the scale there. The current dynamic scale is state, and stays otherwise."""
    optimizer, loaded = engine.optimizer, engine.optimizer.loss_scaler
    if asked.dynamic != loaded.dynamic or not asked.dynamic and asked.cur_scale != loaded.cur_scale:
        optimizer.loss_scaler, optimizer.dynamic_loss_scale = asked, asked.dynamic
        had = f"0: a dynamic scale, {loaded.cur_scale:g} when saved" if loaded.dynamic else f"{loaded.cur_scale:g}"
        now = f"0 (a dynamic scale from {asked.cur_scale:g})" if asked.dynamic else f"{asked.cur_scale:g}"
        return [f"fp16.loss_scale {now} applied (the checkpoint's run had {had})"]
    if not asked.dynamic:
        return []
    notes, in_json = [], (engine.config.get("fp16") or {}).keys()
    default = lambda key: "" if key in in_json else " (its default)"  # noqa: E731 -- a key removed from the JSON
    for attribute, key in SCALER_KEYS.items():
        if getattr(loaded, attribute) != getattr(asked, attribute):
            notes.append(f"fp16.{key} {shown(getattr(asked, attribute))}{default(key)} applied (the checkpoint's run "
                         f"had {shown(getattr(loaded, attribute))})")
            setattr(loaded, attribute, getattr(asked, attribute))
    loaded.cur_hysteresis = min(loaded.cur_hysteresis, loaded.delayed_shift)
    power, had = engine._config.float16_config.initial_scale_power, saved_power(saved_ds_config)
    if had is not None and had != power:
        notes.append(f"fp16.initial_scale_power {power}{default('initial_scale_power')} applied (the checkpoint's run "
                     f"had {had}): the loss scale restarts at {asked.cur_scale:g} (it was {loaded.cur_scale:g})")
        loaded.cur_scale = asked.cur_scale
    return notes


def saved_power(saved_ds_config):
    """The fp16 initial_scale_power of the checkpoint's run (DeepSpeed's default where its JSON had none), or None."""
    if not isinstance(saved_ds_config, dict):
        return None
    return fp16_config(saved_ds_config).initial_scale_power
