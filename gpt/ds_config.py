"""The DeepSpeed JSON: loading it, what it selects (precision, ZeRO stage, activation checkpointing), the
DeepSpeed 0.19 combinations that cannot run, and the copy filled with what the run decides."""
import copy
import json
from pathlib import Path


class DeepSpeedConfigError(ValueError):
    """A DeepSpeed JSON that cannot be used; the message names the file and the problem."""


def load(path):
    """The DeepSpeed JSON as a dict, or a one-line reason why not."""
    path = Path(path)
    if not path.is_file():
        raise DeepSpeedConfigError(f"{path}: DeepSpeed config not found")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(config, dict):
        raise DeepSpeedConfigError(f"{path}: expected a JSON object")
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


def problems(ds_config, path):
    """The combinations DeepSpeed 0.19 accepts but cannot run right, one line each."""
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
