"""What stops and start-up clean-ups decide without a process (gpt/train/stop.py, gpt/runtime/host.py): a launch
that lost its runner, a stop inside an import, a stale JIT build lock on a local or a shared file system. (The
drills: tests/integration/test_stops_runs.py.)"""
import contextlib
import os
import sys
import tempfile

import pytest
import torch

from gpt.runtime import host
from gpt.train import stop


class FakeProcess:
    def __init__(self, pid, cmdline, parent=None):
        self.pid, self._cmdline, self.parent = pid, cmdline, parent

    def cmdline(self):
        return self._cmdline

    def ppid(self):
        return self.parent.pid


LAUNCH = ["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "--master_port=29500"]
RUNNER = ["python", "/usr/bin/deepspeed", "--num_gpus", "2", "train_ds.py"]


@pytest.mark.parametrize("launch_argv,parent_pid,parent_argv,cut", [
    (LAUNCH, 4000, RUNNER, False),  # the runner's child
    (LAUNCH, 1, RUNNER, False),  # the runner as a container's PID 1
    (LAUNCH, 4000, ["python", "-m", "deepspeed.launcher.runner", "train_ds.py"], False),
    (LAUNCH, 1, ["/sbin/init"], True),  # adopted by init: the runner is gone
    (LAUNCH, 4000, ["/lib/systemd/systemd", "--user"], True),  # adopted by a subreaper
    ([*LAUNCH, "--node_rank=1"], 4000, ["bash", "-c", "cd /x; python -u -m deepspeed.launcher.launch"], False),  # pdsh
    ([*LAUNCH, "--node_rank=1"], 1, ["/sbin/init"], True)])
def test_a_launch_that_lost_its_runner_before_the_rank_started_is_found(monkeypatch, launch_argv, parent_pid,
                                                                         parent_argv, cut):
    parent = FakeProcess(parent_pid, parent_argv)
    launch = FakeProcess(4001, launch_argv, parent)
    monkeypatch.setattr(stop.psutil, "Process", lambda pid: parent)
    assert stop.cut_off_launch([launch]) is (launch if cut else None)


def test_a_stop_inside_an_import_is_told_apart(tmp_path, monkeypatch):
    """importing(frame): inside a module's import (a stop then exits at once: a library that catches everything
    around an import would swallow the start-up stop and leave a half-made module, numpy without np.intp in one
    CI run), and not outside one."""
    (tmp_path / "probe_import.py").write_text("import sys\nINSIDE = CHECK(sys._getframe())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins
    monkeypatch.setattr(builtins, "CHECK", stop.importing, raising=False)
    import probe_import
    assert probe_import.INSIDE is True and stop.importing(sys._getframe()) is False


@pytest.mark.parametrize("file_system", ["ext4", "nfs4"])
def test_a_stale_lock_is_removed_on_a_local_file_system_and_reported_on_a_shared_one(tmp_path, monkeypatch,
                                                                                   file_system):
    """On NFS or Lustre a build on another machine holds its lock invisibly from here: say what to do, keep it."""
    lock = tmp_path / "fused_adam" / "lock"
    lock.parent.mkdir()
    lock.touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(host, "file_system_type", lambda path: file_system)
    lines = []
    removed = host.handle_stale_jit_locks(say=lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning:")
    if file_system == "ext4":
        assert removed == [lock] and not lock.exists()
    else:
        assert removed == [] and lock.exists() and "If none is running, delete it" in lines[0]


def test_in_training_a_stop_is_said_at_once_and_a_second_one_later_ends_the_rank_at_once(monkeypatch, capfd):
    """The first signal after the first step: said on stderr at once, the step finishes and saves (requested).
    The launcher's SIGTERM that follows a terminal's Ctrl-C within AT_ONCE_AFTER_S is the same request; the
    signal again after that ends the rank at once, without saving. The times are the signals' arrivals, as the
    watchdog reads them, not when the main thread's handler gets to run. Before the first step: the start-up stop."""
    request = stop.StopRequest()
    exits = []
    monkeypatch.setattr(request, "_exit_now", exits.append)
    try:
        with pytest.raises(stop.StoppedDuringStartUp):
            request._handle(stop.signal.SIGTERM, None)
        request.requested, request._leaving = False, False
        request.started()
        capfd.readouterr()
        request._handle(stop.signal.SIGINT, None)  # the main thread's handler leaves training's signals to the watchdog
        assert request.requested is False and exits == []
        request._signal_in_training("SIGINT", 100.0)
        assert request.requested == "SIGINT" and exits == []
        assert capfd.readouterr().err == ("SIGINT: finishing this step, then saving and exiting (SIGINT again, 2 s or "
                                          "more from now, stops at once without saving)\n")
        request._signal_in_training("SIGTERM", 100.0 + stop.AT_ONCE_AFTER_S - 0.1)  # deepspeed.launcher.launch
        assert exits == [] and capfd.readouterr().err == "" and request.requested == "SIGINT"  # passing the Ctrl-C on
        request._signal_in_training("SIGINT", 100.0 + stop.AT_ONCE_AFTER_S)
        assert exits == ["error: stopped at once by a second SIGINT, without saving: this run has no checkpoint yet "
                         "(a relaunch starts it from step 0)"]  # it said a checkpoint stood before
        request.saved()  # as fit says after each save
        request._signal_in_training("SIGINT", 101.0 + stop.AT_ONCE_AFTER_S)
        assert exits[1:] == ["error: stopped at once by a second SIGINT, without saving: the last complete "
                             "checkpoint stands (--resume auto continues from it)"]
        request._signal_in_training("SIGTERM", 102.0 + stop.AT_ONCE_AFTER_S)  # not a second SIGTERM: named as it is
        assert exits[2:] == ["error: stopped at once by SIGTERM after SIGINT, without saving: the last complete "
                             "checkpoint stands (--resume auto continues from it)"]
    finally:
        request.close()


def test_a_resumed_run_has_a_checkpoint_standing_from_its_first_step():
    request = stop.StopRequest()
    try:
        assert not request.checkpoint_stands
        request.started(resumed=True)
        assert request.checkpoint_stands
    finally:
        request.close()


@contextlib.contextmanager
def stderr_file():
    """fd 2 into a file of its own for the block; yields a function that reads all of it so far. Polling capfd instead
    lost lines: its readouterr() reads, then truncates, and a line the watchdog thread wrote in between was gone (the
    wait timed out in 2 of ~14 full runs on 2026-11-27, the watchdog alive and its signal delivered)."""
    with tempfile.TemporaryFile() as file:
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield lambda: os.pread(file.fileno(), 1 << 16, 0).decode()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def test_the_watchdog_times_training_signals_as_they_arrive_while_the_main_thread_is_busy(monkeypatch):
    """A real SIGINT to this process in training, the main thread busy in a loop that never returns to the handler's
    check: the watchdog thread says the line at once; a second SIGINT AT_ONCE_AFTER_S later ends the rank, however
    late the main thread would have run its handler (on a slow CPU the second signal was taken for the
    first's echo and lost)."""
    request = stop.StopRequest()
    exits = []
    monkeypatch.setattr(request, "_exit_now", exits.append)
    try:
        with stderr_file() as said_so_far:
            request.started()
            stop.signal.pthread_kill(stop.threading.main_thread().ident, stop.signal.SIGINT)
            said = wait_for(said_so_far, state=lambda: watchdog_state(request))
            assert said.startswith("SIGINT: finishing this step") and request.requested == "SIGINT"
            stop.time.sleep(stop.AT_ONCE_AFTER_S + 0.1)  # at least this long: the test never races the clock
            stop.signal.pthread_kill(stop.threading.main_thread().ident, stop.signal.SIGINT)
            assert wait_for(lambda: exits)[0].startswith("error: stopped at once by a second SIGINT")
    finally:
        request.close()


def test_a_signal_another_handler_catches_is_no_stop():
    """Python writes every signal that has a Python handler into the wakeup pipe, not only ours: a library's (torch's
    DataLoader catches SIGCHLD) must not be taken for a stop, nor hide the SIGINT after it."""
    previous = stop.signal.signal(stop.signal.SIGUSR2, lambda *_: None)
    request = stop.StopRequest()
    try:
        with stderr_file() as said_so_far:
            request.started()
            stop.signal.pthread_kill(stop.threading.main_thread().ident, stop.signal.SIGUSR2)
            stop.signal.pthread_kill(stop.threading.main_thread().ident, stop.signal.SIGINT)
            said = wait_for(said_so_far, state=lambda: watchdog_state(request))
            assert said.startswith("SIGINT: finishing this step") and request.requested == "SIGINT"
    finally:
        request.close()
        stop.signal.signal(stop.signal.SIGUSR2, previous)


@pytest.mark.parametrize("signum, ignored", [(stop.signal.SIGTERM, False), (stop.signal.SIGINT, False),
                                             (stop.signal.SIGUSR1, False), (stop.signal.SIGUSR1, True),
                                             (stop.signal.SIGHUP, False)],
                         ids=["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR1_ignored_from_the_start", "SIGHUP"])
def test_each_stop_signal_in_training_is_a_stop_that_saves_and_cuts_an_evaluation_short(signum, ignored):
    """SIGUSR1, Slurm's `--signal=USR1@N` warning before a job's time limit, ended the run by its default, with no line
    and no checkpoint; SIGHUP likewise before it was a stop. Each, in training, finishes the step and saves. SIGUSR1
    also where it was ignored from the start: launch/slurm.sbatch ignores it for the launchers, which it would end.
    Each is what asked() answers between a sample's tokens and an evaluation's batches: the cut of a long sample, drilled
    with the launcher's death in tests/integration/test_stops_runs.py, is the same for each."""
    previous = stop.signal.signal(signum, stop.signal.SIG_IGN) if ignored else None
    request = stop.StopRequest()
    try:
        with stderr_file() as said_so_far:
            request.started()
            assert not request.asked()
            stop.signal.pthread_kill(stop.threading.main_thread().ident, signum)
            said = wait_for(said_so_far, state=lambda: watchdog_state(request))
            assert said.startswith(f"{signum.name}: finishing this step, then saving and exiting")
            assert request.requested == signum.name and request.asked()
    finally:
        request.close()
        if ignored:
            stop.signal.signal(signum, previous)


def test_a_start_up_stop_whose_exception_was_swallowed_ends_the_run_at_the_first_step(capfd):
    """A library that catches everything around a call can swallow the start-up stop's exception: the run must still
    end with the start-up stop's line and exit 1 at its first step, not train a step, save and exit 0."""
    request = stop.StopRequest()
    try:
        try:
            request._handle(stop.signal.SIGINT, None)
        except BaseException:  # noqa: BLE001 -- what such a library does
            pass
        with pytest.raises(stop.StoppedDuringStartUp) as stopped:
            request.started()
        assert str(stopped.value) == ("error: stopped by SIGINT during start-up, before the first step: nothing to "
                                      "save. Relaunch to train")
    finally:
        request.close()


def watchdog_state(request):
    """What a timed-out wait should say about the watchdog (it timed out in 2 of ~14 full runs, 2026-11-27, each time
    alive, the wakeup fd and the handler ours, nothing blocked; cause unknown): also the bytes waiting in its pipe (none:
    the signal never reached it; some: it did not read them) and where the watchdog thread is."""
    import fcntl
    import sys
    import termios
    import traceback
    wakeup = stop.signal.set_wakeup_fd(-1)
    stop.signal.set_wakeup_fd(wakeup)
    pending = fcntl.ioctl(request._wakeup_read, termios.FIONREAD, b"\0\0\0\0")
    frame = sys._current_frames().get(request._watchdog.ident)
    return (f"watchdog alive {request._watchdog.is_alive()}, wakeup fd {wakeup} (ours {request._wakeup_write}), "
            f"SIGINT handler ours {stop.signal.getsignal(stop.signal.SIGINT) == request._handle}, LOCAL_RANK "
            f"{stop.os.environ.get('LOCAL_RANK')!r}, blocked {stop.signal.pthread_sigmask(stop.signal.SIG_BLOCK, [])}, "
            f"{int.from_bytes(pending, sys.byteorder)} byte(s) in its pipe, SIGCHLD handler "
            f"{stop.signal.getsignal(stop.signal.SIGCHLD)!r}, the watchdog at:\n"
            + "".join(traceback.format_stack(frame) if frame else ["(no frame)"]))


def wait_for(find, timeout=60, state=lambda: ""):
    """find()'s first truthy answer, polling: an event, with a timeout far beyond any machine's need."""
    deadline = stop.time.monotonic() + timeout
    while stop.time.monotonic() < deadline:
        found = find()
        if found:
            return found
        stop.time.sleep(0.01)
    raise AssertionError(f"timed out {state()}")


def test_a_stop_while_the_host_module_is_half_imported_still_exits_at_once(monkeypatch, capfd):
    """A signal inside gpt.runtime.host's own import (every command imports it first thing): the exit must not need
    what the module has not defined yet. It raised AttributeError, which an import's bare except could swallow:
    the run then went on and said its stop twice (seen in the suite)."""
    import types

    class Exited(Exception):
        pass

    def exit_(status):
        raise Exited(status)
    request = stop.StopRequest()
    try:
        monkeypatch.setitem(sys.modules, "gpt.runtime.host", types.ModuleType("gpt.runtime.host"))  # half-imported
        monkeypatch.setattr(stop.os, "_exit", exit_)
        with pytest.raises(Exited, match="1"):
            request._exit_now("error: stopped")
        assert capfd.readouterr().err == "error: stopped\n"
    finally:
        request.close()


class Scores(torch.nn.Module):
    """A 'model' whose loss is the batch's first input token: a validation set's mean loss is known by arithmetic."""

    def forward(self, x, y):
        return None, x[:, 0].float().mean()


class Batches:
    def __init__(self, values):
        self.values = values

    def batches(self):
        return ((torch.tensor([[v]]), torch.tensor([[v]])) for v in self.values)

    def batch_count(self):
        return len(self.values)


def as_rank_0_of_2(monkeypatch, other_rank):
    """torch.distributed as rank 0 of 2 sees it: the reduction adds other_rank's tensor (what rank 1 contributed)."""
    def all_reduce(tensor, op=None):
        tensor += torch.as_tensor(other_rank, dtype=tensor.dtype)
    for name, value in (("is_initialized", lambda: True), ("get_rank", lambda: 0), ("get_world_size", lambda: 2),
                        ("all_reduce", all_reduce)):
        monkeypatch.setattr(torch.distributed, name, value)


def test_a_validation_cut_short_on_another_rank_alone_is_logged_on_none(monkeypatch):
    """SIGTERM to rank 1 alone mid-validation: rank 0 scored its share whole and logged a loss over part of the set as
    if whole (9.9300 where the whole set's was 9.9370). Rank 1's flag (the third sum) makes every rank's answer None;
    without a cut the mean is the whole set's. HellaSwag's counts the same way (their fourth sum)."""
    from gpt.data import hellaswag
    from gpt.train.evaluate import validation_loss

    rank_1_whole, rank_1_cut = [4.0 + 6.0, 2.0, 0.0], [4.0, 1.0, 1.0]  # (sum of losses, sequences, ranks cut)
    as_rank_0_of_2(monkeypatch, rank_1_whole)
    assert validation_loss(Scores(), Batches([1.0, 3.0]), torch.device("cpu")) == (1 + 3 + 4 + 6) / 4
    as_rank_0_of_2(monkeypatch, rank_1_cut)
    assert validation_loss(Scores(), Batches([1.0, 3.0]), torch.device("cpu")) is None
    monkeypatch.setattr(hellaswag, "example_losses", lambda model, group, device, block_size: (
        torch.zeros(len(group), 4), torch.zeros(len(group), 4)))  # every example's answer: ending 0
    examples = [hellaswag.Example(context=[1], endings=[[2]] * 4, label=0)] * 4
    as_rank_0_of_2(monkeypatch, [2.0, 2.0, 2.0, 0.0])
    assert hellaswag.evaluate(Scores(), examples, torch.device("cpu"), 8) == {"acc": 1.0, "acc_norm": 1.0,
                                                                              "examples": 4}
    as_rank_0_of_2(monkeypatch, [0.0, 0.0, 0.0, 1.0])
    assert hellaswag.evaluate(Scores(), examples, torch.device("cpu"), 8) is None


def test_evaluation_asks_for_a_stop_that_a_launcher_gone_is(monkeypatch):
    """asked(), what validation, HellaSwag and a sample ask between batches and tokens: a launcher gone is a stop there
    too (the runner killed alone during a 4,096-token sample: the rank sampled on, no checkpoint in 180 s)."""
    request = stop.StopRequest()
    try:
        request.started()
        assert request.asked() is False
        runner = FakeProcess(4242, RUNNER)
        runner.is_running = lambda: False
        request.launchers, request._launchers_seen_at = [runner], float("-inf")
        assert request.asked() is True and request.requested == "its launcher exiting (pid 4242)"
    finally:
        request.close()


@pytest.mark.parametrize("argv, tool", [
    (["/usr/bin/python3", "/venv/bin/gpt-sample", "--prompt", "x"], True),  # a console script, as its #! runs it
    (["python", "-m", "gpt.commands.export", "ckpt"], True), (["python", "-u", "-m", "gpt.commands.plan"], True),
    (["python", "train_ds.py", "--model", "tiny"], False), (["python", "-m", "pytest", "tests/unit"], False),
    (["python", "bench/data.py"], False), (["python", "-c", "import gpt.commands.prepare"], False)])
def test_the_ctrl_c_of_a_tools_imports_is_set_in_a_tools_process_alone(argv, tool):
    """ctrl_c_in_imports_is_one_line is installed by gpt/commands/__init__.py only where the process is a console tool:
    not in the trainer's ranks (their StopRequest handles signals), a test run or a script that imports a tool's main."""
    from gpt.console import run_as_a_console_tool

    assert run_as_a_console_tool(argv) is tool


def test_a_stop_says_evaluation_was_cut_only_at_a_step_with_an_evaluation_due(monkeypatch, capsys):
    """A SIGUSR1 to a run with --val_every 0 --sample_every 0 had said `evaluation skipped or cut short` at its
    stop, with no evaluation there to skip."""
    from types import SimpleNamespace

    from gpt.train import trainer

    monkeypatch.setattr(trainer, "validation_loss", lambda *args, **kwargs: None)  # cut short by the stop

    def stopped_at(step, val_every):
        evaluation = SimpleNamespace(val_every=val_every, eval_every=250, sample_every=0, sample_tokens=64)
        run = SimpleNamespace(settings=SimpleNamespace(evaluation=evaluation), hellaswag_examples=None,
                              engine=SimpleNamespace(global_rank=0), val_set=None, device=None)
        trainer.Trainer.evaluate(run, step, cut_short=lambda: True)
        return capsys.readouterr().out
    assert stopped_at(4, val_every=0) == stopped_at(4, val_every=5) == ""
    assert stopped_at(5, val_every=5) == "step     5 | evaluation skipped or cut short: stopping\n"
