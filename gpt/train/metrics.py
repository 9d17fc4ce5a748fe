"""What a run reports: a console line, TensorBoard scalars and metrics.jsonl, all from rank 0. TensorBoard also
gets the samples and the run's whole settings (text), the settings people compare (hparams) and a custom-scalars
layout that groups the scalars.

Events go to OUT_DIR/tensorboard/NAME, NAME being out_dir's own name, so that TensorBoard names the run NAME
(`--logdir OUT_DIR/tensorboard`), tensorboard/NAME (`--logdir OUT_DIR`) or .../NAME/tensorboard/NAME
(`--logdir runs/`) instead of "."; a resumed run appends a new events file there, which purges (in TensorBoard's
readers) the steps the earlier launch logged from the resumed step on."""
import collections
import json
import re
import statistics
import threading
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from gpt.console import atomic_write, say, warn
from gpt.runtime.links import open_no_follow
from gpt.runtime.memory import peak_memory
from gpt.train.schedule import Schedule

TENSORBOARD_DIR = "tensorboard"
METRICS, METRICS_WHAT = "metrics.jsonl", "the run's metrics log"
PROFILE_DIR = "profile"  # --profile's traces
# TensorBoard tag of each metric (metrics.jsonl and the console keep the names on the left). TensorBoard draws one
# section per prefix before the "/", sections in alphabetical order: the losses come first, and nothing else sorts
# before "loss". The names come from step_metrics below and the trainer's evaluate (gpt/train/trainer.py); a
# metric not listed keeps its name.
TAGS = {"loss": "loss/train", "val_loss": "loss/val",
        "peak_alloc_gib": "memory/peak_alloc_gib", "peak_reserved_gib": "memory/peak_reserved_gib",
        "peak_rss_gib": "memory/peak_rss_gib",
        "lr": "optim/lr", "grad_norm": "optim/grad_norm", "skipped": "optim/skipped", "guard_skips": "optim/guard_skips",
        "update_norm": "optim/update_norm",
        "loss_scale": "optim/fp16_loss_scale", "skipped_steps": "optim/fp16_skipped_steps",
        "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu", "dt": "perf/dt",
        "hellaswag/acc_norm": "score/hellaswag_acc_norm", "hellaswag/acc": "score/hellaswag_acc",
        "target_val_loss": "target/val_loss", "target_tokens": "target/tokens", "target_seconds": "target/seconds"}
# The custom-scalars dashboard: category -> chart -> the metrics drawn together (a chart whose metrics a run does
# not log stays empty).
CHARTS = {
    "loss": {"loss and val_loss": ["loss", "val_loss"], "hellaswag": ["hellaswag/acc_norm", "hellaswag/acc"]},
    "optimizer": {"lr": ["lr"], "grad_norm (before clipping)": ["grad_norm"], "fp16 loss_scale": ["loss_scale"],
                  "update_norm (Muon's orthogonalised update)": ["update_norm"],
                  "skipped updates": ["skipped", "skipped_steps", "guard_skips"]},
    "memory": {"peak memory (GiB)": ["peak_alloc_gib", "peak_reserved_gib", "peak_rss_gib"]},
    "throughput": {"tokens_per_s": ["tokens_per_s"], "mfu": ["mfu"], "dt (s)": ["dt"]},
}
# The hparams dashboard's metrics, each a scalar's last value in the run; the same list in every run: with several
# runs in one logdir TensorBoard takes it from any one of them.
HPARAM_METRICS = ("loss", "val_loss", "hellaswag/acc_norm")
# The settings people compare, as hparams. TensorBoard's HParams shows the first five columns without a tick, in
# the order (differs between the runs shown first, then by name): the five main ones sort first, the rest under
# "setup/" after them. Every setting is in the run's text record ("settings") too.
MAIN_HPARAMS = ("batch", "lr", "model", "precision", "seq_len")


