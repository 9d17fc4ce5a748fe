"""The engine adds no numerical change: DeepSpeed (ZeRO 0, fp32, 1 rank) equals a plain PyTorch AdamW loop
with the same initial weights, data, schedule and clipping."""
from dataclasses import replace

import pytest
import torch

from conftest import SMALL_VOCAB, TINY, train, train_losses, write_ds_config
from gpt.data.shards import ShuffledTokenLoader, find_shards
from gpt.train.engine import param_groups
from gpt.train.schedule import Schedule
from gpt.model.model import GPT, PRESETS

STEPS, MICRO, SEQ, ACCUM, LR, WARMUP, SEED = 5, 4, 64, 2, 1e-3, 2, 1234


def plain_pytorch_losses(data_dir):
    torch.manual_seed(SEED)
    model = GPT(replace(PRESETS["tiny"], vocab_size=SMALL_VOCAB))  # as TINY trains it
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(LR, WARMUP, STEPS, 0.1).factor)
    loader = ShuffledTokenLoader(find_shards(data_dir, "train"), MICRO, SEQ, seed=SEED,
                                 windows_per_batch=ACCUM * MICRO)  # as train_ds.py builds it
    losses, lrs = [], []
    for _ in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        total = 0.0
        for _ in range(ACCUM):
            x, y = loader.next_batch()
            _, loss = model(x, y)
            (loss / ACCUM).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(total / ACCUM)
    return losses, lrs


@pytest.mark.slow
def test_deepspeed_matches_plain_pytorch_adamw(tmp_path, small_vocab_dir):
    """Over 15 s where it is the suite's first integration test: its set-up is the session's (the Shakespeare shards
    in 512 ids, the shared 2-rank launch's one-rank legs, run in this process before that launch starts)."""
    config = write_ds_config(tmp_path / "zero0.json", stage=0, precision="fp32")
    records, _ = train(tmp_path / "run", small_vocab_dir, *TINY, "--ds_config", config, "--max_steps", str(STEPS),
                       "--lr", str(LR), "--total_batch_tokens", str(MICRO * SEQ * ACCUM))
    expected_losses, expected_lrs = plain_pytorch_losses(small_vocab_dir)
    losses = train_losses(records)
    assert len(losses) == STEPS
    for got, want in zip(losses, expected_losses):
        assert abs(got - want) <= 1e-5 * want, (losses, expected_losses)
    assert [r["lr"] for r in records if "loss" in r] == expected_lrs
