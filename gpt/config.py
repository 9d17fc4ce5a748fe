"""Run settings: the command line, read into a typed Settings, and one validation pass that reports
every problem.

Derived values (model shape, gradient accumulation) are computed here, once, before any process group
or tensor exists, so bad input fails fast with a message instead of deep inside a worker.
"""
import argparse
import os
from dataclasses import asdict, dataclass, replace

from gpt import ds_config as dsc
from gpt.args import Parser, range_problems, seed_problem
from gpt.data import DataError, check_lengths, check_shards
from gpt.model import GPT2_VOCAB_SIZE, PADDED_VOCAB_SIZE, PRESETS
from gpt.loss import LOSS_CHOICES, liger_problem
from gpt.optim import OptimizerSettings
from gpt.profiling import profiled_steps_needed

GPT3_TOKENS_PER_STEP = 524288  # 2**19 ~ 0.5M tokens per optimizer step (GPT-3 paper, 125M row)
GPT3_WARMUP_STEPS = 715  # 375M tokens of warmup (GPT-3 paper) at 0.5M tokens per step


class ConfigError(ValueError):
    """One or more problems with the run's settings, one per line."""


@dataclass(frozen=True)
class Settings:
    """A run's settings, one field per flag of build_parser() (which holds the defaults and the help).
    parse() reads them; resolve_defaults() and --micro_batch auto (gpt.plan) fill the three left open."""
    ds_config: str
    model: str
    n_layer: int | None
    n_embd: int | None
    n_head: int | None
    vocab_size: int
    seq_len: int
    micro_batch: int | str  # 'auto' until the planner picks it
    total_batch_tokens: int
    max_steps: int
    lr: float
    warmup_steps: int | None  # None until resolve_defaults
    min_lr_ratio: float
    weight_decay: float
    data: str
    out_dir: str
    val_every: int
    val_tokens: int
    hellaswag: str | None
    eval_every: int
    sample_every: int
    sample_tokens: int
    seed: int
    save_every: int
    keep_last: int
    keep_every: int
    resume: str | None
    reset_data_position: bool
    init_from: str | None
    skip_loss_z: float
    skip_grad_z: float
    max_bad_steps: int
    compile: bool | None  # None until resolve_defaults
    loss: str
    deterministic: bool
    profile: int
    cpu_fp16: bool
    collective_timeout: float
    local_rank: int

    @property
    def model_config(self):
        return model_config(self.model, self.n_layer, self.n_embd, self.n_head, self.vocab_size)

    @property
    def optimizer(self):
        return OptimizerSettings(self.lr, self.weight_decay, self.warmup_steps, self.max_steps, self.min_lr_ratio)

    def recorded(self):
        """The settings as a checkpoint records them: all but the launcher's local rank."""
        return {k: v for k, v in asdict(self).items() if k != "local_rank"}


def parse(argv=None):
    """The command line (sys.argv without argv) as Settings; argparse exits on malformed flags."""
    return Settings(**vars(build_parser().parse_args(argv)))


