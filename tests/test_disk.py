"""Full and read-only disks (gpt/console.py), on small tmpfs mounts: one line, `latest` never on a partial step,
refused up front where the run could not save."""
import subprocess

import pytest

from conftest import TINY, train
from gpt.train import checkpoint
from gpt.console import free_bytes, megabytes


@pytest.fixture
def mount(tmp_path):
    """mount(path, size, read_only=False): a tmpfs at path (made), unmounted at the end; skips where mounting
    is not permitted (not root, a container without CAP_SYS_ADMIN)."""
    mounted = []

    def make(path, size, read_only=False):
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                              text=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(path)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        return path
    try:
        yield make
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_checkpoints_directory_is_refused_before_training(mount, tmp_path, shakespeare_dir):
    out = tmp_path / "out"
    mount(out / "checkpoints", "1m", read_only=True)
    _, proc = train(out, shakespeare_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out}: {out / 'checkpoints'} is not writable\n")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]  # nothing written


def test_a_read_only_out_dir_is_refused_before_training(mount, tmp_path, shakespeare_dir):
    out = mount(tmp_path / "out", "1m", read_only=True)
    _, proc = train(out / "run", shakespeare_dir, *TINY, "--max_steps", "2", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out / 'run'}: {out} is not writable\n")


@pytest.mark.slow
def test_a_save_onto_a_full_disk_says_so_and_keeps_latest_then_a_resume_is_refused(mount, tmp_path, shakespeare_dir):
    """The tiny fp32 model's checkpoint is ~52 MB: 80 MB holds one, not two. The second save fails mid-way:
    one line, exit 1, `latest` on the first; the partial step is never loaded. A --resume auto on the still-full
    disk is refused up front, before a run that could not save starts."""
    out = mount(tmp_path / "disk", "80m") / "out"
    args = [*TINY, "--max_steps", "4", "--total_batch_tokens", "512", "--save_every", "2"]
    _, proc = train(out, shakespeare_dir, *args, check=False)
    ckpt = out / "checkpoints"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        f"error: stopping: {ckpt / 'step_00000003'}: no space left on the device; that checkpoint is incomplete and "
        f"will not be loaded. Last good checkpoint: {ckpt / 'step_00000001'}"]
    assert (ckpt / "latest").read_text() == "step_00000001" and (ckpt / "step_00000003").is_dir()
    assert checkpoint.find_checkpoint("auto", out) == ckpt / "step_00000001"

    needed = sum(checkpoint.file_sizes(ckpt / "step_00000001").values())
    free = free_bytes(ckpt)
    _, proc = train(out, shakespeare_dir, *args, "--resume", "auto", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out}: no space left on the device: "
                                                 f"{megabytes(free)} free, a checkpoint like step_00000001 needs "
                                                 f"{megabytes(needed)}\n")


def test_write_problems_are_told_apart(tmp_path):
    """errno where the error has one; free space where it has none (a C++ stream's RuntimeError); None (the
    error shown whole) where the disk is not why."""
    import errno

    from gpt.console import write_problem
    path = tmp_path / "step_00000003"
    assert write_problem(path, OSError(errno.ENOSPC, "No space left on device")) == \
        f"{path}: no space left on the device"
    assert write_problem(path, OSError(errno.EROFS, "Read-only file system")) == \
        f"{path}: not writable (Read-only file system)"
    assert write_problem(path, RuntimeError("basic_ios::clear: iostream error")) is None  # this disk has room
    assert write_problem(path, OSError(errno.ENOENT, "No such file or directory")) is None


def test_atomic_write_replaces_only_a_whole_file(tmp_path):
    """A body that raises leaves the target as it was and no temporary; one that completes replaces it. Nested,
    nothing is replaced unless every body completes."""
    from gpt.console import atomic_write
    target, other = tmp_path / "a.json", tmp_path / "b.json"
    target.write_text("old")
    with pytest.raises(ValueError):
        with atomic_write(target) as tmp:
            tmp.write_text("partial")
            raise ValueError("interrupted")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with pytest.raises(ValueError):
        with atomic_write(target) as tmp, atomic_write(other) as tmp_other:
            tmp.write_text("new")
            tmp_other.write_text("partial")
            raise ValueError("interrupted")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with atomic_write(target) as tmp:
        assert tmp == tmp_path / "a.json.tmp"
        tmp.write_text("new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
