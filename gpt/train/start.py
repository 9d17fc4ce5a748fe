"""A run's start, before its first step: prepare(settings) -> Setup, on every rank.

1. preflight: every check that can be made before launch, and what the settings left open, decided. It runs before
   any process group, tensor or file of the run exists, and writes nothing: the output directory (writable, not
   locked by a live run, not an earlier run's unless resuming), the settings (every number in range, the DeepSpeed
   JSON, the model's shape, the token budget, the shards, --init_from), the defaults that depend on the run
   (torch.compile, warmup, --micro_batch auto by the memory planner), whether the model's states fit the device at
   all, the checkpoint to resume from and how it loads (gpt/train/resume.py), the disk space, HellaSwag. Bad input
   raises BadInput listing every problem it found, one per line; setup exits on it (gpt.console).
2. setup: rank 0 takes out_dir's run lock (gpt/train/run_lock.py) and converts a checkpoint to resume on another
   layout; every rank joins the process group (gpt/runtime/ranks.py).
3. --micro_batch auto's size: on a resume of the same run on a like device the checkpoint's, else on a GPU the
   probe's by real steps on throwaway engines (gpt.train.engine.new_engine, as the run builds its own, so that the
   probe measures the step the run takes); and the first step's fallback to a smaller size."""
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from gpt.runtime import accelerator, host, ranks  # first: DeepSpeed imported with its logs on stderr
from gpt.config import ds_checks, ds_config as dsc, hardware, muon_checks
from gpt.config.settings import EVAL_EVERY, GPT3_WARMUP_STEPS, Settings
from gpt.console import BadInput, exit_if, exit_with, launch_problem, launched_rank, launched_world_size, say, say0
from gpt.data import hellaswag
from gpt.data.shards import check_lengths, check_shards, find_shards, fingerprints, unfinished_preparations
from gpt.memory.plan import (GiB, auto_micro_batch, auto_record, model_memory_problem, model_state_bytes,
                             use_expandable_segments)
from gpt.memory.probe import dividing_sizes, probe_micro_batch
from gpt.model.loss import loss_problem, memory_kind
from gpt.model.model import GPT2_VOCAB_SIZE, PADDED_VOCAB_SIZE, GPTConfig, param_count, preset_config
from gpt.train import checkpoint, engine, resume, run_lock, universal
from gpt.train.metrics import profiled_steps_needed
from gpt.train.out_dir import check_fresh_out_dir, check_space, check_writable


@dataclass(frozen=True)
class Setup:
    """What preflight() checked and decided before the process group existed (device and lock: after it)."""
    settings: Settings  # complete: what the flags left open decided, --micro_batch auto planned
    ds_config: dict
    model_config: GPTConfig
    grad_accum: int
    run_config: dict  # what this run's checkpoints record about it
    resume_from: Path | None
    hellaswag_examples: list
    resume_kind: str | None = None  # how resume_from loads: resume.resume_kind
    saved_run_config: dict | None = None  # resume_from's run_config.json, as find_resume read and checked it
    auto_plan: dict | None = None  # --micro_batch auto's plan, which the trainer's probe checks on a GPU
    device: object = None  # the torch.device, once the process group exists (gpt.train.start.setup)
    lock: object = None  # rank 0: the open run.lock file, held until the run ends (gpt/train/run_lock.py)
    peak_flops: tuple = (None, None)  # (FLOP/s per device, its label) for MFU, once the device is known

    @property
    def precision(self):
        """'fp32', 'fp16' or 'bf16': what the DeepSpeed JSON selects."""
        return dsc.precision(self.ds_config)


def prepare(settings):
    """setup(); then --micro_batch auto: on a resume where the size was chosen for this same run and device, that size
    (kept_micro_batch), else on a GPU probe() (on CPU the plan alone decides)."""
    prepared = setup(settings)
    if prepared.auto_plan is None:
        return prepared
    return kept_micro_batch(prepared) or (probe(prepared) if prepared.device.type != "cpu" else prepared)


