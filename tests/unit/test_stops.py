"""What stops and start-up clean-ups decide without a process (gpt/train/stop.py, gpt/train/dist.py): a launch
that lost its runner, a stop inside an import, a stale JIT build lock on a local or a shared file system. (The
drills: tests/integration/test_stops_runs.py.)"""
import sys

import pytest

from gpt.train import dist, stop


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
    monkeypatch.setattr(dist, "file_system_type", lambda path: file_system)
    lines = []
    removed = dist.handle_stale_jit_locks(say=lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning:")
    if file_system == "ext4":
        assert removed == [lock] and not lock.exists()
    else:
        assert removed == [] and lock.exists() and "If none is running, delete it" in lines[0]


def test_in_training_a_stop_is_said_at_once_and_a_second_one_later_ends_the_rank_at_once(monkeypatch, capfd):
    """The first signal after the first step: said on stderr at once, the step finishes and saves (requested).
    The launcher's SIGTERM that follows a terminal's Ctrl-C within AT_ONCE_AFTER_S is the same request; the
    signal again after that ends the rank at once, without saving. Before the first step: the start-up stop."""
    clock = [100.0]
    monkeypatch.setattr(stop.time, "monotonic", lambda: clock[0])
    request = stop.StopRequest()
    exits = []
    monkeypatch.setattr(request, "_exit_now", exits.append)
    try:
        with pytest.raises(stop.StoppedDuringStartUp):
            request._handle(stop.signal.SIGTERM, None)
        request.started()
        request.requested, request._leaving = False, False
        capfd.readouterr()
        request._handle(stop.signal.SIGINT, None)
        assert request.requested == "SIGINT" and exits == []
        assert capfd.readouterr().err == ("SIGINT: finishing this step, then saving and exiting (SIGINT again, 2 s or "
                                          "more from now, stops at once without saving)\n")
        clock[0] += stop.AT_ONCE_AFTER_S - 0.1  # deepspeed.launcher.launch passing the Ctrl-C on
        request._handle(stop.signal.SIGTERM, None)
        assert exits == [] and capfd.readouterr().err == "" and request.requested == "SIGINT"
        clock[0] += 0.1
        request._handle(stop.signal.SIGINT, None)
        assert exits == ["error: stopped at once by a second SIGINT, without saving: the last complete checkpoint "
                         "stands (--resume auto continues from it)"]
    finally:
        request.close()
