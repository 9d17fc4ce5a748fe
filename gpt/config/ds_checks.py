"""The DeepSpeed JSON's check before launch, one line per problem: its structure, the values DeepSpeed reads unchecked,
DeepSpeed's parser key by key, what DeepSpeed 0.19 accepts but this trainer cannot run or would ignore, and where its
monitors would write. load_checked: the JSON loaded (gpt/config/ds_config.py) and checked."""
import difflib
import importlib.util
import json
import math
import os
import typing

import pydantic

from gpt.config import muon_checks
from gpt.config.ds_config import (Refused, bf16_config, deepspeed_config, dtype_name, fp16_config, grad_accum_dtype,
                                  load, parsed, precision, zero_config, zero_stage)
from gpt.config.engine_checks import engine_problems
from gpt.console import NAME_MAX, BadInput, longest_component, out_dir_problem, out_file_problem


# Top-level keys DeepSpeed 0.19 reads (its runtime constants, and the sections with a parser of their own);
# DeepSpeed itself ignores any other key silently, so a misspelled `zero_optimisation` would run ZeRO 0.
DEEPSPEED_SECTIONS = {"zero_optimization", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb",
                      "csv_monitor", "comet", "comms_logger", "compile", "aio", "checkpoint", "elasticity",
                      "autotuning", "nebula", "amp", "compression_training", "data_efficiency",
                      "curriculum_learning", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                      "train_batch_size", "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "data_types",
                      "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
                      "torch_autocast"}

# Blocks that must be JSON objects: DeepSpeed unpacks them with ** or .keys() (a traceback otherwise).
SECTIONS = ("zero_optimization", "optimizer", "fp16", "bf16", "bfloat16", "data_types", "activation_checkpointing",
            "torch_autocast", "checkpoint", "flops_profiler", "comms_logger", "tensorboard", "wandb", "csv_monitor",
            "comet", "compile", "aio", "autotuning", "data_efficiency")

# Top-level values DeepSpeed 0.19 reads by hand (get_scalar_param) and uses unchecked.
BOOLEAN_SETTINGS = {"wall_clock_breakdown", "memory_breakdown", "zero_allow_untested_optimizer",
                    "zero_force_ds_cpu_optimizer", "prescale_gradients", "disable_allgather", "dump_state",
                    "disable_python_gc", "dataloader_drop_last", "managed_gradient_accumulation",
                    "use_data_before_expert_parallelism"}

NUMBER_SETTINGS = {  # key: (the check, what it wants)
    "steps_per_print": (lambda v: v is None or _whole(v, 1), "a whole number >= 1 or null"),  # 0: ZeroDivisionError
    "gradient_clipping": (lambda v: _finite(v, 0), "a finite number >= 0 (0: off)"),
    "gradient_predivide_factor": (lambda v: _finite(v, 0, low_open=True), "a finite number > 0")}

DATA_TYPES = ("grad_accum_dtype", "param_dtype", "buffer_dtype", "keep_in_fp32_modules")
DTYPES = ("fp32", "bf16", "fp16")  # what data_types may name (DeepSpeed also takes int8, which trains nothing)

# What the trainer decides from its flags; in the JSON it would be silently overwritten, so it is refused.
RUN_DECIDES = {"train_batch_size": "--total_batch_tokens and --seq_len",
               "train_micro_batch_size_per_gpu": "--micro_batch",
               "gradient_accumulation_steps": "--total_batch_tokens, --micro_batch, --seq_len and the world size",
               "scheduler": "--lr_schedule, --lr, --warmup_steps, --max_steps, --min_lr_ratio and --cooldown_frac, "
                            "--cooldown_shape: gpt/train/schedule.py"}

# The largest ZeRO bucket (elements): DeepSpeed allocates a bucket whole, so 1e13 asked for 40 TB inside the run.
# 2**32 elements is 16 GiB in fp32, 8.6x DeepSpeed's default of 5e8; past ~1e8 elements a bucket gains no bandwidth.
MAX_BUCKET_SIZE = 2**32

# fp16 loss scales. Dynamic: the first scale is 2**initial_scale_power, halved (and the step skipped) at each
# overflow; 2**32 is the largest start in common use (Megatron-LM's default), 2**10000 overflows Python's float.
# Static: fp16's largest value is 65504 (~2**16), so a scale past 2**24 overflows every gradient above 2**-8, and
# every such step is skipped, without a word.
MAX_INITIAL_SCALE_POWER = 32
MAX_STATIC_LOSS_SCALE = 2**24

