"""A training run's settings, each defined once: a field of one of Settings' sections, whose metadata holds its help
text and its checks (the range it must lie in, and a check where a range does not say enough). The command line is
generated from the fields (train_ds.py, with add_setting_arguments below), and each section checks its own fields
(Section.problems; gpt/train/start.py's preflight adds what crosses sections). Imports nothing from the project, so
that anything may read a run's settings without the trainer's dependencies."""
import argparse
import math
import os
from dataclasses import dataclass, field, fields

GPT3_TOKENS_PER_STEP = 524288  # 2**19 ~ 0.5M tokens per optimizer step (GPT-3 paper, 125M row)
GPT3_WARMUP_STEPS = 715  # 375M tokens of warmup (GPT-3 paper) at 0.5M tokens per step
GPT3_LR, GPT3_WEIGHT_DECAY = 6e-4, 0.1  # GPT-3 small's peak learning rate and weight decay (--lr's, --weight_decay's)
EVAL_EVERY = 250  # steps between HellaSwag evaluations with --hellaswag, as build-nanogpt
# GPT-2's 50257 padded to a multiple of 128: gpt.model.model.PADDED_VOCAB_SIZE, which tests/unit/test_settings.py keeps equal.
PADDED_VOCAB_SIZE = 50304

# Upper bounds: far beyond any real run, they turn a typo (1e20 steps) into an error instead of a run that never ends.
MAX_STEPS = 10**8  # checkpoints are named step_%08d (gpt.train.checkpoint.TAG_PATTERN): a 9-digit step would go unfound
MAX_TOTAL_BATCH_TOKENS = 2**32  # 4.3B tokens per step, ~270x the largest published batches (16M, Llama 3): hours a step
MAX_COLLECTIVE_TIMEOUT = 7 * 24 * 3600  # seconds; far beyond, datetime.timedelta overflows
MAX_SAMPLE_TOKENS = 4096  # 4x GPT-2's context; rank 0 samples while the other ranks wait for it at the next collective
# --lr_schedule's and --cooldown_shape's names (gpt/train/schedule.py, whose tests keep them equal)
LR_SCHEDULES = ("cosine", "wsd")
COOLDOWN_SHAPES = ("linear", "sqrt")


SEED_LIMIT = 2**63  # numpy's and torch's generators take a seed in [0, 2**63): none negative, none wider


def range_problem(flag, value, least, inclusive, most=None, why=None):
    """'--flag value must be a finite number >= least' (or > least) when value is out of range, NaN included, and
    '--flag value must be at most most (why)' above an optional upper bound; None when it is in range or unset."""
    if value is None:
        return None
    if not (math.isfinite(value) and (value >= least if inclusive else value > least)):
        return f"--{flag} {value} must be a finite number {'>=' if inclusive else '>'} {least}"
    if most is not None and value > most:
        return f"--{flag} {value} must be at most {most}" + (f" ({why})" if why else "")
    return None


def range_problems(args, ranges):
    """range_problem for each (name, least, inclusive[, most, why]) of `ranges`, read from args: a command's own
    flags."""
    return [p for name, *bounds in ranges for p in [range_problem(name, getattr(args, name), *bounds)] if p]


def seed_problem(flag, seed):
    """Why `seed` is no seed for torch and numpy, or None."""
    return None if 0 <= seed < SEED_LIMIT else f"{flag} {seed} must lie in [0, 2**63)"


def positive_problem(flag, value):
    """Why an optional shape override is not positive, or None."""
    return None if value is None or value > 0 else f"--{flag} must be positive (got {value})"


def setting(default, help, *, at_least=None, above=None, at_most=None, why=None, check=None, env=None, flag=None,
            **argparse_options):
    """A Settings field: its default (or the environment variable `env`, when set), help text, range (at_least
    or above a bound, optionally at_most with the reason) and `check(flag, value)` -> a problem or None, for what a
    range does not say; argparse's options where the default's type does not say enough (type, action, metavar).
    flag: the command line's name, where it is not the field's."""
    bounds = None
    if at_least is not None or above is not None:
        bounds = (above if at_least is None else at_least, at_least is not None) + \
            ((at_most, why) if at_most is not None else ())
    return field(default=default, metadata={"help": help, "range": bounds, "check": check, "env": env, "flag": flag,
                                            "argparse": argparse_options})


def flag_of(f):
    """A field's command-line name."""
    return f.metadata["flag"] or f.name


def field_problems(f, value):
    """A field's value checked alone: out of its range (NaN included), then its own check."""
    bounds, check = f.metadata["range"], f.metadata["check"]
    return [p for p in (bounds and range_problem(flag_of(f), value, *bounds),
                        check and check(flag_of(f), value)) if p]


