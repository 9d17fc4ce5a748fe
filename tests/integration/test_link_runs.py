"""What a run or a tool writes is its own: a run copied as a tree of links (`cp -rs`) and resumed leaves the original's
files as they were; two gpt-export into one --out_dir at once: the second is refused, naming the first, and the first
says "exported" over its own files. (The link checks themselves: tests/unit/test_links.py.)"""
import hashlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import GPT2_VOCAB, REPO, TINY, train
from gpt.runtime import lock_file
from gpt.train import checkpoint
from gpt.train.hf import MODEL_FILES


def contents(directory):
    """path -> SHA-256 of every file under directory (links followed: what they lead to)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_run_copied_as_links_and_resumed_leaves_the_original_as_it_was(trained_checkpoint, shakespeare_dir,
                                                                        tmp_path):
    """The original holds a crash's leftover of the step the copy saves next (a step directory without complete.json):
    in the copy, a directory of links to it, which DeepSpeed's writes would follow. The copy's run.lock and
    metrics.jsonl links are removed first, as their refusal says (tests/unit/test_links.py)."""
    run, fork = tmp_path / "run", tmp_path / "fork"
    shutil.copytree(trained_checkpoint.parent, run)
    shutil.copytree(run / "checkpoints" / "step_00000002", run / "checkpoints" / "step_00000003",
                    ignore=shutil.ignore_patterns(checkpoint.COMPLETE))
    subprocess.run(["cp", "-rs", str(run), str(fork)], check=True)
    for name in ("run.lock", "metrics.jsonl"):
        (fork / name).unlink(missing_ok=True)
    before = contents(run)
    records, _ = train(fork, shakespeare_dir, *TINY, *GPT2_VOCAB, "--max_steps", "4", "--total_batch_tokens", "512",
                       "--lr", "3e-3", "--resume", "auto")
    assert [r["step"] for r in records if "loss" in r] == [3]
    assert contents(run) == before
    assert checkpoint.complete_tags(fork / "checkpoints")[-1] == "step_00000003"
    assert not any(p.is_symlink() for p in (fork / "checkpoints" / "step_00000003").rglob("*"))


@pytest.mark.slow
def test_a_second_export_into_the_same_out_dir_is_refused_naming_the_first(trained_checkpoint, tmp_path):
    """Two at once, of different steps, both wrote: the one that said "exported .../step_00000007" left step 3's
    weights, the other failed on a temporary file the first had renamed. The first holds OUT_DIR/export.lock."""
    out, start, go = tmp_path / "hf", tmp_path / "start", tmp_path / "go"
    export = [str(trained_checkpoint), "--out_dir", str(out)]
    race = [sys.executable, "tests/integration/export_race.py"]
    # both import at once; the first starts at once and waits to write, the second starts once the first holds the lock
    first = subprocess.Popen([*race, str(tmp_path), str(go), *export], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen([*race, str(start), str(tmp_path), *export], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        while lock_file.record_of(out / "export.lock").get("pid") != first.pid:
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        holder = lock_file.holder(out / "export.lock")
        start.touch()
        second.wait(timeout=120)
        assert [p.name for p in out.iterdir()] == ["export.lock"]  # the first waits to write; the second wrote nothing
    finally:
        start.touch()
        go.touch()
    second = subprocess.CompletedProcess(second.args, second.returncode, *second.communicate())
    stdout, stderr = first.communicate(timeout=120)
    assert holder.startswith(f"pid {first.pid} on {socket.gethostname()} (since ")
    assert (second.returncode, second.stdout) == (1, "")
    assert second.stderr == (f"error: --out_dir {out}: another gpt-export is writing there: {holder}; wait for it to "
                             f"end, or use another --out_dir\n")
    assert first.returncode == 0 and stdout.startswith(f"exported {trained_checkpoint} -> {out} "), stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(MODEL_FILES)  # the lock file removed