# DeepSpeed's monitors and the Python package each imports when enabled (csv_monitor: none).
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml", "csv_monitor": None}

# Sections DeepSpeed accepts that take effect only through what this trainer does not do: refused, never ignored
NOT_HONOURED = {
    "autotuning": "DeepSpeed's autotuner runs only under `deepspeed --autotuning`; --micro_batch auto sizes the batch "
                  "here",
    "compile": "DeepSpeed compiles only in engine.compile(), which this trainer does not call; --compile compiles "
               "its model (torch.compile, block by block)",
    "data_efficiency": "the trainer's own loader (gpt/data/shards.py) feeds every step, not DeepSpeed's data sampling "
                       "and routing",
    "aio": "it configures NVMe offload, which this trainer does not run",
}

OPTIMIZERS = ("AdamW", "Adam", "Muon")  # what this trainer's schedule and parameter groups are made for

OPTIMIZER_KEYS = ("type", "params", "legacy_fusion")

# The parameters DeepSpeed 0.19 passes on to its FusedAdam or (torch_adam) torch's Adam/AdamW, and their checks.
ADAM_PARAMS = {
    "betas": (lambda v: isinstance(v, list) and len(v) == 2 and all(_finite(b, 0, 1, high_open=True) for b in v),
              "two numbers in [0, 1)"),
    "eps": (lambda v: _finite(v, 0, low_open=True), "a small positive number"),
    "amsgrad": (lambda v: isinstance(v, bool), "true or false"),
    "adam_w_mode": (lambda v: isinstance(v, bool), "true or false"),
    "torch_adam": (lambda v: isinstance(v, bool), "true or false"),
    "bias_correction": (lambda v: isinstance(v, bool), "true or false"),
    "fused": (lambda v: isinstance(v, bool), "true or false"),  # torch's: one kernel for every tensor
    "foreach": (lambda v: isinstance(v, bool), "true or false")}

TORCH_ADAM_ONLY = {"amsgrad": "AMSGrad", "fused": "fused option", "foreach": "foreach option"}  # not FusedAdam's


def load_checked(path):
    """load(), and every problem() of the JSON as one BadInput."""
    config = load(path)
    found = problems(config, path)
    if found:
        raise BadInput("\n".join(found))
    return config


def known_keys():
    from gpt.runtime import accelerator  # noqa: F401 -- first: DeepSpeed imported with its logs on stderr
    from deepspeed.runtime import constants
    return DEEPSPEED_SECTIONS | {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}


def _unknown_key(path, key, known, otherwise="DeepSpeed would ignore it"):
    """'unknown key' for a dotted key, with the closest of the `known` names at its level, else `otherwise`."""
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    return f"{path}: unknown key '{key}' ({f'did you mean {close[0]!r}?' if close else otherwise})"


def _finite(value, low, high=math.inf, high_open=False, low_open=False):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (low < value if low_open else low <= value) and (value < high if high_open else value <= high))


