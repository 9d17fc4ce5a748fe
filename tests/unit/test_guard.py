"""The spike/NaN guard: the skip mechanism on each DeepSpeed optimizer our configs select (real engines,
in process), and the guard's bookkeeping."""
import json
import math

import pytest
import torch

from common import REPO
from gpt.runtime import accelerator
from gpt.train import engine as ds_engine
from gpt.train.engine import OptimizerSettings, SpikeGuard, install_grad_norm_hook
from gpt.model.model import GPT, GPTConfig

MODEL = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=256)
OPTIMIZER = OptimizerSettings(lr=1e-3, weight_decay=0.1, warmup_steps=1, max_steps=100, min_lr_ratio=0.1)


def build_engine(config_name, fp32=False):
    config = json.loads((REPO / "ds_configs" / config_name).read_text())
    if fp32:
        config.pop("bf16"), config.pop("data_types")
    if "fp16" in config:
        accelerator.enable_cpu_fp16()
        config["fp16"]["initial_scale_power"] = 6  # so that the 20x spike below is an outlier, not an overflow
    torch.manual_seed(0)
    return ds_engine.initialize(GPT(MODEL), config, micro_batch=2, grad_accum=1, optimizer=OPTIMIZER)


def step(engine, guard, scale=1.0):
    """One step as train_ds.py takes it; `scale` multiplies the loss (nan: a NaN loss; large: a spike)."""
    x = torch.randint(0, MODEL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(engine.global_steps))
    _, loss = engine(x, x)
    loss = loss * scale
    if guard.check_loss(loss.item()):
        loss = loss * float("nan")
    skipped_before = engine.skipped_steps
    engine.backward(loss)
    engine.step()
    skipped = engine.skipped_steps > skipped_before
    guard.end_step(loss.item(), skipped)
    return skipped


def weights(engine):
    return {k: v.clone() for k, v in engine.module.state_dict().items()}


