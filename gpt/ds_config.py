"""The DeepSpeed JSON: loading it, what it selects (precision, ZeRO stage, activation checkpointing), the
DeepSpeed 0.19 combinations that cannot run, and the copy filled with what the run decides."""
import copy
import difflib
import json
import math
from pathlib import Path

# Top-level keys DeepSpeed 0.19 reads (its runtime constants, and the sections with a parser of their own);
# DeepSpeed itself ignores any other key silently, so a misspelled `zero_optimisation` would run ZeRO 0.
DEEPSPEED_SECTIONS = {"zero_optimization", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb",
                      "csv_monitor", "comet", "comms_logger", "compile", "aio", "checkpoint", "elasticity",
                      "autotuning", "nebula", "amp", "compression_training", "data_efficiency",
                      "curriculum_learning", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                      "train_batch_size", "optimizer", "scheduler", "fp16", "bf16", "data_types",
                      "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer"}
# What the trainer decides from its flags; in the JSON it would be silently overwritten, so it is refused.
RUN_DECIDES = {"train_batch_size": "--total_batch_tokens and --seq_len",
               "train_micro_batch_size_per_gpu": "--micro_batch",
               "gradient_accumulation_steps": "--total_batch_tokens, --micro_batch, --seq_len and the world size",
               "scheduler": "--lr, --warmup_steps, --max_steps and --min_lr_ratio: the GPT-3 schedule"}
OPTIMIZERS = ("AdamW", "Adam")  # what this trainer's schedule and parameter groups are made for


class DeepSpeedConfigError(ValueError):
    """A DeepSpeed JSON that cannot be used; the message names the file and the problem."""


def load(path):
    """The DeepSpeed JSON as a dict, or a one-line reason why not."""
    if not str(path).strip():
        raise DeepSpeedConfigError("--ds_config is empty: name a DeepSpeed JSON file")
    path = Path(path)
    if path.is_dir():
        raise DeepSpeedConfigError(f"{path}: a directory, not a DeepSpeed JSON file")
    if not path.is_file():
        raise DeepSpeedConfigError(f"{path}: DeepSpeed config not found")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(config, dict):
        raise DeepSpeedConfigError(f"{path}: expected a JSON object")
    return config


def load_checked(path):
    """load(), and every problem() of the JSON as one DeepSpeedConfigError."""
    config = load(path)
    found = problems(config, path)
    if found:
        raise DeepSpeedConfigError("\n".join(found))
    return config


def precision(ds_config):
    """'bf16', 'fp16' or 'fp32' as the DeepSpeed config selects."""
    enabled = [k for k in ("bf16", "fp16") if ds_config.get(k, {}).get("enabled", False)]
    return enabled[0] if enabled else "fp32"


def zero_stage(ds_config):
    return ds_config.get("zero_optimization", {}).get("stage", 0)


def uses_activation_checkpointing(ds_config):
    """DeepSpeed's `activation_checkpointing` block only configures its checkpoint API; the block's
    presence is our switch to checkpoint every transformer block."""
    return "activation_checkpointing" in ds_config


def known_keys():
    from gpt import dist  # noqa: F401 -- first: it imports deepspeed with DeepSpeed's logs sent to stderr
    from deepspeed.runtime import constants
    return DEEPSPEED_SECTIONS | {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}


def _finite(value, low, high=math.inf, high_open=False):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value and (value < high if high_open else value <= high))


