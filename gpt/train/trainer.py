"""The trainer, top-down: setup (gpt/config/preflight.py's checks, the run lock, the process group) -> probe
(--micro_batch auto on a GPU) -> build (engine, data, guard, logger) -> resume -> fit (each step: train, log, the
guard's verdict; then evaluate and save). train(settings) runs them all; train_ds.py is its command line
(gpt/commands/train.py); bench/train.py drives the same steps one at a time."""
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gpt.train import checkpoint, dist, engine as ds_engine, run_lock, universal
from gpt.config import hardware
from gpt.data import hellaswag
from gpt.console import BadInput, exit_with, launched_rank, launched_world_size, say, say0, write_problem
from gpt.data.shards import ShuffledTokenLoader, ValidationSet, find_shards
from gpt.config.ds_config import precision, zero_stage
from gpt.train.evaluate import sample, validation_loss
from gpt.config.hardware import peak_flops
from gpt.train.engine import OptimizerSettings, SpikeGuard, install_grad_norm_hook, lr_at
from gpt.train.hf import load_hf_weights
from gpt.model.loss import compile_model, model_with_loss
from gpt.train.metrics import MetricsLogger, Progress, hparams_of, peak_memory, reset_peak_memory, step_profiler
from gpt.model.model import GPT, param_count
from gpt.config.preflight import gradient_accumulation, model_flags, preflight, run_config_of
from gpt.memory.plan import use_expandable_segments
from gpt.memory.probe import dividing_sizes, is_out_of_memory, on_every_rank, probe_micro_batch, release_memory
from gpt.config.settings import Settings
from gpt.train.stop import StopRequest
from gpt.data.tokenizer import gpt2_tokenizer

SAMPLE_PROMPT = "\n"  # a fresh line: the model writes whatever it has learned to write
LOSS_SCALE_AT_MINIMUM = "Current loss scale already at minimum"


@dataclass
class Run:
    """Everything fit() needs, built once by build()."""
    settings: Settings
    engine: object
    model: GPT
    train_loader: ShuffledTokenLoader
    val_set: ValidationSet | None  # None with --val_every 0
    logger: MetricsLogger
    guard: SpikeGuard
    guard_active: bool  # False: this optimizer has no path to skip an update (ZeRO 0)
    device: torch.device
    world_size: int
    grad_accum: int
    flops_per_step: float
    peak_flops: float
    run_config: dict
    hellaswag_examples: list
    progress: Progress  # the console's step N/M and ETA


class StopTraining(Exception):
    """The run cannot continue; the message says why."""


class DiskProblem(StopTraining):
    """A write failed on a full or read-only disk: on this rank, maybe not on the others."""


class FirstStepOutOfMemory(Exception):
    """--micro_batch auto's size ran out of memory in the run's first step on every rank: build it smaller."""


def setup(settings):
    """Every check before launch (gpt/config/preflight.py), then rank 0 takes out_dir's lock (and converts a checkpoint to
    resume on another layout), and every rank joins the process group."""
    world_size = launched_world_size()
    device_type = dist.device_type()
    if device_type == "cuda":
        say0(use_expandable_segments())  # before anything starts CUDA's allocator (the planner may)
    try:
        prepared = preflight(settings, world_size, device_type)
    except BadInput as e:
        exit_with(e, 2)
    settings, ds_config, resume_from, kind = (prepared.settings, prepared.ds_config, prepared.resume_from,
                                              prepared.resume_kind)
    lock, refusal = lock_out_dir(settings, resume_from)  # last: every check before it writes nothing
    if kind == "universal" and refusal is None and launched_rank() == 0:
        refusal = convert_to_universal(resume_from)  # the other ranks wait for it in the rendezvous below
    if refusal and launched_world_size() == 1:
        exit_with(refusal, 2)
    if device_type == "cuda":
        arch_note = hardware.fix_cuda_arch_list()  # every rank, before DeepSpeed JIT-builds FusedAdam
        if arch_note:
            say0(arch_note)
    elif precision(ds_config) == "bf16" and launched_rank() == 0:
        warning = hardware.cpu_bf16_warning()
        if warning:
            say(warning, sys.stderr)
    if settings.deterministic:
        hardware.make_deterministic(device_type)
    device = dist.setup_distributed(allow_cpu_fp16=settings.cpu_fp16 and precision(ds_config) == "fp16",
                                    timeout_s=settings.collective_timeout)
    if launched_world_size() > 1:  # only rank 0 knows: every rank ends now, not at the collective timeout
        if dist.mean_over_ranks(torch.tensor(float(refusal is not None), device=device)).item() > 0:
            # Hard: the rank that hosted the group's store may be gone already, and tearing the group down then
            # aborted another node's rank (SIGABRT, `terminate called without an active exception`, in CI).
            dist.release_cpu_comm_buffer()  # an atexit handler, which a hard exit skips
            exit_with(refusal or "refused by rank 0", 2, hard=True)
    torch.manual_seed(settings.seed)  # the same initial weights on every rank
    return replace(prepared, device=device, lock=lock)


