"""The trainer, top-down: train(settings) prepares the run (gpt/train/start.py: the checks, the run lock, the
process group, --micro_batch auto's probe), builds a Trainer (engine, data, guard, logger), resumes it and fits it
(each step: train, log, the guard's verdict; then evaluate and save), and turns what stops it into one message.
train_ds.py is its command line; bench/train.py drives a Trainer through the same public methods: step,
evaluate, save, close."""
import sys
import time
from pathlib import Path

import torch

from gpt.console import BadInput, exit_with, os_error_line, say, say0, write_problem
from gpt.data import hellaswag
from gpt.data.shards import ShuffledTokenLoader, ValidationSet, find_shards
from gpt.runtime import ranks  # first: DeepSpeed imported with its logs on stderr
from gpt.runtime.memory import is_out_of_memory, release_memory, reset_peak_memory
from gpt.train import checkpoint, engine as ds_engine, resume_settings, start
from gpt.train.evaluate import Target, sample_text, validation_loss
from gpt.train.metrics import MetricsLogger, Progress, hparams_of, slow_step_warning, step_metrics, step_profiler
from gpt.train.stop import StopRequest

LOSS_SCALE_AT_MINIMUM = "Current loss scale already at minimum"


def train(settings, stop=None):
    """Train with these settings; exits non-zero with one message when the run cannot go on. stop: the run's
    StopRequest if train_ds.py started it before its imports, else one from now."""
    stop = stop or StopRequest()
    try:
        train_or_exit(settings, stop)
    finally:
        stop.close()


def train_or_exit(settings, stop):
    """The run from its start to its end; exits with one message, and the last good checkpoint, when it cannot go
    on."""
    prepared = start.prepare(settings)
    try:
        fit_at_a_size_that_fits(prepared, stop)
    except DiskProblem as e:
        exit_with(f"stopping: {e}. Last good checkpoint: {last_good_checkpoint(settings.run.out_dir)}", 1,
                  every_rank=True)
    except StopTraining as e:
        good = last_good_checkpoint(settings.run.out_dir, e.trouble_from, prepared.resume_from)
        exit_with(f"stopping: {e}. Last good checkpoint: {good}", 1)
    except OSError as e:  # metrics.jsonl, TensorBoard's events: a full disk, a directory removed under the run
        if e.filename:  # the file and what went wrong with it
            problem = os_error_line(e, settings.run.out_dir)
        else:  # no file named: one line only where the disk is why, else a bug to show whole
            problem = write_problem(settings.run.out_dir, e) if e.errno else None
        if problem is None:
            raise
        exit_with(f"stopping: {problem}. Last good checkpoint: {last_good_checkpoint(settings.run.out_dir)}", 1,
                  every_rank=True)
    except BadInput as e:  # what the up-front checks could not see: DeepSpeed's
        # own load failed, or --init_from's weights (read only here, once) are unreadable or misshapen
        exit_with(e, 1)
    except Exception as e:
        if ranks.lost_a_rank(e) and stop.requested:  # a stop the other rank took first (one still starting up)
            exit_with(f"stopped by {stop.requested}, which another rank took before this step's save: last good "
                      f"checkpoint: {last_good_checkpoint(settings.run.out_dir)}", 1)
        if ranks.lost_a_rank(e):  # every survivor says so: rank 0 may be the one that died
            exit_with(f"lost contact with another rank ({str(e).splitlines()[0][:200]}): a rank or node died or hangs. "
                      f"Relaunch the whole job with --resume auto; last good checkpoint: "
                      f"{last_good_checkpoint(settings.run.out_dir)}", 1, every_rank=True)
        if LOSS_SCALE_AT_MINIMUM not in str(e):
            raise
        exit_with("fp16 loss scale fell to its minimum: gradients keep overflowing. Remedies: train in bf16 "
                  "(ds_configs/*_bf16.json) where the GPU has it; raise fp16.hysteresis (e.g. 4) so single "
                  "overflows do not lower the scale; lower fp16.initial_scale_power; lower --lr", 1)
    finally:
        if prepared.lock is not None:
            prepared.lock.close()  # the kernel would drop it at exit; a process running several runs (tests) needs it now


