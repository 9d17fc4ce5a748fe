"""Real DeepSpeed runs on CPU through train_ds.py: 1 rank under `python`, 2 gloo ranks under the
deepspeed launcher (and torchrun)."""
import json
import math

import numpy as np
import pytest

from pathlib import Path

from conftest import (GPT2_VOCAB, SMALL_VOCAB, TINY, assert_exit_0, background_run, launcher_argv, out_dir_of,
                      read_metrics, succeeded, train, train_losses, two_rank_run, write_ds_config)
from gpt.train.schedule import Schedule

FP32_STEPS = ["--max_steps", "5", "--lr", "1e-3", "--total_batch_tokens", "1024"]


def assert_close(a, b, rel=1e-5):
    assert len(a) == len(b) and a, (a, b)
    for x, y in zip(a, b):
        assert abs(x - y) <= rel * abs(y), (a, b)


HALF_PRECISION_CONFIGS = ["zero1_bf16.json", "zero2_bf16.json", "zero1_fp16.json", "zero2_fp16.json"]
# in a 512-token vocabulary: fast also where half-precision matmuls are emulated, and 4x faster in fp32
LOSS_FALLS = {f"loss_falls_{config}": two_rank_run(
    "--data", "{small_vocab_dir}", *TINY, "--ds_config", f"ds_configs/{config}", "--cpu_fp16",
    "--max_steps", "25", "--lr", "3e-3", "--total_batch_tokens", "1024")
    for config in [*HALF_PRECISION_CONFIGS, "zero2_fp32.json"]}


@pytest.mark.two_rank_runs(LOSS_FALLS)
@pytest.mark.parametrize("config", [*HALF_PRECISION_CONFIGS, "zero2_fp32.json"])
def test_loss_falls_on_shakespeare_with_two_ranks(two_rank_runs, config):
    records, proc = succeeded(two_rank_runs[f"loss_falls_{config}"])
    losses = train_losses(records)
    assert len(losses) == 25
    assert losses[0] > math.log(SMALL_VOCAB) - 0.3  # a uniform guess at initialisation
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5
    assert "CPU Virtual Memory" not in proc.stdout  # BF16_Optimizer's start-up memory dumps are silenced
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]  # DeepSpeed calling an API torch deprecated


ZERO_STAGES = {f"zero_stage_{stage}": two_rank_run("--data", "{small_vocab_dir}", *TINY, *FP32_STEPS,
                                                   ds_config=dict(stage=stage, precision="fp32"))
               for stage in (0, 1, 2)}


@pytest.mark.two_rank_runs(ZERO_STAGES)
def test_zero_stages_0_1_2_give_the_same_losses(two_rank_runs):
    losses = {stage: train_losses(succeeded(two_rank_runs[f"zero_stage_{stage}"])[0]) for stage in (0, 1, 2)}
    assert_close(losses[1], losses[0])
    assert_close(losses[2], losses[0])


def test_gradient_accumulation_matches_a_larger_micro_batch(tmp_path, small_vocab_dir):
    config = write_ds_config(tmp_path / "fp32.json", stage=1, precision="fp32")
    losses = []
    for micro in (2, 4):  # 256 tokens/step = 2 x 64 x accumulation 2 = 4 x 64 x accumulation 1
        records, _ = train(tmp_path / f"micro{micro}", small_vocab_dir, *TINY, *FP32_STEPS, "--ds_config", config,
                           "--micro_batch", str(micro), "--total_batch_tokens", "256")
        losses.append(train_losses(records))
    assert_close(losses[0], losses[1])


CHECKPOINTING = {f"checkpointing_{config}": two_rank_run("--data", "{small_vocab_dir}", *TINY, *FP32_STEPS,
                                                          "--ds_config", f"ds_configs/{config}")
                 for config in ("zero2_bf16.json", "zero2_bf16_ckpt.json")}


@pytest.mark.two_rank_runs(CHECKPOINTING)
def test_activation_checkpointing_leaves_losses_unchanged(two_rank_runs):
    losses = [train_losses(succeeded(run)[0]) for run in map(two_rank_runs.get, CHECKPOINTING)]
    assert losses[0] == losses[1]