def _whole(value, low):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def structure_problems(ds_config, path):
    """What must hold before DeepSpeed's own parser can be asked: known top-level keys, sections that are
    JSON objects, none of the keys the trainer decides, and a ZeRO stage this trainer runs."""
    found = []
    known = known_keys()
    found += [_unknown_key(path, key, known) for key in ds_config if key not in known]
    for section in SECTIONS:
        if section in ds_config and not isinstance(ds_config[section], dict):
            found.append(f"{path}: '{section}' must be a JSON object, got {json.dumps(ds_config[section])}")
    params = ds_config["optimizer"].get("params", {}) if isinstance(ds_config.get("optimizer"), dict) else {}
    if not isinstance(params, dict):  # DeepSpeed's engine calls .keys() on it, and the trainer fills it in
        found.append(f"{path}: 'optimizer.params' must be a JSON object, got {json.dumps(params)}")
    for key, flags in RUN_DECIDES.items():
        if key in ds_config:
            found.append(f"{path}: '{key}' is decided by the trainer (from {flags}): remove it from the JSON")
    if "bf16" in ds_config and "bfloat16" in ds_config:
        found.append(f"{path}: both 'bf16' and 'bfloat16' (its older name): keep 'bf16' (DeepSpeed would read "
                     f"only that one)")
    zero = ds_config.get("zero_optimization", {})
    stage = stage_as_read(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    if stage not in (0, 1, 2):  # stricter than DeepSpeed's 0-3, and said our way
        found.append(f"{path}: zero_optimization.stage {json.dumps(stage)} is not supported: use 0, 1 or 2 "
                     f"(ZeRO-3 partitions the parameters themselves, which this trainer does not handle)")
    return found


def stage_as_read(value):
    """A ZeRO stage as DeepSpeed's model reads it ("2", 2.0 and 2 are stage 2), or the value itself where it refuses."""
    try:
        return int(zero_config({"zero_optimization": {"stage": value}}).stage)
    except Refused:
        return value


def hand_parsed_sections():
    """The blocks DeepSpeed 0.19 parses by hand, as {key: DeepSpeed's default} from its own constants."""
    from deepspeed.profiling import constants as profiler
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    names = vars(profiler)
    return {"activation_checkpointing": ACT_CHKPT_DEFAULT,
            "flops_profiler": {value: names[f"{name}_DEFAULT"] for name, value in names.items()
                               if name.startswith("FLOPS_PROFILER_") and f"{name}_DEFAULT" in names}}


def _section_problems(section, name, defaults, path):
    """Each key of a hand-parsed block known, and of its default's type (None: a whole number >= 1, or a
    file name for output_file, or null)."""
    found = []
    for key, value in section.items():
        default, wanted = defaults.get(key), None
        if key not in defaults:
            found.append(_unknown_key(path, f"{name}.{key}", defaults))
        elif isinstance(default, bool):
            wanted = None if isinstance(value, bool) else "true or false"
        elif isinstance(default, int):
            wanted = None if _whole(value, -math.inf) else "a whole number"
        elif isinstance(default, float):
            wanted = None if _finite(value, -math.inf) else "a finite number"
        elif key == "output_file":
            wanted = None if value is None or isinstance(value, str) else "a file name or null"
        elif not (value is None or _whole(value, 1)):  # number_checkpoints
            wanted = "a whole number >= 1 or null"
        if wanted:
            found.append(f"{path}: {name}.{key} {json.dumps(value)} must be {wanted}")
    return found


def hand_parsed_problems(ds_config, path):
    """Types of what DeepSpeed 0.19 reads by hand (get_scalar_param) and uses unchecked, where a wrong type
    fails at the first step or silently: top-level switches and numbers, activation_checkpointing, flops_profiler,
    data_types."""
    found = []
    for key in sorted(BOOLEAN_SETTINGS & ds_config.keys()):
        if not isinstance(ds_config[key], bool):
            found.append(f"{path}: {key} {json.dumps(ds_config[key])} must be true or false")
    enabled = ds_config.get("torch_autocast", {}).get("enabled", False)  # fp16's and bf16's: DeepSpeed's pydantic
    if not isinstance(enabled, bool):
        found.append(f"{path}: torch_autocast.enabled {json.dumps(enabled)} must be true or false")
    for key, (check, wanted) in NUMBER_SETTINGS.items():
        if key in ds_config and not check(ds_config[key]):
            found.append(f"{path}: {key} {json.dumps(ds_config[key])} must be {wanted}")
    for section, defaults in hand_parsed_sections().items():
        found += _section_problems(ds_config.get(section, {}), section, defaults, path)
    for key, value in ds_config.get("data_types", {}).items():
        if key not in DATA_TYPES:
            found.append(_unknown_key(path, f"data_types.{key}", DATA_TYPES))
        elif key != "keep_in_fp32_modules" and value is not None and dtype_name(value) not in DTYPES:
            found.append(f"{path}: data_types.{key} {json.dumps(value)} is not a dtype: use one of {', '.join(DTYPES)}")
    return found


def config_models():
    """DeepSpeed's pydantic config models by class name (a ValidationError's title names its model)."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    models, todo = {}, [DeepSpeedConfigModel]
    while todo:
        model = todo.pop()
        models[model.__name__] = model
        todo += model.__subclasses__()
    return models


def _model_fields(model, loc):
    """The field names (and aliases) of the pydantic model found at `loc` under `model`; empty if none."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        inner = [t for t in (field.annotation, *typing.get_args(field.annotation)) if isinstance(t, type)
                 and issubclass(t, pydantic.BaseModel)] if field else []
        if not inner:
            return []
        model = inner[0]
    return [name for name, field in model.model_fields.items() for name in (name, field.alias) if name]


