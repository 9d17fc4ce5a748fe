"""Bad input: one clear line per problem on stderr and exit status 2, before any worker starts."""
import json
import subprocess
import sys

import pytest

import train_ds
from conftest import REPO


@pytest.fixture
def run_main(shakespeare_dir, capsys):
    def run(*args, data=None):
        argv = ["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--total_batch_tokens", "1024",
                "--data", str(data or shakespeare_dir), *args]
        with pytest.raises(SystemExit) as exit_info:
            train_ds.main(argv)
        return exit_info.value.code, capsys.readouterr().err
    return run


def test_missing_config(run_main):
    assert run_main("--ds_config", "nope.json") == (2, "error: nope.json: DeepSpeed config not found\n")


def test_invalid_json(run_main, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"bf16": {"enabled": true},}')
    code, err = run_main("--ds_config", str(path))
    assert code == 2
    assert err.startswith(f"error: {path}: invalid JSON (")


def test_fp16_and_bf16_both_enabled(run_main, tmp_path):
    path = tmp_path / "both.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "fp16": {"enabled": True}}))
    assert run_main("--ds_config", str(path)) == (2, f"error: {path}: fp16 and bf16 are both enabled; choose one\n")


def test_fp16_with_zero_stage_0(run_main, tmp_path):
    path = tmp_path / "fp16_zero0.json"
    path.write_text(json.dumps({"fp16": {"enabled": True}, "zero_optimization": {"stage": 0}}))
    assert run_main("--ds_config", str(path)) == (
        2, f"error: {path}: fp16 needs ZeRO stage 1 or 2 (stage 0 mis-scales gradients)\n")


def test_bf16_fp32_accumulation_with_zero_stage_0(run_main, tmp_path):
    path = tmp_path / "bf16_zero0.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
                                "zero_optimization": {"stage": 0}}))
    assert run_main("--ds_config", str(path)) == (
        2, f"error: {path}: bf16 with fp32 gradient accumulation (data_types.grad_accum_dtype) needs ZeRO stage 1 or 2\n")


def test_bad_profile_steps(run_main):
    assert run_main("--profile", "-1") == (2, "error: --profile must be >= 0 (got -1)\n")
    assert run_main("--profile", "3", "--max_steps", "4", "--warmup_steps", "2") == (
        2, "error: --profile 3 needs --max_steps >= 5 (1 skipped, 1 warm-up and 3 recorded steps); --max_steps is 4\n")


def test_indivisible_batch(run_main):
    assert run_main("--total_batch_tokens", "1000") == (
        2, "error: --total_batch_tokens 1000 is not divisible by micro_batch x seq_len x world "
           "= 4 x 64 x 1 = 256\n")


def test_sequence_longer_than_block_size(run_main):
    assert run_main("--seq_len", "512", "--total_batch_tokens", "2048") == (
        2, "error: --seq_len 512 exceeds the model's block_size 256 (tiny)\n")


def test_vocab_size_must_be_positive(run_main, shakespeare_dir):
    train_shard = shakespeare_dir / "shakespeare_train_000001.bin"
    assert run_main("--vocab_size", "0") == (
        2, "error: --vocab_size must be positive (got 0)\n"
           f"error: {train_shard}: token 50256 at position 0 is >= the vocabulary size 0\n")


def test_a_vocabulary_smaller_than_the_data_or_hellaswag_needs(run_main, shakespeare_dir):
    train_shard = shakespeare_dir / "shakespeare_train_000001.bin"
    assert run_main("--vocab_size", "512", "--hellaswag", "val") == (
        2, "error: --hellaswag needs GPT-2's vocabulary: --vocab_size 512 < 50257\n"
           f"error: {train_shard}: token 50256 at position 0 is >= the vocabulary size 512\n")


def test_missing_data_dir(run_main, tmp_path):
    missing = tmp_path / "missing"
    assert run_main(data=missing) == (
        2, f"error: {missing}: data directory not found "
           f"(make one with: python -m gpt.prepare shakespeare --out_dir {missing})\n")


def test_every_problem_is_reported_at_once_with_a_nonzero_exit(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train_ds.py", "--ds_config", "nope.json", "--model", "tiny", "--seq_len", "512",
         "--micro_batch", "3", "--data", str(tmp_path / "missing")],
        cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: nope.json: DeepSpeed config not found",
        "error: --seq_len 512 exceeds the model's block_size 256 (tiny)",
        "error: --total_batch_tokens 524288 is not divisible by micro_batch x seq_len x world = 3 x 512 x 1 = 1536",
        f"error: {tmp_path / 'missing'}: data directory not found "
        f"(make one with: python -m gpt.prepare shakespeare --out_dir {tmp_path / 'missing'})",
    ]
    assert "step" not in proc.stdout  # nothing trained