def lock_out_dir(settings, resume_from):
    """Rank 0 takes out_dir's run lock (gpt/train/run_lock.py), then checks again, under it, that out_dir holds
    nothing this run would overwrite: a run that checked before another took the lock may find it written to
    now. Returns (the lock or None, why this run is refused or None); other ranks take nothing."""
    if launched_rank() != 0:
        return None, None
    try:
        lock = run_lock.acquire(settings.out_dir)
    except BadInput as e:
        return None, e
    try:
        if not settings.resume:
            checkpoint.check_fresh_out_dir(settings.out_dir)
        elif resume_from is not None:
            checkpoint.check_resume_target(resume_from, settings.out_dir)
    except BadInput as e:
        lock.close()
        return None, e
    return lock, None


def convert_to_universal(path):
    """Rank 0, before the process group exists: the checkpoint's universal form for a resume on another world size
    or ZeRO stage (gpt/train/universal.py), converted once and reused. Returns why it failed, or None."""
    target = Path(path) / universal.UNIVERSAL
    if target.is_dir():
        say(f"reusing {target}, converted by an earlier resume")
        return None
    start = time.perf_counter()
    try:
        universal.universal_dir(path)
    except BadInput as e:
        return e
    say(f"converted {path} to DeepSpeed's universal form in {time.perf_counter() - start:.1f}s ({target})")
    return None


def new_model(setup):
    """(the model with the loss the settings chose, the loss's name for the log)."""
    return model_with_loss(setup.model_config, setup.settings.loss, setup.device.type, precision(setup.ds_config))


def new_engine(setup, model, micro_batch, grad_accum):
    """The DeepSpeed engine around model as the run steps it: compiled with --compile (gpt.model.loss.compile_model).
    The probe's throwaway engines are built here too, so that it measures the step the run takes."""
    if setup.settings.compile:
        compile_model(model)
    return ds_engine.initialize(model, setup.ds_config, micro_batch, grad_accum, OptimizerSettings.of(setup.settings))


def with_micro_batch(setup, micro_batch):
    """The setup at another micro-batch: its accumulation and run config follow."""
    settings, world_size = replace(setup.settings, micro_batch=micro_batch), dist.world_size()
    return replace(setup, settings=settings, grad_accum=gradient_accumulation(settings, world_size),
                   run_config=run_config_of(settings, setup.ds_config, setup.model_config, world_size))


def forget_compiled_code(setup):
    """Drop torch.compile's graphs after steps at another micro-batch (a probe's, a first step that ran out of
    memory), so that the next engine compiles for its own static shapes, not a dynamic batch dimension."""
    if setup.settings.compile:
        torch._dynamo.reset()


