"""The console step line's parts: durations at a glance, an ETA from the recent steps' pace (the line in a run:
tests/integration/test_progress_runs.py)."""
import pytest

from gpt.train.metrics import SLOW_STEP_S, Progress, duration, slow_step_warning


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


def test_a_step_that_takes_a_minute_or_more_at_the_cpus_peak_is_said_before_it_starts():
    """The defaults (d12, 524,288 tokens/step: 6.5e14 FLOP) on a 2-core CPU at 0.3 TFLOP/s per rank: over half an hour at the peak, said
    before the first step; a CPU-sized run, a GPU, or no known peak: nothing."""
    d12_step = 6.5e14
    assert slow_step_warning(d12_step, 3e11, 1, "cpu") == (
        "warning: a step takes at least 36m07s on this CPU (6.5e+14 FLOP at its measured matmul peak, 3e+11 FLOP/s "
        "per rank); a run sized for a CPU: bash launch/cpu_demo.sh")
    assert slow_step_warning(d12_step, 3e11, 2, "cpu").startswith("warning: a step takes at least 18m03s")
    assert slow_step_warning(SLOW_STEP_S * 3e11 * 2, 3e11, 2, "cpu").startswith("warning: a step takes at least 1m00s")
    assert slow_step_warning(SLOW_STEP_S * 3e11 * 2 * 0.99, 3e11, 2, "cpu") is None
    assert slow_step_warning(d12_step, 9.89e14, 1, "cuda") is None and slow_step_warning(d12_step, None, 1, "cpu") is None