def _error_lines(path, key, error):
    """One line per problem DeepSpeed's parser found in the top-level `key`: pydantic's errors by dotted key,
    anything else (its asserts, its own BadInput) as its first line."""
    if not isinstance(error, pydantic.ValidationError):
        return [f"{path}: {key}: {_first_line(error)}"]
    lines = []
    for item in error.errors(include_url=False):
        loc = item["loc"]
        if loc and loc[0] == key:  # the monitors' model (tensorboard, wandb, ...) parses from the top level
            loc = loc[1:]
        dotted = ".".join([key, *(str(part) for part in loc)])
        if item["type"] == "extra_forbidden":
            model = config_models().get(error.title)
            fields = _model_fields(model, item["loc"][:-1]) if model else []
            lines.append(_unknown_key(path, dotted, fields, otherwise="DeepSpeed refuses it"))
            continue
        message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        got = f" (got {json.dumps(item['input'], default=repr)})" if loc and item["type"] != "missing" else ""
        lines.append(f"{path}: {message}" if message.startswith(dotted) else f"{path}: {dotted}: {message}{got}")
    return lines


def deepspeed_problems(ds_config, path):
    """What DeepSpeed 0.19's own parser refuses, one line per problem, each top-level key parsed apart so
    that every key's problems are named (the ZeRO block goes along once it parses: others depend on its
    stage)."""
    found, context = [], {}
    keys = [k for k in ds_config if k != "zero_optimization"]
    for key in ["zero_optimization", *keys] if "zero_optimization" in ds_config else keys:
        try:
            deepspeed_config({**context, key: ds_config[key]})
            if key == "zero_optimization":
                context = {key: ds_config[key]}
        except Exception as e:  # noqa: BLE001 -- whatever DeepSpeed raises is the user's JSON's problem
            found += _error_lines(path, key, e)
    return found


def whole_config_problems(ds_config, path):
    """DeepSpeed's parser on the whole JSON, last: for what only a combination of keys shows."""
    try:
        deepspeed_config(ds_config)
    except Exception as e:  # noqa: BLE001
        return [f"{path}: DeepSpeed refuses it: {_first_line(e)}"]
    return []


def _first_line(error):
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def auto_values(value, prefix=""):
    """The dotted keys holding "auto", Hugging Face's placeholder, which DeepSpeed drops for its default."""
    if isinstance(value, dict):
        return [key for k, v in value.items() for key in auto_values(v, f"{prefix}{k}.")]
    return [prefix[:-1]] if value == "auto" else []


def trainer_problems(ds_config, path):
    """What DeepSpeed accepts but this trainer cannot run right: offload, another optimizer or its
    parameters, the learning rate and weight decay (our flags), autocast, "auto" values, what DeepSpeed's engine
    refuses inside the ranks or overrides (gpt/config/engine_checks.py), and the 0.19 combinations that fail or
    misbehave (fp16 with ZeRO-0, bf16 with fp32 accumulation and ZeRO-0, ...)."""
    found = [f"{path}: {key} \"auto\" is a Hugging Face placeholder: give a value (DeepSpeed would use its "
             f"default)" for key in auto_values(ds_config)]
    zero = zero_config(ds_config)
    offloaded = [k for k in ("offload_optimizer", "offload_param") if getattr(zero, k) is not None]
    if offloaded:
        found.append(f"{path}: zero_optimization.{offloaded[0]} is not supported by this trainer (ZeRO-Offload's "
                     f"CPU optimizer is untested here)")
    found += [f"{path}: '{key}' is not honoured by this trainer ({why}): remove it" for key, why in NOT_HONOURED.items()
              if key in ds_config and (ds_config[key] or {}).get("enabled", True)]  # DeepSpeed: if enabled
    if (ds_config.get("torch_autocast") or {}).get("enabled", False):
        found.append(f"{path}: torch_autocast is not supported by this trainer: enable bf16 or fp16 instead")
    found += (muon_checks.problems(ds_config, path) if muon_checks.uses_muon(ds_config)
              else optimizer_problems(ds_config.get("optimizer", {}), path))
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        size = getattr(zero, key)
        if key in ds_config.get("zero_optimization", {}) and size > MAX_BUCKET_SIZE:
            found.append(f"{path}: zero_optimization.{key} {size} must be at most {MAX_BUCKET_SIZE} (2**32 elements, "
                         f"16 GiB in fp32): ZeRO allocates its buckets whole (DeepSpeed's default: 500000000)")
    found += engine_problems(ds_config, zero, path)
    if (ds_config.get("checkpoint") or {}).get("load_universal"):
        found.append(f"{path}: checkpoint.load_universal is the trainer's to set: --resume converts a checkpoint to "
                     f"DeepSpeed's universal form and loads it that way when the world size or ZeRO stage changed; "
                     f"remove it")
    return found or precision_problems(ds_config, path)