def build_parser():
    p = Parser(description="Pretrain GPT-2 with DeepSpeed.", error_status=2)
    p.add_argument("--ds_config", default="ds_configs/zero1_bf16.json", help="DeepSpeed JSON (ds_configs/)")
    add_model_arguments(p)
    p.add_argument("--vocab_size", type=int, default=PADDED_VOCAB_SIZE,
                   help="GPT-2's 50257 padded to a multiple of 128; smaller only for data from a smaller tokenizer")
    p.add_argument("--seq_len", type=int, default=1024, help="tokens per sequence (<= block_size)")
    p.add_argument("--micro_batch", type=micro_batch_arg, default=16,
                   help="sequences per rank per forward pass, or 'auto': the memory planner's choice for this device")
    p.add_argument("--total_batch_tokens", type=int, default=GPT3_TOKENS_PER_STEP,
                   help="tokens per optimizer step over all ranks; sets gradient accumulation")
    p.add_argument("--max_steps", type=int, default=19073, help="optimizer steps (19073 x 0.5M = 10B tokens)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    p.add_argument("--warmup_steps", type=int, default=None,
                   help=f"linear warmup steps (default {GPT3_WARMUP_STEPS}, or max_steps // 10 for shorter runs)")
    p.add_argument("--min_lr_ratio", type=float, default=0.1, help="cosine decays to lr x this")
    p.add_argument("--weight_decay", type=float, default=0.1, help="on matrices and embeddings only")
    p.add_argument("--data", default="data/shakespeare", help="directory of *_train_*.bin / *_val_*.bin shards")
    p.add_argument("--out_dir", default="runs/dsgpt", help="TensorBoard events and metrics.jsonl")
    p.add_argument("--val_every", type=int, default=250, help="validation loss every N steps (0: off)")
    p.add_argument("--val_tokens", type=int, default=10 * 2**20,
                   help="validation set size: the first val_tokens // seq_len sequences of the val split")
    p.add_argument("--hellaswag", default=None,
                   help="HellaSwag jsonl, llm.c hellaswag_val.bin, or 'val' (download) to score during training")
    p.add_argument("--eval_every", type=int, default=250, help="HellaSwag every N steps (with --hellaswag)")
    p.add_argument("--sample_every", type=int, default=1000, help="print samples every N steps (0: off)")
    p.add_argument("--sample_tokens", type=int, default=64, help="new tokens per sample")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--save_every", type=int, default=1000, help="checkpoint every N steps (0: only at the end)")
    p.add_argument("--keep_last", type=int, default=3, help="keep the newest N checkpoints")
    p.add_argument("--keep_every", type=int, default=0, help="also keep every checkpoint whose step is a multiple of N")
    p.add_argument("--resume", default=None,
                   help="'auto' (newest complete checkpoint in --out_dir; none: fresh start) or a checkpoint path")
    p.add_argument("--reset_data_position", action="store_true",
                   help="with --resume: continue from the start of the next epoch instead of the saved data position "
                        "(which is refused when the train shards, --seq_len or --seed changed since the save)")
    p.add_argument("--init_from", default=None,
                   help="a Hugging Face GPT-2 directory (config.json + weights) to start from, e.g. OpenAI's GPT-2")
    p.add_argument("--skip_loss_z", type=float, default=0.0,
                   help="skip the update when the loss is this many sigmas above the recent window (0: off)")
    p.add_argument("--skip_grad_z", type=float, default=0.0,
                   help="skip the update when the grad norm is this many sigmas above the recent window (0: off)")
    p.add_argument("--max_bad_steps", type=int, default=5, help="stop after this many skipped steps in a row")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on with CUDA, off on CPU)")
    p.add_argument("--loss", default="fused", choices=LOSS_CHOICES,
                   help="fused: lm_head + cross-entropy chunk by chunk, never the full logits (half the memory per "
                        "sequence), with the device's fastest kernel; chunked / liger: that kernel (liger: CUDA bf16); "
                        "classic: full fp32 logits")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic GPU kernels, so that a rerun or resume is bit-exact on GPUs too (CPU always is)")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="torch profiler trace of STEPS steps (after 1 skipped + 1 warm-up) in OUT_DIR/profile (0: off)")
    p.add_argument("--cpu_fp16", action="store_true",
                   help="let fp16 configs run on the CPU accelerator (testing the loss-scaling path); "
                        "refused on GPUs")
    p.add_argument("--collective_timeout", type=float, default=600, metavar="SECONDS",
                   help="how long a rank waits in a collective (all-reduce, barrier) for the others before it fails "
                        "with an error: a node that died stops the survivors after this (DeepSpeed's default: 600)")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="set by the deepspeed launcher")
    return p


def add_model_arguments(parser):
    """The model's shape flags; gpt-plan takes them too."""
    parser.add_argument("--model", default="d12", choices=sorted(PRESETS), help="size preset")
    parser.add_argument("--n_layer", type=int, help="override the preset's layer count")
    parser.add_argument("--n_embd", type=int, help="override the preset's width")
    parser.add_argument("--n_head", type=int, help="override the preset's head count")


