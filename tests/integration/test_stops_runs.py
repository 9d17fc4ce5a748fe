"""Stops at any moment end cleanly (gpt/train/stop.py), and what killed runs leave behind is removed at the next
start (gpt/runtime/host.py): a SIGTERM to the `deepspeed` command during start-up, before and after it started
the ranks, and in training (a long sample cut short, save, exit); a SIGINT during the imports; a SIGKILLed rank of two; a main thread stuck
in C code; a stale JIT build lock. Each: every process gone in bounded time, one line, and the port free for the
next launch (which the SIGKILL drill makes). A SIGTERM to a one-rank run, and SIGHUP: test_checkpoint_runs.py."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, TINY, free_port, started_early, train
from gpt.train import resume

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


def start(out_dir, data, *args, port=None, ranks=2, launcher="deepspeed", steps="500", sigint=signal.SIG_DFL,
          env=None):
    """The run in a session of its own, SIGINT as `sigint` says from its start (SIG_IGN: as a non-interactive shell
    starts a background job, `cmd &`), whatever this process's own is; env: this process's environment by default."""
    argv = ["train_ds.py", *ARGS, "--max_steps", steps, "--data", str(data), "--out_dir", str(out_dir), *args]
    prefix = (["deepspeed", "--num_gpus", str(ranks), "--master_port", str(port or free_port())]
              if launcher == "deepspeed" else [sys.executable])
    return subprocess.Popen([*prefix, *argv], cwd=REPO, env={**(env or os.environ), "PYTHONPATH": str(REPO)},
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
    the runner go). Then the port is free. Over 15 s on a 2-core AVX2 EPYC: three launches one after another on one
    port, the last to its ranks' imports, beside killed_then_stopped's launches."""
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
stop_module.POLL_S = 0.1  # and its look at the clock, every 0.1 s instead of 1 s
stop = stop_module.StopRequest()
import torch.distributed
torch.distributed.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, timeout=datetime.timedelta(seconds=300))
"""


def listening(process, port):
    try:
        return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp"))
    except psutil.Error:
        return False


@pytest.mark.slow
def test_a_stop_while_the_main_thread_is_stuck_in_c_code_ends_the_process(tmp_path):
    """A rendezvous with a rank that never comes runs no Python signal handler: the watchdog ends the process. The
    stop comes once the store listens on its port: inside the C call that waits."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(port)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: listening(psutil.Process(proc.pid), port))
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output = proc.stdout.read()
    assert proc.wait(timeout=GONE_WITHIN_S) == 1 and time.monotonic() - signalled < 30
    assert error_lines(output) == ["error: stopped by SIGTERM during start-up, before the first step: nothing to "
                                   "save. Relaunch to train (the main thread did not respond in 1 s)"], output


