"""Bad input to the trainer: one clear line per problem on stderr and exit status 2, before any worker starts,
and nothing written. (The console scripts' table is tests/integration/test_bad_input_scripts.py.)"""
import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import train_ds
from conftest import REPO, TINY, out_dir_of, plain_shell_env, read_metrics, succeeded, two_rank_run
from gpt.runtime import accelerator
from train_ds import parse
from gpt.console import BadInput
from gpt.data.shards import write_shard
from gpt.memory.plan import device_total_bytes
from gpt.model.model import GPT2_VOCAB_SIZE
from gpt.train.start import model_config, validate


@pytest.fixture
def run_main(shakespeare_dir, capsys, monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("the input passed validation: the run would have started")
    monkeypatch.setattr("gpt.runtime.ranks.setup_distributed", started)  # a case that fails to fail, fails fast

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
    assert run_main("--ds_config", str(path), "--cpu_fp16") == (
        2, f"error: {path}: fp16 needs ZeRO stage 1 or 2 (stage 0 mis-scales gradients)\n")


def test_bf16_fp32_accumulation_with_zero_stage_0(run_main, tmp_path):
    path = tmp_path / "bf16_zero0.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
                                "zero_optimization": {"stage": 0}}))
    assert run_main("--ds_config", str(path)) == (
        2, f"error: {path}: bf16 with fp32 gradient accumulation (data_types.grad_accum_dtype) needs ZeRO stage 1 or 2\n")


def test_bad_profile_steps(run_main):
    assert run_main("--profile", "-1") == (2, "error: --profile -1 must be a finite number >= 0\n")
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


def test_a_padded_vocabulary_id_in_the_data(run_main, tmp_path):
    """GPT-2's padded vocabulary predicts 50257 ids: 50257..50303 would have -inf logits, an infinite loss."""
    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data" / "x_val_000000.bin", np.arange(5000) % 1000)
    write_shard(tmp_path / "data" / "x_train_000001.bin", np.array([1, 2, GPT2_VOCAB_SIZE, 3] * 1000))
    assert run_main(data=tmp_path / "data") == (
        2, f"error: {tmp_path / 'data' / 'x_train_000001.bin'}: token 50257 at position 2 is >= the vocabulary size "
           f"50257\n")


def test_missing_data_dir(run_main, tmp_path):
    missing = tmp_path / "missing"
    assert run_main(data=missing) == (
        2, f"error: {missing}: data directory not found "
           f"(make one with: python -m gpt.commands.prepare shakespeare --out_dir {missing})\n")


def test_every_problem_is_reported_at_once_with_a_nonzero_exit(run_main, tmp_path):
    """(The same as a process, whose exit status is main's: the plain-shell refusals below.)"""
    assert run_main("--ds_config", "nope.json", "--seq_len", "512", "--micro_batch", "3",
                    data=tmp_path / "missing") == (2, "\n".join([
        "error: nope.json: DeepSpeed config not found",
        "error: --seq_len 512 exceeds the model's block_size 256 (tiny)",
        "error: --total_batch_tokens 1024 is not divisible by micro_batch x seq_len x world = 3 x 512 x 1 = 1536",
        f"error: {tmp_path / 'missing'}: data directory not found "
        f"(make one with: python -m gpt.commands.prepare shakespeare --out_dir {tmp_path / 'missing'})\n"]))


