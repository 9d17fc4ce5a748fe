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