def micro_batch_arg(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


def resolve_defaults(settings, device_type):
    """Fill the settings whose default depends on the run: torch.compile by device, the warmup by run
    length. Returns (the settings filled, one log line per choice a user may not expect)."""
    notes, compile, warmup_steps = [], settings.compile, settings.warmup_steps
    if compile is None:
        compile = device_type == "cuda"  # +37% tokens/s on an H100; on CPU it gained <= 7%
        if compile:
            notes.append("torch.compile on (the default with CUDA; --no-compile turns it off)")
    if warmup_steps is None:
        warmup_steps = GPT3_WARMUP_STEPS
        if 0 < settings.max_steps < GPT3_WARMUP_STEPS:  # a short trial run: keep the warmup a tenth of it
            warmup_steps = settings.max_steps // 10
            notes.append(f"--warmup_steps {warmup_steps}: --max_steps {settings.max_steps} is below the default "
                         f"warmup of {GPT3_WARMUP_STEPS}, so the warmup is a tenth of the run")
    return replace(settings, compile=compile, warmup_steps=warmup_steps), notes


def model_config(preset, n_layer=None, n_embd=None, n_head=None, vocab_size=PADDED_VOCAB_SIZE):
    """A preset's GPTConfig with the given overrides (None: the preset's)."""
    overrides = {k: v for k, v in dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head).items() if v is not None}
    return replace(PRESETS[preset], vocab_size=vocab_size, **overrides)


def gradient_accumulation(settings, world_size):
    tokens_per_micro_step = settings.micro_batch * settings.seq_len * world_size
    if settings.total_batch_tokens % tokens_per_micro_step:
        raise ConfigError(
            f"--total_batch_tokens {settings.total_batch_tokens} is not divisible by micro_batch x seq_len x world "
            f"= {settings.micro_batch} x {settings.seq_len} x {world_size} = {tokens_per_micro_step}")
    return settings.total_batch_tokens // tokens_per_micro_step


# Upper bounds: far beyond any real run, they turn a typo (1e20 steps) into an error instead of a run that never ends.
MAX_STEPS = 10**8  # checkpoints are named step_%08d (gpt.checkpoint.TAG_PATTERN): a 9-digit step would go unfound
MAX_TOTAL_BATCH_TOKENS = 2**32  # 4.3B tokens per step, ~270x the largest published batches (16M, Llama 3): hours a step
TOTAL_BATCH_TOKENS_RANGE = ("total_batch_tokens", 1, True, MAX_TOTAL_BATCH_TOKENS,
                            "2**32, hours a step on any hardware")  # gpt-plan's too
MAX_COLLECTIVE_TIMEOUT = 7 * 24 * 3600  # seconds; far beyond, datetime.timedelta overflows
MAX_SAMPLE_TOKENS = 4096  # 4x GPT-2's context; rank 0 samples while the other ranks wait for it at the next collective

# Numeric flags and the least each may be: (name, minimum, whether the minimum itself is allowed[, maximum, why]).
NUMBER_RANGES = [("seq_len", 1, True), TOTAL_BATCH_TOKENS_RANGE,
                 ("max_steps", 1, True, MAX_STEPS, "checkpoint names hold 8 digits"), ("lr", 0, False),
                 ("weight_decay", 0, True), ("skip_loss_z", 0, True), ("skip_grad_z", 0, True),
                 ("max_bad_steps", 1, True), ("save_every", 0, True), ("keep_last", 1, True), ("keep_every", 0, True),
                 ("val_every", 0, True), ("val_tokens", 1, True), ("eval_every", 1, True), ("sample_every", 0, True),
                 ("sample_tokens", 1, True, MAX_SAMPLE_TOKENS, "rank 0 samples while the other ranks wait for it"),
                 ("collective_timeout", 0, False, MAX_COLLECTIVE_TIMEOUT, "seconds: a week"), ("profile", 0, True)]


def number_problems(settings):
    """Every numeric flag finite and in range, and the model's shape positive: one line each. (A NaN
    learning rate used to train, exit 0 and save NaN weights as `latest`.)"""
    problems = range_problems(settings, NUMBER_RANGES)
    if settings.val_every and 1 <= settings.val_tokens < settings.seq_len:
        problems.append(f"--val_tokens {settings.val_tokens} is less than one sequence (--seq_len {settings.seq_len}); "
                        f"turn validation off with --val_every 0")
    if settings.micro_batch != "auto" and settings.micro_batch <= 0:
        problems.append(f"--micro_batch must be positive or 'auto' (got {settings.micro_batch})")
    if seed_problem("--seed", settings.seed):
        problems.append(seed_problem("--seed", settings.seed))
    if not 0 <= settings.min_lr_ratio <= 1:  # also NaN
        problems.append(f"--min_lr_ratio {settings.min_lr_ratio} must lie in [0, 1]")
    for name in ("n_layer", "n_embd", "n_head"):
        value = getattr(settings, name)
        if value is not None and value <= 0:
            problems.append(f"--{name} must be positive (got {value})")
    return problems