def ds_json(tmp_path, **changes):
    """ds_configs/zero2_fp32.json with top-level keys changed (None: removed)."""
    config = json.loads((REPO / "ds_configs" / "zero2_fp32.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


def shards(tmp_path, train_tokens, val_tokens):
    """A data directory of one train and one val shard of these lengths."""
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "x_train_000000.bin", np.arange(train_tokens) % 1000)
    write_shard(data / "x_val_000000.bin", np.arange(val_tokens) % 1000)
    return str(data)


def ds_file(tmp_path, content):
    """A DeepSpeed JSON file of exactly this text or these bytes."""
    path = tmp_path / "ds.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


def with_bad_shard(tmp_path, make):
    """shards() plus x_train_000001.bin made by make(path): a FIFO, a link, a directory, an empty file."""
    data = shards(tmp_path, 5000, 5000)
    make(tmp_path / "data" / "x_train_000001.bin")
    return data


def hf_dir(tmp_path, **changes):
    """A Hugging Face config.json of the tiny model's shape, with these keys changed."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2,
                                                             "n_embd": 64, "n_positions": 256, "vocab_size": 50257,
                                                             **changes}))
    return str(tmp_path / "hf")


RUN_CONFIG = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 256, "vocab_size": 50304},
              "precision": "fp32", "zero_stage": 2, "world_size": 1,
              "args": {"warmup_steps": 1, "micro_batch": 4, "seq_len": 64, "seed": 1337, "max_steps": 2, "lr": 6e-4,
                       "min_lr_ratio": 0.1, "init_from": None}}


def universal_dir_of(step):
    """STEP/universal as DeepSpeed's converter lays one out (zero/ and the model-states file), empty files."""
    (Path(step) / "universal" / "zero").mkdir(parents=True)
    (Path(step) / "universal" / "mp_rank_00_model_states.pt").write_bytes(b"")
    return f"{step}/universal"


def fake_checkpoint(tmp_path, run_config=RUN_CONFIG, complete='{"step": 1}'):
    """{tmp}/ck/step_00000001 holding only a run_config.json and a complete.json (json text, or a function
    making the file at the path given): enough for the checks before launch, which read nothing else."""
    step = tmp_path / "ck" / "step_00000001"
    step.mkdir(parents=True)
    for name, content in (("run_config.json", run_config), ("complete.json", complete)):
        if callable(content):
            content(step / name)
        else:
            (step / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return str(step)


def out_with(tmp_path, name, make):
    """{tmp}/run with `name` under it made by make(path): the run's own paths in the way."""
    (tmp_path / "run" / name).parent.mkdir(parents=True, exist_ok=True)
    make(tmp_path / "run" / name)
    return ["--out_dir", str(tmp_path / "run")]


ZERO = json.loads((REPO / "ds_configs" / "zero2_fp32.json").read_text())["zero_optimization"]
OPTIMIZER = json.loads((REPO / "ds_configs" / "zero2_fp32.json").read_text())["optimizer"]
# (flags, or a function of tmp_path giving them; the one line expected on stderr, {path}: the DeepSpeed JSON,
# {tmp}: tmp_path, {device}: what this machine's device holds, as gpt.memory.plan.device_total_bytes says)
TRAIN_CASES = [
    (["--ds_config", "ds_configs/zero2_fp16.json"],
     "error: ds_configs/zero2_fp16.json: fp16 on a CPU, which DeepSpeed's CPU accelerator lacks: use "
     "ds_configs/zero2_fp32.json, or --cpu_fp16 to emulate fp16 (to test loss scaling)"),
    (lambda t: ["--data", shards(t, 200, 5000)],  # 200 tokens: 3 sequences of 64 (+ 1), a global batch is 4
     "error: {tmp}/data: no train shard holds one global batch of 4 sequences of 65 tokens (the longest, "
     "x_train_000000.bin, has 200): lower --micro_batch or --seq_len, or prepare more text"),
    (lambda t: ["--data", shards(t, 5000, 60), "--val_every", "10"],
     "error: {tmp}/data/x_val_000000.bin: the val split is shorter than one sequence of 65 tokens; lower --seq_len "
     "or turn validation off with --val_every 0"),
    (lambda t: (t / "file").write_text("x") and ["--out_dir", str(t / "file" / "out")],
     "error: --out_dir {tmp}/file/out: {tmp}/file is a file, not a directory"),
    (lambda t: (t / "run" / "checkpoints" / "step_00000003").mkdir(parents=True) or (
        t / "run" / "checkpoints" / "latest").write_text("step_00000003") and ["--out_dir", str(t / "run" / "checkpoints")],
     "error: --out_dir {tmp}/run/checkpoints is the checkpoints directory of the run in {tmp}/run: to continue that "
     "run, use --out_dir {tmp}/run --resume auto"),
    (lambda t: (t / "run" / "checkpoints" / "step_00000003").mkdir(parents=True) or (
        t / "run" / "checkpoints" / "step_00000003" / "complete.json").write_text("{}") and [
        "--out_dir", str(t / "run" / "checkpoints" / "step_00000003")],
     "error: --out_dir {tmp}/run/checkpoints/step_00000003 is a checkpoint of the run in {tmp}/run: to continue that "
     "run, use --out_dir {tmp}/run --resume auto"),
    (lambda t: (t / "link").symlink_to(t / "gone") or ["--out_dir", str(t / "link")],
     "error: --out_dir {tmp}/link is a symbolic link to {tmp}/gone, which does not exist"),
    (lambda t: (t / "link").symlink_to(t / "gone") or ["--out_dir", str(t / "link" / "out")],
     "error: --out_dir {tmp}/link/out: {tmp}/link is a symbolic link to {tmp}/gone, which does not exist"),
    (["--loss", "liger", "--ds_config", "ds_configs/zero2_fp32.json"],
     "error: --loss liger runs on CUDA in bf16 only (this run: cpu, fp32)"),
    (["--lr", "nan"], "error: --lr nan must be a finite number > 0"),
    (["--lr", "-0.001"], "error: --lr -0.001 must be a finite number > 0"),
    (["--lr", "inf"], "error: --lr inf must be a finite number > 0"),
    (["--weight_decay", "-1"], "error: --weight_decay -1.0 must be a finite number >= 0"),
    (["--min_lr_ratio", "nan"], "error: --min_lr_ratio nan must lie in [0, 1]"),
    (["--cooldown_frac", "0"], "error: --cooldown_frac 0.0 must lie in (0, 1]"),
    (["--cooldown_frac", "nan"], "error: --cooldown_frac nan must lie in (0, 1]"),
    (["--lr_schedule", "wsd", "--max_steps", "40", "--warmup_steps", "30"],
     "error: --cooldown_frac 0.5: a cooldown of the last 20 of --max_steps 40 steps would start at step 20, inside the "
     "warmup of --warmup_steps 30"),
    (["--lr_schedule", "wsd", "--max_steps", "10", "--cooldown_frac", "0.01"],
     "error: --cooldown_frac 0.01: a cooldown of 0.01 x --max_steps 10 rounds to no step"),
    (["--lr_schedule", "trapezoid"], "error: argument --lr_schedule: invalid choice: 'trapezoid' (choose from 'cosine', "
                                     "'wsd')"),
    (["--cooldown_frac", "0.3", "--cooldown_shape", "sqrt"],  # without --lr_schedule wsd: it was ignored
     "error: --cooldown_frac 0.3 applies to --lr_schedule wsd, not cosine"),
    (["--target_val_loss", "0"], "error: --target_val_loss 0.0 must be a finite number > 0"),
    (["--target_val_loss", "inf"], "error: --target_val_loss inf must be a finite number > 0"),
    (["--target_val_loss", "4.5", "--val_every", "0"],
     "error: --target_val_loss 4.5 needs a validation loss: --val_every is 0"),
    (["--save_every", "-1"], "error: --save_every -1 must be a finite number >= 0"),
    (["--keep_last", "0"], "error: --keep_last 0 must be a finite number >= 1"),
    (["--max_bad_steps", "0"], "error: --max_bad_steps 0 must be a finite number >= 1"),
    (["--skip_loss_z", "nan"], "error: --skip_loss_z nan must be a finite number >= 0"),
    (["--val_tokens", "0"], "error: --val_tokens 0 must be a finite number >= 1"),
    (["--val_every", "5", "--val_tokens", "10"],
     "error: --val_tokens 10 is less than one sequence (--seq_len 64); turn validation off with --val_every 0"),
    (["--n_layer", "0"], "error: --n_layer must be positive (got 0)"),
    (["--n_head", "0"], "error: --n_head must be positive (got 0)"),
    (["--max_steps", "0"], "error: --max_steps 0 must be a finite number >= 1"),
    (["--collective_timeout", "5"], "error: --collective_timeout 5.0 must be a finite number >= 10"),  # too short to start
    (["--micro_batch", "auto", "--lr", "nan"], "error: --lr nan must be a finite number > 0"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "stage": "two"})],
     'error: {path}: zero_optimization.stage "two" is not supported: use 0, 1 or 2 (ZeRO-3 partitions the '
     'parameters themselves, which this trainer does not handle)'),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "stage": 3})],
     "error: {path}: zero_optimization.stage 3 is not supported: use 0, 1 or 2 (ZeRO-3 partitions the "
     "parameters themselves, which this trainer does not handle)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization=None, zero_optimisation=ZERO)],
     "error: {path}: unknown key 'zero_optimisation' (did you mean 'zero_optimization'?)"),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "type": "AdamWW"})],
     'error: {path}: optimizer.type "AdamWW": this trainer runs AdamW, Adam or Muon'),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"betas": [0.9, 1.5]}})],
     "error: {path}: optimizer.params.betas [0.9, 1.5] must be two numbers in [0, 1)"),
    (lambda t: ["--ds_config", ds_json(t, gradient_clipping=-1)],
     "error: {path}: gradient_clipping -1 must be a finite number >= 0 (0: off)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization=[1])],
     "error: {path}: 'zero_optimization' must be a JSON object, got [1]"),
    (lambda t: ["--ds_config", ds_json(t, train_batch_size=7)],
     "error: {path}: 'train_batch_size' is decided by the trainer (from --total_batch_tokens and --seq_len): remove "
     "it from the JSON"),
    (lambda t: ["--ds_config", ds_json(t, gradient_accumulation_steps=5)],
     "error: {path}: 'gradient_accumulation_steps' is decided by the trainer (from --total_batch_tokens, "
     "--micro_batch, --seq_len and the world size): remove it from the JSON"),
    (lambda t: ["--ds_config", ds_json(t, scheduler={"type": "WarmupLR"})],
     "error: {path}: 'scheduler' is decided by the trainer (from --lr_schedule, --lr, --warmup_steps, --max_steps, "
     "--min_lr_ratio and --cooldown_frac, --cooldown_shape: gpt/train/schedule.py): remove it from the JSON"),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"lr": "high"}})],
     "error: {path}: optimizer.params.lr is decided by the trainer (from --lr): remove it from the JSON"),
    (lambda t: ["--ds_config", ds_json(t, fp16={"enabled": "maybe"})],  # "yes" is true to DeepSpeed's parser
     'error: {path}: fp16.enabled: Input should be a valid boolean, unable to interpret input (got "maybe")'),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "offload_optimizer": {"device": "cpu"}})],
     "error: {path}: zero_optimization.offload_optimizer is not supported by this trainer (ZeRO-Offload's CPU "
     "optimizer is untested here)"),
    (["--seed", "-1"], "error: --seed -1 must lie in [0, 2**63)"),
    (["--micro_batch", "0"], "error: --micro_batch must be positive or 'auto' (got 0)"),
    (["--micro_batch", "many"], "error: argument --micro_batch: expected a whole number or 'auto', got 'many'"),
    (["--lr_rate", "3"], "error: unrecognized arguments: --lr_rate 3"),
    (["--model", "d99"], "error: argument --model: invalid choice: 'd99' (choose from 'd12', 'd24', 'd36', 'd4', "
                         "'d48', 'tiny')"),
    (["--warmup_steps", "50", "--max_steps", "10"], "error: --warmup_steps 50 must lie in [0, --max_steps 10]"),
    (["--n_embd", "100", "--n_head", "3"], "error: n_embd 100 is not divisible by n_head 3"),
    (["--sample_every", "5", "--sample_tokens", "0"], "error: --sample_tokens 0 must be a finite number >= 1"),
    (["--ds_config", "ds_configs"], "error: ds_configs: a directory, not a DeepSpeed JSON file"),
    (["--ds_config", ""], "error: --ds_config is empty: name a DeepSpeed JSON file"),
    (["--out_dir", ""], "error: --out_dir is empty: name a directory"),  # it used to train into the working directory
    (["--data", ""], "error: --data is empty: name a shard directory"),
    (lambda t: (t / "f.txt").write_text("x") and ["--data", str(t / "f.txt")],
     "error: {tmp}/f.txt: a file, not a directory of shards"),
    (lambda t: ["--resume", str(t / "nope")], "error: {tmp}/nope: not found"),
    (lambda t: ["--init_from", str(t / "nope")], "error: {tmp}/nope: not found"),
    (lambda t: (t / "hf").mkdir() or (t / "hf" / "config.json").write_text("{") and ["--init_from", str(t / "hf")],
     "error: {tmp}/hf/config.json: invalid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
     "(char 1))"),
    (lambda t: ["--hellaswag", str(t / "nope.jsonl")], "error: {tmp}/nope.jsonl: file not found"),
    (["--collective_timeout", "1e300"], "error: --collective_timeout 1e+300 must be at most 604800 (seconds: a week)"),
    # numbers so large that the run would never end (they used to hang: a step of 4e15 micro-steps, 1e20 steps, a
    # sample of 1e20 tokens)
    (["--total_batch_tokens", "1024000000000000000"],
     "error: --total_batch_tokens 1024000000000000000 must be at most 4294967296 (2**32, hours a step on any hardware)"),
    (["--max_steps", "100000000000000000000"],
     "error: --max_steps 100000000000000000000 must be at most 100000000 (checkpoint names hold 8 digits)"),
    (["--sample_every", "1", "--sample_tokens", "100000000000000000000"],
     "error: --sample_tokens 100000000000000000000 must be at most 4096 (rank 0 samples while the other ranks wait "
     "for it)"),
    (lambda t: shards(t, 5000, 5000) and write_shard(t / "data" / "y_train_000001.bin", np.arange(5000) % 1000) or [
        "--data", str(t / "data")],
     "error: {tmp}/data: shards of 2 corpora (x_*, y_*): a run would train on all of them; keep one corpus per "
     "directory"),
    # DeepSpeed's own parser (its pydantic models), each problem named by its dotted key
    (lambda t: ["--ds_config", ds_file(t, '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e400}}')],
     "error: {path}: zero_optimization.reduce_bucket_size: Input should be a finite number (got Infinity)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "reduce_bucket_size": -1})],
     "error: {path}: zero_optimization.reduce_bucket_size: Input should be greater than 0 (got -1)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "allgather_bucket_size": -1})],
     "error: {path}: zero_optimization.allgather_bucket_size: Input should be greater than or equal to 0 (got -1)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "overlap_comms": True})],
     "error: {path}: unknown key 'zero_optimization.overlap_comms' (did you mean 'overlap_comm'?)"),
    (lambda t: ["--ds_config", ds_json(t, fp16={"enabled": True, "loss_scale_windw": 500})],
     "error: {path}: unknown key 'fp16.loss_scale_windw' (did you mean 'loss_scale_window'?)"),
    (lambda t: ["--ds_config", ds_json(t, fp16={"enabled": True, "loss_scale_window": 0})],
     "error: {path}: fp16.loss_scale_window must be > 0 when dynamic loss scaling is enabled (loss_scale=0)"),
    (lambda t: ["--ds_config", ds_json(t, tensorboard={"enabled": True, "output_path": 3})],
     "error: {path}: tensorboard.output_path: Input should be a valid string (got 3)"),
    (lambda t: ["--ds_config", ds_json(t, nebula={"enabled": True})],
     "error: {path}: nebula: Nebula checkpointing has been removed. A leftover 'nebula' block would be ignored and "
     "checkpoints would silently fall back to local torch.save. See https://github.com/deepspeedai/DeepSpeed/issues/8489."),
    # what DeepSpeed reads by hand, unchecked
    (lambda t: ["--ds_config", ds_json(t, steps_per_print=0)],
     "error: {path}: steps_per_print 0 must be a whole number >= 1 or null"),
    (lambda t: ["--ds_config", ds_json(t, wall_clock_breakdown="yes")],
     'error: {path}: wall_clock_breakdown "yes" must be true or false'),
    (lambda t: ["--ds_config", ds_json(t, activation_checkpointing={"partition_activations": "yes",
                                                                     "number_checkpoints": "x"})],
     'error: {path}: activation_checkpointing.partition_activations "yes" must be true or false\n'
     'error: {path}: activation_checkpointing.number_checkpoints "x" must be a whole number >= 1 or null'),
    (lambda t: ["--ds_config", ds_json(t, activation_checkpointing={"cpu_checkpoint": False})],
     "error: {path}: unknown key 'activation_checkpointing.cpu_checkpoint' (did you mean 'cpu_checkpointing'?)"),
    (lambda t: ["--ds_config", ds_json(t, flops_profiler={"enabled": False, "detail": True})],
     "error: {path}: unknown key 'flops_profiler.detail' (did you mean 'detailed'?)"),
    (lambda t: ["--ds_config", ds_json(t, fp16={"enabled": True, "hysteresis": 0})],
     "error: {path}: fp16.hysteresis 0 must be >= 1 (below, the loss scale would never drop on overflow and every "
     "step would be skipped)"),
    (lambda t: ["--ds_config", ds_json(t, data_types={"grad_accum_dtype": "int8"})],
     'error: {path}: data_types.grad_accum_dtype "int8" is not a dtype: use one of fp32, bf16, fp16'),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"amsgrad": "maybe"}})],
     'error: {path}: optimizer.params.amsgrad "maybe" must be true or false'),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"amsgrad": True}})],
     "error: {path}: optimizer.params.amsgrad true needs optimizer.params.torch_adam true (DeepSpeed's FusedAdam has "
     "no AMSGrad)"),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"fused": True}})],
     "error: {path}: optimizer.params.fused true needs optimizer.params.torch_adam true (DeepSpeed's FusedAdam has "
     "no fused option)"),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"torch_adam": True, "fused": True,
                                                                              "foreach": True}})],
     "error: {path}: optimizer.params.fused and foreach cannot both be true (torch's AdamW takes one)"),
    (lambda t: ["--ds_config", ds_json(t, optimizer={**OPTIMIZER, "params": {"beta": [0.9, 0.95]}})],
     "error: {path}: unknown key 'optimizer.params.beta' (did you mean 'betas'?)"),
    # what the JSON reader refuses, and what DeepSpeed accepts but this trainer would get wrong
    (lambda t: ["--ds_config", ds_file(t, '{"zero_optimization": {"stage": 1, "stage": 2}}')],
     "error: {path}: duplicate key 'zero_optimization.stage' (DeepSpeed would use the last one, silently)"),
    (lambda t: ["--ds_config", ds_file(t, b'{"steps_per_print": 1} \xff')],
     "error: {path}: not UTF-8 text (byte 0xff at offset 23)"),
    (lambda t: ["--ds_config", ds_json(t, bf16={"enabled": True}, bfloat16={"enabled": False})],
     "error: {path}: both 'bf16' and 'bfloat16' (its older name): keep 'bf16' (DeepSpeed would read only that one)"),
    (lambda t: ["--ds_config", ds_json(t, bfloat16={"enabled": True}, fp16={"enabled": True})],
     "error: {path}: fp16 and bf16 are both enabled; choose one"),
    (lambda t: ["--ds_config", ds_json(t, bfloat16={"enabled": True}, data_types={"grad_accum_dtype": "fp16"})],
     'error: {path}: data_types.grad_accum_dtype "fp16" does not fit bf16 training: use "fp32" or "bf16" (or leave '
     'it out)'),
    (lambda t: ["--ds_config", ds_json(t, torch_autocast={"enabled": True})],
     "error: {path}: torch_autocast is not supported by this trainer: enable bf16 or fp16 instead"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "reduce_bucket_size": "auto"})],
     'error: {path}: zero_optimization.reduce_bucket_size "auto" is a Hugging Face placeholder: give a value '
     '(DeepSpeed would use its default)'),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "cpu_offload": True})],
     "error: {path}: zero_optimization.offload_optimizer is not supported by this trainer (ZeRO-Offload's CPU "
     "optimizer is untested here)"),
    # shards that are not regular files: a FIFO used to block in the first read forever, the rest to raise
    (lambda t: os.mkfifo(t / "ds.json") or ["--ds_config", str(t / "ds.json")],
     "error: {tmp}/ds.json: a FIFO (named pipe), not a regular file"),
    (lambda t: (t / "ds.json").symlink_to(t / "gone.json") or ["--ds_config", str(t / "ds.json")],
     "error: {tmp}/ds.json: a symbolic link to {tmp}/gone.json, which does not exist"),
    (lambda t: ["--data", with_bad_shard(t, os.mkfifo)],
     "error: {tmp}/data/x_train_000001.bin: a FIFO (named pipe) named like a shard, not a shard file"),
    (lambda t: ["--data", with_bad_shard(t, Path.mkdir)],
     "error: {tmp}/data/x_train_000001.bin: a directory named like a shard, not a shard file"),
    (lambda t: ["--data", with_bad_shard(t, lambda p: p.symlink_to(p.parent / "gone.bin"))],
     "error: {tmp}/data/x_train_000001.bin: a symbolic link to {tmp}/data/gone.bin, which does not exist"),
    (lambda t: ["--data", with_bad_shard(t, lambda p: p.symlink_to(p))],
     "error: {tmp}/data/x_train_000001.bin: a symbolic link that loops (Too many levels of symbolic links)"),
    (lambda t: ["--data", with_bad_shard(t, Path.touch)],
     "error: {tmp}/data/x_train_000001.bin: an empty file (0 bytes), not a token shard"),
    (["--reset_data_position"], "error: --reset_data_position applies to --resume, which is not given"),
    (["--eval_every", "250"], "error: --eval_every applies to --hellaswag, which is not given"),  # even the default
    (lambda t: ["--init_from", hf_dir(t, n_head=3)], "error: {tmp}/hf/config.json: n_embd 64 is not divisible by n_head 3"),
    (lambda t: ["--init_from", hf_dir(t, n_positions=2**40)],
     "error: {tmp}/hf/config.json: n_positions 1099511627776 is beyond any GPT-2 (at most 1048576 here; GPT-2's is "
     "1024)"),
    # the run's own paths under --out_dir in the way: found when written (a traceback at the first save), or never
    # (a FIFO blocks the open forever)
    (lambda t: out_with(t, "run.lock", os.mkfifo),
     "error: {tmp}/run/run.lock: a FIFO (named pipe), not a regular file (the run's lock file): move it away, or use "
     "another --out_dir"),
    (lambda t: out_with(t, "run.lock", Path.mkdir),
     "error: {tmp}/run/run.lock: a directory, not a regular file (the run's lock file): move it away, or use another "
     "--out_dir"),
    (lambda t: out_with(t, "checkpoints", lambda p: p.write_text("x")) + ["--resume", "auto"],
     "error: {tmp}/run/checkpoints: a file, not a directory (where the run saves its checkpoints): move it away, or "
     "use another --out_dir"),
    (lambda t: out_with(t, "tensorboard", lambda p: p.write_text("x")),
     "error: {tmp}/run/tensorboard: a file, not a directory (where the run writes its TensorBoard events): move it "
     "away, or use another --out_dir"),
    (lambda t: out_with(t, "metrics.jsonl", Path.mkdir) + ["--resume", "auto"],
     "error: {tmp}/run/metrics.jsonl: a directory, not a regular file (the run's metrics log): move it away, or use "
     "another --out_dir"),
    (lambda t: out_with(t, "metrics.jsonl", os.mkfifo),
     "error: {tmp}/run/metrics.jsonl: a FIFO (named pipe), not a regular file (the run's metrics log): move it away, "
     "or use another --out_dir"),
    # ... or a symbolic link to a user's file, which the lock's record overwrote (tests/unit/test_links.py)
    (lambda t: out_with(t, "run.lock", lambda p: p.symlink_to(t / "notes.txt")),
     "error: {tmp}/run/run.lock: a symbolic link to {tmp}/notes.txt (the run's lock file): it is written in place, "
     "never through a link, which would overwrite the file the link leads to: remove the link, or use another "
     "--out_dir"),
    (lambda t: out_with(t, "checkpoints/latest", Path.mkdir) + ["--resume", "auto"],
     "error: {tmp}/run/checkpoints/latest: a directory, not a regular file (the name of the newest checkpoint): move "
     "it away, or use another --out_dir"),
    (lambda t: ["--data", shards(t, 5000, 5000), "--out_dir", str(t / "data")],
     "error: --out_dir {tmp}/data is the --data directory: the run's checkpoints, metrics and lock file would land "
     "among its shards; use another --out_dir"),
    # --resume with --init_from whose run did not start there: the checkpoint's weights replaced --init_from's silently
    (lambda t: ["--resume", fake_checkpoint(t), "--init_from", hf_dir(t)],
     "error: --init_from {tmp}/hf: --resume continues {tmp}/ck/step_00000001, whose weights would replace "
     "--init_from's (its run did not start from {tmp}/hf): drop --init_from to continue that run, or --resume (and "
     "use a fresh --out_dir) to start from {tmp}/hf"),
    # a checkpoint's run_config.json and complete.json of another structure, or not regular files
    (lambda t: ["--resume", fake_checkpoint(t, run_config="[]")],
     "error: {tmp}/ck/step_00000001/run_config.json: an array, not a JSON object"),
    (lambda t: ["--resume", fake_checkpoint(t, run_config={**RUN_CONFIG, "model": {}})],
     "error: {tmp}/ck/step_00000001/run_config.json: model.n_layer must be a positive whole number, got null"),
    (lambda t: ["--resume", fake_checkpoint(t, run_config={**RUN_CONFIG, "zero_stage": "2"})],
     'error: {tmp}/ck/step_00000001/run_config.json: zero_stage must be 0, 1, 2 or 3, got "2"'),
    (lambda t: ["--resume", fake_checkpoint(t, run_config=os.mkfifo)],
     "error: {tmp}/ck/step_00000001/run_config.json: a FIFO (named pipe), not a regular file"),
    (lambda t: ["--resume", fake_checkpoint(t, run_config={**RUN_CONFIG, "args": {**RUN_CONFIG["args"],
                                                                                  "lr_schedule": "trapezoid"}})],
     'error: {tmp}/ck/step_00000001/run_config.json: args.lr_schedule must be one of cosine, wsd, got "trapezoid"'),
    (lambda t: ["--resume", fake_checkpoint(t, run_config={**RUN_CONFIG, "format": 3})],
     "error: {tmp}/ck/step_00000001/run_config.json: format must be a checkpoint format this trainer reads (1 to 2), "
     "got 3"),
    (lambda t: ["--resume", universal_dir_of(fake_checkpoint(t))],
     "error: {tmp}/ck/step_00000001/universal: a universal checkpoint: --resume takes the checkpoint it was made "
     "from, {tmp}/ck/step_00000001"),
    (lambda t: fake_checkpoint(t, complete=os.mkfifo) and ["--resume", str(t / "ck")],
     "error: {tmp}/ck: every complete checkpoint is damaged (the oldest, step_00000001: unreadable complete.json (a "
     "FIFO (named pipe), not a regular file))"),
    (lambda t: ["--resume", fake_checkpoint(t, complete='{"step": 1, "files": [1, 2]}')],
     "error: {tmp}/ck/step_00000001: damaged checkpoint (unreadable complete.json ('files' is not an object of file "
     "sizes)); give its parent directory to take the newest intact one"),
    (lambda t: ["--micro_batch", "auto", "--ds_config", ds_json(t, zero_optimization={**ZERO, "stage": "two"})],
     'error: {path}: zero_optimization.stage "two" is not supported: use 0, 1 or 2 (ZeRO-3 partitions the '
     'parameters themselves, which this trainer does not handle)'),
    # absurd sizes: a traceback inside the run (RecursionError, OverflowError, a 40 TB allocation) or silent overflow
    (lambda t: ["--ds_config", ds_file(t, '{"a":' * 100000 + "1" + "}" * 100000)],
     "error: {path}: nested more than 32 levels deep (DeepSpeed's deepest blocks need about 6)"),
    (lambda t: ["--cpu_fp16", "--ds_config", ds_json(t, fp16={"enabled": True, "initial_scale_power": 10000})],
     "error: {path}: fp16.initial_scale_power 10000 must lie in [0, 32]: the first loss scale is 2**power, and a "
     "larger one only overflows, each halving a skipped step (DeepSpeed's default: 16)"),
    (lambda t: ["--cpu_fp16", "--ds_config", ds_json(t, fp16={"enabled": True, "initial_scale_power": 4,
                                                              "min_loss_scale": 1e10})],
     "error: {path}: fp16.min_loss_scale 10000000000 exceeds the first loss scale 2**4 = 16 "
     "(fp16.initial_scale_power): the floor must lie at or below the start"),
    (lambda t: ["--cpu_fp16", "--ds_config", ds_json(t, fp16={"enabled": True, "loss_scale": 1e40})],
     "error: {path}: fp16.loss_scale 1e+40 must be at most 16777216 (2**24) for a static scale: beyond it every "
     "gradient above 2**-8 overflows fp16 (largest 65504) and its step is skipped; use 0 (dynamic) or a power of two "
     "such as 65536"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "reduce_bucket_size": 1e13,
                                                             "allgather_bucket_size": 1e13})],
     "error: {path}: zero_optimization.reduce_bucket_size 10000000000000 must be at most 4294967296 (2**32 elements, "
     "16 GiB in fp32): ZeRO allocates its buckets whole (DeepSpeed's default: 500000000)\n"
     "error: {path}: zero_optimization.allgather_bucket_size 10000000000000 must be at most 4294967296 (2**32 "
     "elements, 16 GiB in fp32): ZeRO allocates its buckets whole (DeepSpeed's default: 500000000)"),
    (["--vocab_size", "1000000000000"],
     "error: --model tiny --vocab_size 1000000000000: 6.4e+13 parameters, whose weights, gradients and optimizer "
     "states need 1,072,884.7 GiB per rank (bf16, ZeRO 1, 1 rank(s)), more than {device}: choose a smaller model, or "
     "more ranks with ZeRO 1 or 2"),
    (["--n_embd", "16777216", "--n_head", "1", "--ds_config", "ds_configs/zero2_fp32.json"],
     "error: --model tiny --n_embd 16777216 --n_head 1: 6.76e+15 parameters, whose weights, gradients and optimizer "
     "states need 125,844,930.2 GiB per rank (fp32, ZeRO 2, 1 rank(s)), more than {device}: choose a smaller model, "
     "or more ranks with ZeRO 1 or 2"),
    # DeepSpeed's monitors and profiler: what they write, and the packages they import, inside the run
    (lambda t: ["--ds_config", ds_json(t, tensorboard={"enabled": True, "output_path": "/dev/null/x",
                                                       "job_name": "j"})],
     "error: {path}: tensorboard.output_path /dev/null/x/j: /dev/null is a file, not a directory"),
    (lambda t: (t / "link").symlink_to(t / "gone") or [
        "--ds_config", ds_json(t, csv_monitor={"enabled": True, "output_path": str(t / "link")})],
     "error: {path}: csv_monitor.output_path {tmp}/link/DeepSpeedJobName: {tmp}/link is a symbolic link to {tmp}/gone, "
     "which does not exist"),
    # a component longer than file systems take, in the monitor's output_path or its job_name: OSError: File name too
    # long from the check itself, or nothing said when it lies below a directory not made yet
    (lambda t: ["--ds_config", ds_json(t, tensorboard={"enabled": True, "output_path": "x" * 300, "job_name": "j"})],
     "error: {path}: tensorboard.output_path " + "x" * 150 + "..." + "x" * 17 + "/j: (303 characters) a path component of "
     "300 bytes, longer than file systems take (255)"),
    (lambda t: ["--ds_config", ds_json(t, csv_monitor={"enabled": True, "output_path": "csv", "job_name": "y" * 300})],
     "error: {path}: csv_monitor.job_name csv/" + "y" * 146 + "..." + "y" * 19 + ": (305 characters) a path "
     "component of 300 bytes, longer than file systems take (255)"),
    (lambda t: ["--ds_config", ds_json(t, flops_profiler={"enabled": True, "profile_step": 1,
                                                          "output_file": "/dev/null/x.txt"})],
     "error: {path}: flops_profiler.output_file /dev/null/x.txt: /dev/null is a file, not a directory"),
    (lambda t: ["--ds_config", ds_json(t, flops_profiler={"enabled": True, "output_file": str(t)})],
     "error: {path}: flops_profiler.output_file {tmp} is a directory, not a regular file"),
    pytest.param(lambda t: ["--ds_config", ds_json(t, wandb={"enabled": True})],
                 "error: {path}: wandb.enabled needs the wandb package, which is not installed (pip install wandb, or "
                 "disable it)", marks=pytest.mark.skipif(bool(find_spec("wandb")), reason="wandb is installed")),
    (lambda t: ["--ds_config", ds_json(t, autotuning={"enabled": True})],
     "error: {path}: 'autotuning' is not honoured by this trainer (DeepSpeed's autotuner runs only under `deepspeed "
     "--autotuning`; --micro_batch auto sizes the batch here): remove it"),
    (lambda t: ["--ds_config", ds_json(t, compile={"deepcompile": True})],
     "error: {path}: 'compile' is not honoured by this trainer (DeepSpeed compiles only in engine.compile(), which "
     "this trainer does not call; --compile compiles its model (torch.compile, block by block)): remove it"),
    (lambda t: ["--ds_config", ds_json(t, data_efficiency={"enabled": True})],
     "error: {path}: 'data_efficiency' is not honoured by this trainer (the trainer's own loader (gpt/data/shards.py) "
     "feeds every step, not DeepSpeed's data sampling and routing): remove it"),
    (lambda t: ["--ds_config", ds_json(t, prescale_gradients=True)],
     "error: {path}: prescale_gradients true is not supported by DeepSpeed with ZeRO 2's reduce-scatter (it averages "
     "after the sum): remove it, or set zero_optimization.reduce_scatter false"),
    (lambda t: ["--ds_config", ds_json(t, gradient_predivide_factor=2.0)],
     "error: {path}: gradient_predivide_factor 2.0 is not supported by DeepSpeed with ZeRO 2's reduce-scatter: remove "
     "it, or set zero_optimization.reduce_scatter false"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={"stage": 2, "compute_grad_norm": False})],
     "error: {path}: zero_optimization.compute_grad_norm false leaves DeepSpeed no norm to clip with: set "
     "gradient_clipping 0, or remove compute_grad_norm"),
    # accepted by DeepSpeed's parser, then an assert, ValueError or Exception from every rank, or silently overridden
    (lambda t: ["--ds_config", ds_json(t, gradient_clipping=0, bf16={"enabled": True},
                                       data_types={"grad_accum_dtype": "fp32"},
                                       zero_optimization={**ZERO, "stage": 1, "compute_grad_norm": False})],
     "error: {path}: zero_optimization.compute_grad_norm false is not supported by DeepSpeed with ZeRO 1, bf16 and fp32 "
     "gradient accumulation (its BF16_Optimizer always measures the norm): remove it, or use ZeRO 2"),
    (lambda t: ["--skip_grad_z", "3", "--ds_config", ds_json(t, gradient_clipping=0,
                                                             zero_optimization={**ZERO, "compute_grad_norm": False})],
     "error: --skip_grad_z 3: {path} sets zero_optimization.compute_grad_norm false, so DeepSpeed measures no gradient "
     "norm for it to act on: drop one of them"),
    (lambda t: ["--skip_grad_z", "3", "--ds_config", ds_json(t, gradient_clipping=0, optimizer={"type": "Muon"})],
     "error: --skip_grad_z 3: under {path}'s Muon DeepSpeed measures the norm of Muon's orthogonalised update, not the "
     "gradient's (its ZeRO optimizer; the log's update_norm), so the guard could not see a gradient spike: use "
     "--skip_loss_z, or bf16 with ZeRO 1 and fp32 grad_accum_dtype (ds_configs/zero1_bf16_muon.json), where the norm "
     "is the gradient's"),
    (lambda t: ["--ds_config", ds_json(t, gradient_clipping=0, optimizer={"type": "Muon", "params": []})],
     "error: {path}: 'optimizer.params' must be a JSON object, got []"),
    # DeepSpeed's other spellings of true and false (every key's: tests/unit/test_ds_config.py)
    (lambda t: ["--skip_grad_z", "3", "--ds_config", ds_json(t, gradient_clipping=0, zero_optimization={
        **ZERO, "compute_grad_norm": "false"})],
     "error: --skip_grad_z 3: {path} sets zero_optimization.compute_grad_norm false, so DeepSpeed measures no gradient "
     "norm for it to act on: drop one of them"),
    (lambda t: ["--ds_config", ds_json(t, bf16={"enabled": True, "bf16_master_weights_and_grads": 1})],
     "error: {path}: bf16.bf16_master_weights_and_grads true is not supported by this trainer (16-bit master "
     "weights and gradients: DeepSpeed runs them only with ZeRO-Offload's CPU Adam or bf16 optimizer states, "
     "neither of which this trainer runs): remove it"),
    (lambda t: ["--ds_config", ds_json(t, managed_gradient_accumulation=False)],
     "error: {path}: managed_gradient_accumulation false is not supported by this trainer (it steps the engine after "
     "every micro-batch and lets DeepSpeed accumulate, so each micro-batch would be an update of its own): remove it"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "allgather_bucket_size": 1})],
     "error: {path}: zero_optimization.allgather_bucket_size 1 must be a multiple of 2 (ZeRO aligns its all-gather "
     "buffers to 4 bytes, 2 16-bit elements)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "legacy_stage1": True})],
     "error: {path}: zero_optimization.legacy_stage1 true: DeepSpeed removed that ZeRO 1 in 0.5.9 and refuses it: "
     "remove it (\"stage\": 1 is today's ZeRO 1)"),
    (lambda t: ["--ds_config", ds_json(t, zero_optimization={**ZERO, "zenflow": {"topk_ratio": 0.1}})],
     "error: {path}: zero_optimization.zenflow is not supported by this trainer (ZenFlow runs on ZeRO-Offload's CPU "
     "optimizer, which this trainer does not run): remove it"),
    *((lambda t, p=p: ["--cpu_fp16", "--ds_config", ds_json(t, **{p: {"enabled": True, f"{p}_master_weights_and_grads":
                                                                          True}})],
       f"error: {{path}}: {p}.{p}_master_weights_and_grads true is not supported by this trainer (16-bit master "
       f"weights and gradients: DeepSpeed runs them only with ZeRO-Offload's CPU Adam or bf16 optimizer states, "
       f"neither of which this trainer runs): remove it") for p in ("fp16", "bf16")),
    (lambda t: ["--ds_config", ds_json(t, optimizer={"type": "AdamW", "params": {**OPTIMIZER["params"],
                                                                                 "adam_w_mode": False}})],
     "error: {path}: optimizer.params.adam_w_mode false contradicts optimizer.type \"AdamW\" (DeepSpeed would run "
     "AdamW's decoupled weight decay anyway): use \"type\": \"Adam\" for Adam with L2 weight decay, or remove "
     "adam_w_mode"),
    # a value is quoted up to 200 characters: an optimizer given as a 30 MB string echoed all of it
    (lambda t: ["--ds_config", ds_json(t, optimizer="x" * 3_000_000)],
     "error: {path}: 'optimizer' must be a JSON object, got \"" + "x" * 149 + "..." + "x" * 19 + "\" (3,000,002 "
     "characters)"),
    # a path component longer than file systems take: every look at it failed (OSError: File name too long)
    *((["--" + flag, "x" * 256], f"error: argument --{flag}: a path component of 256 bytes, longer than file systems "
                                 f"take (255): " + "x" * 150 + "..." + "x" * 20 + " (256 characters)")
      for flag in ("out_dir", "data", "resume", "ds_config", "init_from", "hellaswag")),
    (lambda t: ["--ds_config", ds_json(t, checkpoint={"load_universal": True})],
     "error: {path}: checkpoint.load_universal is the trainer's to set: --resume converts a checkpoint to "
     "DeepSpeed's universal form and loads it that way when the world size or ZeRO stage changed; remove it"),
]