class Section:
    """A group of settings that one part of the trainer reads alone (its fields: dataclasses below)."""

    def problems(self):
        """Every field checked alone, one line per problem: all of them rather than a raise at the first (as a
        __post_init__ would), so that a command line with three mistakes is told all three at once."""
        return [p for f in fields(self) for p in field_problems(f, getattr(self, f.name))]


NAME_MAX, PATH_MAX = 255, 4096  # bytes: the longest path component and path Linux's file systems take


def path_arg(text):
    """argparse's type for a path flag (the trainer's and the tools'): refused in one line where a component, or the
    whole, is longer than file systems take, which every look at it fails on (ENAMETOOLONG) before a check could say
    what is wrong."""
    encoded = os.fsencode(text)
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX:
        raise argparse.ArgumentTypeError(f"a path component of {longest} bytes, longer than file systems take "
                                         f"({NAME_MAX}): {text}")
    if len(encoded) > PATH_MAX:
        raise argparse.ArgumentTypeError(f"a path of {len(encoded)} bytes, longer than file systems take "
                                         f"({PATH_MAX}): {text}")
    return text


def micro_batch_arg(text):
    """--micro_batch: a whole number or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


@dataclass(frozen=True)
class ModelSection(Section):
    """The network: its shape (gpt-plan takes these flags too), its loss kernel, torch.compile."""
    # preset (--model): one of gpt.model.model.PRESETS (the parser's choices).
    preset: str = setting("d12", "size preset", flag="model")
    n_layer: int | None = setting(None, "override the preset's layer count", check=positive_problem, type=int)
    n_embd: int | None = setting(None, "override the preset's width", check=positive_problem, type=int)
    n_head: int | None = setting(None, "override the preset's head count", check=positive_problem, type=int)
    vocab_size: int = setting(
        PADDED_VOCAB_SIZE, "GPT-2's 50257 padded to a multiple of 128; smaller only for data from a smaller tokenizer")
    # loss: one of gpt.model.loss.LOSS_CHOICES; the parser's help and choices come from that registry (train_ds.py)
    loss: str = setting("fused", "the loss kernel: fused (the device's fastest) or one of gpt.model.loss.KERNELS")
    compile: bool | None = setting(None, "torch.compile the model (default: on with CUDA, off on CPU)",
                                   action=argparse.BooleanOptionalAction)


@dataclass(frozen=True)
class DataSection(Section):
    """What each step reads: the shards, the sequence length, the batch."""
    dir: str = setting("data/shakespeare", "directory of *_train_*.bin / *_val_*.bin shards", flag="data",
                       type=path_arg)
    seq_len: int = setting(1024, "tokens per sequence (<= block_size)", at_least=1)
    micro_batch: int | str = setting(
        16, "sequences per rank per forward pass, or 'auto': the memory planner's choice for this device",
        check=lambda flag, value: None if value == "auto" or value > 0 else
        f"--{flag} must be positive or 'auto' (got {value})", type=micro_batch_arg)
    total_batch_tokens: int = setting(
        GPT3_TOKENS_PER_STEP, "tokens per optimizer step over all ranks; sets gradient accumulation",
        at_least=1, at_most=MAX_TOTAL_BATCH_TOKENS, why="2**32, hours a step on any hardware")
    reset_data_position: bool = setting(
        False, "with --resume: continue from the start of the next epoch instead of the saved data position "
               "(which is refused when the train shards, --seq_len or --seed changed since the save)")


@dataclass(frozen=True)
class OptimizerSection(Section):
    """The optimizer's schedule and the spike guard: the warmup, cosine or warmup-stable-decay (gpt/train/schedule.py),
    weight decay, skipped updates."""
    max_steps: int = setting(19073, "optimizer steps (19073 x 0.5M = 10B tokens)",
                             at_least=1, at_most=MAX_STEPS, why="checkpoint names hold 8 digits")
    lr: float | None = setting(
        None, f"peak learning rate (default {GPT3_LR:g}; under a Muon JSON the Adam half's, default its "
              f"optimizer.params.adam_lr)", above=0, type=float)
    warmup_steps: int | None = setting(
        None, f"linear warmup steps (default {GPT3_WARMUP_STEPS}, or max_steps // 10 for shorter runs)", type=int)
    min_lr_ratio: float = setting(0.1, "the schedule decays to lr x this (0 allowed)",
                                  check=lambda flag, value: None if 0 <= value <= 1
                                  else f"--{flag} {value} must lie in [0, 1]")  # NaN too
    lr_schedule: str = setting("cosine", "cosine (GPT-3's: decay from the warmup's end) or wsd (warmup-stable-decay: "
                                         "the peak held, then a cooldown over the last --cooldown_frac of the run)",
                               choices=LR_SCHEDULES)
    cooldown_frac: float = setting(0.5, "wsd: the share of --max_steps in the final cooldown, in (0, 1]",
                                   check=lambda flag, value: None if 0 < value <= 1
                                   else f"--{flag} {value} must lie in (0, 1]")  # NaN too
    cooldown_shape: str = setting("linear", "wsd: the cooldown's shape, linear or sqrt (1 - sqrt, Hägele et al. 2024)",
                                  choices=COOLDOWN_SHAPES)
    weight_decay: float | None = setting(
        None, f"on matrices and embeddings only (default {GPT3_WEIGHT_DECAY:g}; under a Muon JSON its "
              f"optimizer.params.weight_decay)", at_least=0, type=float)
    skip_loss_z: float = setting(
        0.0, "skip the update when the loss is this many sigmas above the recent window (0: off)", at_least=0)
    skip_grad_z: float = setting(
        0.0, "skip the update when the grad norm is this many sigmas above the recent window (0: off)", at_least=0)
    max_bad_steps: int = setting(5, "stop after this many skipped steps in a row", at_least=1)


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Where a run starts from and what it keeps: checkpoints, --resume, --init_from."""
    save_every: int = setting(1000, "checkpoint every N steps (0: only at the end)", at_least=0)
    keep_last: int = setting(3, "keep the newest N checkpoints", at_least=1)
    keep_every: int = setting(0, "also keep every checkpoint whose step is a multiple of N", at_least=0)
    resume: str | None = setting(
        None, "'auto' (newest complete checkpoint in --out_dir; none: fresh start) or a checkpoint path",
        type=path_arg)
    init_from: str | None = setting(
        None, "a Hugging Face GPT-2 directory (config.json + weights) to start from, e.g. OpenAI's GPT-2",
        type=path_arg)


