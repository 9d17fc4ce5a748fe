"""The lock files (gpt/runtime/lock_file.py): one holder at a time, who it is, and a lock file removed by its holder
never locked by two. (The trainer's run.lock: tests/integration/test_run_lock.py; gpt-prepare's:
tests/integration/test_prepare_runs.py.)"""
import os
import socket

import pytest

from gpt.console import BadInput
from gpt.runtime import lock_file


def test_a_held_lock_is_refused_and_says_who_holds_it(tmp_path):
    path = tmp_path / "out" / "x.lock"
    held = lock_file.acquire(path, "the lock file", "unguarded", record={"launch": None})
    assert lock_file.held_by_another(path)
    with pytest.raises(lock_file.Held):
        lock_file.acquire(path, "the lock file", "unguarded", tries=2)
    record = lock_file.record_of(path)
    assert (record["pid"], record["host"], record["launch"]) == (os.getpid(), socket.gethostname(), None)
    assert lock_file.holder(path) == f"pid {os.getpid()} on {socket.gethostname()} (since {record['since']})"
    held.close()
    assert not lock_file.held_by_another(path)
    lock_file.acquire(path, "the lock file", "unguarded").close()


def test_a_lock_released_with_its_file_leaves_nothing_and_is_taken_again(tmp_path):
    path = tmp_path / "x.lock"
    held = lock_file.acquire(path, "the lock file", "unguarded")
    opened_before = open(path)  # as another process that opened the file just before it was removed
    lock_file.release(held, remove=True)
    assert not path.exists() and not lock_file.still_at(opened_before, path)
    again = lock_file.acquire(path, "the lock file", "unguarded")  # a new file: the one at the path is locked
    assert lock_file.still_at(again, path) and lock_file.held_by_another(path)
    again.close()
    opened_before.close()


def test_a_fifo_where_the_lock_file_goes_is_refused_without_opening_it(tmp_path):
    path = tmp_path / "x.lock"
    os.mkfifo(path)
    with pytest.raises(BadInput) as refused:
        lock_file.acquire(path, "the lock file", "unguarded")
    assert str(refused.value) == (f"{path}: a FIFO (named pipe), not a regular file (the lock file): move it away, or "
                                  f"use another --out_dir")
