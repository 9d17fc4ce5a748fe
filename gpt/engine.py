"""deepspeed.initialize around the model (schedule, parameter groups, activation checkpointing, a quiet
start-up), the engine's per-step statistics, and the optimizer state a checkpoint cannot hold."""
import contextlib

import torch

from gpt import dist  # first: it imports deepspeed with DeepSpeed's logs sent to stderr
from gpt import ds_config as dsc
from gpt.optim import param_groups

import deepspeed  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.ops.adam import FusedAdam  # noqa: E402
from deepspeed.runtime import bf16_optimizer  # noqa: E402


def initialize(model, ds_config, micro_batch, grad_accum, optimizer):
    """The DeepSpeed engine around model, in the process group that exists (gpt.dist), with AdamW and the
    schedule from `optimizer` (gpt.optim.OptimizerSettings). With an `activation_checkpointing` block in
    the JSON, every transformer block is recomputed in backward through DeepSpeed's checkpoint API."""
    config = dsc.fill(ds_config, micro_batch, grad_accum, micro_batch * grad_accum * dist.world_size(), optimizer.lr,
                      optimizer.weight_decay)
    if dsc.uses_activation_checkpointing(config):
        deepspeed.checkpointing.configure(mpu_=None, deepspeed_config=config)
        model.checkpoint_fn = deepspeed.checkpointing.checkpoint  # reentrant: block inputs carry grad
    with no_memory_dumps():
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, optimizer.weight_decay), config=config,
            lr_scheduler=lambda torch_optimizer: torch.optim.lr_scheduler.LambdaLR(torch_optimizer,
                                                                                    optimizer.lr_factor))
    return engine


@contextlib.contextmanager
def no_memory_dumps():
    """DeepSpeed 0.19's BF16_Optimizer prints 18 lines of memory statistics (see_memory_usage with
    force=True) to stdout while it builds; silence those, and only those: warnings go through DeepSpeed's
    logger, untouched."""
    original = bf16_optimizer.see_memory_usage
    bf16_optimizer.see_memory_usage = lambda *args, **kwargs: None
    try:
        yield
    finally:
        bf16_optimizer.see_memory_usage = original


def step_stats(engine):
    """grad_norm (before clipping); with fp16 also the loss scale and the count of skipped steps."""
    stats = {}
    grad_norm = engine.get_global_grad_norm()
    if grad_norm is not None:
        stats["grad_norm"] = float(grad_norm)
    if engine.fp16_enabled():
        stats["loss_scale"] = float(engine.optimizer.cur_scale)
        stats["skipped_steps"] = int(engine.skipped_steps)
    return stats


def replay_adam_step_count(engine):
    """After a checkpoint's optimizer state is loaded on DeepSpeed's CPU accelerator, bring its C++ Adam to the
    saved step the way an uninterrupted run got there. FusedAdam there is cpu_adam's Adam_Optimizer, one per
    process, which keeps beta1^t and beta2^t as running float products (t-1's times beta) that no checkpoint
    holds; on a resume it computes them with pow instead, which rounds differently: the bias correction moves by
    an ulp and every weight by ~1e-9 from the first resumed step on. Stepping it through 1..t on empty tensors
    rebuilds the same products. (CUDA's FusedAdam computes pow(beta, t) at every step: nothing to replay.)"""
    adam = engine.basic_optimizer
    if get_accelerator().device_name() != "cpu" or type(adam) is not FusedAdam:
        return
    steps = {int(state["step"]) for state in adam.state.values() if "step" in state}
    if len(steps) != 1:  # no step taken yet, or groups out of step (then a product is no better than pow)
        return
    empty = torch.empty(0)
    beta1, beta2 = adam.param_groups[0]["betas"]
    for step in range(1, steps.pop() + 1):
        adam.multi_tensor_adam(0, adam._dummy_overflow_buf, [[empty], [empty], [empty], [empty]], 0.0, beta1,
                               beta2, 0.0, step, adam.adam_w_mode, 1, 0.0)
