"""The console step line in a run: `step N/M` and an ETA, `done` on the last step."""
import re

from conftest import TINY, train


def test_each_step_line_says_how_far_and_when(tmp_path, shakespeare_dir):
    _, proc = train(tmp_path / "out", shakespeare_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "256")
    lines = [line for line in proc.stdout.splitlines() if re.match(r"step +\d+/", line)]
    assert [line.split(" |")[0].split()[1] for line in lines] == ["0/3", "1/3", "2/3"]
    assert re.search(r" \| eta \d+s$", lines[0]) and lines[-1].endswith(" | done"), lines
