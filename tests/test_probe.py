"""--micro_batch auto's probe (gpt/probe.py): real DeepSpeed engines on CPU, with the GPU allocator's
out-of-memory simulated in the loss, since a CPU process swaps or is killed instead of raising it."""
import gc
import json
import subprocess
import weakref

import pytest
import torch

from gpt import engine as ds_engine
from gpt.model import GPT, GPTConfig
from gpt.optim import OptimizerSettings
from gpt.probe import dividing_sizes, probe_micro_batch
from conftest import FP32_CONFIG, REPO, TINY, free_port

SEQ_LEN, VOCAB = 16, 128
CONFIG = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=SEQ_LEN, vocab_size=VOCAB)


def engine_factory(limit, models, error=torch.OutOfMemoryError):
    """new_engine for the probe: a real fp32 engine whose loss raises `error` above `limit` sequences."""
    ds_config = json.loads((REPO / FP32_CONFIG).read_text())

    def limited_loss(hidden, weight, targets):
        if hidden.shape[0] > limit * SEQ_LEN:
            raise error("simulated")
        return torch.nn.functional.cross_entropy(hidden @ weight.t(), targets)

    def new_engine(micro_batch):
        model = GPT(CONFIG)
        model.loss_fn = limited_loss
        models.append(weakref.ref(model))
        return ds_engine.initialize(model, ds_config, micro_batch, 1, OptimizerSettings(1e-3, 0.1, 0, 10, 0.1))
    return new_engine


def test_dividing_sizes_are_the_micro_batches_that_split_the_token_budget():
    assert dividing_sizes(2048, 32, 2, 32) == [1, 2, 4, 8, 16, 32]
    assert dividing_sizes(6 * 64, 32, 1, 11) == [1, 2, 3, 4, 6]


@pytest.mark.parametrize("limit, expected, probed", [(40, 32, [32]), (5, 4, [32, 4, 8]), (1, 1, [32, 4, 1, 2]),
                                                     (0, None, [32, 4, 1])])
def test_the_probe_bisects_below_the_plan_to_the_largest_size_that_fits(single_rank_group, limit, expected,
                                                                        probed):
    models, log = [], []
    candidates = dividing_sizes(32 * SEQ_LEN, SEQ_LEN, 1, 32)
    chosen = probe_micro_batch(engine_factory(limit, models), candidates, SEQ_LEN, VOCAB, torch.device("cpu"),
                               log=log.append)
    assert chosen == expected
    assert [int(line.split("micro-batch ")[1].split(":")[0]) for line in log] == probed
    assert [("fits" in line) for line in log] == [size <= limit for size in probed]
    assert "peak_rss_gib" in log[0]
    gc.collect()
    assert all(model() is None for model in models), "a probe's model outlived its engine"


def test_an_error_other_than_out_of_memory_is_not_taken_for_one(single_rank_group):
    with pytest.raises(ValueError, match="simulated"):
        probe_micro_batch(engine_factory(2, [], error=ValueError), [1, 2, 4], SEQ_LEN, VOCAB, torch.device("cpu"),
                          log=lambda line: None)


def test_two_ranks_probe_through_the_trainer_and_agree_on_the_smaller_limit(shakespeare_dir, tmp_path):
    """Rank 1 runs out above 6 sequences, rank 0 above 12: both take 4 (of 1, 2, 4, ... 32), the trainer's
    grad_accum and run follow, and the initial weights are those of a run without a probe."""
    out = subprocess.run(
        ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "tests/probe_ranks.py", *TINY,
         "--micro_batch", "auto", "--seq_len", "32", "--total_batch_tokens", "2048", "--max_steps", "2",
         "--data", str(shakespeare_dir), "--out_dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"probe_rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["planned"] == 32 and rank["micro_batch"] == 4 and rank["engine_micro_batch"] == 4
        assert rank["grad_accum"] == 2048 // (4 * 32 * 2) and rank["same_init"]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert "--micro_batch auto: planned 32" in out.stdout and "probed 4: micro_batch 4 x grad_accum 8" in out.stdout
