"""The console step line's parts: durations at a glance, an ETA from the recent steps' pace (the line in a run:
tests/integration/test_progress_runs.py)."""
import pytest

from gpt.train.metrics import Progress, duration


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m"),
                                           (2 * 86400 + 3 * 3600 + 59, "2d03h")])
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


def test_the_eta_is_the_recent_pace_times_the_steps_left():
    now = [0.0]
    progress = Progress(max_steps=100, window=3, clock=lambda: now[0])
    assert progress.step_ended(0, seconds=50.0) == "eta 1h22m"  # one step: its own 50 s x 99 left
    for step, gap in enumerate([10, 10, 10, 40, 40, 40], start=1):  # slower after an evaluation every step
        now[0] += gap
        eta = progress.step_ended(step, seconds=1.0)
    assert eta == f"eta {duration(40 * (100 - step - 1))}"  # the window forgot the fast steps
    now[0] += 40
    assert Progress(max_steps=1).step_ended(0, seconds=3.0) == "done"