def snapshot(directory):
    return {p: p.stat().st_mtime_ns for p in directory.rglob("*")}


@pytest.mark.parametrize("flags, expected", TRAIN_CASES, ids=lambda case: None if callable(case) or
                         isinstance(case, list) else case.split(": ")[-1][:40])
def test_bad_training_input_is_one_line_and_exit_2(run_main, tmp_path, flags, expected):
    flags = flags(tmp_path) if callable(flags) else flags
    path = flags[flags.index("--ds_config") + 1] if "--ds_config" in flags else ""
    code, err = run_main("--out_dir", str(tmp_path / "out"), *flags)
    device = device_total_bytes(accelerator.device_type())[1]  # the machine's memory, for the refusals of huge models
    assert (code, err) == (2, expected.format(path=path, tmp=tmp_path, device=device) + "\n")
    assert not (tmp_path / "out").exists()  # nothing written


TWO_RANK_CASES = {
    "lr": (["--lr", "nan"], "error: --lr nan must be a finite number > 0"),
    "indivisible": (["--total_batch_tokens", "768"], "error: --total_batch_tokens 768 is not divisible by micro_batch "
                                                     "x seq_len x world = 4 x 64 x 2 = 512"),
    "fp16": (["--ds_config", "ds_configs/zero1_fp16.json"],
             "error: ds_configs/zero1_fp16.json: fp16 on a CPU, which DeepSpeed's CPU accelerator lacks: use "
             "ds_configs/zero2_fp32.json, or --cpu_fp16 to emulate fp16 (to test loss scaling)"),
    "argparse": (["--model", "d99"], "error: argument --model: invalid choice: 'd99' (choose from 'd12', 'd24', 'd36', "
                                     "'d4', 'd48', 'tiny')"),
}