def step_metrics(engine, *, loss, lr, seconds, skipped, guard_skips, tokens, flops, peak_flops, world_size,
                 norm_name="grad_norm"):
    """A training step's metrics, in the console line's order: the loss, lr, time and throughput, grad_norm (before
    clipping; with fp16 also the loss scale and the count of skipped steps), the updates skipped, the step's peak
    memory, and MFU against peak_flops per device (None: not known). A new metric goes here, with its tag in TAGS.
    norm_name: what DeepSpeed's norm is (gpt.train.muon.norm_name: 'update_norm' under Muon's ZeRO optimizer)."""
    metrics = dict(loss=loss, lr=lr, dt=seconds, tokens_per_s=tokens / seconds)
    grad_norm = engine.get_global_grad_norm()
    if grad_norm is not None:
        metrics[norm_name] = float(grad_norm)
    if engine.fp16_enabled():
        metrics.update(loss_scale=float(engine.optimizer.cur_scale), skipped_steps=int(engine.skipped_steps))
    metrics.update(skipped=int(skipped), guard_skips=guard_skips, **peak_memory(engine.device.type))
    if peak_flops:
        metrics["mfu"] = flops / seconds / (peak_flops * world_size)
    return metrics


def flat_tag(name):
    """The tag of a metric in runs logged before tags had sections (2026-11-26): its own name."""
    return name


def sectioned_tag(name):
    return TAGS.get(name, name)


def layout(tag):
    """CHARTS as TensorBoard's custom-scalars layout, each metric under its tag (a regex anchored at both ends)."""
    return {category: {title: ["Multiline", ["^" + re.escape(tag(name)) + "$" for name in names]]
                       for title, names in charts.items()} for category, charts in CHARTS.items()}


def tag_function_of(events):
    """How the run in `events` (a directory) names its tags: flat_tag if an events file there has the flat
    `loss` (a run begun before sections, now resumed: its charts go on under the same tags), else sectioned_tag."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    for path in sorted(Path(events).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if any(value.tag == "loss" for value in event.summary.value):
                return flat_tag
    return sectioned_tag


def run_name(out_dir):
    """out_dir's own name ("run" for a root directory): the name TensorBoard shows for the run."""
    return Path(out_dir).resolve().name or "run"


def events_dir(out_dir):
    return Path(out_dir) / TENSORBOARD_DIR / run_name(out_dir)


def hparams_of(run_config, grad_accum, loss_label):
    """A run's settings for TensorBoard's hparams, from what a checkpoint records (gpt/train/start.py run_config_of:
    the flags, the model's shape, precision, ZeRO stage, ranks, Muon's muon_lr): MAIN_HPARAMS, then the rest that
    people compare under setup/; each a number or a str (None and bools, which TensorBoard would show as 0 and 1, as Python
    writes them)."""
    args, model = run_config["args"], run_config["model"]
    values = {
        "batch": f"{args['micro_batch']} x {grad_accum} x {run_config['world_size']} rank(s) = "
                 f"{args['total_batch_tokens']:,} tokens",
        "lr": args["lr"],
        "model": f"{args['model']}: {model['n_layer']} layers x {model['n_embd']}, {model['n_head']} heads",
        "precision": run_config["precision"],
        "seq_len": args["seq_len"],
        "setup/compile": args["compile"], "setup/ds_config": args["ds_config"], "setup/loss": loss_label,
        "setup/seed": args["seed"], "setup/total_batch_tokens": args["total_batch_tokens"],
        "setup/warmup_steps": args["warmup_steps"], "setup/zero_stage": run_config["zero_stage"],
        **({"setup/muon_lr": run_config["muon_lr"]} if "muon_lr" in run_config else {}),  # Muon's half; lr: the rest
        "setup/lr_schedule": Schedule.of(args).describe(),
    }
    return {k: v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v) for k, v in values.items()}