def precision_problems(ds_config, path):
    """The precision settings DeepSpeed 0.19 accepts but fail or misbehave: both half types, accumulation or
    parameters in another dtype, fp16's loss scaling (hysteresis, scales) and fp16 or bf16 with ZeRO 0."""
    run_precision = precision(ds_config)
    if fp16_config(ds_config).enabled and bf16_config(ds_config).enabled:
        return [f"{path}: fp16 and bf16 are both enabled; choose one"]
    accumulation = grad_accum_dtype(ds_config)
    if accumulation not in (None, "fp32", run_precision):
        return [f"{path}: data_types.grad_accum_dtype {json.dumps(ds_config['data_types']['grad_accum_dtype'])} "
                f"does not fit {run_precision} training: use \"fp32\" or \"{run_precision}\" (or leave it out)"]
    param_dtype = dtype_name((ds_config.get("data_types") or {}).get("param_dtype"))
    if param_dtype not in (None, run_precision):  # DeepSpeed asserts this in deepspeed.initialize
        return [f"{path}: data_types.param_dtype {json.dumps(ds_config['data_types']['param_dtype'])} does not "
                f"fit {run_precision} training (the fp16/bf16 blocks set it): leave it out"]
    hysteresis = fp16_config(ds_config).hysteresis
    if run_precision == "fp16" and hysteresis < 1:  # DynamicLossScaler counts down to 1: from below it never gets there
        return [f"{path}: fp16.hysteresis {hysteresis} must be >= 1 (below, the loss scale would never drop on "
                f"overflow and every step would be skipped)"]
    if run_precision == "fp16" and (found := loss_scale_problems(fp16_config(ds_config), path)):
        return found
    if run_precision == "fp16" and zero_stage(ds_config) == 0:
        # DeepSpeed 0.19's stage-0 FP16_Optimizer unscales gradients the engine never scaled:
        # grad norms and clipping come out wrong by the loss scale.
        return [f"{path}: fp16 needs ZeRO stage 1 or 2 (stage 0 mis-scales gradients)"]
    if run_precision == "bf16" and zero_stage(ds_config) == 0 and accumulation == "fp32":
        # DeepSpeed 0.19 raises NotImplementedError inside deepspeed.initialize for this mix.
        return [f"{path}: bf16 with fp32 gradient accumulation (data_types.grad_accum_dtype) needs ZeRO stage 1 or 2"]
    return []


def loss_scale_problems(fp16, path):
    """fp16's loss scale (DeepSpeed's parsed fp16 block): a dynamic scale's start and floor, a static scale's size."""
    if fp16.loss_scale:  # static
        if fp16.loss_scale > MAX_STATIC_LOSS_SCALE:
            return [f"{path}: fp16.loss_scale {fp16.loss_scale:g} must be at most {MAX_STATIC_LOSS_SCALE} (2**24) "
                    f"for a static scale: beyond it every gradient above 2**-8 overflows fp16 (largest 65504) and its "
                    f"step is skipped; use 0 (dynamic) or a power of two such as 65536"]
        return []
    power = fp16.initial_scale_power
    if not 0 <= power <= MAX_INITIAL_SCALE_POWER:
        return [f"{path}: fp16.initial_scale_power {power} must lie in [0, {MAX_INITIAL_SCALE_POWER}]: the first loss "
                f"scale is 2**power, and a larger one only overflows, each halving a skipped step (DeepSpeed's "
                f"default: 16)"]
    if fp16.min_loss_scale > 2**power:
        return [f"{path}: fp16.min_loss_scale {fp16.min_loss_scale} exceeds the first loss scale 2**{power} = "
                f"{2**power} (fp16.initial_scale_power): the floor must lie at or below the start"]
    return []


