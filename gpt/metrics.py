"""What a run reports: a console line, TensorBoard scalars and metrics.jsonl, all from rank 0."""
import json
from pathlib import Path

from gpt.console import say


class MetricsLogger:
    """Rank 0 writes; other ranks hold a logger that does nothing, so call sites need no rank checks."""

    def __init__(self, out_dir, enabled):
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # imported here: only rank 0 needs it
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(out_dir))
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

    def close(self):
        if self.enabled:
            self.writer.close()
            self.jsonl.close()