@pytest.mark.two_rank_runs({f"bad_input_{case}": two_rank_run(
    "--data", "{small_vocab_dir}", "--model", "tiny", "--seq_len", "64", "--micro_batch", "4",
    "--total_batch_tokens", "1024", *flags) for case, (flags, _) in TWO_RANK_CASES.items()})
@pytest.mark.parametrize("case", TWO_RANK_CASES)
def test_two_ranks_say_it_once_and_exit_2(two_rank_runs, case):
    """Exit status 2, said once (by rank 0), nothing written. (The same through the deepspeed launcher, which
    exits with a failed rank's status: tests/integration/test_run_lock.py, a launch into a held out_dir.)"""
    _, proc = two_rank_runs[f"bad_input_{case}"]
    expected = TWO_RANK_CASES[case][1]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and output.count(expected) == 1 and "Traceback" not in output, output[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [expected]
    assert not out_dir_of(proc).exists()


def test_init_from_with_a_resume_of_a_run_that_started_there_is_a_relaunch(tmp_path):
    """The same command relaunched (--init_from X --resume auto) continues its own run: not refused."""
    from gpt.train import resume
    hf = hf_dir(tmp_path)
    resume.check_init_from(tmp_path / "ck", {"args": {"init_from": hf}}, hf)
    with pytest.raises(BadInput):
        resume.check_init_from(tmp_path / "ck", {"args": {"init_from": None}}, hf)


def test_validation_off_needs_no_val_sequence(tmp_path):
    """A val split shorter than one sequence is fine with --val_every 0 (it used to abort anyway)."""
    settings = parse(["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--total_batch_tokens", "1024",
                      "--val_every", "0", "--data", shards(tmp_path, 5000, 60)])
    assert validate(settings, 1)[3] == 4  # grad_accum: validated


@pytest.mark.parametrize("held", ["checkpoints", "metrics"])
def test_a_fresh_run_into_an_earlier_runs_out_dir_is_refused_and_changes_nothing(run_main, tmp_path, held):
    out = tmp_path / "out"
    if held == "checkpoints":
        (out / "checkpoints" / "step_00000007").mkdir(parents=True)
        (out / "checkpoints" / "latest").write_text("step_00000007")
    else:
        out.mkdir()
        (out / "metrics.jsonl").write_text('{"step": 0, "loss": 10.9}\n')
    before = snapshot(out)
    code, err = run_main("--out_dir", str(out))
    what = "checkpoints up to step_00000007" if held == "checkpoints" else "metrics.jsonl"
    assert (code, err) == (2, f"error: --out_dir {out} holds an earlier run ({what}): continue it with --resume auto, "
                              f"or start afresh with another --out_dir\n")
    assert snapshot(out) == before


def test_an_out_dir_that_is_a_file(run_main, tmp_path):
    (tmp_path / "out").write_text("x")
    assert run_main("--out_dir", str(tmp_path / "out")) == (
        2, f"error: --out_dir {tmp_path / 'out'} is a file, not a directory\n")


@pytest.mark.parametrize("inside", ["checkpoints/step_00000001/ft", "checkpoints/ft/deeper"])
def test_an_out_dir_inside_another_runs_checkpoints_is_refused(run_main, tmp_path, inside):
    """Fine-tuning "next to" the checkpoint it came from was accepted, and the other run's next resume pruned that
    step with the new run in it."""
    other = tmp_path / "runA"
    (other / "checkpoints" / "step_00000001").mkdir(parents=True)
    (other / "checkpoints" / "latest").write_text("step_00000001")
    out = other / inside
    assert run_main("--out_dir", str(out)) == (
        2, f"error: --out_dir {out} is inside the checkpoints of the run in {other}, whose pruning (--keep_last) "
           f"deletes its old steps with whatever lies in them: use an --out_dir outside {other / 'checkpoints'}\n")
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == ["latest", "step_00000001"]


def saved_run(path):
    """A run's out_dir as its saves leave it: checkpoints/step_00000010 and latest."""
    (path / "checkpoints" / "step_00000010").mkdir(parents=True)
    (path / "checkpoints" / "latest").write_text("step_00000010")
    return path


@pytest.mark.parametrize("target, under", [("checkpoints/step_00000010", "ft"), ("checkpoints", "ft")])
def test_an_out_dir_reached_through_a_link_into_another_runs_checkpoints_is_refused(run_main, tmp_path, target, under):
    """A link into another run's step directory was accepted, and that run's next prune (--keep_last) deleted the new
    run with the step; into its checkpoints/, accepted without a word. The path is resolved before it is judged."""
    other = saved_run(tmp_path.resolve() / "runA")
    (tmp_path / "link").symlink_to(other / target)
    out, real = tmp_path / "link" / under, other / target / under
    assert run_main("--out_dir", str(out)) == (
        2, f"error: --out_dir {out} is inside the checkpoints of the run in {other} (through a symbolic link: {real}), "
           f"whose pruning (--keep_last) deletes its old steps with whatever lies in them: use an --out_dir outside "
           f"{other / 'checkpoints'}\n")
    assert not real.exists()


def test_an_out_dir_that_links_to_another_runs_checkpoints_names_that_run(run_main, tmp_path):
    other = saved_run(tmp_path.resolve() / "runA")
    (tmp_path / "link").symlink_to(other / "checkpoints")
    assert run_main("--out_dir", str(tmp_path / "link")) == (
        2, f"error: --out_dir {tmp_path / 'link'} is the checkpoints directory of the run in {other} (through a "
           f"symbolic link: {other / 'checkpoints'}): to continue that run, use --out_dir {other} --resume auto\n")


@pytest.mark.parametrize("marker", ["run.lock", "metrics.jsonl"])
def test_a_run_nested_in_or_around_a_run_that_has_not_saved_yet_is_refused(run_main, tmp_path, marker):
    """Inside the checkpoints/ of a run that has not saved yet (known by its lock file or metrics log), a run was
    accepted, then stranded: once the outer run saved, the inner one's --resume was refused. The reverse: a run
    started around another one, which then lay in the new run's checkpoints/ (and in its pruning's way)."""
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / marker).write_text("")
    out = outer / "checkpoints" / "inner"
    assert run_main("--out_dir", str(out)) == (
        2, f"error: --out_dir {out} is inside the checkpoints of the run in {outer}, whose pruning (--keep_last) "
           f"deletes its old steps with whatever lies in them: use an --out_dir outside {outer / 'checkpoints'}\n")
    assert not out.exists()
    (outer / marker).unlink()  # the other way round: the inner run was there first
    out.mkdir(parents=True)
    (out / marker).write_text("")
    assert run_main("--out_dir", str(outer)) == (
        2, f"error: --out_dir {outer}: its checkpoints directory holds the run in {out}, which this run's pruning "
           f"(--keep_last) would delete with the steps around it: move that run out of {outer / 'checkpoints'}, or "
           f"use another --out_dir\n")