def output_problems(ds_config, path):
    """DeepSpeed's monitors and flops profiler, enabled: the package each imports installed, and the directory or
    file it writes possible to make (they fail inside the run otherwise). For a JSON problems() passed, on the
    machine that runs it: the trainer asks, gpt-plan (which may plan for another machine) does not."""
    found, parsed_config = [], parsed(ds_config, *MONITOR_PACKAGES, "flops_profiler")
    for name, package in MONITOR_PACKAGES.items():
        monitor = getattr(parsed_config.monitor_config, name)
        if not monitor.enabled:
            continue
        if package and importlib.util.find_spec(package) is None:
            found.append(f"{path}: {name}.enabled needs the {package} package, which is not installed "
                         f"(pip install {package}, or disable it)")
        if hasattr(monitor, "output_path"):  # DeepSpeed writes into output_path/job_name
            key = "job_name" if longest_component(monitor.job_name) > NAME_MAX else "output_path"
            found += [p for p in [out_dir_problem(f"{path}: {name}.{key}",
                                                  os.path.join(monitor.output_path, monitor.job_name))] if p]
    profiler = parsed_config.flops_profiler_config
    if profiler.enabled and profiler.output_file:
        found += [p for p in [out_file_problem(f"{path}: flops_profiler.output_file", profiler.output_file)] if p]
    return found


def optimizer_problems(optimizer, path):
    """The optimizer block: Adam or AdamW (DeepSpeed's FusedAdam, or torch's with torch_adam) and the
    parameters they take, with lr and weight_decay left to the trainer's flags."""
    found = [_unknown_key(path, f"optimizer.{key}", OPTIMIZER_KEYS) for key in optimizer if key not in OPTIMIZER_KEYS]
    if str(optimizer.get("type", "AdamW")).lower() not in [name.lower() for name in OPTIMIZERS]:
        found.append(f"{path}: optimizer.type {json.dumps(optimizer.get('type'))}: this trainer runs "
                     f"{', '.join(OPTIMIZERS[:-1])} or {OPTIMIZERS[-1]}")
    params = optimizer.get("params", {})
    for key, value in params.items():
        if key in ("lr", "weight_decay"):
            found.append(f"{path}: optimizer.params.{key} is decided by the trainer (from --{key}): remove it "
                         f"from the JSON")
        elif key not in ADAM_PARAMS:
            found.append(_unknown_key(path, f"optimizer.params.{key}", ADAM_PARAMS,
                                      otherwise=f"this trainer's Adam takes {', '.join(ADAM_PARAMS)}"))
        elif not ADAM_PARAMS[key][0](value):
            found.append(f"{path}: optimizer.params.{key} {json.dumps(value)} must be {ADAM_PARAMS[key][1]}")
    for key, what in TORCH_ADAM_ONLY.items():
        if params.get(key) is True and params.get("torch_adam") is not True:
            found.append(f"{path}: optimizer.params.{key} true needs optimizer.params.torch_adam true (DeepSpeed's "
                         f"FusedAdam has no {what})")
    if params.get("fused") is True and params.get("foreach") is True:
        found.append(f"{path}: optimizer.params.fused and foreach cannot both be true (torch's AdamW takes one)")
    if "bias_correction" in params and params.get("torch_adam") is True:
        found.append(f"{path}: optimizer.params.bias_correction is FusedAdam's; torch's Adam (torch_adam) always "
                     f"corrects the bias: remove it")
    return found


def problems(ds_config, path):
    """Everything wrong with the JSON that can be seen before launch, one line each, in stages that each
    assume the last one passed: the structure, the values DeepSpeed reads unchecked, DeepSpeed's own parser
    (its pydantic models) key by key, what DeepSpeed accepts but this trainer cannot run, and DeepSpeed's parser
    on the whole."""
    for stage in (structure_problems, hand_parsed_problems, deepspeed_problems, trainer_problems,
                  whole_config_problems):
        try:
            found = stage(ds_config, path)
        except Refused as e:  # a block DeepSpeed's parser refuses where a check reads it: one line, never a traceback
            found = _error_lines(path, e.key, e.error)
        if found:
            return found
    return []
