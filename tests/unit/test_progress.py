"""The console step line's parts: durations at a glance, an ETA from the recent steps' pace (the line in a run:
tests/integration/test_progress_runs.py)."""
import pytest

from gpt.train.metrics import SLOW_STEP_S, Progress, duration, slow_step_warning


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m"),
                                           (2 * 86400 + 3 * 3600 + 59, "2d03h")])
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


def progress_through(intervals, max_steps=1000, window=5):
    """A Progress whose step 0 ended at 50 s (50 s of training), then one step per interval (1 s of training
    each); returns (its ETAs after step 0 and each step, the last step)."""
    now = [50.0]
    progress = Progress(max_steps=max_steps, window=window, clock=lambda: now[0])
    etas = [progress.step_ended(0, seconds=50.0)]
    for step, interval in enumerate(intervals, start=1):
        now[0] += interval
        etas.append(progress.step_ended(step, seconds=1.0))
    return etas, len(intervals)


def test_the_eta_is_the_pace_plus_the_evaluations_spread_over_the_steps():
    """1 s steps, an evaluation of 5 s more every 10th: the ETA is 1.5 s per step left, after every step alike. The
    first interval (a compile of the evaluation graphs: 30 s) is not the pace; until another ends, a step's own
    time is."""
    evaluations = [6.0 if i % 10 == 9 else 1.0 for i in range(100)]
    etas, last = progress_through([30.0, *evaluations])
    assert etas[:2] == [f"eta {duration(50 * 999)}", f"eta {duration(1 * 998)}"]  # each step's own time
    assert etas[-1] == f"eta {duration(1.5 * (1000 - last - 1))}"
    assert etas[-2] == f"eta {duration((1 + 45 / 99) * (1000 - last))}"  # just before the 10th evaluation: 9 of 99
    assert Progress(max_steps=1).step_ended(0, seconds=3.0) == "done"


def test_the_eta_follows_a_slower_machine_within_the_window():
    """1 s steps, then 3 s from a load that came: after the window's 5 steps the pace is 3 s; the steps on the way
    count beyond the pace (2 x 2 s here, over all the steps since)."""
    etas, last = progress_through([30.0, *[1.0] * 20, *[3.0] * 20])
    assert etas[21] == f"eta {duration(1 * (1000 - 22))}"
    assert etas[-1] == f"eta {duration((3 + 4 / 40) * (1000 - last - 1))}"


def test_a_step_that_takes_a_minute_or_more_at_the_cpus_peak_is_said_before_it_starts():
    """The defaults (d12, 524,288 tokens/step: 6.5e14 FLOP) on a 2-core CPU at 0.3 TFLOP/s per rank: over half an hour at the peak, said
    before the first step; a CPU-sized run, a GPU, or no known peak: nothing."""
    d12_step = 6.5e14
    assert slow_step_warning(d12_step, 3e11, 1, "cpu") == (
        "warning: a step takes at least 36m07s on this CPU (6.5e+14 FLOP at its peak, 3e+11 FLOP/s per rank); "
        "a run sized for a CPU: bash launch/cpu_demo.sh")
    assert slow_step_warning(d12_step, 3e11, 2, "cpu").startswith("warning: a step takes at least 18m03s")
    assert slow_step_warning(SLOW_STEP_S * 3e11 * 2, 3e11, 2, "cpu").startswith("warning: a step takes at least 1m00s")
    assert slow_step_warning(SLOW_STEP_S * 3e11 * 2 * 0.99, 3e11, 2, "cpu") is None
    assert slow_step_warning(d12_step, 9.89e14, 1, "cuda") is None and slow_step_warning(d12_step, None, 1, "cpu") is None