def quiet_writer_thread_errors():
    """TensorBoard's writer thread re-raises what stopped it (its events file's directory removed, a full disk), which
    threading prints as a traceback; the writer hands the same error to the next write from the main thread, whose
    handler says it in one line (gpt/train/trainer.py). Installed once per process."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args):
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)
    hook.quiets_tensorboard = True
    threading.excepthook = hook


class MetricsLogger:
    """Rank 0 writes; other ranks hold a logger that does nothing, so call sites need no rank checks."""

    def __init__(self, out_dir, enabled, hparams=None, settings=None):
        """hparams: the run's settings (hparams_of), shown beside HPARAM_METRICS in TensorBoard's hparams;
        settings: the whole record of them (a dict), as text at this launch's first step."""
        self.enabled = enabled
        if not enabled:
            return
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir, self.hparams, self.writer, self.session_end = out_dir, hparams, None, None
        self.tag = tag_function_of(events_dir(out_dir))  # before this launch's events file exists
        self.settings = settings  # written at this launch's first step (a resumed launch's may differ)
        self.jsonl = open_no_follow(out_dir / METRICS, "a", METRICS_WHAT, buffering=1)

    def open_events(self, purge_step=None):
        """This launch's events file, made at the first step (continue_from) or the first write. purge_step: the
        step a resumed launch starts from; TensorBoard's readers drop the events of that step and later that the
        earlier launch logged (a killed run's steps after its checkpoint), which this launch logs again."""
        from torch.utils.tensorboard import SummaryWriter  # imported here: only rank 0 needs it
        from torch.utils.tensorboard.summary import hparams as hparams_summaries
        quiet_writer_thread_errors()
        self.writer = SummaryWriter(log_dir=str(events_dir(self.out_dir)), purge_step=purge_step)
        self.writer.add_custom_scalars(layout(self.tag))
        if self.hparams is not None:
            # Into this run's own events (SummaryWriter.add_hparams would make a sub-run). TensorBoard keeps the
            # first of each: a resumed run's repeat is ignored, and the session ends at the first finished run.
            experiment, session_start, self.session_end = hparams_summaries(
                self.hparams, dict.fromkeys(self.tag(name) for name in HPARAM_METRICS))
            self.writer.file_writer.add_summary(experiment)
            self.writer.file_writer.add_summary(session_start)

    @property
    def events(self):
        if self.writer is None:
            self.open_events()
        return self.writer

    def log(self, step, metrics, console=None):
        """metrics: name -> number, each a key of one JSON line and a TensorBoard scalar (its tag: TAGS);
        console: the line to print, if any."""
        if not self.enabled:
            return
        if self.settings is not None:
            self.text("settings", json.dumps(self.settings, indent=1, default=str), step)
            self.settings = None
        for name, value in metrics.items():
            self.events.add_scalar(self.tag(name), value, step)
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        if console:
            say(console)

    def continue_from(self, step):
        """Before this launch's first step: metrics.jsonl keeps one record per step, one JSON object a line. A killed
        run logged the steps after its last checkpoint, which a resume takes again: their records are dropped, and
        a last line the kill cut off (appended to, two records would make one line that does not parse). Said in
        one line when anything is dropped. TensorBoard's events of those steps: purged (open_events)."""
        if not self.enabled:
            return
        self.open_events(purge_step=step)  # 0 too: a killed launch that saved nothing logged steps from 0
        path = Path(self.jsonl.name)
        self.jsonl.close()
        lines = path.read_text(errors="replace").split("\n")
        kept, redone, unreadable = [], 0, []
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            record = _record(line)
            if record is None:
                unreadable.append(number)
            elif record["step"] >= step:
                redone += 1
            else:
                kept.append(line)
        if redone or unreadable:
            with atomic_write(path) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept))
            warn(f"{path}: " + "; ".join(
                ([f"{redone} record(s) of steps {step} on dropped: this launch trains them again"] if redone else [])
                + ([f"line(s) {', '.join(map(str, unreadable))} dropped: not a whole record (cut by a kill)"]
                   if unreadable else [])))
        self.jsonl = open_no_follow(path, "a", METRICS_WHAT, buffering=1)

    def text(self, tag, text, step):
        """A TensorBoard text summary, verbatim: TensorBoard renders Markdown, so it goes in as a code block."""
        if self.enabled:
            self.events.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)

    def close(self, finished=False):
        """finished: the run reached --max_steps (the hparams session ends, successfully)."""
        if self.enabled:
            if finished and self.session_end is not None:
                self.events.file_writer.add_summary(self.session_end)
            if self.writer is not None:
                self.writer.close()
            self.jsonl.close()


