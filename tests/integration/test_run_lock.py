"""One run per --out_dir at a time (gpt/train/run_lock.py): a second run beside a live one, fresh or resumed, is
refused with one line naming the holder; a dead run's lock file blocks nothing."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import REPO, TINY, free_port, train
from gpt.runtime import lock_file
from gpt.train import run_lock
from gpt.console import BadInput

LONG_RUN = [*TINY, "--max_steps", "500", "--total_batch_tokens", "512", "--save_every", "0"]


def start_holder(cmd, out):
    """A run that holds out's lock: started, and read until its step 1 (it has the lock by then)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("step     1/"):
            return proc
    raise AssertionError(f"the holder ended before step 1 ({proc.wait()})")


def refusal_line(out):
    record = json.loads((out / run_lock.LOCK_FILE).read_text())
    return (f"error: --out_dir {out}: another run is using it: pid {record['pid']} on {record['host']} (since "
            f"{record['since']}); wait for it to end, or use another --out_dir")


@pytest.mark.slow
def test_a_second_run_beside_a_live_one_is_refused_and_a_dead_ones_lock_blocks_nothing(tmp_path, small_vocab_dir):
    out = tmp_path / "out"
    holder = start_holder([sys.executable, "train_ds.py", *LONG_RUN, "--data", str(small_vocab_dir), "--out_dir",
                           str(out)], out)
    try:
        record = json.loads((out / run_lock.LOCK_FILE).read_text())
        assert (record["pid"], record["host"]) == (holder.pid, socket.gethostname())
        for resume in ([], ["--resume", "auto"]):
            _, proc = train(out, small_vocab_dir, *TINY, "--max_steps", "2", *resume, check=False)
            assert (proc.returncode, proc.stderr) == (2, refusal_line(out) + "\n")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # as the OOM killer would: no chance to clean up
        holder.wait()
    assert (out / run_lock.LOCK_FILE).exists()
    _, proc = train(out, small_vocab_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512", "--resume", "auto")
    assert "fresh start" in proc.stdout  # the killed run saved nothing
    assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()  # this process held it


@pytest.mark.slow
def test_every_node_ends_at_once_when_only_rank_0_finds_the_lock_held(tmp_path, small_vocab_dir):
    """Rank 0 alone takes the lock, after the other ranks passed every check (tests/integration/lock_race.py), on two
    nodes (two launchers of one rank each, as tests/integration/test_multinode.py runs them): node 1's launcher is not
    killed with node 0's, so its rank ends by itself, at once, rather than at the collective timeout (120 s
    here). Both exit 2, the refusal said once. ~7 s here, ~12 s on a 2-core AVX2 EPYC: two launchers and their
    ranks, each importing torch and DeepSpeed."""
    out = tmp_path / "out"
    (tmp_path / "hostfile").write_text("node0 slots=1\nnode1 slots=1\n")
    port = free_port()
    held = run_lock.acquire(out)
    try:
        nodes = [subprocess.Popen(
            ["deepspeed", "--hostfile", str(tmp_path / "hostfile"), "--master_port", str(port), "--no_ssh",
             "--node_rank", str(node), "--master_addr", "127.0.0.1", "tests/integration/lock_race.py", *LONG_RUN,
             "--collective_timeout", "120", "--data", str(small_vocab_dir), "--out_dir", str(out)], cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True) for node in (0, 1)]
        try:
            results = [(node.wait(timeout=90), *node.communicate()) for node in nodes]
        finally:
            for node in nodes:
                if node.poll() is None:
                    os.killpg(node.pid, signal.SIGKILL)
    finally:
        held.close()
    assert [code for code, _, _ in results] == [2, 2], results[0][2][-2000:] + results[1][2][-2000:]
    errors = [line for _, _, err in results for line in err.splitlines() if "error:" in line]
    assert errors == [refusal_line(out)] and not any("Traceback" in out + err for _, out, err in results)


@pytest.mark.slow
def test_a_two_rank_launch_into_a_held_out_dir_ends_every_rank_at_once(tmp_path, small_vocab_dir):
    """A `deepspeed --num_gpus 2` launch into an --out_dir a live run holds (this process, as the test above
    checks a run does): its ranks all end at once, exit 2, the refusal said once; the holder keeps the lock. ~9 s
    here, ~14 s on a 2-core AVX2 EPYC: the launch is the point (its 4 processes each import torch and DeepSpeed)."""
    out = tmp_path / "out"
    held = run_lock.acquire(out)
    try:
        proc = subprocess.run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_ds.py",
                               *LONG_RUN, "--data", str(small_vocab_dir), "--out_dir", str(out)],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
        assert [line for line in proc.stderr.splitlines() if "error:" in line] == [refusal_line(out)]
        assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        held.close()


def test_the_fresh_check_is_made_again_under_the_lock(tmp_path):
    """Two fresh runs that both checked an empty out_dir before either took the lock: the one that takes it
    second finds the first one's files (or the first one still holding it), and is refused."""
    from gpt.train.run_lock import lock_out_dir
    out_dir = tmp_path / "out"
    first, refusal = lock_out_dir(out_dir, None, None, 10)
    assert refusal is None
    (tmp_path / "out" / "metrics.jsonl").write_text('{"step": 0, "loss": 10.9}\n')
    lock, refusal = lock_out_dir(out_dir, None, None, 10)
    assert lock is None and isinstance(refusal, BadInput)
    first.close()  # the first run ended
    lock, refusal = lock_out_dir(out_dir, None, None, 10)
    assert lock is None and isinstance(refusal, BadInput) and "holds an earlier run" in str(refusal)
    run_lock.acquire(out_dir).close()  # the refused run let go of the lock


def test_a_file_system_without_locks_is_said_and_trains_unguarded(tmp_path, monkeypatch, capsys):
    import errno

    def no_locks(file, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(lock_file.fcntl, "flock", no_locks)
    out = tmp_path / "out"
    run_lock.acquire(out).close()
    run_lock.check_unlocked(out)  # nothing to refuse on
    assert capsys.readouterr().err == (f"warning: {out / run_lock.LOCK_FILE}: this file system has no file locks (No "
                                       f"locks available): a second run into --out_dir {out} would not be stopped\n")