def probe(setup):
    """--micro_batch auto on a GPU: one real step at the planned micro-batch on a throwaway engine built as
    build() builds the real one (compiled when the run compiles), smaller sizes that divide the token budget
    bisected on out-of-memory (gpt/memory/probe.py). Returns the setup at the largest that fits."""
    settings, plan, world_size = setup.settings, setup.auto_plan, dist.world_size()
    candidates = dividing_sizes(settings.total_batch_tokens, settings.seq_len, world_size, plan["micro_batch"])

    def throwaway_engine(micro_batch):
        forget_compiled_code(setup)  # each size compiled for its static shape, as the run will be
        return new_engine(setup, new_model(setup)[0], micro_batch, 1)

    probed = probe_micro_batch(throwaway_engine, candidates, settings.seq_len, setup.model_config.vocab_size,
                               setup.device, log=say0)
    torch.manual_seed(settings.seed)  # the probe drew random numbers: the same initial weights as without it
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
    smaller = dividing_sizes(settings.total_batch_tokens, settings.seq_len, dist.world_size(), settings.micro_batch - 1)
    if not smaller:
        exit_with(f"--micro_batch auto: even micro-batch {settings.micro_batch} ran out of memory in the run's first "
                  f"step; use ZeRO-2, activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more "
                  f"GPUs", 1, every_rank=True)
    say0(f"--micro_batch auto: micro-batch {settings.micro_batch} ran out of memory in the run's first step; "
         f"falling back to {smaller[-1]}")
    torch.manual_seed(settings.seed)  # the same initial weights as a run started at that size
    forget_compiled_code(setup)
    return with_micro_batch(setup, smaller[-1])


def build(setup):
    settings = setup.settings
    model, loss_label = new_model(setup)
    if settings.init_from:
        model.load_state_dict(load_hf_weights(settings.init_from, setup.model_config))
        say0(f"initial weights from {settings.init_from}")
    engine = new_engine(setup, model, settings.micro_batch, setup.grad_accum)
    rank, world_size = dist.rank(), dist.world_size()
    train_loader = ShuffledTokenLoader(find_shards(settings.data, "train"), settings.micro_batch, settings.seq_len,
                                       rank, world_size, seed=settings.seed,
                                       windows_per_batch=settings.total_batch_tokens // settings.seq_len,
                                       pin_memory=setup.device.type == "cuda")
    val_set = ValidationSet(find_shards(settings.data, "val"), settings.seq_len, settings.val_tokens // settings.seq_len,
                            settings.micro_batch, rank, world_size) if settings.val_every else None
    guard = SpikeGuard(settings.skip_loss_z, settings.skip_grad_z, max_bad_steps=settings.max_bad_steps,
                       fp16=precision(setup.ds_config) == "fp16")
    guard_active = install_grad_norm_hook(engine, guard)
    peak, peak_label = peak_flops(setup.device.type, precision(setup.ds_config))
    logger = MetricsLogger(settings.out_dir, enabled=rank == 0, settings=setup.run_config,
                           hparams=hparams_of(setup.run_config, setup.grad_accum, f"{settings.loss} ({loss_label})"))
    say0(f"model {settings.model}: {model.num_params() / 1e6:.2f}M parameters, {setup.model_config}")
    say0(f"{precision(setup.ds_config)}, ZeRO {engine.zero_optimization_stage()}, "
           f"{type(engine.optimizer).__name__} over {type(engine.basic_optimizer).__name__}, {world_size} rank(s) x "
           f"micro_batch {settings.micro_batch} x seq_len {settings.seq_len} x grad_accum {setup.grad_accum} "
           f"= {settings.total_batch_tokens:,} tokens/step; MFU against {peak_label}")
    say0(f"loss: {settings.loss} ({loss_label})")
    say0(f"data {settings.data}: {len(train_loader.shards)} train shard(s), "
           f"{sum(train_loader.batches_per_shard):,} steps/epoch; "
           + (f"validation on {len(val_set)} sequences of {settings.seq_len} tokens" if val_set else "no validation"))
    return Run(settings=settings, engine=engine, model=model, train_loader=train_loader, val_set=val_set,
               logger=logger, guard=guard, guard_active=guard_active, device=setup.device, world_size=world_size,
               grad_accum=setup.grad_accum,
               flops_per_step=model.flops_per_token(settings.seq_len) * settings.total_batch_tokens,
               peak_flops=peak, run_config=setup.run_config, hellaswag_examples=setup.hellaswag_examples,
               progress=Progress(settings.max_steps))