def setup(settings):
    """Every check before launch (preflight, below), then rank 0 takes out_dir's lock (and converts a
    checkpoint to resume on another layout), and every rank joins the process group."""
    # the device asked for; the world size every plan below is made for, as the group will have it; the port its store
    # will listen on
    exit_if([accelerator.accelerator_problem(), launch_problem(), ranks.master_port_problem(),
             ranks.store_port_problem()], 2)
    world_size = launched_world_size()
    device_type = accelerator.device_type()
    if device_type == "cuda":
        say0(use_expandable_segments())  # before anything starts CUDA's allocator (the planner may)
    try:
        prepared = preflight(settings, world_size, device_type)
    except BadInput as e:
        exit_with(e, 2)
    settings, resume_from, kind = prepared.settings, prepared.resume_from, prepared.resume_kind
    # last: every check before it writes nothing
    lock, refusal = run_lock.lock_out_dir(settings.run.out_dir, settings.checkpoint.resume, resume_from)
    if kind == "universal" and refusal is None and launched_rank() == 0:
        refusal = universal.convert_once(resume_from)  # the other ranks wait for it in the rendezvous below
    if refusal and launched_world_size() == 1:
        exit_with(refusal, 2)
    if device_type == "cuda":
        arch_note = hardware.fix_cuda_arch_list()  # every rank, before DeepSpeed JIT-builds FusedAdam
        if arch_note:
            say0(arch_note)
    elif prepared.precision == "bf16" and launched_rank() == 0:
        warning = hardware.cpu_bf16_warning()
        if warning:
            say(warning, sys.stderr)
    if settings.run.deterministic:
        hardware.make_deterministic(device_type)
    device = ranks.setup_distributed(allow_cpu_fp16=settings.run.cpu_fp16 and prepared.precision == "fp16",
                                    timeout_s=settings.run.collective_timeout)
    if launched_world_size() > 1:  # only rank 0 knows: every rank ends now, not at the collective timeout
        if ranks.mean_over_ranks(torch.tensor(float(refusal is not None), device=device)).item() > 0:
            # Hard: the rank that hosted the group's store may be gone already, and tearing the group down then
            # aborted another node's rank (SIGABRT, `terminate called without an active exception`, in CI).
            exit_with(refusal or "refused by rank 0", 2, hard=True)
    torch.manual_seed(settings.run.seed)  # the same initial weights on every rank
    # MFU is rank 0's to say (on CPU: for the threads this rank was given)
    peak = hardware.peak_flops(device.type, prepared.precision) if ranks.rank() == 0 else (None, None)
    return replace(prepared, device=device, lock=lock, peak_flops=peak)


# -- preflight: every check before launch, and what the settings left open ------------------------------------------

def preflight(settings, world_size, device_type):
    """Check everything that can be checked before launch, and decide what the settings left open; says the
    choices a user may not expect (rank 0). Raises BadInput. Writes nothing."""
    check_writable(settings.run.out_dir, settings.data.dir)
    run_lock.check_unlocked(settings.run.out_dir)
    if not settings.checkpoint.resume:
        check_fresh_out_dir(settings.run.out_dir)  # again under the lock (gpt.train.start); this writes nothing
    resume_from, saved = resume.find_resume(settings)
    decided, notes = resolve_defaults(settings, device_type, saved, world_size)
    for note in notes:
        say0(note)
    given = settings.optimizer
    settings, ds_config, model_config, grad_accum, auto_plan = check_settings(settings, world_size, device_type,
                                                                              decided)
    for note in muon_checks.overridden(given, ds_config, settings.run.ds_config):
        say0(note)
    for warning in unfinished_preparations(settings.data.dir):
        say0(warning, sys.stderr)
    auto = auto_record(model_config, settings.data.seq_len, ds_config, world_size, device_type, settings.model.loss,
                       settings.model.compile, settings.run.deterministic) if auto_plan else None
    run_config = run_config_of(settings, ds_config, model_config, world_size, auto)
    kind = None
    if resume_from is not None:
        kind = resume.plan_resume(resume_from, saved, run_config, settings)
        problem = muon_checks.resume_problem(resume_from, saved, run_config, kind)
        if problem:
            raise BadInput(problem)
        if kind == "universal":
            converted = (resume_from / universal.UNIVERSAL).is_dir()  # by an earlier resume: reused
            problem = None if converted else universal.convert_problem(resume_from)
            if problem:
                raise BadInput(problem)
            ds_config = {**ds_config, "checkpoint": {**ds_config.get("checkpoint", {}), "load_universal": True}}
    check_space(settings.run.out_dir, resume_from)
    examples = hellaswag.load(settings.evaluation.hellaswag) if settings.evaluation.hellaswag else []
    return Setup(settings=settings, ds_config=ds_config, model_config=model_config, grad_accum=grad_accum,
                 run_config=run_config, resume_from=resume_from, resume_kind=kind, saved_run_config=saved,
                 hellaswag_examples=examples, auto_plan=auto_plan)