@pytest.mark.slow
def test_gpt_prepare_refuses_to_mix_corpora_and_other_inputs(shakespeare_dir, tmp_path):
    """A second corpus beside the first would join its splits; other inputs under the same name would be
    reported 'done' over the old shards. Both refused, nothing written."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(shakespeare_dir, data)
    text = tmp_path / "more.txt"
    text.write_text("Some other text. " * 200)
    before = snapshot(data)

    def prepare(*args):
        return subprocess.run([sys.executable, "-m", "gpt.commands.prepare", *args], cwd=REPO, capture_output=True, text=True)
    proc = prepare("files", str(text), "--out_dir", str(data))
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: {data} already holds shards of another corpus "
                                                           f"(shakespeare_train_000001.bin, shakespeare_val_000000.bin)")
    proc = prepare("files", str(text), "--out_dir", str(data), "--name", "shakespeare")
    assert proc.returncode == 1 and "was prepared with other settings" in proc.stderr, proc.stderr
    assert snapshot(data) == before


EARLIER_RUN = ["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--total_batch_tokens", "1024",
               "--max_steps", "1", "--ds_config", "ds_configs/zero2_fp32.json", "--data", "{small_vocab_dir}"]


@pytest.mark.two_rank_runs({"bad_input_earlier_run": two_rank_run(*EARLIER_RUN, ranks=1),
                            "bad_input_into_an_earlier_run": two_rank_run(
                                *EARLIER_RUN, "--out_dir", "{runs}/bad_input_earlier_run")})
def test_two_ranks_refuse_a_fresh_run_into_an_earlier_runs_out_dir(two_rank_runs):
    """The data-loss case on 2 ranks (an earlier run of one rank's out_dir, in the shared launch): said once, exit 2
    on every rank, the earlier run's files untouched: none changed since the launch began."""
    earlier, _ = succeeded(two_rank_runs["bad_input_earlier_run"])
    _, proc = two_rank_runs["bad_input_into_an_earlier_run"]
    out = out_dir_of(proc).parent / "bad_input_earlier_run"
    codes = [json.loads((out.parent / f"bad_input_into_an_earlier_run.rank{rank}.json").read_text())["returncode"]
             for rank in (0, 1)]
    assert codes == [2, 2] and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        f"error: --out_dir {out} holds an earlier run (checkpoints up to step_00000000 and metrics.jsonl): continue it "
        f"with --resume auto, or start afresh with another --out_dir"]
    launched = (out.parent / "runs.json").stat().st_mtime_ns  # written as the launch began, after the earlier run
    assert [p for p, mtime in snapshot(out).items() if mtime > launched] == [] and read_metrics(out) == earlier


