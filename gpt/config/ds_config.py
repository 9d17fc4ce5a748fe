"""The DeepSpeed JSON: loading it (from any directory, repeated keys and runaway nesting refused), what it selects
(precision, ZeRO stage, activation checkpointing) and DeepSpeed's own parser of a section. The copy filled with what
the run decides: gpt/train/engine.py fill. What the JSON may not hold, checked before launch: gpt/config/ds_checks.py."""
import json
from collections import Counter
from pathlib import Path

from gpt.console import BadInput, regular_file_problem


class _JSONObject(dict):
    """A JSON object that remembers the keys it held more than once (json keeps the last one silently)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.repeated = [key for key, count in Counter(key for key, _ in pairs).items() if count > 1]


def _repeated_keys(value, where=""):
    """Every repeated key in a parsed JSON value, dotted from the top; the value back with plain dicts."""
    if isinstance(value, list):
        found, items = [], []
        for i, item in enumerate(value):
            item_found, item = _repeated_keys(item, f"{where}[{i}]")
            found += item_found
            items.append(item)
        return found, items
    if not isinstance(value, dict):
        return [], value
    dotted = (lambda key: f"{where}.{key}") if where else str
    found, plain = [dotted(key) for key in getattr(value, "repeated", [])], {}
    for key, item in value.items():
        item_found, plain[key] = _repeated_keys(item, dotted(key))
        found += item_found
    return found, plain


MAX_DEPTH = 32  # nesting levels of a DeepSpeed JSON: its deepest blocks (data_efficiency, compression_training) need ~6


def _depth(value):
    """How many levels of objects and arrays `value` nests (0: a scalar), counted without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        value, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(value, (dict, list)) and depth <= MAX_DEPTH:
            todo += [(item, depth + 1) for item in (value.values() if isinstance(value, dict) else value)]
    return deepest


# The shipped configs, beside the gpt package in a clone (an editable install): the defaults name them as
# ds_configs/NAME.json, which a command started outside the repository finds here
SHIPPED = Path(__file__).resolve().parents[2] / "ds_configs"


def shipped_or_given(path):
    """path, or, for a ds_configs/NAME.json that is not there from the current directory, the shipped one."""
    path = Path(path)
    if path.exists() or path.is_symlink() or path.is_absolute() or path.parts[:1] != ("ds_configs",):
        return path
    shipped = SHIPPED.joinpath(*path.parts[1:])
    return shipped if shipped.is_file() else path


def load(path):
    """The DeepSpeed JSON as a dict, or a one-line reason why not (repeated keys included: DeepSpeed would
    take the last one without a word). ds_configs/NAME.json is found from any directory (shipped_or_given)."""
    if not str(path).strip():
        raise BadInput("--ds_config is empty: name a DeepSpeed JSON file")
    path = shipped_or_given(path)
    if path.is_dir():
        raise BadInput(f"{path}: a directory, not a DeepSpeed JSON file")
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"{path}: DeepSpeed config not found")
    if regular_file_problem(path):  # a FIFO would block the read below; a dangling link, say where it points
        raise BadInput(regular_file_problem(path))
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    too_deep = False
    try:
        config = json.loads(text, object_pairs_hook=_JSONObject)
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: invalid JSON ({e})") from None
    except RecursionError:  # json's parser recurses once per level: thousands of levels exhaust Python's stack
        too_deep = True
    if too_deep or _depth(config) > MAX_DEPTH:
        raise BadInput(f"{path}: nested more than {MAX_DEPTH} levels deep (DeepSpeed's deepest blocks "
                       f"need about 6)")
    if not isinstance(config, dict):
        raise BadInput(f"{path}: expected a JSON object")
    repeated, config = _repeated_keys(config)
    if repeated:
        raise BadInput("\n".join(f"{path}: duplicate key '{key}' (DeepSpeed would use the last "
                                              f"one, silently)" for key in repeated))
    return config


class Refused(BadInput):
    """DeepSpeed's own parser refused a block of the JSON (a pydantic ValidationError, or one of its asserts): the
    top-level key and DeepSpeed's error, for the checks to say in one line (gpt/config/ds_checks.py problems)."""

    def __init__(self, key, error):
        super().__init__(f"{key}: {error}")
        self.key, self.error = key, error


def _model(key, read, ds_config):
    """DeepSpeed's model of one block of the JSON, read by DeepSpeed's own function for it; Refused if it refuses."""
    from gpt.runtime import accelerator  # noqa: F401 -- first: DeepSpeed imported with its logs on stderr
    try:
        return read(ds_config)
    except Exception as e:  # noqa: BLE001 -- whatever DeepSpeed raises is the user's JSON's problem
        raise Refused(key, e) from None