@dataclass(frozen=True)
class EvaluationSection(Section):
    """What a run measures besides its loss: validation, HellaSwag, text samples."""
    val_every: int = setting(250, "validation loss every N steps (0: off)", at_least=0)
    val_tokens: int = setting(10 * 2**20, "validation set size: the first val_tokens // seq_len sequences of the "
                                          "val split", at_least=1)
    hellaswag: str | None = setting(
        None, "HellaSwag jsonl, llm.c hellaswag_val.bin, or 'val' (download) to score during training",
        type=path_arg)
    eval_every: int | None = setting(None, f"HellaSwag every N steps (with --hellaswag; default {EVAL_EVERY})",
                                     at_least=1, type=int)
    target_val_loss: float | None = setting(
        None, "stop (saving) at the first validation whose loss is at or below this", above=0, type=float)
    sample_every: int = setting(1000, "print samples every N steps (0: off)", at_least=0)
    sample_tokens: int = setting(64, "new tokens per sample", at_least=1, at_most=MAX_SAMPLE_TOKENS,
                                 why="rank 0 samples while the other ranks wait for it")


@dataclass(frozen=True)
class RunSection(Section):
    """The run as a whole: its DeepSpeed JSON, its directory, seed, determinism, profiling, ranks."""
    ds_config: str = setting("ds_configs/zero1_bf16.json", "DeepSpeed JSON (ds_configs/)", type=path_arg)
    out_dir: str = setting("runs/dsgpt", "metrics.jsonl, checkpoints/, TensorBoard events in tensorboard/NAME/",
                           type=path_arg)
    seed: int = setting(1337, None, check=lambda flag, value: seed_problem(f"--{flag}", value))
    deterministic: bool = setting(
        False, "deterministic GPU kernels, so that a rerun or resume is bit-exact on GPUs too (CPU always is)")
    profile: int = setting(
        0, "torch profiler trace of STEPS steps (after 1 skipped + 1 warm-up) in OUT_DIR/profile (0: off)",
        at_least=0, metavar="STEPS")
    cpu_fp16: bool = setting(False, "let fp16 configs run on the CPU accelerator (testing the loss-scaling path); "
                                    "refused on GPUs")
    collective_timeout: float = setting(
        600, "how long a rank waits in a collective (all-reduce, barrier) for the others before it fails with an "
             "error: a node that died stops the survivors after this (DeepSpeed's default: 600; at least 10: ranks "
             "start seconds apart, and rank 0 alone checksums each checkpoint while the others wait)",
        at_least=10, at_most=MAX_COLLECTIVE_TIMEOUT, why="seconds: a week", metavar="SECONDS", type=float)
    local_rank: int = setting(0, "set by the deepspeed launcher", env="LOCAL_RANK")