def hold(path, mapped):
    """A live process that holds path: open (mapped=False) or mapped with its descriptor closed (mapped=True)."""
    code = ("import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "if sys.argv[2] == 'mapped': m = mmap.mmap(fd, 4096); os.close(fd)\n"
            "print('holding', flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", code, str(path), "mapped" if mapped else "open"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "holding\n"
    return process


# torch's JIT build of an op of one line (no torch header: compiled and linked in about a second): what a stale lock
# makes wait is torch's build and load, whichever op it is (FusedAdam's own build: test_optimizer_runs.py)
BUILD_STAND_IN = """
import sys
from torch.utils.cpp_extension import load
load("stand_in", [sys.argv[1]], is_python_module=False)
print("loaded", flush=True)
"""


@pytest.mark.slow
def test_a_stale_jit_build_lock_does_not_hang_the_start(tmp_path, small_vocab_dir, monkeypatch):
    """A build killed mid-way leaves OP/lock in torch's extensions directory, and torch's next build or load of that
    op (DeepSpeed's FusedAdam, for a JSON without torch_adam) waits for it forever. The start of a run removes it
    (one line) and trains, and the op then builds; a lock that a live process holds is left alone."""
    extensions = tmp_path / "torch_extensions"
    stale, live = extensions / "stand_in" / "lock", extensions / "being_built" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir(parents=True)
        lock.touch()
    holder = hold(live, mapped=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    try:
        records, proc = train(tmp_path / "out", small_vocab_dir, *ARGS, "--max_steps", "2")
    finally:
        holder.kill()
    assert [r["step"] for r in records if "loss" in r] == [0, 1]
    assert f"warning: removed {stale}: left by a JIT build of stand_in that was killed" in proc.stderr
    assert live.exists() and not stale.exists()
    source = tmp_path / "stand_in.cpp"
    source.write_text('extern "C" int stand_in() { return 1; }\n')
    build = subprocess.run([sys.executable, "-c", BUILD_STAND_IN, str(source)], capture_output=True, text=True,
                           timeout=300)  # with the stale lock there: forever
    assert build.stdout == "loaded\n", build.stderr[-3000:]
    assert (extensions / "stand_in" / "stand_in.so").exists()


def test_the_stop_watch_starts_before_torch_loads():
    """train_ds.py starts gpt.train.stop first so that a stop during the seconds of importing torch and DeepSpeed is
    caught: it must not import them itself."""
    code = "import sys, gpt.train.stop; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert proc.stdout == "[]\n", proc.stderr


def killed_then_stopped(data, environ, out):
    """Three drills on one run, each 2-rank launch costing seconds of imports on its four processes: rank 1 SIGKILLed
    at step 3, then the relaunch on the same port, resuming, stopped by a SIGTERM to its `deepspeed` command once
    it has trained a step (with no periodic save: a checkpoint after it is the stop's), while rank 0 writes the
    sample of that step (4,096 tokens of the tiny model, ~5 ms each on a 2-core AVX512 EPYC, 2026-12-06: ~20 s to cut,
    where the stop is seen within POLL_S, 1 s)."""
    port = free_port()
    runner = start(out, data, port=port, env=environ)
    lines = []
    for line in runner.stdout:
        lines.append(line)
        if line.startswith("step     3/"):
            break
    rank1 = next(p for p in processes_of(out) if "--local_rank=1" in p.cmdline())
    rank1.kill()
    killed = dict(gone_after=wait_until_gone(out), output="".join(lines) + runner.stdout.read(),
                  code=runner.wait(timeout=10), resumable=resume.find_checkpoint("auto", out))
    runner = start(out, data, "--resume", "auto", "--save_every", "0", "--sample_every", "1", "--sample_tokens", "4096",
                   port=port, env=environ)
    lines = []
    try:
        for line in runner.stdout:
            lines.append(line)
            if line.startswith("step ") and "/500 |" in line:  # the relaunch's first step: its sample begins
                break
        descendants = psutil.Process(runner.pid).children(recursive=True)
        runner.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        output = "".join(lines) + runner.stdout.read()  # until every process holding the pipe (launch.py, the ranks) exits
        exited_after = time.monotonic() - signalled
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    _, still_running = psutil.wait_procs(descendants, timeout=10)  # launch.py and the ranks: none orphaned
    stopped = dict(output=output, code=runner.wait(timeout=10), exited_after=exited_after, still_running=still_running,
                   checkpoint=resume.find_checkpoint("auto", out))
    return killed, stopped


@pytest.mark.slow
def test_a_sigkilled_rank_ends_the_run_with_one_line_and_the_relaunch_resumes(killed_then_stopped_runs):
    """deepspeed.launcher.launch SIGTERMs the survivor, whose next collective fails; the relaunch, on the same
    port, resumes from the last complete checkpoint. Over 15 s on a 2-core AVX2 EPYC, where the wait for the shared
    run (killed_then_stopped, beside the module's other tests) is counted: two launches of 2 ranks, the least a
    relaunch takes."""
    killed, stopped = killed_then_stopped_runs
    assert killed["code"] != 0 and killed["gone_after"] < GONE_WITHIN_S
    errors = error_lines(killed["output"])
    assert len(errors) == 1 and errors[0].startswith("error: [rank 0] lost contact with another rank"), \
        killed["output"][-3000:]
    assert "Traceback" not in killed["output"]
    resumed_step = int(killed["resumable"].name.split("_")[1])
    assert f"resumed from {killed['resumable']}" in stopped["output"], stopped["output"][-3000:]
    assert f"step {resumed_step + 1:5d}/500 |" in stopped["output"]


@pytest.mark.slow
def test_sigterm_to_the_deepspeed_command_saves_and_stops_every_rank(killed_then_stopped_runs):
    """`kill PID` of the `deepspeed` command (DeepSpeed 0.19's runner forwards no signal on one node; `docker stop`
    signals a container's PID 1 so): the ranks notice their launcher is gone (gpt/train/stop.py), save and exit;
    nothing is left running. The stop came in the sample of the relaunch's first step, which rank 0 wrote on to its
    end before it looked at its launchers (minutes of a d4 sample, past a scheduler's grace period: Slurm's default is
    30 s): it is cut short, and that step saved (validation and HellaSwag are cut the same way). A signal to a rank sets
    the flag the sample asks for (tests/unit/test_stops.py, each stop signal). A node killed outright is
    tests/integration/test_multinode.py's drill."""
    killed, stopped = killed_then_stopped_runs
    output = stopped["output"]
    assert stopped["code"] == -signal.SIGTERM and stopped["exited_after"] < 60 and not stopped["still_running"]
    assert output.count("stopped by its launcher exiting") == 1, output[-3000:]  # printed by rank 0
    stopped_at = int(stopped["checkpoint"].name.split("_")[1])
    assert stopped_at == int(killed["resumable"].name.split("_")[1]) + 1  # the first step: its sample cut
    assert f"step {stopped_at:5d} | evaluation skipped or cut short: stopping" in output, output[-3000:]
    assert "sample at step" not in output and f"step {stopped_at:5d} | saved" in output
    assert "Traceback" not in output


# beside the module's other drills from its first test on: the 2-rank launches leave a core idle at times, and the
# drills here mostly wait
killed_then_stopped_started, killed_then_stopped_runs = started_early(killed_then_stopped, "small_vocab_dir",
                                                                      name="killed_then_stopped_runs")
