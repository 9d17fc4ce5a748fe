"""DeepSpeed's Muon (`"optimizer": {"type": "Muon"}`, MuonWithAuxAdam) in the JSON, checked before launch: the settings
this trainer passes on, each of its type and range; what the run's flags decide; the ZeRO stages and clipping it runs
right with; and a resume across optimizers or onto another layout, which cannot carry Muon's state. How it trains:
gpt/train/muon.py."""
import difflib
import json
import math

from gpt.config.ds_config import grad_accum_dtype, precision, zero_stage


def _fraction(value):  # in [0, 1)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1


def _positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# What this trainer's Muon takes (optimizer.params), each with its check: Muon's half (the block matrices) and the
# auxiliary Adam's (embeddings, head, 1-D parameters). DeepSpeed 0.19.8 runs 5 Newton-Schulz steps, not configurable.
MUON_PARAMS = {
    "muon_lr": (_positive, "a finite number > 0 (Muon's peak learning rate; --lr is the Adam half's)"),
    "momentum": (_fraction, "a number in [0, 1)"),
    "ns_method": (lambda v: v in ("gram", "standard"), '"gram" or "standard" (the Newton-Schulz iteration)'),
    "betas": (lambda v: isinstance(v, list) and len(v) == 2 and all(map(_fraction, v)), "two numbers in [0, 1)"),
    "eps": (_positive, "a small positive number"),
    "torch_adam": (lambda v: isinstance(v, bool), "true or false (the Adam half: torch's AdamW, or FusedAdam)"),
}
DECIDED = {"lr": "--lr", "adam_lr": "--lr", "weight_decay": "--weight_decay"}  # the run's flags set them

# DeepSpeed's default muon_lr when the JSON leaves it out (MuonWithAuxAdam's; the shipped JSONs set it)
DEFAULT_MUON_LR = 0.02


def uses_muon(ds_config):
    """Whether the JSON's optimizer is DeepSpeed's Muon (its type, in any case, as DeepSpeed reads it)."""
    optimizer = ds_config.get("optimizer")
    return isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() == "muon"


def clips_the_gradient(ds_config):
    """Whether DeepSpeed clips the gradient under Muon: only BF16_Optimizer (bf16, ZeRO 1, fp32 accumulation) clips
    before orthogonalising; DeepSpeedZeroOptimizer (every other ZeRO 1/2 run) measures and clips Muon's update."""
    return precision(ds_config) == "bf16" and zero_stage(ds_config) == 1 and grad_accum_dtype(ds_config) == "fp32"


def problems(ds_config, path):
    """Everything wrong with a Muon JSON's optimizer block and what Muon runs with, one line each (the optimizer
    block of any other JSON: gpt/config/ds_checks.py)."""
    optimizer = ds_config["optimizer"]
    found = [_unknown(path, f"optimizer.{key}", ("type", "params"), "DeepSpeed's Muon has no such setting")
             for key in optimizer if key not in ("type", "params")]
    params = optimizer.get("params", {})
    if not isinstance(params, dict):
        return found + [f"{path}: optimizer.params must be a JSON object"]
    for key, value in params.items():
        if key in DECIDED:
            found.append(f"{path}: optimizer.params.{key} is decided by the trainer (from {DECIDED[key]}): remove it "
                         f"from the JSON")
        elif key not in MUON_PARAMS:
            found.append(_unknown(path, f"optimizer.params.{key}", MUON_PARAMS,
                                  f"this trainer's Muon takes {', '.join(MUON_PARAMS)}"))
        elif not MUON_PARAMS[key][0](value):
            found.append(f"{path}: optimizer.params.{key} {json.dumps(value)} must be {MUON_PARAMS[key][1]}")
    if zero_stage(ds_config) == 0:
        found.append(f'{path}: optimizer.type "Muon" needs zero_optimization.stage 1 or 2 (DeepSpeed runs Muon '
                     f'inside its ZeRO optimizer)')
    clip = ds_config.get("gradient_clipping", 0)
    if clip and not clips_the_gradient(ds_config):
        found.append(f'{path}: gradient_clipping {clip} with optimizer.type "Muon": DeepSpeed 0.19 would clip '
                     f"Muon's orthogonalised update, not the gradient (its issue #8439), shrinking every step: set 0 "
                     f"or leave it out (only bf16 with ZeRO 1 and fp32 grad_accum_dtype clips the gradient)")
    return found


def _unknown(path, key, known, otherwise):
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    return f"{path}: unknown key '{key}' ({f'did you mean {close[0]!r}?' if close else otherwise})"


def optimizer_name(run):
    """The optimizer a run_config records: "Muon", or "AdamW" (run_configs name only Muon)."""
    return run.get("optimizer", "AdamW")


def recorded(ds_config):
    """What run_config.json records of the optimizer: Muon's name (an AdamW run records nothing, as before)."""
    return {"optimizer": "Muon"} if uses_muon(ds_config) else {}


def resume_problem(path, saved, current, kind):
    """A resume Muon cannot take, in one line: from another optimizer's checkpoint (Muon keeps one momentum buffer per
    matrix where Adam keeps two moments), or through DeepSpeed's universal form (its converter carries Adam's moments
    only, so Muon's momentum would be lost); None when it can."""
    was, now = optimizer_name(saved), optimizer_name(current)
    if was != now:
        return (f"{path}: cannot resume: optimizer {was} in the checkpoint, {now} now (--ds_config): their states "
                f"differ; resume with a {was} JSON, or start a new run from its weights (gpt-export, then "
                f"--init_from)")
    if now == "Muon" and kind == "universal":
        return (f"{path}: cannot resume Muon on another layout (saved on {saved['world_size']} rank(s) with ZeRO "
                f"{saved['zero_stage']}, now {current['world_size']} with ZeRO {current['zero_stage']}): DeepSpeed's "
                f"universal checkpoint carries Adam's moments only, not Muon's momentum; resume on the saved layout")
    return None