def resume(run, path, kind):
    """Load a checkpoint the way checkpoint.resume_kind chose; returns the step to continue from. 'exact' (the
    same world size and ZeRO stage): everything, bit-exact on CPU. 'universal', 'whole': another world size or
    stage: all but the RNG. 'weights': the weights only (a checkpoint too old to convert)."""
    if path is None:
        if run.settings.resume:
            say0(f"--resume {run.settings.resume}: no checkpoint in "
                   f"{checkpoint.checkpoint_dir(run.settings.out_dir)}; fresh start")
        return 0
    saved = checkpoint.read_run_config(path)
    if kind == "universal":
        state, rng_problem = universal.load(run.engine, path), None
    else:
        state, rng_problem = checkpoint.load(run.engine, path, load_optimizer_states=kind != "weights",
                                             restore_rng=kind == "exact")
    if kind != "weights":
        ds_engine.replay_adam_step_count(run.engine)  # bit-exact on CPU also from the first resumed step
    if run.engine.global_rank == 0:
        checkpoint.set_aside_damaged(checkpoint.checkpoint_dir(run.settings.out_dir))
    step = state["step"] + 1
    position = resume_data(run, path, state["loader"])
    if rng_problem:
        say(f"warning: [rank {run.engine.global_rank}] {path}: {rng_problem}: this rank's random state was not "
            f"restored, so the run will not repeat an uninterrupted one exactly", sys.stderr)
    every_rng = dist.mean_over_ranks(torch.tensor(0.0 if rng_problem else 1.0, device=run.device)).item() == 1.0
    layout = (f"saved on {saved['world_size']} rank(s) with ZeRO {saved['zero_stage']}, now "
              f"{run.world_size} with ZeRO {run.engine.zero_optimization_stage()}")
    if kind == "weights":
        set_schedule_position(run, step)
        say0(f"resumed from {path} at step {step} with WEIGHTS ONLY ({layout}; saved before checkpoints recorded "
               f"what a conversion needs): optimizer moments restart from zero; schedule; {position}")
        return step
    if kind == "exact":
        loaded = "weights, optimizer, schedule, " + position + " and " + (
            "RNG" if every_rng else "not the RNG of every rank (see the warning)")
    else:
        how = (f"through its universal form, {Path(path) / universal.UNIVERSAL}" if kind == "universal"
               else "ZeRO 0 keeps it whole")
        loaded = (f"weights, fp32 master weights, Adam's moments ({how}), schedule and {position}; not the RNG "
                  f"({layout}: the random states were per rank)")
    say0(f"resumed from {path} at step {step}: {loaded}")
    schedule_changes(run, saved["args"], run.engine.lr_scheduler.last_epoch)
    if saved["args"]["total_batch_tokens"] != run.settings.total_batch_tokens:
        say0(f"--total_batch_tokens {run.settings.total_batch_tokens:,} (the checkpoint's run had "
               f"{saved['args']['total_batch_tokens']:,}): grad_accum {run.grad_accum} from here on")
    return step


def resume_data(run, path, saved):
    """Put the loader where the checkpoint's run would have read next (gpt/data/shards.py: on any world size and
    micro-batch), or with --reset_data_position at the next epoch's start; says which."""
    if run.settings.reset_data_position:
        return f"data from the start of epoch {restart_data(run.train_loader, saved)} (--reset_data_position)"
    try:
        note = run.train_loader.load_state_dict(saved)
    except BadInput as e:  # other shards under --data than the checkpoint's run read
        raise BadInput(f"{path}: cannot resume the data position: {e}") from None
    return note or "data position"


def restart_data(loader, saved):
    """Put the loader at the start of the epoch after the saved one (whatever shards and batch shape it has now);
    returns that epoch."""
    loader.load_state_dict({**loader.state_dict(), "epoch": saved["epoch"] + 1, "batch": 0})
    return saved["epoch"] + 1


SCHEDULE_FLAGS = ("lr", "warmup_steps", "max_steps", "min_lr_ratio")


def set_schedule_position(run, position):
    """The lr schedule of this run's flags, at `position` (its count of updates taken)."""
    scheduler = run.engine.lr_scheduler
    scheduler.base_lrs = [run.settings.lr] * len(scheduler.base_lrs)  # a loaded state brings the saved --lr
    scheduler.last_epoch = position - 1
    scheduler.step()