def test_unreadable_init_from_weights_are_one_line(small_vocab_dir, tmp_path):
    """--init_from's weights are read once, after launch: a damaged file is still one line and exit 1."""
    from conftest import train
    from gpt.model.model import PRESETS
    tiny = PRESETS["tiny"]
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": tiny.n_layer, "n_head": tiny.n_head,
                                                    "n_embd": tiny.n_embd, "n_positions": tiny.block_size,
                                                    "vocab_size": 50257}))
    (hf_dir / "model.safetensors").write_bytes(b"garbage" * 10)
    _, proc = train(tmp_path / "out", small_vocab_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "1024",
                    "--init_from", str(hf_dir), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        f"error: {hf_dir}/model.safetensors: unreadable GPT-2 weights (SafetensorError: Error while deserializing "
        f"header: header too large)"]


def test_an_unfinished_preparation_is_one_warning_and_trains(shakespeare_dir, tmp_path, capsys, monkeypatch):
    """A data directory whose gpt-prepare did not complete is trained on (a partial FineWeb may be meant), with one
    warning line."""
    data = tmp_path / "data"
    shutil.copytree(shakespeare_dir, data)
    progress = data / "shakespeare_prepare.json"
    progress.write_text(json.dumps({**json.loads(progress.read_text()), "complete": False}))
    monkeypatch.setattr("gpt.runtime.ranks.setup_distributed", lambda **kwargs: sys.exit("started"))
    with pytest.raises(SystemExit, match="started"):
        train_ds.main(["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--total_batch_tokens", "1024",
                       "--ds_config", "ds_configs/zero2_fp32.json", "--data", str(data), "--out_dir", str(tmp_path / "out")])
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {progress}: its gpt-prepare did not complete (2 shard(s) written): training on part of the corpus; "
        f"rerun the same gpt-prepare command to finish it"]


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 256000000000000 bytes. Error code 12 (Cannot allocate memory)"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB")])
def test_running_out_of_memory_while_building_the_engine_is_one_line_and_exit_1(monkeypatch, capsys, error):
    """The safety net behind the memory check before launch: an allocation that fails while the model and its
    engine are built (what the check cannot see: other processes' memory, a cgroup's limit) ends the run with one
    line naming the model, what it needs and what to do, exit 1."""
    from gpt.config import ds_config as dsc
    from gpt.train import engine, start, trainer
    settings = parse(["--model", "tiny", "--vocab_size", "1000000", "--ds_config", "ds_configs/zero2_fp32.json"])
    prepared = SimpleNamespace(settings=settings, ds_config=dsc.load(settings.run.ds_config), lock=None, grad_accum=1,
                               model_config=model_config(settings))
    monkeypatch.setattr(start, "prepare", lambda settings: prepared)

    def new_engine(*args, **kwargs):
        raise error
    monkeypatch.setattr(engine, "new_engine", new_engine)
    with pytest.raises(SystemExit) as exit_info:
        trainer.train(settings)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error: out of memory building the model and its DeepSpeed engine (--model tiny --vocab_size 1000000: 6.41e+07 "
        "parameters, whose weights, gradients and optimizer states need 2.7 GiB per rank): choose a smaller model, "
        f"more ranks with ZeRO 1 or 2, or a device with more memory ({str(error)[:200]})\n")


