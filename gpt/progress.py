"""How far a run is and when it ends: the console step line's `step N/M` and ETA. The ETA is the wall time per
step over the recent steps (evaluations and saves included, so it is when the run ends, not when its training
steps do) times the steps left; recent, so torch.compile's slow first steps and a changed machine load fade out."""
import collections
import time

WINDOW = 20  # steps the pace is averaged over


class Progress:
    def __init__(self, max_steps, window=WINDOW, clock=time.monotonic):
        self.max_steps, self.clock = max_steps, clock
        self.ends = collections.deque(maxlen=window + 1)  # when each recent step ended

    def step_ended(self, step, seconds):
        """Record that `step` (0-based) ended now, after `seconds` of training; returns 'eta 1h02m' (none left:
        'done'). Until a second step ends, the pace is this step's own time."""
        self.ends.append(self.clock())
        left = self.max_steps - step - 1
        if left <= 0:
            return "done"
        pace = (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1) if len(self.ends) > 1 else seconds
        return f"eta {duration(pace * left)}"


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