def model_flags(settings):
    """The flags that chose the model's shape, as given: '--model tiny --vocab_size 1000000000000'."""
    given = [f"--{name} {getattr(settings, name)}" for name in ("n_layer", "n_embd", "n_head")
             if getattr(settings, name) is not None]
    if settings.vocab_size != PADDED_VOCAB_SIZE:
        given.append(f"--vocab_size {settings.vocab_size}")
    return " ".join([f"--model {settings.model}", *given])


def validate(settings, world_size, device_type="cpu"):
    """Check everything that can be checked before launch; raise one ConfigError listing every problem.
    Returns (ds_config, model_config, grad_accum)."""
    problems, ds_config, grad_accum, config_problems = number_problems(settings), None, None, True
    if problems:  # the checks below assume sane numbers
        raise ConfigError("\n".join(problems))
    try:
        ds_config = dsc.load(settings.ds_config)
        config_problems = dsc.problems(ds_config, settings.ds_config) or dsc.output_problems(ds_config,
                                                                                            settings.ds_config)
        problems += config_problems
        if not config_problems and device_type == "cpu" and dsc.precision(ds_config) == "fp16" and not settings.cpu_fp16:
            problems.append(f"{settings.ds_config}: fp16 on a CPU, which DeepSpeed's CPU accelerator lacks: use "
                            f"ds_configs/zero2_fp32.json, or --cpu_fp16 to emulate fp16 (to test loss scaling)")
    except dsc.DeepSpeedConfigError as e:
        problems.append(str(e))
    if settings.loss == "liger" and not config_problems:  # the JSON read and sound
        problems += [p for p in [liger_problem(device_type, dsc.precision(ds_config))] if p]
    mconfig = settings.model_config
    if mconfig.n_embd % mconfig.n_head:
        problems.append(f"n_embd {mconfig.n_embd} is not divisible by n_head {mconfig.n_head}")
    if settings.seq_len > mconfig.block_size:
        problems.append(f"--seq_len {settings.seq_len} exceeds the model's block_size {mconfig.block_size} ({settings.model})")
    if mconfig.vocab_size <= 0:  # smaller than GPT-2's is fine for other tokenizers: check_shards checks the ids
        problems.append(f"--vocab_size must be positive (got {mconfig.vocab_size})")
    elif mconfig.vocab_size < GPT2_VOCAB_SIZE and settings.hellaswag:
        problems.append(f"--hellaswag needs GPT-2's vocabulary: --vocab_size {mconfig.vocab_size} < {GPT2_VOCAB_SIZE}")
    if settings.max_steps < profiled_steps_needed(settings.profile):
        problems.append(f"--profile {settings.profile} needs --max_steps >= {profiled_steps_needed(settings.profile)} "
                        f"(1 skipped, 1 warm-up and {settings.profile} recorded steps); --max_steps is {settings.max_steps}")
    if settings.warmup_steps < 0 or settings.warmup_steps > settings.max_steps:
        problems.append(f"--warmup_steps {settings.warmup_steps} must lie in [0, --max_steps {settings.max_steps}]")
    try:
        grad_accum = gradient_accumulation(settings, world_size)
    except ConfigError as e:
        problems.append(str(e))
    if settings.reset_data_position and not settings.resume:
        problems.append("--reset_data_position applies to --resume, which is not given")
    if settings.init_from:
        from gpt.hf import InteropError, check_hf_matches
        try:
            check_hf_matches(settings.init_from, mconfig)
        except InteropError as e:
            problems.append(str(e))
    try:
        check_shards(settings.data, mconfig.vocab_size)
        if grad_accum:
            check_lengths(settings.data, settings.seq_len, settings.micro_batch * world_size, settings.val_every > 0)
    except DataError as e:
        problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    return ds_config, mconfig, grad_accum