def resolve_defaults(settings, device_type, saved=None, world_size=1):
    """Decide what the flags left open and the run decides: torch.compile by device; HellaSwag's interval; the warmup
    by run length, or as the checkpoint resumed from (`saved`, its run config) had it, since its default depends on
    --max_steps, which a resume may raise; and --micro_batch auto as an old checkpoint was saved with, on the same
    world size (before FORMAT 2 its data order depended on the micro-batch; else the planner decides, in
    check_settings, which writes all of it into the settings at once). Returns ({flag: value}, one log line per
    choice a user may not expect)."""
    notes, compile, warmup_steps = [], settings.model.compile, settings.optimizer.warmup_steps
    micro_batch = settings.data.micro_batch
    if compile is None:
        compile = device_type == "cuda"  # +37% tokens/s on an H100; on CPU it gained <= 7%
        if compile:
            notes.append("torch.compile on (the default with CUDA; --no-compile turns it off)")
    if warmup_steps is None and saved:
        warmup_steps = saved["args"]["warmup_steps"]
    if warmup_steps is None:
        warmup_steps = GPT3_WARMUP_STEPS
        if 0 < settings.optimizer.max_steps < GPT3_WARMUP_STEPS:  # a short trial run: keep the warmup a tenth of it
            warmup_steps = settings.optimizer.max_steps // 10
            notes.append(f"--warmup_steps {warmup_steps}: --max_steps {settings.optimizer.max_steps} is below the "
                         f"default warmup of {GPT3_WARMUP_STEPS}, so the warmup is a tenth of the run")
    if (micro_batch == "auto" and saved and saved["world_size"] == world_size
            and resume.format_of(saved) < checkpoint.FORMAT):
        micro_batch = saved["args"]["micro_batch"]
        notes.append(f"--micro_batch auto: {micro_batch}, as the checkpoint was saved with (it is older than "
                     f"data positions that any micro-batch continues)")
    eval_every = EVAL_EVERY if settings.evaluation.eval_every is None else settings.evaluation.eval_every
    return {"compile": compile, "warmup_steps": warmup_steps, "micro_batch": micro_batch,
            "eval_every": eval_every}, notes


def check_settings(settings, world_size, device_type, decided=None):
    """The settings checked, --micro_batch auto planned (the DeepSpeed JSON read once for both), and what the flags
    left open written into them in one step: `decided` (resolve_defaults' choices), --lr and --weight_decay (a Muon
    JSON's recipe, else GPT-3's: gpt.config.muon_checks.flag_values) and the plan's micro-batch.
    Raises BadInput listing every problem. Returns (the settings, the DeepSpeed config, the model's GPTConfig,
    grad_accum, the auto plan or None)."""
    decided = dict(decided or {})
    problems = number_problems(settings)
    if problems:  # the checks below assume sane numbers
        raise BadInput("\n".join(problems))
    ds_config, problems = read_ds_config(settings, device_type)
    decided.update(muon_checks.flag_values(settings.optimizer, ds_config))  # --lr, --weight_decay: a Muon JSON's
    config = model_config(settings)
    problems += config.problems(settings.data.seq_len, settings.model.preset) + flag_problems(settings, config, decided)
    auto_plan = None
    if decided.get("micro_batch", settings.data.micro_batch) == "auto" and not problems:  # needs a sound JSON, shape
        auto_plan = plan_micro_batch(settings, config, ds_config, world_size, device_type,
                                     decided.get("compile", settings.model.compile))
        decided["micro_batch"] = auto_plan["micro_batch"]
    settings = settings.replace(**decided)  # the one rewrite: from here on, the run's settings
    grad_accum = None
    if settings.data.micro_batch != "auto":
        try:
            grad_accum = gradient_accumulation(settings.data, world_size)
        except BadInput as e:
            problems.append(str(e))
    problems += input_problems(settings, config, grad_accum, world_size)
    if problems:
        raise BadInput("\n".join(problems))
    too_large = model_memory_problem(model_flags(settings), config, ds_config, world_size, device_type)
    if too_large:
        raise BadInput(too_large)
    return settings, ds_config, config, grad_accum, auto_plan


