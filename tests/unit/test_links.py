"""No file a run or a tool writes is written through a symbolic link (gpt/runtime/links.py): a link where a file
written in place goes (a lock file, metrics.jsonl) is refused in one line, naming it, and its target is untouched; a
file written whole replaces the link; a directory linked into another run is refused; a step directory is removed,
links and all, never what they lead to. (The resumed `cp -rs` copy of a run: tests/integration/test_link_runs.py.)"""
import os
import subprocess
from pathlib import Path

import pytest

from gpt.console import BadInput, atomic_write
from gpt.runtime import lock_file
from gpt.runtime.links import open_no_follow
from gpt.train import checkpoint
from gpt.train.out_dir import check_writable, run_path_problems

NOTES = "a user's own words\n"


@pytest.fixture
def notes(tmp_path):
    path = tmp_path / "elsewhere" / "notes.txt"
    path.parent.mkdir()
    path.write_text(NOTES)
    return path


def link_line(path, target, what):
    return (f"{path}: a symbolic link to {target} ({what}): it is written in place, never through a link, which would "
            f"overwrite the file the link leads to: remove the link, or use another --out_dir")


@pytest.mark.parametrize("dangling", [False, True], ids=["to_a_file", "dangling"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, notes, dangling):
    """OUT_DIR/prepare.lock (or run.lock) linked to a user's notes.txt: the lock's record overwrote the notes. A
    dangling link: the open would have made its target."""
    target = tmp_path / "elsewhere" / "absent.txt" if dangling else notes
    path = tmp_path / "out" / "prepare.lock"
    path.parent.mkdir()
    path.symlink_to(target)
    with pytest.raises(BadInput) as refused:
        with lock_file.holding(path.parent, path.name, "gpt-prepare"):
            pass
    assert str(refused.value) == link_line(path, target, "gpt-prepare's lock file")
    assert notes.read_text() == NOTES and not (tmp_path / "elsewhere" / "absent.txt").exists()
    assert path.is_symlink()  # the user's link is theirs to remove


def test_a_link_made_after_the_checks_is_not_opened(tmp_path, notes):
    """The checks look before the open; a link made in between is refused by the open itself (O_NOFOLLOW)."""
    path = tmp_path / "metrics.jsonl"
    path.symlink_to(notes)
    with pytest.raises(BadInput) as refused:
        open_no_follow(path, "a", "the run's metrics log")
    assert str(refused.value) == link_line(path, notes, "the run's metrics log")
    assert notes.read_text() == NOTES


def test_a_file_written_whole_replaces_a_link_never_follows_it(tmp_path, notes):
    """run_config.json, complete.json, `latest`, an export's files: a temporary renamed over the path replaces a link
    there; a link at the temporary's own path (PATH.tmp) is removed before the write."""
    for name in ("latest", "config.json"):
        path = tmp_path / name
        path.symlink_to(notes)
        if name == "config.json":
            Path(f"{path}.tmp").symlink_to(notes)
        with atomic_write(path) as tmp:
            tmp.write_text("step_00000002")
        assert not path.is_symlink() and path.read_text() == "step_00000002"
    assert notes.read_text() == NOTES


def test_a_run_copied_as_a_tree_of_links_is_refused_naming_each_file_it_would_write_through(tmp_path):
    """`cp -rs run fork`: every file of fork a link to run's; a resume of fork appended its records to run's
    metrics.jsonl and rewrote run's run.lock. `latest` (written whole) and the checkpoints (read) may stay links."""
    run, fork = tmp_path / "run", tmp_path / "fork"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    for name in ("run.lock", "metrics.jsonl", "checkpoints/latest", "checkpoints/step_00000002/complete.json"):
        (run / name).write_text("{}\n")
    subprocess.run(["cp", "-rs", str(run), str(fork)], check=True)
    assert run_path_problems(fork) == [link_line(fork / "run.lock", run / "run.lock", "the run's lock file"),
                                       link_line(fork / "metrics.jsonl", run / "metrics.jsonl",
                                                 "the run's metrics log")]
    for name in ("run.lock", "metrics.jsonl"):  # as the line says
        (fork / name).unlink()
    assert run_path_problems(fork) == []


def test_a_directory_linked_into_another_run_is_refused_one_on_another_disk_is_not(tmp_path):
    run, fork, scratch = tmp_path / "run", tmp_path / "fork", tmp_path / "scratch" / "fork_checkpoints"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    fork.mkdir()
    (fork / "checkpoints").symlink_to(run / "checkpoints")
    with pytest.raises(BadInput) as refused:
        check_writable(fork)
    assert str(refused.value) == (
        f"{fork / 'checkpoints'} leads through a symbolic link to {run / 'checkpoints'}, among the files of the run "
        f"in {run} (where the run saves its checkpoints): this run would write into that run's; remove the link, or "
        f"use another --out_dir")
    (fork / "checkpoints").unlink()
    scratch.mkdir(parents=True)
    (fork / "checkpoints").symlink_to(scratch)
    check_writable(fork)


def test_a_step_directory_is_removed_with_its_links_never_what_they_lead_to(tmp_path, notes):
    """Where a step is saved, a crash's leftover goes first (DeepSpeed's writes follow links); pruning a step that is
    a link removes the link (shutil.rmtree raised on it)."""
    leftover, linked = tmp_path / "step_00000004", tmp_path / "step_00000002"
    leftover.mkdir()
    (leftover / "mp_rank_00_model_states.pt").symlink_to(notes)
    linked.symlink_to(notes.parent)
    for path in (leftover, linked):
        checkpoint.remove(path)
        assert not os.path.lexists(path)
    assert notes.read_text() == NOTES
