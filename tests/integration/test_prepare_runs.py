"""gpt-prepare as a process: offline hub and bad files are clear errors (the rest: tests/unit/test_prepare.py)."""
import json
import os
import subprocess
import sys

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
    counts, and the directory held one corpus. The first holds the directory (gpt.data.prepare.only_preparation)."""
    from gpt.commands.prepare import main
    from gpt.data.prepare import only_preparation

    texts, out = [tmp_path / "val.txt", tmp_path / "train.txt"], tmp_path / "shards"
    for text in texts:  # a document each: the first the val split's
        text.write_text("Some words, and then some more. " * 400)
    argv = ["files", *map(str, texts), "--out_dir", str(out), "--val_tokens", "64", "--shard_tokens", "1024"]
    with only_preparation(out):  # as a preparation that is writing there holds it
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert list(out.iterdir()) == []
    assert refused.value.code == 1
    assert capsys.readouterr().err == (f"error: --out_dir {out}: another gpt-prepare is writing there; wait for it "
                                       f"to end, or use another --out_dir\n")
    assert not out.exists()  # made for the lock, and removed again while empty
    main(argv)  # alone, it runs
    assert "corpus_prepare.json" in {p.name for p in out.iterdir()}