def value_problems(ds_config, path):
    """Keys and values DeepSpeed 0.19 would take without complaint and then misbehave on: unknown keys,
    a ZeRO stage other than 0/1/2, another optimizer, non-finite or out-of-range numbers."""
    found = []
    known = known_keys()
    for key in ds_config:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            found.append(f"{path}: unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else
                                                           " (DeepSpeed would ignore it)"))
    for section in ("zero_optimization", "optimizer", "fp16", "bf16", "data_types", "activation_checkpointing"):
        if section in ds_config and not isinstance(ds_config[section], dict):
            found.append(f"{path}: '{section}' must be a JSON object, got {json.dumps(ds_config[section])}")
    for key, flags in RUN_DECIDES.items():
        if key in ds_config:
            found.append(f"{path}: '{key}' is decided by the trainer (from {flags}): remove it from the JSON")
    if found:
        return found
    for section in ("fp16", "bf16"):
        enabled = ds_config.get(section, {}).get("enabled", False)
        if not isinstance(enabled, bool):
            found.append(f"{path}: {section}.enabled {json.dumps(enabled)} must be true or false")
    offloaded = [k for k in ("offload_optimizer", "offload_param") if k in ds_config.get("zero_optimization", {})]
    if offloaded:
        found.append(f"{path}: zero_optimization.{offloaded[0]} is not supported by this trainer (ZeRO-Offload's "
                     f"CPU optimizer is untested here)")
    stage = ds_config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2) or isinstance(stage, bool):
        found.append(f"{path}: zero_optimization.stage {json.dumps(stage)} is not supported: use 0, 1 or 2 "
                     f"(ZeRO-3 partitions the parameters themselves, which this trainer does not handle)")
    optimizer = ds_config.get("optimizer", {})
    if optimizer.get("type", "AdamW") not in OPTIMIZERS:
        found.append(f"{path}: optimizer.type {json.dumps(optimizer.get('type'))}: this trainer runs "
                     f"{' or '.join(OPTIMIZERS)}")
    params = optimizer.get("params", {}) if isinstance(optimizer.get("params", {}), dict) else None
    if params is None:
        found.append(f"{path}: optimizer.params must be a JSON object")
    else:
        betas = params.get("betas", [0.9, 0.999])
        if not (isinstance(betas, list) and len(betas) == 2 and all(_finite(b, 0, 1, high_open=True) for b in betas)):
            found.append(f"{path}: optimizer.params.betas {json.dumps(betas)} must be two numbers in [0, 1)")
        if not _finite(params.get("eps", 1e-8), 0, high_open=True) or params.get("eps", 1e-8) <= 0:
            found.append(f"{path}: optimizer.params.eps {json.dumps(params.get('eps'))} must be a small positive number")
        for key in ("lr", "weight_decay"):
            if key in params:
                found.append(f"{path}: optimizer.params.{key} is decided by the trainer (from --{key}): remove it "
                             f"from the JSON")
    if not _finite(ds_config.get("gradient_clipping", 0), 0):
        found.append(f"{path}: gradient_clipping {json.dumps(ds_config.get('gradient_clipping'))} must be a finite "
                     f"number >= 0 (0: off)")
    return found


def problems(ds_config, path):
    """Everything wrong with the JSON that can be seen before launch, one line each: bad keys and values
    (value_problems), and the combinations DeepSpeed 0.19 accepts but cannot run right."""
    found = value_problems(ds_config, path)
    if found:
        return found
    if all(ds_config.get(k, {}).get("enabled", False) for k in ("bf16", "fp16")):
        return [f"{path}: fp16 and bf16 are both enabled; choose one"]
    if precision(ds_config) == "fp16" and zero_stage(ds_config) == 0:
        # DeepSpeed 0.19's stage-0 FP16_Optimizer unscales gradients the engine never scaled:
        # grad norms and clipping come out wrong by the loss scale.
        return [f"{path}: fp16 needs ZeRO stage 1 or 2 (stage 0 mis-scales gradients)"]
    if (precision(ds_config) == "bf16" and zero_stage(ds_config) == 0
            and ds_config.get("data_types", {}).get("grad_accum_dtype") == "fp32"):
        # DeepSpeed 0.19 raises NotImplementedError inside deepspeed.initialize for this mix.
        return [f"{path}: bf16 with fp32 gradient accumulation (data_types.grad_accum_dtype) needs ZeRO stage 1 or 2"]
    return []


def fill(ds_config, micro_batch, grad_accum, train_batch_size, lr, weight_decay):
    """A copy of the JSON with what the run decides: the batch triple, learning rate, weight decay."""
    config = copy.deepcopy(ds_config)
    config["train_micro_batch_size_per_gpu"] = micro_batch
    config["gradient_accumulation_steps"] = grad_accum
    config["train_batch_size"] = train_batch_size
    optimizer = config.setdefault("optimizer", {"type": "AdamW", "params": {}})
    optimizer.setdefault("params", {}).update(lr=lr, weight_decay=weight_decay)
    return config