def test_each_bf16_optimizer_answers_to_its_own_guard(single_rank_group):
    """BF16_Optimizer's gradient norm comes from a module function that every BF16_Optimizer in the process shares
    (several runs in one process: the tests, the bench): one run's guard must not judge another run's steps."""
    first, second = build_engine("zero1_bf16.json"), build_engine("zero1_bf16.json")
    skipping = SpikeGuard(grad_z=4.0)
    skipping.reason = "the first run's step is being skipped"  # as filter_grad_norm sets it, until end_step
    install_grad_norm_hook(first, skipping)
    guard = SpikeGuard(grad_z=4.0, min_history=3)
    install_grad_norm_hook(second, guard)
    before = weights(second)
    assert not step(second, guard) and any(not torch.equal(before[k], v) for k, v in weights(second).items())
    skipped_before = first.skipped_steps
    x = torch.randint(0, MODEL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    first.backward(first(x, x)[1])
    first.step()
    assert first.skipped_steps == skipped_before + 1  # its own guard still skips its update


def test_a_guarded_bf16_step_leaves_deepspeed_its_own_norm_function(single_rank_group):
    """BF16_Optimizer's guard swaps the module function get_global_norm_of_tensors in for its own step only: with
    no engine, between steps and after them (a skipped one, a failed one) the process has DeepSpeed's own."""
    import deepspeed.runtime.bf16_optimizer as bf16_optimizer
    from deepspeed.runtime.utils import get_global_norm_of_tensors as deepspeeds_own

    assert bf16_optimizer.get_global_norm_of_tensors is deepspeeds_own  # no engine
    engine = build_engine("zero1_bf16.json")
    guard = SpikeGuard(grad_z=4.0)
    assert install_grad_norm_hook(engine, guard)
    assert bf16_optimizer.get_global_norm_of_tensors is deepspeeds_own
    assert not step(engine, guard) and len(guard.norms) == 1  # the guard filtered the step's norm
    assert bf16_optimizer.get_global_norm_of_tensors is deepspeeds_own
    guard.reason = "this step is being skipped"  # as filter_grad_norm sets it, until end_step
    skipped_before = engine.skipped_steps
    x = torch.randint(0, MODEL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    engine.backward(engine(x, x)[1])
    engine.step()
    assert engine.skipped_steps == skipped_before + 1  # the guard's NaN norm skipped the update
    assert bf16_optimizer.get_global_norm_of_tensors is deepspeeds_own

    def failing_step(*args, **kwargs):
        assert bf16_optimizer.get_global_norm_of_tensors is not deepspeeds_own  # the guarded one, for the step
        raise RuntimeError("the step failed")
    engine.optimizer.step = failing_step
    install_grad_norm_hook(engine, guard)
    with pytest.raises(RuntimeError, match="the step failed"):
        engine.optimizer.step()
    assert bf16_optimizer.get_global_norm_of_tensors is deepspeeds_own


@pytest.mark.parametrize("config,fp32,optimizer_class", [
    ("zero1_bf16.json", False, "BF16_Optimizer"),
    ("zero2_bf16.json", False, "DeepSpeedZeroOptimizer"),
    ("zero1_fp16.json", False, "DeepSpeedZeroOptimizer"),
    ("zero2_bf16.json", True, "DeepSpeedZeroOptimizer"),
])
def test_outliers_skip_the_whole_update(single_rank_group, config, fp32, optimizer_class):
    engine = build_engine(config, fp32)
    assert type(engine.optimizer).__name__ == optimizer_class
    guard = SpikeGuard(loss_z=0.0, grad_z=4.0, min_history=3)
    assert install_grad_norm_hook(engine, guard)
    for _ in range(4):
        assert not step(engine, guard)
    before = weights(engine)
    lr_before = engine.get_lr()[0]
    assert step(engine, guard, scale=float("nan"))  # a NaN loss is skipped
    assert guard.reason == "loss nan"
    assert step(engine, guard, scale=20.0)  # a gradient-norm outlier is skipped (loss_z is off)
    assert guard.reason.startswith("grad norm") and "sigma above the last 4" in guard.reason
    after = weights(engine)
    assert all(torch.equal(before[k], after[k]) for k in before)  # no weight moved
    assert engine.get_lr()[0] == lr_before  # nor did the schedule
    assert not step(engine, guard)  # and training goes on
    assert any(not torch.equal(before[k], v) for k, v in weights(engine).items())
    assert guard.skipped == 2


def test_loss_spikes_and_repeated_bad_steps():
    guard = SpikeGuard(loss_z=3.0, min_history=5, max_bad_steps=3)
    for loss in (3.0, 3.1, 2.9, 3.05, 2.95):
        assert not guard.check_loss(loss)
        assert guard.end_step(loss, skipped=False) is None
    assert not guard.check_loss(3.08)  # inside the window's spread
    guard.end_step(3.08, skipped=False)
    assert guard.check_loss(9.0) and "sigma above the last 6" in guard.reason
    assert guard.end_step(9.0, skipped=True) is None
    assert guard.check_loss(math.nan) and guard.reason == "loss nan"
    assert guard.end_step(math.nan, skipped=True) is None
    assert guard.check_loss(math.inf)
    assert guard.end_step(math.inf, skipped=True) == "3 bad steps in a row (last: loss inf)"
    assert guard.skipped == 3


def test_fp16_overflows_are_not_bad_steps():
    guard = SpikeGuard(max_bad_steps=2, fp16=True)
    for _ in range(5):
        assert not guard.check_loss(3.0)  # a finite loss whose gradients overflowed in fp16
        assert guard.end_step(3.0, skipped=True) is None
    assert guard.skipped == 0 and guard.reason == "fp16 overflow: the loss scale was lowered"
    assert guard.check_loss(math.nan)
    guard.end_step(math.nan, skipped=True)
    assert guard.check_loss(math.nan)
    assert guard.end_step(math.nan, skipped=True) == "2 bad steps in a row (last: loss nan)"


@pytest.mark.parametrize("trouble_from, resumed_from, named", [
    (None, None, "step_00000005"),  # a stop for another reason: the newest
    (6, None, "step_00000005"),  # saved before the first bad step
    (6, "step_00000005", "step_00000003"),  # the trouble came in the step right after the resume: not that one
    (7, "step_00000005", "step_00000005"),  # a step after the resume went well first
    (5, None, "step_00000003"),  # saved during the bad streak: not good
    (3, None, "step_00000001"),
    (2, "step_00000001", "none")])
def test_the_last_good_checkpoint_is_from_before_the_trouble(tmp_path, trouble_from, resumed_from, named):
    from gpt.train.trainer import last_good_checkpoint
    ckpt = tmp_path / "checkpoints"
    for tag in ("step_00000001", "step_00000003", "step_00000005"):
        (ckpt / tag).mkdir(parents=True)
        (ckpt / tag / "complete.json").write_text("{}")
    found = last_good_checkpoint(tmp_path, trouble_from, resumed_from and ckpt / resumed_from)
    assert found == (ckpt / named if named != "none" else "none")