def test_a_world_size_left_in_the_shell_is_one_line_before_anything_is_planned(small_vocab_dir, tmp_path):
    """A WORLD_SIZE exported by an earlier session, no launcher: the batch would be planned for 2 ranks and trained on
    1, silently. One line naming the variable, exit 2, nothing written."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "train_ds.py", "--model", "tiny", "--seq_len", "64", "--micro_batch", "4",
                           "--total_batch_tokens", "512", "--data", str(small_vocab_dir), "--out_dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**plain_shell_env(), "WORLD_SIZE": "2"})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        "error: WORLD_SIZE=2 is set but RANK is not, and a launcher sets both: left in this shell, it would plan the "
        "batch for 2 ranks while 1 trains. Unset WORLD_SIZE, or launch with deepspeed or torchrun")
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("command", [["train_ds.py", "--model", "tiny"], ["-m", "gpt.commands.plan", "--gpu", "h100-80gb"]])
def test_an_accelerator_deepspeed_does_not_know_is_one_line_and_exit_2(command):
    """DS_ACCELERATOR is read while DeepSpeed is imported, before any flag: an unknown value is one line naming
    it and DeepSpeed's own list, not DeepSpeed's traceback, from the trainer and the console scripts alike."""
    proc = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**plain_shell_env(), "DS_ACCELERATOR": "tpu"})
    from deepspeed.accelerator.real_accelerator import SUPPORTED_ACCELERATOR_LIST
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: DS_ACCELERATOR='tpu' is not an accelerator DeepSpeed knows: one of "
                           f"{', '.join(SUPPORTED_ACCELERATOR_LIST)}, or unset to let DeepSpeed detect the device\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
@pytest.mark.parametrize("asked", ["cuda", "xpu"])
def test_an_accelerator_this_machine_lacks_is_one_line_and_exit_2_with_nothing_written(asked, tmp_path, small_vocab_dir):
    """DeepSpeed takes DS_ACCELERATOR=cuda on trust (the run failed in its first CUDA call, `Torch not compiled with
    CUDA enabled`), and raises its own traceback for one it knows whose support is not installed (xpu, npu, mps, ...)."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train_ds.py", "--model", "tiny", "--data", str(small_vocab_dir),
                           "--out_dir", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**plain_shell_env(), "DS_ACCELERATOR": asked})
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    if asked == "cuda":
        assert line == (f"error: DS_ACCELERATOR='cuda': torch {torch.__version__} here "
                        + ("is built without CUDA" if torch.version.cuda is None else "finds no CUDA device")
                        + "; unset it to let DeepSpeed detect the device")
    else:
        assert line.startswith("error: DS_ACCELERATOR='xpu': XPU_Accelerator requires PyTorch with XPU support")
        assert line.endswith("; unset it to let DeepSpeed detect the device")


