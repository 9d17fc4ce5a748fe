"""DeepSpeed's Muon (`"optimizer": {"type": "Muon"}`, MuonWithAuxAdam) in the JSON, checked before launch: the settings
this trainer passes on, each of its type and range; its recipe (each half's peak learning rate, the weight decay), which
the flags take as their defaults; the ZeRO stages, clipping and spike guard it runs right with; and a resume across
optimizers or onto another layout, which cannot carry Muon's state. How it trains: gpt/train/muon.py."""
import difflib
import json
import math

from gpt.config.ds_config import grad_accum_dtype, precision, zero_stage
from gpt.config.settings import GPT3_LR, GPT3_WEIGHT_DECAY


def _fraction(value):  # in [0, 1)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1


def _finite(value, least):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= least


def _positive(value):
    return _finite(value, 0) and value > 0


# What this trainer's Muon takes (optimizer.params), each with its check: Muon's half (the block matrices) and the
# auxiliary Adam's (embeddings, head, 1-D parameters). DeepSpeed 0.19.8 runs 5 Newton-Schulz steps, not configurable.
MUON_PARAMS = {
    "muon_lr": (_positive, "a finite number > 0 (Muon's peak learning rate)"),
    "adam_lr": (_positive, "a finite number > 0 (the Adam half's peak learning rate)"),
    "weight_decay": (lambda v: _finite(v, 0), "a finite number >= 0 (on both halves' matrices and embeddings)"),
    "momentum": (_fraction, "a number in [0, 1)"),
    "ns_method": (lambda v: v in ("gram", "standard"), '"gram" or "standard" (the Newton-Schulz iteration)'),
    "betas": (lambda v: isinstance(v, list) and len(v) == 2 and all(map(_fraction, v)), "two numbers in [0, 1)"),
    "eps": (_positive, "a small positive number"),
    "torch_adam": (lambda v: isinstance(v, bool), "true or false (the Adam half: torch's AdamW, or FusedAdam)"),
}
# DeepSpeed's shared lr, which it gives to a half without its own: each half's is named instead
DECIDED = {"lr": "--lr; a Muon JSON names each half's: muon_lr, adam_lr"}
# The recipe a Muon JSON carries in place of a flag's default: the flag -> its key in optimizer.params. A flag given
# on the command line wins (said in one line: overridden below); the JSON's muon_lr has no flag.
RECIPE = {"lr": "adam_lr", "weight_decay": "weight_decay"}

# The Muon half's peak where the JSON leaves muon_lr out (MuonWithAuxAdam's own default, which DeepSpeed would not
# apply: it gives the half the shared lr instead; gpt.train.engine.fill writes this one in)
DEFAULT_MUON_LR = 0.02


def uses_muon(ds_config):
    """Whether the JSON's optimizer is DeepSpeed's Muon (its type, in any case, as DeepSpeed reads it)."""
    optimizer = ds_config.get("optimizer") if isinstance(ds_config, dict) else None  # None: a JSON that did not load
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
    for key, value in optimizer.get("params", {}).items():
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


def recipe(ds_config):
    """{flag: value} a Muon JSON's optimizer.params sets in place of the flag's default (RECIPE), its valid values only
    (a wrong one is refused by problems()); {} for any other JSON."""
    params = ds_config["optimizer"].get("params", {}) if uses_muon(ds_config) else {}
    if not isinstance(params, dict):
        return {}
    return {flag: params[key] for flag, key in RECIPE.items() if key in params and MUON_PARAMS[key][0](params[key])}


def flag_values(optimizer, ds_config):
    """{flag: value} for --lr and --weight_decay where the command line left them out (None in `optimizer`, the
    settings' section): the JSON's recipe, else GPT-3 small's."""
    defaults = {"lr": GPT3_LR, "weight_decay": GPT3_WEIGHT_DECAY, **recipe(ds_config)}
    return {flag: value for flag, value in defaults.items() if getattr(optimizer, flag) is None}


def overridden(optimizer, ds_config, path):
    """One line per flag given on the command line beside another value in the JSON's recipe: the flag wins."""
    return [f"--{flag} {getattr(optimizer, flag):g} given: it wins over optimizer.params.{RECIPE[flag]} {value:g} of "
            f"{path}" for flag, value in recipe(ds_config).items()
            if getattr(optimizer, flag) is not None and getattr(optimizer, flag) != value]


def guard_problem(skip_grad_z, ds_config, path):
    """--skip_grad_z where DeepSpeed measures no gradient norm under Muon: DeepSpeedZeroOptimizer measures the norm of
    Muon's orthogonalised update (the log's update_norm), which stays near-constant whatever the gradient does, so the
    guard would miss a gradient's spike and take the update's small wobbles for spikes. None where it can act."""
    if not skip_grad_z or not uses_muon(ds_config) or clips_the_gradient(ds_config):
        return None
    return (f"--skip_grad_z {skip_grad_z:g}: under {path}'s Muon DeepSpeed measures the norm of Muon's orthogonalised "
            f"update, not the gradient's (its ZeRO optimizer; the log's update_norm), so the guard could not see a "
            f"gradient spike: use --skip_loss_z, or bf16 with ZeRO 1 and fp32 grad_accum_dtype "
            f"(ds_configs/zero1_bf16_muon.json), where the norm is the gradient's")


def optimizer_name(run):
    """The optimizer a run_config records: "Muon", or "AdamW" (run_configs name only Muon)."""
    return run.get("optimizer", "AdamW")


def recorded(ds_config):
    """What run_config.json records of the optimizer: Muon's name and its half's peak learning rate (an AdamW run
    records nothing, as before; the Adam half's peak and the weight decay are the args' lr and weight_decay)."""
    if not uses_muon(ds_config):
        return {}
    return {"optimizer": "Muon", "muon_lr": ds_config["optimizer"].get("params", {}).get("muon_lr", DEFAULT_MUON_LR)}


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