def number_problems(settings):
    """Every field in its range and passing its own check (each section's, gpt/config/settings.py), then what crosses
    sections: one line each. (A NaN learning rate used to train, exit 0 and save NaN weights as `latest`.)"""
    problems = settings.problems()
    if settings.evaluation.val_every and 1 <= settings.evaluation.val_tokens < settings.data.seq_len:
        problems.append(f"--val_tokens {settings.evaluation.val_tokens} is less than one sequence "
                        f"(--seq_len {settings.data.seq_len}); "
                        f"turn validation off with --val_every 0")
    return problems


def read_ds_config(settings, device_type):
    """(the DeepSpeed JSON, its problems for this run: one line each)."""
    try:
        ds_config = dsc.load(settings.run.ds_config)
    except BadInput as e:
        return None, [str(e)]
    problems = (ds_checks.problems(ds_config, settings.run.ds_config)
                or ds_checks.output_problems(ds_config, settings.run.ds_config))
    if problems:
        return ds_config, problems
    if device_type == "cpu" and dsc.precision(ds_config) == "fp16" and not settings.run.cpu_fp16:
        problems.append(f"{settings.run.ds_config}: fp16 on a CPU, which DeepSpeed's CPU accelerator lacks: use "
                        f"ds_configs/zero2_fp32.json, or --cpu_fp16 to emulate fp16 (to test loss scaling)")
    skip_grad_z = settings.optimizer.skip_grad_z
    problems += [p for p in [loss_problem(settings.model.loss, device_type, dsc.precision(ds_config)),
                             dsc.builds_an_op(ds_config) and host.extensions_dir_problem(),
                             guard_problem(settings, ds_config),
                             muon_checks.guard_problem(skip_grad_z, ds_config, settings.run.ds_config)] if p]
    return ds_config, problems


def guard_problem(settings, ds_config):
    """--skip_grad_z acts on the gradient norm DeepSpeed measures: with compute_grad_norm false (in any spelling
    DeepSpeed reads as false: 0, "false", "no", ...) there is none, and the guard could never act."""
    if settings.optimizer.skip_grad_z and not dsc.zero_config(ds_config).compute_grad_norm:
        return (f"--skip_grad_z {settings.optimizer.skip_grad_z:g}: {settings.run.ds_config} sets "
                f"zero_optimization.compute_grad_norm false, so DeepSpeed measures no gradient norm for it to act on: "
                f"drop one of them")
    return None


def model_config(settings):
    """The model's GPTConfig: the preset with the settings' overrides."""
    model = settings.model
    return preset_config(model.preset, model.n_layer, model.n_embd, model.n_head, model.vocab_size)


def flag_problems(settings, config, decided):
    """Flags that do not fit together: HellaSwag on another vocabulary, a profile longer than the run, --eval_every
    without --hellaswag, a warmup longer than the run (as `decided` will set it) or a wsd cooldown that starts inside
    it, --target_val_loss without validation."""
    problems = []
    if config.vocab_size > 0 and config.vocab_size < GPT2_VOCAB_SIZE and settings.evaluation.hellaswag:
        problems.append(f"--hellaswag needs GPT-2's vocabulary: --vocab_size {config.vocab_size} < {GPT2_VOCAB_SIZE}")
    if settings.optimizer.max_steps < profiled_steps_needed(settings.run.profile):
        problems.append(f"--profile {settings.run.profile} needs --max_steps >= "
                        f"{profiled_steps_needed(settings.run.profile)} (1 skipped, 1 warm-up and {settings.run.profile} "
                        f"recorded steps); --max_steps is {settings.optimizer.max_steps}")
    if settings.evaluation.eval_every is not None and not settings.evaluation.hellaswag:  # given: ignored otherwise
        problems.append("--eval_every applies to --hellaswag, which is not given")
    warmup_steps = decided.get("warmup_steps", settings.optimizer.warmup_steps)
    if warmup_steps < 0 or warmup_steps > settings.optimizer.max_steps:
        problems.append(f"--warmup_steps {warmup_steps} must lie in [0, --max_steps {settings.optimizer.max_steps}]")
    else:  # a wsd cooldown that does not fit after the warmup
        schedule = replace(engine.OptimizerSettings.of(settings.optimizer), warmup_steps=warmup_steps).schedule
        problems += [p for p in [schedule.problem()] if p]
    if settings.evaluation.target_val_loss is not None and not settings.evaluation.val_every:
        problems.append(f"--target_val_loss {settings.evaluation.target_val_loss} needs a validation loss: "
                        f"--val_every is 0")
    return problems


