"""Write problems told apart and atomic writes (gpt/console.py); full and read-only disks in runs:
tests/integration/test_disk_runs.py."""
import pytest


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