def fit_at_a_size_that_fits(prepared, stop):
    """Build, resume, fit. Under --micro_batch auto, a first step out of memory on every rank builds the run again
    at the next smaller size that divides the token budget (one line), from the same initial weights or checkpoint."""
    while True:
        trainer = Trainer.build_or_exit(prepared)
        try:
            first_step = trainer.resume(prepared.resume_from, prepared.resume_kind, prepared.saved_run_config)
            return trainer.fit(first_step, stop, auto=prepared.auto_plan is not None)
        except FirstStepOutOfMemory:
            trainer.close()
        del trainer
        release_memory()
        prepared = start.smaller_micro_batch(prepared)


def last_good_checkpoint(out_dir, trouble_from=None, resumed_from=None):
    """The newest complete checkpoint; after a stop for non-finite or outlying steps (trouble_from: the first of
    them), the newest saved before that step, and not the one the run resumed from when the trouble came in the step
    right after it: its own state may be what went wrong (a checkpoint whose bytes changed led to NaN two steps on)."""
    ckpt_dir = checkpoint.checkpoint_dir(out_dir)
    tags = checkpoint.complete_tags(ckpt_dir)
    if trouble_from is not None:
        tags = [tag for tag in tags if checkpoint.step_of(tag) < trouble_from]
        if tags and resumed_from is not None and Path(resumed_from).name == tags[-1] \
                and checkpoint.step_of(tags[-1]) + 1 == trouble_from:
            tags = tags[:-1]
    return ckpt_dir / tags[-1] if tags else "none"


# why a wsd run's checkpoint at the start of its cooldown is never pruned
COOLDOWN_KEPT = "the cooldown's start: resume from it with a larger --max_steps to extend the run"


class StopTraining(Exception):
    """The run cannot continue; the message says why. trouble_from: the step where non-finite or outlying steps
    began, when that is why."""

    def __init__(self, message, trouble_from=None):
        super().__init__(message)
        self.trouble_from = trouble_from


class DiskProblem(StopTraining):
    """A write failed on a full or read-only disk: on this rank, maybe not on the others."""


class FirstStepOutOfMemory(Exception):
    """--micro_batch auto's size ran out of memory in the run's first step on every rank: build it smaller."""


