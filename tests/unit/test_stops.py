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
