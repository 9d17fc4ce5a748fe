"""gpt-prepare as a process: offline hub and bad files are clear errors, one preparation per directory, Ctrl-C in one
line (the rest: tests/unit/test_prepare.py)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO


def run_prepare(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gpt.commands.prepare", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_offline_hub_is_a_clear_error(tmp_path):
    proc = run_prepare("hub", "HuggingFaceFW/fineweb-edu", "--hub_config", "sample-10BT", "--out_dir", str(tmp_path),
                       env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: cannot reach the Hugging Face Hub for 'HuggingFaceFW/fineweb-edu' (offline?); download it "
        "elsewhere and prepare the files with: python -m gpt.commands.prepare files PATH")


@pytest.mark.slow
def test_bad_file_inputs_are_clear_errors(tmp_path):
    proc = run_prepare("files", str(tmp_path / "*.jsonl"), "--out_dir", str(tmp_path / "out"))
    assert (proc.returncode, proc.stderr.strip()) == (1, f"error: no files match {tmp_path / '*.jsonl'}")
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    proc = run_prepare("files", str(tmp_path / "a.jsonl"), "--out_dir", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'a.jsonl'}:1: no 'text' field (fields: body); choose one with --text_field")


def test_a_second_preparation_into_a_directory_being_written_is_refused(tmp_path, capsys):
    """Two preparations of different corpora into one --out_dir at the same moment both reported their token
    counts, and the directory held one corpus. The first holds OUT_DIR/prepare.lock (gpt.data.prepare.only_preparation),
    and says who it is."""
    from gpt.commands.prepare import main
    from gpt.data.prepare import only_preparation

    texts, out = [tmp_path / "val.txt", tmp_path / "train.txt"], tmp_path / "shards"
    for text in texts:  # a document each: the first the val split's
        text.write_text("Some words, and then some more. " * 400)
    argv = ["files", *map(str, texts), "--out_dir", str(out), "--val_tokens", "64", "--shard_tokens", "1024"]
    with only_preparation(out):  # as a preparation that is writing there holds it
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert list(out.iterdir()) == [out / "prepare.lock"]  # a file: a directory's flock fails on NFS
        since = json.loads((out / "prepare.lock").read_text())["since"]
    holder = f"pid {os.getpid()} on {socket.gethostname()} (since {since})"
    assert refused.value.code == 1
    assert capsys.readouterr().err == (f"error: --out_dir {out}: another gpt-prepare is writing there: {holder}; "
                                       f"wait for it to end, or use another --out_dir\n")
    assert not out.exists()  # made for the lock, and removed again with it
    main(argv)  # alone, it runs
    assert "corpus_prepare.json" in {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_ctrl_c_to_a_preparation_with_workers_is_one_line_and_a_rerun_finishes_the_same_shards(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) to `gpt-prepare --workers 2` printed
    KeyboardInterrupt tracebacks from the main process and each worker. Sent once a train shard is complete: 1500
    documents are 6 tasks of the workers' (gpt.data.prepare.DOCUMENTS_PER_TASK) and ~580 shards, of which the
    first task's output holds the first ~90, so that the preparation is still at work when the signal lands."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Line {i} of a long and plain document. " * 40}) + "\n"
                              for i in range(1500)))
    argv = [sys.executable, "-m", "gpt.commands.prepare", "files", str(corpus), "--workers", "2", "--val_tokens",
            "1000", "--shard_tokens", "1000"]
    interrupted, whole = tmp_path / "interrupted", tmp_path / "whole"
    proc = subprocess.Popen([*argv, "--out_dir", str(interrupted)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal starts it
    while not (interrupted / "corpus_train_000002.bin").exists() and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.strip()][-1:] == [
        "error: stopped by Ctrl-C (SIGINT): the shards complete so far are kept; the same command again continues "
        "after them"]
    assert "resuming after" in run_prepare(*argv[3:], "--out_dir", str(interrupted)).stdout
    run_prepare(*argv[3:], "--out_dir", str(whole))
    shards = sorted(p.name for p in whole.glob("*.bin"))
    assert sorted(p.name for p in interrupted.glob("*.bin")) == shards
    assert all((interrupted / name).read_bytes() == (whole / name).read_bytes() for name in shards)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["waiting for a task", "in the caller's loop"])
def test_a_ctrl_c_shuts_the_workers_pool_down_before_it_propagates(where):
    """No pool thread outlives the KeyboardInterrupt: one still closing its pipe when the interpreter's exit woke it
    printed "Exception ignored ... Bad file descriptor" after gpt-prepare's one line (a race, seen in the drill above)."""
    from concurrent.futures.process import _ExecutorManagerThread
    from contextlib import closing
    from gpt.data.prepare import DOCUMENTS_PER_TASK, tokenized

    documents = iter(["To be, or not to be."] * (8 * DOCUMENTS_PER_TASK))
    with pytest.raises(KeyboardInterrupt):
        with closing(tokenized(documents, workers=2)) as batches:
            next(batches)
            if where == "waiting for a task":
                batches.throw(KeyboardInterrupt)
            raise KeyboardInterrupt
    assert not [t for t in threading.enumerate() if isinstance(t, _ExecutorManagerThread)]
