"""Stops at any moment end cleanly (gpt/train/stop.py), and what killed runs leave behind is removed at the next
start (gpt/runtime/host.py): a SIGTERM to the `deepspeed` command during start-up, before and after it started
the ranks; a SIGINT during the imports; a SIGKILLed rank of two; a main thread stuck in C code; a stale JIT
build lock (FusedAdam's, for a config that asks for it). Each: every process gone in bounded
time, one line, and the port free for the next launch (which the SIGKILL drill makes). A SIGTERM after the first step (save, exit 0) is
tests/integration/test_checkpoint_runs.py's drill."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import FUSED_ADAM, REPO, TINY, free_port, train, write_ds_config

ARGS = [*TINY, "--total_batch_tokens", "512", "--save_every", "2"]
GONE_WITHIN_S = 60  # generous: the machine is shared and loaded; gpt/train/stop.py's hard exit is at 10 s


def processes_of(out_dir):
    """The live processes whose command line names out_dir: the runner, deepspeed.launcher.launch, the ranks."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(out_dir) in (process.info["cmdline"] or []) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            pass
    return found


def wait_until_gone(out_dir, timeout=GONE_WITHIN_S):
    """Seconds until no process of the run is left; kills what is left after timeout and fails."""
    start = time.monotonic()
    while processes_of(out_dir):
        if time.monotonic() - start > timeout:
            left = processes_of(out_dir)
            for process in left:
                process.kill()
            raise AssertionError(f"still running after {timeout} s: {[p.cmdline()[:4] for p in left]}")
        time.sleep(0.2)
    return time.monotonic() - start


def start(out_dir, data, *args, port=None, ranks=2, launcher="deepspeed", steps="500", sigint=signal.SIG_DFL):
    """The run in a session of its own, SIGINT as `sigint` says from its start (SIG_IGN: as a non-interactive shell
    starts a background job, `cmd &`), whatever this process's own is."""
    argv = ["train_ds.py", *ARGS, "--max_steps", steps, "--data", str(data), "--out_dir", str(out_dir), *args]
    prefix = (["deepspeed", "--num_gpus", str(ranks), "--master_port", str(port or free_port())]
              if launcher == "deepspeed" else [sys.executable])
    return subprocess.Popen([*prefix, *argv], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def wait_for(find, timeout=120):
    start_time = time.monotonic()
    while time.monotonic() - start_time < timeout:
        found = find()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def children_matching(process, mark):
    try:
        return [c for c in process.children() if any(mark in arg for arg in c.cmdline())]
    except psutil.Error:
        return []


def loads_torch(process):
    try:
        return "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def error_lines(output):
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_sigterm_to_the_deepspeed_command_during_start_up_ends_every_process_and_the_port_is_free(
        tmp_path, small_vocab_dir):
    """Killed at once (before it starts anything), just after it started deepspeed.launcher.launch (the ranks
    start orphaned: the chain was cut before they looked), and after the ranks started (their watchdog sees
    the runner go). Then the port is free."""
    port = free_port()
    runner = start(tmp_path / "at_once", small_vocab_dir, port=port)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=30) == -signal.SIGTERM and wait_until_gone(tmp_path / "at_once") < GONE_WITHIN_S
    for name in ("before_the_ranks", "after"):
        out = tmp_path / name
        runner = start(out, small_vocab_dir, port=port)
        launch = wait_for(lambda: children_matching(psutil.Process(runner.pid), "deepspeed.launcher.launch"))[0]
        if name == "after":
            for rank in (0, 1):  # each, not one: a rank not yet watching when the runner goes says 'before this rank
                # started' (seen under launch/slow_machine.sh, rank 0 behind rank 1)
                process = wait_for(lambda: children_matching(launch, f"--local_rank={rank}"))[0]
                wait_for(lambda: loads_torch(process))  # train_ds.py watches from before it imports torch
        runner.send_signal(signal.SIGTERM)
        seconds = wait_until_gone(out)
        output = runner.stdout.read()
        assert runner.wait(timeout=10) == -signal.SIGTERM
        assert seconds < GONE_WITHIN_S
        errors = error_lines(output)
        assert len(errors) == 1 and "during start-up, before the first step" in errors[0], output[-3000:]
        assert "Traceback" not in output and "step     0/" not in output
        if name == "before_the_ranks":
            assert "the deepspeed runner exiting before this rank started" in errors[0]
        else:
            assert f"its launcher exiting (pid {runner.pid})" in errors[0]
    with socket.create_server(("", port)):  # as the next launch's rendezvous does (a whole relaunch: the next drill)
        pass


@pytest.mark.slow
@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["foreground", "background job"])
def test_sigint_during_start_up_is_one_line_without_a_traceback(tmp_path, small_vocab_dir, sigint):
    """Ctrl-C (SIGINT to the process group) soon after train_ds.py started: while it imports torch and DeepSpeed. Also
    in a run started with SIGINT ignored, as a script's `cmd &` or a suite run that way starts it: the stop was lost
    there, and the run trained its 500 steps and exited 0."""
    proc = start(tmp_path, small_vocab_dir, launcher="python", sigint=sigint)
    wait_for(lambda: psutil.Process(proc.pid).num_threads() > 1)  # its stop watchdog: train_ds.py's first line
    os.killpg(proc.pid, signal.SIGINT)
    output = proc.stdout.read()
    assert proc.wait(timeout=GONE_WITHIN_S) == 1
    assert error_lines(output) == ["error: stopped by SIGINT during start-up, before the first step: nothing to "
                                   "save. Relaunch to train"], output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output