def test_a_master_port_in_use_is_one_line_and_exit_2_with_nothing_written(tmp_path, small_vocab_dir):
    """A launcher's MASTER_PORT that another program holds: torch's rendezvous failed with EADDRINUSE, a traceback."""
    import socket

    out = tmp_path / "run"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "train_ds.py", "--model", "tiny", "--data", str(small_vocab_dir),
                               "--out_dir", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**plain_shell_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        f"error: MASTER_PORT={port}: the process group's port is in use on this machine (another run, or another "
        f"program, holds it): launch with a free one, --master_port N (deepspeed, torchrun)")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_a_master_port_that_is_no_port_is_one_line_from_rank_0_and_exit_2_on_every_rank(tmp_path, small_vocab_dir,
                                                                                        monkeypatch, capsys, rank):
    """`deepspeed --master_port 296114`: rank 0 said so, rank 1 printed torch's `ValueError: port must have value from 0
    to 65535` traceback. Each rank checks it before the rendezvous; rank 0 says it, the others exit 2 silently (after
    SILENT_RANK_WAIT_S, here 0: the launcher ends them once rank 0 has)."""
    from gpt import console
    from gpt.train import start

    monkeypatch.setattr(console, "SILENT_RANK_WAIT_S", 0.0)
    for name, value in {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "296114"}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        start.setup(parse([*TINY, "--total_batch_tokens", "512", "--data", str(small_vocab_dir), "--out_dir", str(out)]))
    said = "" if rank else "error: MASTER_PORT='296114': not a port number (1-65535)\n"
    assert (exited.value.code, capsys.readouterr().err, out.exists()) == (2, said, False)
