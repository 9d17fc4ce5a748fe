"""Recomputing blocks in backward changes nothing: same loss, bit-identical gradients."""
import json

import deepspeed
import pytest
import torch
import torch.utils.checkpoint

from common import REPO
from gpt.model.model import GPT, GPTConfig

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=128)


@pytest.fixture
def deepspeed_checkpoint(single_rank_group):
    """deepspeed.checkpointing.checkpoint configured from ds_configs/zero2_bf16_ckpt.json."""
    config = json.loads((REPO / "ds_configs" / "zero2_bf16_ckpt.json").read_text())
    deepspeed.checkpointing.configure(None, deepspeed_config={**config, "train_micro_batch_size_per_gpu": 1})
    return deepspeed.checkpointing.checkpoint


def loss_and_grads(model, x, checkpoint_fn):
    model.zero_grad()
    model.checkpoint_fn = checkpoint_fn
    _, loss = model(x, x)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_as_without_checkpointing(checkpoint_fn):
    torch.manual_seed(0)
    model = GPT(TINY)
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    loss, grads = loss_and_grads(model, x, None)
    loss_ckpt, grads_ckpt = loss_and_grads(model, x, checkpoint_fn)
    assert torch.equal(loss, loss_ckpt)
    for name in grads:
        assert torch.equal(grads[name], grads_ckpt[name]), name


def test_deepspeed_checkpointing_gives_identical_gradients(deepspeed_checkpoint):
    assert_same_as_without_checkpointing(deepspeed_checkpoint)


def test_torch_checkpointing_gives_identical_gradients():
    assert_same_as_without_checkpointing(
        lambda fn, *args: torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False))