STUCK = """
import datetime, sys
from gpt.train import stop as stop_module
stop_module.HARD_EXIT_AFTER_S = 1.0  # the watchdog's wait, not the user's 10 s: the same path, 9 s sooner
stop = stop_module.StopRequest()
import torch.distributed
print("waiting for a rank that never comes", flush=True)
torch.distributed.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, timeout=datetime.timedelta(seconds=300))
"""


@pytest.mark.slow
def test_a_stop_while_the_main_thread_is_stuck_in_c_code_ends_the_process(tmp_path):
    """A rendezvous with a rank that never comes runs no Python signal handler: the watchdog ends the process."""
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(free_port())], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().startswith("waiting")
    time.sleep(0.5)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output = proc.stdout.read()
    assert proc.wait(timeout=GONE_WITHIN_S) == 1 and time.monotonic() - signalled < 30
    assert error_lines(output) == ["error: stopped by SIGTERM during start-up, before the first step: nothing to "
                                   "save. Relaunch to train (the main thread did not respond in 1 s)"], output


@pytest.mark.slow
def test_a_sigkilled_rank_ends_the_run_with_one_line_and_the_relaunch_resumes(tmp_path, small_vocab_dir):
    """deepspeed.launcher.launch SIGTERMs the survivor, whose next collective fails; the relaunch, on the same
    port, resumes."""
    port = free_port()
    runner = start(tmp_path, small_vocab_dir, port=port)
    lines = []
    for line in runner.stdout:
        lines.append(line)
        if line.startswith("step     3/"):
            break
    rank1 = next(p for p in processes_of(tmp_path) if "--local_rank=1" in p.cmdline())
    rank1.kill()
    seconds = wait_until_gone(tmp_path)
    output = "".join(lines) + runner.stdout.read()
    assert runner.wait(timeout=10) != 0 and seconds < GONE_WITHIN_S
    errors = error_lines(output)
    assert len(errors) == 1 and errors[0].startswith("error: [rank 0] lost contact with another rank"), output[-3000:]
    assert "Traceback" not in output
    records, proc = train(tmp_path, small_vocab_dir, *ARGS, "--max_steps", "5", "--resume", "auto", ranks=2,
                          port=port)
    assert "resumed from" in proc.stdout
    assert [r["step"] for r in records if "loss" in r][-1] == 4


def hold(path, mapped):
    """A live process that holds path: open (mapped=False) or mapped with its descriptor closed (mapped=True)."""
    code = ("import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "if sys.argv[2] == 'mapped': m = mmap.mmap(fd, 4096); os.close(fd)\n"
            "print('holding', flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", code, str(path), "mapped" if mapped else "open"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "holding\n"
    return process


@pytest.mark.slow
def test_a_stale_jit_build_lock_does_not_hang_the_start(tmp_path, small_vocab_dir):
    """A build killed mid-way leaves fused_adam/lock; torch would wait for it forever. The start of a run with
    FusedAdam (a JSON without torch_adam) removes it (one line) and trains; a lock that a live process holds is left
    alone."""
    from torch.utils.cpp_extension import get_default_build_root

    extensions = tmp_path / "torch_extensions"
    built = Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    if (built / "fused_adam" / "fused_adam.so").exists():  # a built one, when there is: no minute of compiling here
        shutil.copytree(built / "fused_adam", extensions / "fused_adam", ignore=shutil.ignore_patterns("lock"))
    (extensions / "fused_adam").mkdir(parents=True, exist_ok=True)
    stale = extensions / "fused_adam" / "lock"
    stale.touch()
    fused_adam = write_ds_config(tmp_path / "fused_adam.json", "zero2_fp32.json", optimizer=FUSED_ADAM)
    live = extensions / "being_built" / "lock"
    live.parent.mkdir()
    live.touch()
    holder = hold(live, mapped=False)
    try:
        proc = subprocess.run([sys.executable, "train_ds.py", *ARGS, "--max_steps", "2", "--data", str(small_vocab_dir),
                               "--out_dir", str(tmp_path / "out"), "--ds_config", fused_adam], cwd=REPO,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(extensions)},
                              timeout=900)
    finally:
        holder.kill()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"warning: removed {stale}: left by a JIT build of fused_adam that was killed" in proc.stderr
    assert live.exists() and (extensions / "fused_adam" / "fused_adam.so").exists()


def test_the_stop_watch_starts_before_torch_loads():
    """train_ds.py starts gpt.train.stop first so that a stop during the seconds of importing torch and DeepSpeed is
    caught: it must not import them itself."""
    code = "import sys, gpt.train.stop; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert proc.stdout == "[]\n", proc.stderr
