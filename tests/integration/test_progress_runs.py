"""The console step line in a run: `step N/M` and an ETA, `done` on the last step."""
import re
import subprocess
import sys
import threading

from conftest import GPT2_VOCAB, REPO, TINY, train


def test_each_step_line_says_how_far_and_when(tmp_path, small_vocab_dir):
    _, proc = train(tmp_path / "out", small_vocab_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "256")
    lines = [line for line in proc.stdout.splitlines() if re.match(r"step +\d+/", line)]
    assert [line.split(" |")[0].split()[1] for line in lines] == ["0/3", "1/3", "2/3"]
    assert re.search(r" \| eta \d+s$", lines[0]) and lines[-1].endswith(" | done"), lines


def test_a_run_too_big_for_this_cpu_says_so_before_its_first_step(tmp_path, small_vocab_dir):
    """d4 at 1M tokens/step: ~1e14 FLOP, minutes a step even at the peak the CPU declares: a warning before the first
    step, whose ETA would come only after it (the run is stopped there)."""
    cmd = [sys.executable, "train_ds.py", *TINY, *GPT2_VOCAB, "--model", "d4", "--total_batch_tokens", "1048576", "--max_steps",
           "2", "--data", str(small_vocab_dir), "--out_dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        said = []
        for line in proc.stdout:
            said.append(line)
            if line.startswith(("warning: a step takes", "step ")):
                break
    finally:
        proc.kill()
        proc.wait()
        watchdog.cancel()
    assert re.fullmatch(r"warning: a step takes at least \d+m\d\ds on this CPU \([\d.]+e\+14 FLOP at its peak, "
                        r"[\d.e+]+ FLOP/s per rank\); a run sized for a CPU: bash launch/cpu_demo.sh\n",
                        said[-1]), said[-3:]