# The blocks DeepSpeed reads through pydantic, which takes "true", 1, "yes", "on" for true and "false", 0, "no",
# "off" for false: the checks read these from DeepSpeed's models, so every spelling gets the answer true or false gets
def fp16_config(ds_config):
    """DeepSpeed's reading of the fp16 block (DeepSpeedFP16Config: its defaults filled, its spellings read)."""
    from deepspeed.runtime.precision_config import get_float16_config
    return _model("fp16", get_float16_config, ds_config)


def bf16_config(ds_config):
    """DeepSpeed's reading of the bf16 block, or of its older name `bfloat16` when `bf16` is absent or null."""
    from deepspeed.runtime.precision_config import get_bfloat16_config
    return _model("bf16" if ds_config.get("bf16") is not None else "bfloat16", get_bfloat16_config, ds_config)


def zero_config(ds_config):
    """DeepSpeed's reading of the zero_optimization block (DeepSpeedZeroConfig)."""
    from deepspeed.runtime.zero.config import get_zero_config
    return _model("zero_optimization", get_zero_config, ds_config)


def precision(ds_config):
    """'bf16', 'fp16' or 'fp32' as DeepSpeed will train: the one place that reads the precision blocks."""
    if fp16_config(ds_config).enabled:
        return "fp16"
    return "bf16" if bf16_config(ds_config).enabled else "fp32"


def dtype_name(value):
    """DeepSpeed's canonical name ('fp32', 'fp16', 'bf16', 'int8') for one of the dtype spellings its
    data_types accept ('float32', 'torch.float32', 'float', ...); None for None; the value itself when unknown."""
    from deepspeed.runtime.config import DtypeEnum
    try:
        return DtypeEnum(value).name if value is not None else None
    except (ValueError, TypeError):
        return value


def grad_accum_dtype(ds_config):
    """data_types.grad_accum_dtype as a canonical name (dtype_name), None when unset: the training precision."""
    return dtype_name((ds_config.get("data_types") or {}).get("grad_accum_dtype"))


def zero_stage(ds_config):
    """The ZeRO stage as an int, as DeepSpeed reads it (JSON's 2.0 and "2" are stage 2): run_config.json records it
    in the form its reader accepts on a resume."""
    return int(zero_config(ds_config).stage)


# The optimizer a JSON without an optimizer block gets, as ds_configs/ name it: torch's fused AdamW through DeepSpeed
# (torch_adam), which needs no op built. DeepSpeed's FusedAdam (without torch_adam) is JIT-built at a first start:
# g++ on its CPU accelerator, nvcc on GPUs (docs/configs.md).
DEFAULT_OPTIMIZER = {"type": "AdamW", "params": {"torch_adam": True, "fused": True}}


def builds_an_op(ds_config):
    """Whether DeepSpeed JIT-builds an op to train with this JSON: its FusedAdam, for an optimizer block without
    torch_adam true (offload, which would build CPU Adam, is refused by gpt/config/ds_checks.py)."""
    optimizer = ds_config.get("optimizer", DEFAULT_OPTIMIZER)
    return (optimizer.get("params") or {}).get("torch_adam") is not True


def uses_activation_checkpointing(ds_config):
    """DeepSpeed's `activation_checkpointing` block only configures its checkpoint API; the block's
    presence is our switch to checkpoint every transformer block."""
    return "activation_checkpointing" in ds_config


class _OneRank:
    """DeepSpeedConfig's `mpu`: one data-parallel rank, whether or not a process group exists yet."""

    @staticmethod
    def get_data_parallel_world_size():
        return 1


def deepspeed_config(sections):
    """DeepSpeed's own parsed config (deepspeed.runtime.config.DeepSpeedConfig) of `sections` with a
    placeholder batch triple, before any process group exists; its logger is silenced meanwhile (the engine
    says its warnings once more when it starts)."""
    from gpt.runtime import accelerator  # noqa: F401 -- first: DeepSpeed imported with its logs on stderr
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import logger
    disabled, logger.disabled = logger.disabled, True
    try:
        return DeepSpeedConfig({**sections, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                "train_batch_size": 1}, mpu=_OneRank())
    finally:
        logger.disabled = disabled


def parsed(ds_config, *keys):
    """DeepSpeed's own reading of these top-level keys of a checked JSON (deepspeed_config), for values its
    models coerce ("2" to 2, "no" to false) or fill in (defaults, deprecated aliases such as cpu_offload): the
    monitors' and the profiler's (fp16, bf16, ZeRO: fp16_config, bf16_config, zero_config, without the asserts
    DeepSpeedConfig makes across blocks)."""
    return deepspeed_config({key: ds_config[key] for key in keys if key in ds_config})