@dataclass(frozen=True)
class Settings:
    """A run's settings, in sections that each part of the trainer reads alone (the loader the data section, the
    engine the optimizer's). The command line stays flat: one flag per field, named as the field (`--model` and
    `--data`: model.preset and data.dir). The four left open (None, 'auto') are filled once before launch, by
    gpt.train.start preflight: model.compile, optimizer.warmup_steps and evaluation.eval_every, and data.micro_batch 'auto'
    by the planner."""
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    run: RunSection = field(default_factory=RunSection)

    @classmethod
    def from_flags(cls, **flags):
        """The settings of a flat command line: flag name -> value (the flags not given keep their defaults)."""
        by_section = {}
        for flag, value in flags.items():
            section, name = FLAGS[flag]
            by_section.setdefault(section, {})[name] = value
        return cls(**{section: section_class(**by_section.get(section, {}))
                      for section, section_class in SECTIONS.items()})

    def flags(self):
        """flag name -> value, in the order of --help."""
        return {flag: getattr(getattr(self, section), name) for flag, (section, name) in FLAGS.items()}

    def replace(self, **flags):
        """A copy with these flags changed."""
        return Settings.from_flags(**{**self.flags(), **flags})

    def problems(self):
        """Each section's own problems (Section.problems), one line each; what crosses sections is preflight's."""
        return [p for section in SECTIONS for p in getattr(self, section).problems()]

    def recorded(self):
        """The settings as a checkpoint records them, flat: all but the launcher's local rank."""
        return {k: v for k, v in self.flags().items() if k != "local_rank"}


SECTIONS = {f.name: f.type for f in fields(Settings)}  # section -> its dataclass
# The flags in the order of --help and of what a checkpoint records: the order they had before the sections.
FLAG_ORDER = ("ds_config", "model", "n_layer", "n_embd", "n_head", "vocab_size", "seq_len", "micro_batch",
              "total_batch_tokens", "max_steps", "lr", "warmup_steps", "min_lr_ratio", "lr_schedule", "cooldown_frac",
              "cooldown_shape", "weight_decay", "data", "out_dir", "val_every", "val_tokens", "target_val_loss",
              "hellaswag", "eval_every", "sample_every", "sample_tokens", "seed", "save_every", "keep_last",
              "keep_every", "resume", "reset_data_position", "init_from", "skip_loss_z", "skip_grad_z",
              "max_bad_steps", "compile", "loss", "deterministic", "profile", "cpu_fp16", "collective_timeout",
              "local_rank")
FIELDS = {flag_of(f): (section, f)  # flag -> (section, its field)
          for section, section_class in SECTIONS.items() for f in fields(section_class)}
FLAGS = {flag: (FIELDS[flag][0], FIELDS[flag][1].name) for flag in FLAG_ORDER}  # flag -> (section, field name)
assert FLAGS.keys() == FIELDS.keys(), "FLAG_ORDER names every setting once"


def ranges():
    """(flag, least, whether least itself is allowed[, most, why]) of every setting with a range."""
    return [(flag, *FIELDS[flag][1].metadata["range"]) for flag in FLAGS if FIELDS[flag][1].metadata["range"]]


def range_of(flag):
    """One setting's (flag, least, inclusive[, most, why]), for a tool that takes the same flag (gpt-plan)."""
    return next(r for r in ranges() if r[0] == flag)


def current_default(f, environ=os.environ):
    """A field's default: the environment variable its metadata names (local_rank: LOCAL_RANK) if set, else its own."""
    variable = f.metadata["env"]
    return type(f.default)(environ[variable]) if variable and variable in environ else f.default


def add_setting_arguments(parser, names=None, choices=None, helps=None):
    """A flag per setting, or per setting named: --<flag> with the field's default, help and argparse options; a
    bool defaulting to False is a switch. choices: flag -> allowed values; helps: flag -> its help, where a layer
    above this one knows it better (the loss kernels' registry)."""
    for flag, (_, f) in ((flag, FIELDS[flag]) for flag in FLAGS):
        if names is not None and flag not in names:
            continue
        options = dict(f.metadata["argparse"])
        if f.metadata["help"] is not None:
            options["help"] = (helps or {}).get(flag, f.metadata["help"])
        if flag in (choices or {}):
            options["choices"] = choices[flag]
        if f.default is False and "action" not in options:
            options["action"] = "store_true"
        elif not ({"action", "type"} & options.keys()) and f.default is not None and not isinstance(f.default, str):
            options["type"] = type(f.default)
        parser.add_argument(f"--{flag}", default=current_default(f), **options)