def input_problems(settings, config, grad_accum, world_size):
    """What the flags name, read: --reset_data_position needs a resume, --init_from's weights fit the model, the shards'
    ids fit the vocabulary and their length the batch (grad_accum None: the micro-batch is not known yet)."""
    problems = []
    if settings.data.reset_data_position and not settings.checkpoint.resume:
        problems.append("--reset_data_position applies to --resume, which is not given")
    if settings.checkpoint.init_from:
        from gpt.train.hf import check_hf_matches  # transformers-free, but only --init_from needs it
        try:
            check_hf_matches(settings.checkpoint.init_from, config)
        except BadInput as e:
            problems.append(str(e))
    try:
        check_shards(settings.data.dir, config.real_vocab_size)  # a padded id would have an infinite loss
        if grad_accum:
            check_lengths(settings.data.dir, settings.data.seq_len, settings.data.micro_batch * world_size,
                          settings.evaluation.val_every > 0)
    except BadInput as e:
        problems.append(str(e))
    return problems


def plan_micro_batch(settings, config, ds_config, world_size, device_type, compile):
    """--micro_batch auto: the planner's plan for the step the run takes (compiled or not); says it (rank 0)."""
    try:
        plan, text = auto_micro_batch(config, settings.data.seq_len, ds_config, world_size,
                                      settings.data.total_batch_tokens, device_type, memory_kind(settings.model.loss),
                                      compile)
    except BadInput as e:
        raise BadInput(f"--micro_batch auto: {e}") from None
    say0(text)
    return plan


def gradient_accumulation(data, world_size):
    """The micro-steps per optimizer step for the data section's batch on world_size ranks."""
    tokens_per_micro_step = data.micro_batch * data.seq_len * world_size
    if data.total_batch_tokens % tokens_per_micro_step:
        raise BadInput(
            f"--total_batch_tokens {data.total_batch_tokens} is not divisible by micro_batch x seq_len x world "
            f"= {data.micro_batch} x {data.seq_len} x {world_size} = {tokens_per_micro_step}")
    return data.total_batch_tokens // tokens_per_micro_step


def model_flags(settings):
    """The flags that chose the model's shape, as given: '--model tiny --vocab_size 1000000000000'."""
    given = [f"--{name} {getattr(settings.model, name)}" for name in ("n_layer", "n_embd", "n_head")
             if getattr(settings.model, name) is not None]
    if settings.model.vocab_size != PADDED_VOCAB_SIZE:
        given.append(f"--vocab_size {settings.model.vocab_size}")
    return " ".join([f"--model {settings.model.preset}", *given])


AUTO = "micro_batch_auto"  # run_config's key for gpt.memory.plan.auto_record, when --micro_batch auto chose the size

def run_config_of(settings, ds_config, model_config, world_size, auto=None):
    """What a checkpoint records about the run that wrote it; the train shards' fingerprints let the next
    resume see, before launch, whether its data position still points into the same tokens; `auto`: what
    --micro_batch auto's choice depended on, when it chose the micro-batch."""
    return {"format": checkpoint.FORMAT, "model": asdict(model_config), "precision": dsc.precision(ds_config),
            "zero_stage": dsc.zero_stage(ds_config), "world_size": world_size, "args": settings.recorded(),
            "data": fingerprints(find_shards(settings.data.dir, "train")), **({AUTO: auto} if auto else {}),
            **muon_checks.recorded(ds_config)}


def validate(settings, world_size, device_type="cpu"):
    """check_settings with the defaults decided as a fresh run decides them: (the settings so decided, ds_config,
    model_config, grad_accum)."""
    return check_settings(settings, world_size, device_type, resolve_defaults(settings, device_type)[0])[:4]


# -- --micro_batch auto after the process group exists --------------------------------------------------------------

def kept_micro_batch(setup):
    """--micro_batch auto resuming a checkpoint whose micro-batch auto chose for what this run is, on a device like
    this one (run_config's AUTO records equal: gpt.memory.plan.auto_record): the setup at that size, when it still
    divides the token budget within the plan, else None. No probe then, and the resumed run takes the steps the
    interrupted one would have taken: a probe or the plan may choose otherwise today (free memory, a first step's
    fallback, free RAM on CPU). Every rank must agree (one collective); the first step's fallback still applies."""
    saved = setup.saved_run_config or {}
    size, data, record = saved.get("args", {}).get("micro_batch"), setup.settings.data, setup.run_config.get(AUTO)
    fits = dividing_sizes(data.total_batch_tokens, data.seq_len, ranks.world_size(), setup.auto_plan["micro_batch"])
    if not ranks.on_every_rank(record is not None and saved.get(AUTO) == record and size in fits, setup.device):
        return None
    setup = with_micro_batch(setup, size)
    say0(f"--micro_batch auto: kept micro_batch {size} x grad_accum {setup.grad_accum}, which the checkpoint's run "
         f"chose for this same run on {record['device']}")
    return setup