def _record(line):
    """A metrics.jsonl line as its record, or None where it is not one (a line cut short)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and type(record.get("step")) is int else None


# How far a run is and when it ends: the console step line's `step N/M` and ETA. The ETA is a training step's pace,
# the median wall time from one step's end to the next over the recent steps (a changed machine load is followed;
# one evaluation, save or sample among them is not the pace), plus what those took beyond the pace, spread over every
# step since (so the ETA is when the run ends, evaluations included, and steady between them). A process's first
# interval holds one-off costs (the step-0 evaluation's and sample's compiles): not counted.
WINDOW = 20  # steps the pace is the median of


class Progress:
    def __init__(self, max_steps, window=WINDOW, clock=time.monotonic):
        self.max_steps, self.clock = max_steps, clock
        self.last_end, self.ends_seen = None, 0
        self.recent = collections.deque(maxlen=window)  # wall seconds from one step's end to the next
        self.beyond_pace, self.counted = 0.0, 0  # their seconds over the pace at the time, and how many intervals

    def step_ended(self, step, seconds):
        """Record that `step` (0-based) ended now, after `seconds` of training; returns 'eta 1h02m' (none left:
        'done'). Until an interval counts, the pace is this step's own time."""
        now, self.ends_seen = self.clock(), self.ends_seen + 1
        if self.ends_seen > 2:  # an interval, but not the first: it holds one-off costs (above)
            interval = now - self.last_end
            self.recent.append(interval)
            self.beyond_pace += max(0.0, interval - statistics.median(self.recent))
            self.counted += 1
        self.last_end = now
        left = self.max_steps - step - 1
        if left <= 0:
            return "done"
        pace = statistics.median(self.recent) + self.beyond_pace / self.counted if self.recent else seconds
        return f"eta {duration(pace * left)}"


SLOW_STEP_S = 60  # a step at least this long at the CPU's peak: a GPU-sized run on a CPU


def slow_step_warning(flops_per_step, peak_flops, world_size, device_type):
    """A warning line where a step would take SLOW_STEP_S or more even at this CPU's peak (hardware.cpu_peak_flops; the
    defaults, d12 at 0.5M tokens/step, are a GPU run: hours per step on a laptop), else None. Said before the first
    step: the ETA comes only after it."""
    if device_type != "cpu" or not peak_flops:
        return None
    at_least = flops_per_step / (peak_flops * world_size)
    if at_least < SLOW_STEP_S:
        return None
    return (f"warning: a step takes at least {duration(at_least)} on this CPU ({flops_per_step:.2g} FLOP at its "
            f"peak, {peak_flops:.2g} FLOP/s per rank); a run sized for a CPU: bash launch/cpu_demo.sh")


def duration(seconds):
    """'2d03h', '1h02m', '3m05s', '42s'."""
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


# --profile STEPS: a torch profiler trace of a few training steps, for TensorBoard's profiler view.
#
# Each rank writes {out_dir}/profile/rank{N}.*.pt.trace.json (Chrome trace format): open it with
# `tensorboard --logdir {out_dir}/profile` (needs the torch-tb-profiler plugin) or drag it into
# https://ui.perfetto.dev.
WAIT_STEPS = 1  # the first step pays one-off costs (allocator warm-up, compilation): not representative


class NoProfiler:
    def step(self):
        pass

    def stop(self):
        pass


def step_profiler(steps, out_dir, device_type, rank):
    """A started profiler that records `steps` steps after one skipped and one warm-up step; call
    .step() after every training step and .stop() at the end. steps 0: a profiler that does nothing."""
    if not steps:
        return NoProfiler()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    profiler = profile(activities=activities, schedule=schedule(wait=WAIT_STEPS, warmup=1, active=steps, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(str(Path(out_dir) / PROFILE_DIR), worker_name=f"rank{rank}"),
                       record_shapes=True, profile_memory=True, with_stack=False)
    profiler.start()
    return profiler


def profiled_steps_needed(steps):
    """Training steps a --profile STEPS run needs for a complete trace."""
    return WAIT_STEPS + 1 + steps if steps else 0
