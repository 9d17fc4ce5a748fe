"""What a run reports: a console line, TensorBoard scalars and metrics.jsonl, all from rank 0. TensorBoard also
gets the samples (text), the run's settings (hparams) and a custom-scalars layout that groups the scalars.

Events go to OUT_DIR/tensorboard/NAME, NAME being out_dir's own name, so that TensorBoard names the run NAME
(`--logdir OUT_DIR/tensorboard`), tensorboard/NAME (`--logdir OUT_DIR`) or .../NAME/tensorboard/NAME
(`--logdir runs/`) instead of "."; a resumed run appends a new events file there.
"""
import json
from pathlib import Path

from gpt.console import say

TENSORBOARD_DIR = "tensorboard"
# The custom-scalars dashboard: category -> chart -> ["Multiline", tag regexes (re.match: anchored at the start)].
# The tags are the trainer's metric names (gpt/trainer.py log_step and fit, gpt/engine.py step_stats,
# gpt/memory.py peak_memory); a chart whose tags a run does not log stays empty.
LAYOUT = {
    "loss": {"loss and val_loss": ["Multiline", ["^loss$", "^val_loss$"]],
             "hellaswag": ["Multiline", ["^hellaswag/"]]},
    "optimizer": {"lr": ["Multiline", ["^lr$"]],
                  "grad_norm (before clipping)": ["Multiline", ["^grad_norm$"]],
                  "fp16 loss_scale": ["Multiline", ["^loss_scale$"]],
                  "skipped updates": ["Multiline", ["^skipped$", "^skipped_steps$", "^guard_skips$"]]},
    "memory": {"peak memory (GiB)": ["Multiline", [r"^peak_\w+_gib$"]]},
    "throughput": {"tokens_per_s": ["Multiline", ["^tokens_per_s$"]],
                   "mfu": ["Multiline", ["^mfu$"]],
                   "dt (s)": ["Multiline", ["^dt$"]]},
}
# The hparams dashboard's metrics: TensorBoard shows each scalar's last value in the run. The same list in every
# run: with several runs in one logdir it takes the list from any one of them.
HPARAM_METRICS = ("loss", "val_loss", "hellaswag/acc_norm")


def run_name(out_dir):
    """out_dir's own name ("run" for a root directory): the name TensorBoard shows for the run."""
    return Path(out_dir).resolve().name or "run"


def events_dir(out_dir):
    return Path(out_dir) / TENSORBOARD_DIR / run_name(out_dir)


def hparams_of(run_config, **more):
    """A run's settings for TensorBoard's hparams: what a checkpoint records (gpt/preflight.py run_config_of: the
    flags, the model's shape, precision, ZeRO stage, ranks) and `more`, each a number or a str: None, bools (which
    TensorBoard would show as 0 and 1) and anything else as Python writes them."""
    values = {**run_config["args"], **{f"model.{k}": v for k, v in run_config["model"].items()},
              **{k: run_config[k] for k in ("precision", "zero_stage", "world_size")}, **more}
    return {k: v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v) for k, v in values.items()}


class MetricsLogger:
    """Rank 0 writes; other ranks hold a logger that does nothing, so call sites need no rank checks."""

    def __init__(self, out_dir, enabled, hparams=None):
        """hparams: the run's settings (hparams_of), shown beside HPARAM_METRICS in TensorBoard's hparams."""
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # imported here: only rank 0 needs it
        from torch.utils.tensorboard.summary import hparams as hparams_summaries
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(events_dir(out_dir)))
        self.writer.add_custom_scalars(LAYOUT)
        self.session_end = None
        if hparams is not None:
            # Into this run's own events (SummaryWriter.add_hparams would make a sub-run). TensorBoard keeps the
            # first of each: a resumed run's repeat is ignored, and the session ends at the first finished run.
            experiment, session_start, self.session_end = hparams_summaries(hparams, dict.fromkeys(HPARAM_METRICS))
            self.writer.file_writer.add_summary(experiment)
            self.writer.file_writer.add_summary(session_start)
        self.jsonl = open(out_dir / "metrics.jsonl", "a", buffering=1)

    def log(self, step, metrics, console=None):
        """metrics: name -> number, each a TensorBoard scalar of that name and a key of one JSON line;
        console: the line to print, if any."""
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        if console:
            say(console)

    def text(self, tag, text, step):
        """A TensorBoard text summary, verbatim: TensorBoard renders Markdown, so it goes in as a code block."""
        if self.enabled:
            self.writer.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)

    def close(self, finished=False):
        """finished: the run reached --max_steps (the hparams session ends, successfully)."""
        if self.enabled:
            if finished and self.session_end is not None:
                self.writer.file_writer.add_summary(self.session_end)
            self.writer.close()
            self.jsonl.close()