def test_fp16_overflow_skips_the_step_and_lowers_the_loss_scale(tmp_path, small_vocab_dir):
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 24, "loss_scale_window": 1000,
            "hysteresis": 1, "min_loss_scale": 1}
    config = write_ds_config(tmp_path / "fp16.json", precision="fp32", fp16=fp16)
    records, proc = train(tmp_path / "run", small_vocab_dir, *TINY, *FP32_STEPS, "--max_steps", "12",
                          "--ds_config", config, "--cpu_fp16")
    steps = [r for r in records if "loss" in r]
    assert steps[0]["skipped_steps"] == 1 and steps[0]["loss_scale"] == 2.0**23
    skipped = [r["step"] for r in steps if r["skipped_steps"] > (steps[r["step"] - 1]["skipped_steps"] if r["step"] else 0)]
    assert skipped == list(range(len(skipped))) and 0 < len(skipped) < 12  # overflows, then trains
    for r in steps[:len(skipped) + 1]:  # the schedule does not advance on a skipped step
        assert r["lr"] == pytest.approx(Schedule(1e-3, 2, 12, 0.1).lr_at(0))
    assert steps[-1]["loss_scale"] == 2.0 ** (24 - len(skipped))
    assert "skipped_steps 1" in proc.stdout


@pytest.mark.background_runs({"torchrun": background_run(
    *launcher_argv("torchrun", 2, "{port}"), "train_ds.py", "--data", "{small_vocab_dir}", "--out_dir", "{out}", *TINY,
    "--max_steps", "3", "--total_batch_tokens", "1024", "--val_every", "2", "--val_tokens", "512")})
def test_torchrun_launch_with_two_ranks(background_runs):
    proc = background_runs["torchrun"]
    assert_exit_0(proc)
    records, port = read_metrics(out_dir_of(proc)), proc.args[proc.args.index("--master_port") + 1]
    assert [r["step"] for r in records if "loss" in r] == [0, 1, 2]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 2]
    assert "2 rank(s)" in proc.stdout
    # no DeepSpeed shared-memory allreduce buffer (66 MB a rank in /dev/shm): its op is never built
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


@pytest.mark.slow
def test_micro_batch_auto_asks_the_planner(tmp_path, small_vocab_dir):
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--micro_batch", "auto", "--max_steps", "2",
                          "--total_batch_tokens", "4096")
    assert "--micro_batch auto on CPU RAM / 1 local rank(s)" in proc.stdout
    assert "for the token budget: micro-batch 64 x grad_accum 1" in proc.stdout
    assert "1 rank(s) x micro_batch 64 x seq_len 64 x grad_accum 1" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["fused", "classic"])  # fused: the chunked kernel, the one other than liger (CUDA)
def test_compile_keeps_training_validation_and_sampling_working(tmp_path, small_vocab_dir, loss):
    """--compile (each block, and the head with our own losses: gpt.train.engine.compile_regions) gives eager's losses and
    validation losses for every --loss that runs on a CPU, and samples."""
    config = write_ds_config(tmp_path / "fp32.json", stage=1, precision="fp32")
    args = [*TINY, *FP32_STEPS, "--max_steps", "2", "--ds_config", config, "--val_every", "1",
            "--val_tokens", "512", "--sample_every", "1", "--sample_tokens", "8", "--loss", loss]
    eager, _ = train(tmp_path / "eager", small_vocab_dir, *args)
    compiled, proc = train(tmp_path / "compiled", small_vocab_dir, *args, "--compile")
    for key in ("loss", "val_loss"):
        assert_close([r[key] for r in compiled if key in r], [r[key] for r in eager if key in r], rel=1e-4)
    assert "sample at step 1:" in proc.stdout
    assert list((tmp_path / "compiled" / "tensorboard" / "compiled").glob("events.out.tfevents.*"))  # TensorBoard


@pytest.mark.slow
@pytest.mark.parametrize("source", ["files", "hub", "npy"])
def test_training_runs_on_shards_from_each_source(tmp_path, small_vocab_dir, source):
    from gpt.commands.prepare import main as prepare_main
    from gpt.data.shards import find_shards, load_shard
    from gpt.data.prepare import shakespeare_documents

    data = tmp_path / "data"
    if source == "npy":  # build-nanogpt's format: headerless uint16 .npy shards
        data.mkdir()
        for split in ("val", "train"):
            for path in find_shards(small_vocab_dir, split):
                np.save(data / path.with_suffix(".npy").name, np.asarray(load_shard(path)))
    else:
        (tmp_path / "corpus").mkdir()
        documents = shakespeare_documents()
        (tmp_path / "corpus" / "plays.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in documents["val"] + documents["train"]))
        where = str(tmp_path / "corpus" / "plays.jsonl") if source == "files" else str(tmp_path / "corpus")
        prepare_main([source, where, "--out_dir", str(data), "--val_tokens", "20000", "--shard_tokens", "500000"])
    vocab = GPT2_VOCAB if source != "npy" else []  # gpt-prepare writes GPT-2's ids
    records, proc = train(tmp_path / "run", data, *TINY, *vocab, "--max_steps", "2", "--total_batch_tokens", "1024",
                          "--val_every", "1", "--val_tokens", "1024")
    assert [r["step"] for r in records if "val_loss" in r] == [0, 1]
    assert f"data {data}: {4 if source != 'npy' else 1} train shard(s)" in proc.stdout