def probe(setup):
    """--micro_batch auto on a GPU: one real step at the planned micro-batch on a throwaway engine built as the
    run's (compiled when the run compiles), smaller sizes that divide the token budget tried on out-of-memory
    (gpt/memory/probe.py). Returns the setup at the largest that fits."""
    settings, plan, world_size = setup.settings, setup.auto_plan, ranks.world_size()
    data = settings.data
    candidates = dividing_sizes(data.total_batch_tokens, data.seq_len, world_size, plan["micro_batch"])

    def throwaway_engine(micro_batch):
        forget_compiled_code(setup)  # each size compiled for its static shape, as the run will be
        return engine.new_engine(setup, micro_batch, 1, initial_weights=False)[0]

    probed = probe_micro_batch(throwaway_engine, candidates, settings.data.seq_len, setup.model_config.vocab_size,
                               setup.device, log=say0)
    torch.manual_seed(settings.run.seed)  # the probe drew random numbers: the same initial weights as without it
    forget_compiled_code(setup)
    if probed is None:
        exit_with(f"--micro_batch auto: even micro-batch {candidates[0]} runs out of memory on this GPU; use ZeRO-2, "
                  f"activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more GPUs", 2)
    setup = with_micro_batch(setup, probed)
    say0(f"--micro_batch auto: planned {plan['micro_batch']} (largest fitting the plan: {plan['max_micro_batch']}), "
         f"probed {probed}: micro_batch {probed} x grad_accum {setup.grad_accum}")
    return setup


def smaller_micro_batch(setup):
    """--micro_batch auto after its size ran out of memory in the run's first step on every rank: the setup at the
    next smaller size that divides the token budget, said in one line; exits when there is none."""
    settings = setup.settings
    data = settings.data
    smaller = dividing_sizes(data.total_batch_tokens, data.seq_len, ranks.world_size(), data.micro_batch - 1)
    if not smaller:
        exit_with(f"--micro_batch auto: even micro-batch {data.micro_batch} ran out of memory in the run's first "
                  f"step; use ZeRO-2, activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more "
                  f"GPUs", 1, every_rank=True)
    say0(f"--micro_batch auto: micro-batch {settings.data.micro_batch} ran out of memory in the run's first step; "
         f"falling back to {smaller[-1]}")
    torch.manual_seed(settings.run.seed)  # the same initial weights as a run started at that size
    forget_compiled_code(setup)
    return with_micro_batch(setup, smaller[-1])


def with_micro_batch(setup, micro_batch):
    """The setup at another micro-batch: its accumulation and run config follow."""
    settings, world_size = setup.settings.replace(micro_batch=micro_batch), ranks.world_size()
    return replace(setup, settings=settings, grad_accum=gradient_accumulation(settings.data, world_size),
                   run_config=run_config_of(settings, setup.ds_config, setup.model_config, world_size,
                                            setup.run_config.get(AUTO)))


def forget_compiled_code(setup):
    """Drop torch.compile's graphs after steps at another micro-batch (a probe's, a first step that ran out of
    memory), so that the next engine compiles for its own static shapes, not a dynamic batch dimension."""
    if setup.settings.model.compile:
        engine.forget_compiled_code()


def out_of_memory_message(setup, error):
    """One line for an allocation that failed while the model and its engine were built: the model, what its
    states need per rank (the planner's count), what to do, and the allocator's own first line."""
    n_params = param_count(setup.model_config)
    need = sum(model_state_bytes(n_params, dsc.precision(setup.ds_config), dsc.zero_stage(setup.ds_config),
                                 ranks.world_size(), setup.ds_config, setup.model_config).values())
    reason = (str(error).splitlines() or [type(error).__name__])[0][:200]
    return (f"out of memory building the model and its DeepSpeed engine ({model_flags(setup.settings)}: "
            f"{n_params:.3g} parameters, whose weights, gradients and optimizer states need {need / GiB:,.1f} GiB per "
            f"rank): choose a smaller model, more ranks with ZeRO 1 or 2, or a device with more memory ({reason})")