class Trainer:
    """One run, built from a prepared setup (gpt.train.start.prepare): its DeepSpeed engine and model, its data,
    spike guard and logger. fit() drives step(), evaluate() and save(); close() frees it. Public: these methods
    and the fields settings, model and engine."""

    @classmethod
    def build_or_exit(cls, setup):
        """Trainer(setup), or one line and exit 1 when the model and its engine do not fit the device."""
        try:
            return cls(setup)
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(e):
                raise
            exit_with(start.out_of_memory_message(setup, e), 1, every_rank=True)

    def __init__(self, setup):
        settings = self.settings = setup.settings
        data, evaluation, optimizer = settings.data, settings.evaluation, settings.optimizer
        self.engine, self.model, loss_label = ds_engine.new_engine(setup, data.micro_batch, setup.grad_accum)
        self.device, self.grad_accum, self.run_config = setup.device, setup.grad_accum, setup.run_config
        self.hellaswag_examples = setup.hellaswag_examples
        rank, self.world_size = ranks.rank(), ranks.world_size()
        self.train_loader = ShuffledTokenLoader(
            find_shards(data.dir, "train"), data.micro_batch, data.seq_len, rank, self.world_size,
            seed=settings.run.seed, windows_per_batch=data.total_batch_tokens // data.seq_len,
            pin_memory=self.device.type == "cuda")
        self.val_set = ValidationSet(find_shards(data.dir, "val"), data.seq_len,
                                     evaluation.val_tokens // data.seq_len, data.micro_batch, rank,
                                     self.world_size) if evaluation.val_every else None  # None: --val_every 0
        self.guard = ds_engine.SpikeGuard(optimizer.skip_loss_z, optimizer.skip_grad_z,
                                          max_bad_steps=optimizer.max_bad_steps, fp16=setup.precision == "fp16")
        self.guard_active = ds_engine.install_grad_norm_hook(self.engine, self.guard)  # False: no skip path (ZeRO 0)
        self.peak_flops, peak_label = setup.peak_flops
        self.flops_per_step = self.model.flops_per_token(data.seq_len) * data.total_batch_tokens
        loss_label = f"{settings.model.loss} ({loss_label})"
        self.logger = MetricsLogger(settings.run.out_dir, enabled=rank == 0, settings=setup.run_config,
                                    hparams=hparams_of(setup.run_config, setup.grad_accum, loss_label))
        self.progress = Progress(optimizer.max_steps)  # the console's step N/M and ETA
        self.target = Target(evaluation.target_val_loss, self.device)
        say0(f"model {settings.model.preset}: {self.model.num_params() / 1e6:.2f}M parameters, {setup.model_config}")
        say0(f"{setup.precision}, ZeRO {self.engine.zero_optimization_stage()}, "
             f"{type(self.engine.optimizer).__name__} over {ds_engine.muon.describe(self.engine)}, "
             f"{self.world_size} rank(s) x micro_batch {data.micro_batch} x seq_len {data.seq_len} x grad_accum "
             f"{setup.grad_accum} = {data.total_batch_tokens:,} tokens/step; MFU against {peak_label}")
        say0(f"loss: {loss_label}")
        say0(f"lr schedule {ds_engine.OptimizerSettings.of(optimizer).schedule.describe()}"
             + (" (each half from its own peak)" if ds_engine.muon.uses_muon(self.engine) else ""))
        say0(f"data {data.dir}: {len(self.train_loader.shards)} train shard(s), "
             f"{sum(self.train_loader.batches_per_shard):,} steps/epoch; "
             + (f"validation on {len(self.val_set)} sequences of {data.seq_len} tokens" if self.val_set
                else "no validation"))
        slow = slow_step_warning(self.flops_per_step, self.peak_flops, self.world_size, self.device.type)
        if slow:
            say0(slow)

    # -- the run: resume, fit ------------------------------------------------------------------------------------

    def resume(self, path, kind, saved):
        """Load a checkpoint as resume_kind chose (gpt/train/resume.py); returns the step to continue from. 'exact'
        (the same world size and ZeRO stage): everything, bit-exact on CPU. 'universal', 'whole': another world size
        or stage: all but the RNG. 'weights': the weights only (a checkpoint too old to convert). saved: its
        run_config.json, as preflight read it."""
        settings, engine = self.settings, self.engine
        if path is None:
            if settings.checkpoint.resume:
                say0(f"--resume {settings.checkpoint.resume}: no checkpoint in "
                     f"{checkpoint.checkpoint_dir(settings.run.out_dir)}; fresh start")
            return 0
        state, rng_problem, notes = resume_settings.load(engine, path, kind)
        for note in notes:
            say0(f"resume: {note}")
        if engine.global_rank == 0:
            checkpoint.set_aside_damaged(checkpoint.checkpoint_dir(settings.run.out_dir), path)
        step = state["step"] + 1
        position = self._resume_data(path, state["loader"])
        if rng_problem:
            say(f"warning: [rank {engine.global_rank}] {path}: {rng_problem}: this rank's random state was not "
                f"restored, so the run will not repeat an uninterrupted one exactly", sys.stderr)
        every_rng = ranks.mean_over_ranks(torch.tensor(0.0 if rng_problem else 1.0, device=self.device)).item() == 1.0
        layout = (f"saved on {saved['world_size']} rank(s) with ZeRO {saved['zero_stage']}, now "
                  f"{self.world_size} with ZeRO {engine.zero_optimization_stage()}")
        if kind == "weights":
            self._set_schedule_position(step)
            say0(f"resumed from {path} at step {step} with WEIGHTS ONLY ({layout}; saved before checkpoints recorded "
                 f"what a conversion needs): optimizer moments restart from zero; schedule; {position}")
            return step
        if kind == "exact":
            loaded = "weights, optimizer, schedule, " + position + " and " + (
                "RNG" if every_rng else "not the RNG of every rank (see the warning)")
        else:
            how = (f"through its universal form, {Path(path) / checkpoint.UNIVERSAL}" if kind == "universal"
                   else "ZeRO 0 keeps it whole")
            loaded = (f"weights, fp32 master weights, Adam's moments ({how}), schedule and {position}; not the RNG "
                      f"({layout}: the random states were per rank)")
        say0(f"resumed from {path} at step {step}: {loaded}")
        self._schedule_changes(saved["args"], engine.lr_scheduler.last_epoch)
        if saved["args"]["total_batch_tokens"] != settings.data.total_batch_tokens:
            say0(f"--total_batch_tokens {settings.data.total_batch_tokens:,} (the checkpoint's run had "
                 f"{saved['args']['total_batch_tokens']:,}): grad_accum {self.grad_accum} from here on")
        return step

    def fit(self, start_step, stop, auto=False):
        """Train from start_step to --max_steps, or to the first validation at or below --target_val_loss. auto
        (--micro_batch auto): the first step may raise FirstStepOutOfMemory."""
        settings = self.settings
        self.logger.continue_from(start_step)  # a killed run's records of the steps taken again, dropped
        stop.started(resumed=start_step > 0)  # from here a stop finishes the step and saves
        profiler = step_profiler(settings.run.profile, settings.run.out_dir, self.device.type, self.engine.global_rank)
        cooldown_start = ds_engine.OptimizerSettings.of(settings.optimizer).schedule.cooldown_start()
        began, reached = time.perf_counter(), False
        for step in range(start_step, settings.optimizer.max_steps):
            last = step == settings.optimizer.max_steps - 1
            if auto and step == start_step:
                try:
                    self._first_step(step)
                except FirstStepOutOfMemory:
                    profiler.stop()
                    raise
            else:
                self.step(step)
            profiler.step()
            val = self.evaluate(step, last, cut_short=stop.asked)  # a signal, or a launcher gone
            reached = self.target.reached(step, val)
            stopping = stop.agreed(self.device)
            save_every, at_cooldown = settings.checkpoint.save_every, step + 1 == cooldown_start
            if last or stopping or reached or at_cooldown or (save_every and (step + 1) % save_every == 0):
                self.save(step, kept=COOLDOWN_KEPT if at_cooldown else None)
                stop.saved()
            if reached:
                tokens = (step + 1) * settings.data.total_batch_tokens
                self.logger.log(step, *self.target.record(step, val, tokens, time.perf_counter() - began))
                break
            if stopping:
                say0(f"step {step:5d} | stopped by {stop.requested or 'another rank'}: checkpoint saved, exiting")
                break
        profiler.stop()
        self.train_loader.close()
        if last and not reached and self.target.missed():
            say0(self.target.missed())
        self.logger.close(finished=last or reached)

    # -- what fit does at each step: step, evaluate, save; and close ---------------------------------------------

    def step(self, step):
        """One optimizer step as fit takes it: train, log, the guard's verdict. Returns the loss."""
        lr = ds_engine.muon.lr_flag_lr(self.engine)
        reset_peak_memory(self.device.type)
        try:
            (loss, skipped), seconds = ranks.timed_on_device(self._train_step)
        except StopTraining as e:  # a non-finite loss that ZeRO 0 cannot skip: the trouble began at this step
            raise StopTraining(str(e), step) from None
        self._log_step(step, lr, loss, skipped, seconds)
        self._guard_step(step, loss, skipped)
        return loss

    def evaluate(self, step, last=False, cut_short=lambda: False):
        """What --val_every, --eval_every and --sample_every ask for at this step (all of it when last): the
        validation loss, HellaSwag, a text sample (rank 0). cut_short: a stop request, which ends each early (the
        checkpoint is worth more than them, and a scheduler's grace period is short); what it cut is not logged.
        Returns the validation loss, or None where none was taken."""
        evaluation = self.settings.evaluation  # this step's part of the settings
        # a stop that reached another rank alone cuts this rank's validation too: what follows is skipped here as well
        # (each evaluation still makes its one reduction on every rank)
        cut, val = False, None

        def stop_here():
            return cut or cut_short()
        if evaluation.val_every and (step % evaluation.val_every == 0 or last):
            val = validation_loss(self.engine, self.val_set, self.device, cut_short=cut_short)
            cut = val is None
            if val is not None:
                self.logger.log(step, {"val_loss": val}, console=f"step {step:5d} | val_loss {val:.4f}")
        if self.hellaswag_examples and (step % evaluation.eval_every == 0 or last):
            scores = hellaswag.evaluate(self.engine, self.hellaswag_examples, self.device, self.model.config.block_size,
                                        self.settings.data.micro_batch, progress=True, cut_short=stop_here)
            cut = cut or scores is None
            if scores is not None:
                self.logger.log(step, {"hellaswag/acc_norm": scores["acc_norm"], "hellaswag/acc": scores["acc"]},
                                console=f"step {step:5d} | hellaswag acc_norm {scores['acc_norm']:.4f} "
                                        f"acc {scores['acc']:.4f} ({scores['examples']} examples)")
        if evaluation.sample_every and (step % evaluation.sample_every == 0 or last) and self.engine.global_rank == 0:
            text = sample_text(self.model, evaluation.sample_tokens, self.settings.run.seed + self.engine.global_rank,
                               self.device, cut_short=stop_here)  # its own generator: the training RNG untouched
            if text is not None:
                say(f"[rank {self.engine.global_rank}] sample at step {step}: {text!r}")
                self.logger.text("samples", text, step)
        if stop_here():
            say0(f"step {step:5d} | evaluation skipped or cut short: stopping")
        return val

    def save(self, step, kept=None):
        """A checkpoint of this step (gpt/train/checkpoint.py), with the data position; refuses weights that are
        not finite. kept: why pruning must never remove it. A full or read-only disk raises DiskProblem."""
        settings = self.settings
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):  # the same on every rank
            raise StopTraining(f"step {step}: the weights are not finite (NaN or inf), so they were not saved", step)
        client_state = {"step": step, "tokens": (step + 1) * settings.data.total_batch_tokens,
                        "loader": self.train_loader.state_dict()}
        began = time.perf_counter()
        try:
            path = checkpoint.save(self.engine, settings.run.out_dir, step, client_state, self.run_config,
                                   settings.checkpoint.keep_last, settings.checkpoint.keep_every, kept)
        except (OSError, RuntimeError) as e:  # RuntimeError: DeepSpeed's and torch's C++ writers
            problem = write_problem(checkpoint.checkpoint_dir(settings.run.out_dir) / checkpoint.tag_for(step), e)
            if problem is None:
                raise
            raise DiskProblem(f"{problem}; that checkpoint is incomplete and will not be loaded") from None
        say0(f"step {step:5d} | saved {path} in {time.perf_counter() - began:.2f}s"
             + (f" (kept: {kept})" if kept else ""))

    def close(self):
        """Free a run that does not go on: its loader's thread, its logs, its engine's memory."""
        self.train_loader.close()
        self.logger.close()
        self.engine.destroy()

    # -- the parts of a step -------------------------------------------------------------------------------------

    def _train_step(self):
        """One optimizer step = grad_accum micro-steps. Returns (loss averaged over micro-steps and ranks,
        whether the update was skipped)."""
        engine, device = self.engine, self.device
        loss_sum = torch.zeros((), device=device)
        skip_before = engine.skipped_steps
        for micro in range(self.grad_accum):
            x, y = self.train_loader.next_batch()
            _, loss = engine(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            loss_sum += loss.detach()  # stays on device: one host sync per step, below
            if micro == self.grad_accum - 1:
                mean_loss = ranks.mean_over_ranks(loss_sum).item() / self.grad_accum
                if self.guard.check_loss(mean_loss):
                    if not self.guard_active:
                        raise StopTraining(f"loss {mean_loss} and this optimizer has no skip path (ZeRO 0)")
                    loss = loss * float("nan")  # DeepSpeed's overflow path then skips the whole update
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        return mean_loss, engine.skipped_steps > skip_before

    def _log_step(self, step, lr, loss, skipped, seconds):
        """The step's metrics (gpt.train.metrics.step_metrics) to console, TensorBoard and metrics.jsonl."""
        metrics = step_metrics(self.engine, loss=loss, lr=lr, seconds=seconds, skipped=skipped,
                               guard_skips=self.guard.skipped, tokens=self.settings.data.total_batch_tokens,
                               flops=self.flops_per_step, peak_flops=self.peak_flops, world_size=self.world_size,
                               norm_name=ds_engine.muon.norm_name(self.engine))
        self.logger.log(step, metrics, console=f"step {step:5d}/{self.settings.optimizer.max_steps} | " + " | ".join(
            [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()]
            + [self.progress.step_ended(step, seconds)]))

    def _guard_step(self, step, loss, skipped):
        """The spike guard's verdict on the step just taken: say why an update was skipped; StopTraining
        after too many bad steps in a row."""
        bad = self.guard.end_step(loss, skipped)
        if skipped:
            say0(f"step {step:5d} | update skipped: {self.guard.reason}")
        if bad:
            raise StopTraining(bad, trouble_from=step - self.guard.bad_in_a_row + 1)

    def _first_step(self, step):
        """The run's first optimizer step under --micro_batch auto. Out of memory on every rank raises
        FirstStepOutOfMemory: the size the plan and probe chose did not fit the real step after all. Every rank
        says whether its step fitted (one collective, this step only); ranks run out together (the same shapes)."""
        try:
            self.step(step)
            fitted = True
        except Exception as error:  # noqa: BLE001 -- out-of-memory is an answer here; anything else is re-raised
            if not is_out_of_memory(error):
                raise
            fitted = False  # leaving this block drops the error, its traceback and the step's tensors
        if not ranks.on_every_rank(fitted, self.device):
            raise FirstStepOutOfMemory

    # -- the parts of a resume -----------------------------------------------------------------------------------

    def _resume_data(self, path, saved):
        """Put the loader where the checkpoint's run would have read next (gpt/data/shards.py: on any world size and
        micro-batch), or with --reset_data_position at the next epoch's start; says which."""
        loader = self.train_loader
        if self.settings.data.reset_data_position:  # the next epoch's start, whatever the shards now
            loader.load_state_dict({**loader.state_dict(), "epoch": saved["epoch"] + 1, "batch": 0})
            return f"data from the start of epoch {saved['epoch'] + 1} (--reset_data_position)"
        try:
            note = loader.load_state_dict(saved)
        except BadInput as e:  # other shards under --data than the checkpoint's run read
            raise BadInput(f"{path}: cannot resume the data position: {e}") from None
        return note or "data position"

    def _set_schedule_position(self, position):
        """The lr schedule of this run's flags, at `position` (its count of updates taken)."""
        scheduler = self.engine.lr_scheduler
        # each group's peak (Muon's half: muon_lr): a loaded state has the saved ones
        scheduler.base_lrs = ds_engine.muon.base_lrs(self.engine, self.settings.optimizer.lr)
        scheduler.last_epoch = position - 1
        scheduler.step()

    def _schedule_changes(self, saved_args, position):
        """A resume whose schedule flags differ from the checkpoint's run follows the new flags from here on: the
        schedule is a function of (step, --max_steps, ...), so --max_steps 20 after 10 stretches the rest of the
        cosine to end at step 20, instead of keeping the saved lr for one step and then jumping; a wsd run resumed
        before its cooldown holds the peak up to its new cooldown. Said in one line. `position`: the loaded
        scheduler's count of updates (behind the step by the updates skipped)."""
        now = ds_engine.OptimizerSettings.of(self.settings.optimizer)
        was = now.as_recorded(saved_args)
        changed = [f"{ds_engine.muon.setting_name(self.engine, flag)} {getattr(now, flag)} (the checkpoint's "
                   f"run had {getattr(was, flag)})"
                   for flag in now.SCHEDULE_FLAGS if getattr(was, flag) != getattr(now, flag)]
        if not changed:
            return
        self._set_schedule_position(position)
        was, now = was.schedule, now.schedule
        say0(f"{'; '.join(changed)}: the lr schedule follows the new flags from here on ({now.describe()}); lr at "
             f"step {position} is {ds_engine.muon.lr_flag_lr(self.engine):.4g} (was {was.lr_at(position):.4g})"
             + now.rewarming(was, position))