def schedule_changes(run, saved_args, position):
    """A resume whose schedule flags differ from the checkpoint's run follows the new flags from here on: the
    schedule is a function of (step, --max_steps, ...), so --max_steps 20 after 10 stretches the rest of the
    cosine to end at step 20, instead of keeping the saved lr for one step and then jumping. Said in one line.
    `position`: the loaded scheduler's count of updates (behind the step by the updates skipped)."""
    changed = [f"--{flag} {getattr(run.settings, flag)} (the checkpoint's run had {saved_args[flag]})"
               for flag in SCHEDULE_FLAGS if saved_args[flag] != getattr(run.settings, flag)]
    if not changed:
        return
    set_schedule_position(run, position)
    was = lr_at(position, *(saved_args[flag] for flag in SCHEDULE_FLAGS))
    say0(f"{'; '.join(changed)}: the lr schedule follows the new flags from here on, its cosine decay ending at "
           f"step {run.settings.max_steps}; lr at step {position} is {run.engine.get_lr()[0]:.4g} (was {was:.4g})")


def train_step(run):
    """One optimizer step = grad_accum micro-steps. Returns (loss averaged over micro-steps and ranks,
    whether the update was skipped)."""
    loss_sum = torch.zeros((), device=run.device)
    skip_before = run.engine.skipped_steps
    for micro in range(run.grad_accum):
        x, y = run.train_loader.next_batch()
        _, loss = run.engine(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
        loss_sum += loss.detach()  # stays on device: one host sync per step, below
        if micro == run.grad_accum - 1:
            mean_loss = dist.mean_over_ranks(loss_sum).item() / run.grad_accum
            if run.guard.check_loss(mean_loss):
                if not run.guard_active:
                    raise StopTraining(f"loss {mean_loss} and this optimizer has no skip path (ZeRO 0)")
                loss = loss * float("nan")  # DeepSpeed's overflow path then skips the whole update
        run.engine.backward(loss)
        run.engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
    return mean_loss, run.engine.skipped_steps > skip_before


def log_step(run, step, lr, loss, skipped, dt):
    """The step's metrics to console, TensorBoard and metrics.jsonl (memory: the step's peak)."""
    metrics = dict(loss=loss, lr=lr, dt=dt, tokens_per_s=run.settings.total_batch_tokens / dt,
                   **ds_engine.step_stats(run.engine), skipped=int(skipped), guard_skips=run.guard.skipped,
                   **peak_memory(run.device.type))
    if run.peak_flops:
        metrics["mfu"] = run.flops_per_step / dt / (run.peak_flops * run.world_size)
    run.logger.log(step, metrics, console=f"step {step:5d}/{run.settings.max_steps} | " + " | ".join(
        [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()]
        + [run.progress.step_ended(step, dt)]))


def guard_step(run, step, loss, skipped):
    """The spike guard's verdict on the step just taken: say why an update was skipped; StopTraining
    after too many bad steps in a row."""
    bad = run.guard.end_step(loss, skipped)
    if skipped:
        say0(f"step {step:5d} | update skipped: {run.guard.reason}")
    if bad:
        raise StopTraining(bad)


def first_step(run, step):
    """The run's first optimizer step under --micro_batch auto. Out of memory on every rank raises
    FirstStepOutOfMemory: the size the plan and probe chose did not fit the real step after all. Every rank says
    whether its step fitted (one collective, this step only); ranks run out together (the same shapes and memory)."""
    try:
        optimizer_step(run, step)
        fitted = True
    except Exception as error:  # noqa: BLE001 -- out-of-memory is an answer here; anything else is re-raised
        if not is_out_of_memory(error):
            raise
        fitted = False  # leaving this block drops the error, its traceback and the step's tensors
    if not on_every_rank(fitted, run.device):
        raise FirstStepOutOfMemory


def optimizer_step(run, step):
    """One step as fit takes it: train, log, the guard's verdict. Returns the loss."""
    lr = run.engine.get_lr()[0]
    reset_peak_memory(run.device.type)
    (loss, skipped), seconds = dist.timed_on_device(lambda: train_step(run))
    log_step(run, step, lr, loss, skipped, seconds)
    guard_step(run, step, loss, skipped)
    return loss


def save(run, step):
    settings = run.settings
    if not all(bool(torch.isfinite(p).all()) for p in run.model.parameters()):  # the same on every rank
        raise StopTraining(f"step {step}: the weights are not finite (NaN or inf), so they were not saved")
    client_state = {"step": step, "tokens": (step + 1) * settings.total_batch_tokens,
                    "loader": run.train_loader.state_dict()}
    start = time.perf_counter()
    try:
        path = checkpoint.save(run.engine, settings.out_dir, step, client_state, run.run_config, settings.keep_last,
                               settings.keep_every)
    except (OSError, RuntimeError) as e:  # RuntimeError: DeepSpeed's and torch's C++ writers
        problem = write_problem(checkpoint.checkpoint_dir(settings.out_dir) / checkpoint.tag_for(step), e)
        if problem is None:
            raise
        raise DiskProblem(f"{problem}; that checkpoint is incomplete and will not be loaded") from None
    say0(f"step {step:5d} | saved {path} in {time.perf_counter() - start:.2f}s")


def log_samples(run, step):
    tokenizer = gpt2_tokenizer()
    generator = torch.Generator().manual_seed(run.settings.seed + run.engine.global_rank)  # training RNG untouched
    tokens = sample(run.model, tokenizer.encode_ordinary(SAMPLE_PROMPT), run.settings.sample_tokens, generator,
                    run.device)
    text = tokenizer.decode(tokens)
    say(f"[rank {run.engine.global_rank}] sample at step {step}: {text!r}")
    run.logger.text("samples", text, step)


def fit(run, start_step, stop, auto=False):
    """Train from start_step to --max_steps. auto (--micro_batch auto): the first step may raise
    FirstStepOutOfMemory (first_step)."""
    settings = run.settings
    stop.started()  # from here a stop finishes the step and saves
    profiler = step_profiler(settings.profile, settings.out_dir, run.device.type, run.engine.global_rank)
    for step in range(start_step, settings.max_steps):
        last = step == settings.max_steps - 1
        if auto and step == start_step:
            try:
                first_step(run, step)
            except FirstStepOutOfMemory:
                profiler.stop()
                raise
        else:
            optimizer_step(run, step)
        profiler.step()
        if settings.val_every and (step % settings.val_every == 0 or last):
            val = validation_loss(run.engine, run.val_set, run.device)
            run.logger.log(step, {"val_loss": val}, console=f"step {step:5d} | val_loss {val:.4f}")
        if run.hellaswag_examples and (step % settings.eval_every == 0 or last):
            scores = hellaswag.evaluate(run.engine, run.hellaswag_examples, run.device, run.model.config.block_size,
                                        settings.micro_batch, progress=True)
            run.logger.log(step, {"hellaswag/acc_norm": scores["acc_norm"], "hellaswag/acc": scores["acc"]},
                           console=f"step {step:5d} | hellaswag acc_norm {scores['acc_norm']:.4f} "
                                   f"acc {scores['acc']:.4f} ({scores['examples']} examples)")
        if settings.sample_every and (step % settings.sample_every == 0 or last) and run.engine.global_rank == 0:
            log_samples(run, step)
        stopping = stop.agreed(run.device)
        if last or stopping or (settings.save_every and (step + 1) % settings.save_every == 0):
            save(run, step)
        if stopping:
            say0(f"step {step:5d} | stopped by {stop.requested or 'another rank'}: checkpoint saved, exiting")
            break
    profiler.stop()
    run.train_loader.close()
    run.logger.close(finished=last)


def prepare(settings):
    """setup(), and on a GPU probe() for --micro_batch auto (on CPU the plan alone decides)."""
    prepared = setup(settings)
    return probe(prepared) if prepared.auto_plan and prepared.device.type != "cpu" else prepared


def last_good_checkpoint(settings):
    tags = checkpoint.complete_tags(checkpoint.checkpoint_dir(settings.out_dir))
    return checkpoint.checkpoint_dir(settings.out_dir) / tags[-1] if tags else "none"


def train(settings, stop=None):
    """Train with these settings; exits non-zero with one message when the run cannot go on. stop: the run's
    StopRequest if train_ds.py started it before its imports, else one from now."""
    stop = stop or StopRequest()
    try:
        train_or_exit(settings, stop)
    finally:
        stop.close()


def out_of_memory_message(prepared, error):
    """One line for an allocation that failed while the model and its engine were built: the model, what its
    states need per rank (the planner's count), what to do, and the allocator's own first line."""
    from gpt.memory.plan import GiB, model_state_bytes
    n_params = param_count(prepared.model_config)
    need = sum(model_state_bytes(n_params, precision(prepared.ds_config), zero_stage(prepared.ds_config),
                                 dist.world_size(), prepared.ds_config).values())
    reason = (str(error).splitlines() or [type(error).__name__])[0][:200]
    return (f"out of memory building the model and its DeepSpeed engine ({model_flags(prepared.settings)}: "
            f"{n_params:.3g} parameters, whose weights, gradients and optimizer states need {need / GiB:,.1f} GiB per "
            f"rank): choose a smaller model, more ranks with ZeRO 1 or 2, or a device with more memory ({reason})")


def build_or_exit(prepared):
    try:
        return build(prepared)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if not is_out_of_memory(e):
            raise
        exit_with(out_of_memory_message(prepared, e), 1, every_rank=True)


def close_run(run):
    """Free a run that does not go on: its loader's thread, its logs, its engine's memory."""
    run.train_loader.close()
    run.logger.close()
    run.engine.destroy()


def build_and_fit(prepared, stop):
    """build, resume, fit. Under --micro_batch auto, a first step out of memory on every rank builds the run again at
    the next smaller size that divides the token budget (one line), from the same initial weights or checkpoint."""
    while True:
        run = build_or_exit(prepared)
        try:
            return fit(run, resume(run, prepared.resume_from, prepared.resume_kind), stop,
                       auto=prepared.auto_plan is not None)
        except FirstStepOutOfMemory:
            close_run(run)
        del run
        release_memory()
        prepared = smaller_micro_batch(prepared)


def train_or_exit(settings, stop):
    """The run from setup to its end; exits with one message, and the last good checkpoint, when it cannot go on."""
    prepared = prepare(settings)
    try:
        build_and_fit(prepared, stop)
    except DiskProblem as e:
        exit_with(f"stopping: {e}. Last good checkpoint: {last_good_checkpoint(settings)}", 1, every_rank=True)
    except StopTraining as e:
        exit_with(f"stopping: {e}. Last good checkpoint: {last_good_checkpoint(settings)}", 1)
    except OSError as e:  # metrics.jsonl, TensorBoard's events
        problem = write_problem(e.filename or settings.out_dir, e) if e.errno else None
        if problem is None:
            raise
        exit_with(f"stopping: {problem}. Last good checkpoint: {last_good_checkpoint(settings)}", 1, every_rank=True)
    except BadInput as e:  # what the up-front checks could not see: DeepSpeed's
        # own load failed, or --init_from's weights (read only here, once) are unreadable or misshapen
        exit_with(e, 1)
    except Exception as e:
        if dist.lost_a_rank(e):  # every survivor says so: rank 0 may be the one that died
            exit_with(f"lost contact with another rank ({str(e).splitlines()[0][:200]}): a rank or node died or hangs. "
                      f"Relaunch the whole job with --resume auto; last good checkpoint: "
                      f"{last_good_checkpoint(settings)}", 1, every_rank=True)
        if LOSS_SCALE_AT_MINIMUM not in str(e):
            raise
        exit_with("fp16 loss scale fell to its minimum: gradients keep overflowing. Remedies: train in bf16 "
                  "(ds_configs/*_bf16.json) where the GPU has it; raise fp16.hysteresis (e.g. 4) so single "
                  "overflows do not lower the scale; lower fp16.initial_scale_power; lower --lr", 1)
    finally:
        if prepared.lock is not None:
            prepared.lock.close()  # the kernel would drop it at exit; a process running several runs (tests) needs it now
