"""HellaSwag evaluation runs in training (2 ranks = 1 rank, compile on = off) and standalone (gpt-eval).
(The scoring and the readers: tests/unit/test_hellaswag.py.)"""
import json

import pytest
import torch

from conftest import GPT2_VOCAB, TINY, succeeded, train, two_rank_run, write_ds_config
from gpt.commands.eval import main as evaluate_main


def scores(records):
    return [(r["step"], r["hellaswag/acc"], r["hellaswag/acc_norm"]) for r in records if "hellaswag/acc" in r]


# lr ~0 keeps every run at the same (seeded) weights, whatever the world size or compilation
IN_TRAINING = [*TINY, *GPT2_VOCAB, "--max_steps", "2", "--total_batch_tokens", "512", "--lr", "1e-12", "--hellaswag",
               "{hellaswag_files}/hellaswag_val.bin", "--eval_every", "1"]
FP32_ZERO1 = dict(stage=1, precision="fp32")


@pytest.mark.two_rank_runs({"hellaswag_in_training": two_rank_run("--data", "{small_vocab_dir}", *IN_TRAINING,
                                                                  ds_config=FP32_ZERO1)})
def test_in_training_two_ranks_equal_one_and_compile_equals_eager(tmp_path, small_vocab_dir, hellaswag_files,
                                                                  two_rank_runs):
    config = write_ds_config(tmp_path / "fp32.json", **FP32_ZERO1)
    args = [arg.format(hellaswag_files=hellaswag_files) for arg in IN_TRAINING] + ["--ds_config", config]
    one, proc = train(tmp_path / "one", small_vocab_dir, *args)
    two, _ = succeeded(two_rank_runs["hellaswag_in_training"])
    compiled, _ = train(tmp_path / "compiled", small_vocab_dir, *args, "--compile")
    assert len(scores(one)) == 2 and scores(one) == scores(two) == scores(compiled)
    assert "hellaswag acc_norm" in proc.stdout and "(10 examples)" in proc.stdout


@pytest.mark.slow
def test_gpt_eval_standalone(tmp_path, small_vocab_dir, hellaswag_files, capsys):
    """gpt-eval in this process (its plain-shell run: tests/integration/test_eval_device_runs.py; gpt-sample's, that a
    fresh process samples what this one does: test_plain_shell_runs.py)."""
    train(tmp_path / "run", small_vocab_dir, *TINY, *GPT2_VOCAB, "--max_steps", "2", "--total_batch_tokens", "512")
    checkpoint = str(tmp_path / "run" / "checkpoints")
    evaluate_main(["--checkpoint", checkpoint, "--data", str(small_vocab_dir), "--seq_len", "64", "--val_tokens",
                       "2048", "--hellaswag", str(hellaswag_files / "hellaswag_val.jsonl"), "--json"])
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 9 < results["val_loss"] < 11 and results["hellaswag_examples"] == 10
    assert results["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    assert 0 <= results["hellaswag_acc_norm"] <= 1 and results["hellaswag_examples_per_s"] > 0
