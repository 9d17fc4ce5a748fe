"""The console step line: `step N/M` and an ETA from the recent steps' pace."""
import re

import pytest

from conftest import TINY, train
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


def test_each_step_line_says_how_far_and_when(tmp_path, shakespeare_dir):
    _, proc = train(tmp_path / "out", shakespeare_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "256")
    lines = [line for line in proc.stdout.splitlines() if re.match(r"step +\d+/", line)]
    assert [line.split(" |")[0].split()[1] for line in lines] == ["0/3", "1/3", "2/3"]
    assert re.search(r" \| eta \d+s$", lines[0]) and lines[-1].endswith(" | done"), lines
