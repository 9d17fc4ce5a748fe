"""gpt-eval and gpt-sample --device on a trained checkpoint: auto is cpu without CUDA, with exactly the fp32
results gpt-eval gave before the flag existed; in a plain shell, --device cuda without CUDA is one line and
--json prints only JSON. The choice itself: tests/unit/test_eval_device.py; the other bad input in
tests/integration/test_bad_input_scripts.py, the CUDA runs in tests/integration/test_gpu.py."""
import argparse
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, plain_shell_env
from gpt.data import hellaswag
from gpt.train import hf
from gpt.commands.eval import main as evaluate_main
from gpt.commands.sample import main as sample_main
from gpt.data.shards import ValidationSet, find_shards
from gpt.train.evaluate import validation_loss

CPU = torch.device("cpu")


def test_gpt_eval_auto_is_cpu_without_cuda_and_gives_the_fp32_results(trained_checkpoint, small_vocab_dir,
                                                                       hellaswag_files, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as here, also on a machine with a GPU
    args = ["--checkpoint", str(trained_checkpoint), "--data", str(small_vocab_dir), "--seq_len", "64",
            "--val_tokens", "2048", "--hellaswag", str(hellaswag_files / "hellaswag_val.jsonl"), "--json"]
    runs = []
    for device in ([], ["--device", "auto"], ["--device", "cpu"]):
        evaluate_main(args + device)
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        runs.append({k: v for k, v in result.items() if not k.endswith("_per_s")})  # timings vary
    # the reference: the model in fp32 on the CPU, scored as gpt-eval scored it before --device
    config, load_model = hf.model_source(argparse.Namespace(checkpoint=str(trained_checkpoint), hf=None))
    model = load_model(CPU)
    scores = hellaswag.evaluate(model, hellaswag.load(hellaswag_files / "hellaswag_val.jsonl"), CPU,
                                config.block_size)
    expected = {"device": "cpu", "precision": "fp32",
                "val_loss": validation_loss(model, ValidationSet(find_shards(small_vocab_dir, "val"), 64, 32, 8), CPU),
                "val_tokens": 32 * 64,
                **{f"hellaswag_{k}": v for k, v in scores.items()}}
    assert runs == [expected] * 3  # equality, not a tolerance


def test_gpt_sample_auto_is_cpu_without_cuda(trained_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    outputs = []
    for device in ("auto", "cpu"):
        sample_main(["--checkpoint", str(trained_checkpoint), "--prompt", "To be", "--max_new_tokens", "8",
                         "--device", device])
        outputs.append(capsys.readouterr())
    assert outputs[0].out == outputs[1].out and "--- sample 0\nTo be" in outputs[0].out
    assert [o.err.splitlines()[-1] for o in outputs] == ["sampling on cpu in fp32"] * 2


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without CUDA")
def test_device_cuda_without_cuda_in_a_plain_shell_is_one_line():
    """As a user runs it (DeepSpeed picking its accelerator, and saying so on stderr): exit 1, nothing on stdout,
    one error line, checked before any weights are read (the repository stands in for the checkpoint)."""
    proc = subprocess.run([sys.executable, "-m", "gpt.commands.eval", "--checkpoint", str(REPO), "--device", "cuda",
                           "--data", str(REPO), "--json"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=plain_shell_env())
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert [line for line in proc.stderr.splitlines() if "error" in line.lower() or "Traceback" in line] == [
        "error: --device cuda: torch sees no CUDA GPU here; use --device auto or cpu"]


def test_gpt_sample_device_cuda_without_cuda_is_one_line(monkeypatch, capsys):
    """gpt-sample's refusal is gpt-eval's (gpt.train.hf.choose_device; gpt-sample in a plain shell:
    tests/integration/test_plain_shell_runs.py), also before any weights are read."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exited:
        sample_main(["--checkpoint", str(REPO), "--device", "cuda"])
    assert (exited.value.code, *capsys.readouterr()) == (
        1, "", "error: --device cuda: torch sees no CUDA GPU here; use --device auto or cpu\n")


@pytest.mark.slow
def test_gpt_eval_json_in_a_plain_shell_prints_only_json(trained_checkpoint, small_vocab_dir, hellaswag_files):
    """As a user runs it (DeepSpeed picking its accelerator and logging as it likes): stdout is one JSON object,
    whatever the logs and the progress bar write (to stderr)."""
    proc = subprocess.run([sys.executable, "-m", "gpt.commands.eval", "--checkpoint", str(trained_checkpoint), "--data",
                           str(small_vocab_dir), "--seq_len", "64", "--val_tokens", "512", "--hellaswag",
                           str(hellaswag_files / "hellaswag_val.jsonl"), "--limit", "4", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=plain_shell_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)
    assert {"device", "precision", "val_loss", "hellaswag_acc_norm"} <= results.keys()
    assert results["hellaswag_examples"] == 4
