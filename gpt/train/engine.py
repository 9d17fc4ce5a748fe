"""The model a run trains, in DeepSpeed's engine: a GPT of the run's shape (new_engine), wrapped as torchtitan's
parallelize wraps one (wrap: the loss, activation checkpointing, compile, in that order), inside deepspeed.initialize
with the batch the run decided (fill), AdamW, the lr schedule and the weight-decay groups; the spike guard on its
updates, and the optimizer state a checkpoint cannot hold. Every engine a run steps is built here (the run's, the
probe's throwaway ones, gpt-plan --measure's, the bench's), so that each measures the step the run takes; and this is
the one place that says how a model is compiled, and how compiled code is dropped again (forget_compiled_code)."""
import contextlib
import copy
import dataclasses
import math
from collections import deque
from dataclasses import dataclass

import torch

from gpt.runtime import accelerator, ranks  # first: DeepSpeed imported with its logs on stderr
from gpt.config import ds_config as dsc, muon_checks
from gpt.config.settings import OptimizerSection
from gpt.console import say0
from gpt.model import loss as losses
from gpt.model.model import GPT
from gpt.train import muon
from gpt.train.hf import load_hf_weights
from gpt.train.schedule import Schedule

import deepspeed  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.ops.adam import FusedAdam  # noqa: E402
from deepspeed.runtime import bf16_optimizer  # noqa: E402


def new_engine(setup, micro_batch, grad_accum, initial_weights=True):
    """(the DeepSpeed engine, the model, the loss's name for the log) as the run steps them: a GPT of the run's
    shape (setup: gpt.train.start.Setup), --init_from's weights when initial_weights, built by initialize."""
    settings = setup.settings
    model = GPT(setup.model_config)
    if initial_weights and settings.checkpoint.init_from:
        model.load_state_dict(load_hf_weights(settings.checkpoint.init_from, setup.model_config))
        say0(f"initial weights from {settings.checkpoint.init_from}")
    engine = initialize(model, setup.ds_config, micro_batch, grad_accum, OptimizerSettings.of(settings.optimizer),
                        settings.model.loss, settings.model.compile)
    return engine, model, losses.kernel_for(settings.model.loss, setup.device.type, setup.precision).label


def initialize(model, ds_config, micro_batch, grad_accum, optimizer, loss=None, compile=False):
    """The DeepSpeed engine around model, in the process group that exists (gpt.runtime.ranks), with AdamW and the
    schedule from `optimizer` (OptimizerSettings below). The model is first wrapped as a run trains it (wrap: the
    --loss, None for the model's own; then activation checkpointing; then --compile): with an
    `activation_checkpointing` block in the JSON, every transformer block is recomputed in backward through
    DeepSpeed's checkpoint API."""
    config = fill(ds_config, micro_batch, grad_accum, micro_batch * grad_accum * ranks.world_size(), optimizer.lr,
                  optimizer.weight_decay)
    checkpoint_fn = None
    if dsc.uses_activation_checkpointing(config):
        deepspeed.checkpointing.configure(mpu_=None, deepspeed_config=config)
        checkpoint_fn = deepspeed.checkpointing.checkpoint  # reentrant: block inputs carry grad
    wrap(model, loss, accelerator.device_type(), dsc.precision(config), checkpoint_fn=checkpoint_fn, compile=compile)
    with no_memory_dumps(), muon.blocks_tagged_for_muon():
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, optimizer.weight_decay), config=config,
            lr_scheduler=lambda torch_optimizer: torch.optim.lr_scheduler.LambdaLR(torch_optimizer,
                                                                                    optimizer.lr_factor))
    return engine


def fill(ds_config, micro_batch, grad_accum, train_batch_size, lr, weight_decay):
    """A copy of the DeepSpeed JSON with what the run decides: the batch triple, learning rate, weight decay. Under
    Muon, lr is the Adam half's and muon_lr is written in where the JSON has none (DeepSpeed would give that half lr);
    the weight decay rides on the param groups (param_groups); a key of the JSON's recipe (adam_lr, weight_decay)
    stays only where the run trains at its value, a flag given having overridden it (gpt.train.muon.setting_name)."""
    config = copy.deepcopy(ds_config)
    config["train_micro_batch_size_per_gpu"] = micro_batch
    config["gradient_accumulation_steps"] = grad_accum
    config["train_batch_size"] = train_batch_size
    optimizer = config.setdefault("optimizer", copy.deepcopy(dsc.DEFAULT_OPTIMIZER))
    params = optimizer.setdefault("params", {})
    if not muon_checks.uses_muon(config):
        params.update(lr=lr, weight_decay=weight_decay)
        return config
    for key, value in ((muon_checks.RECIPE["lr"], lr), (muon_checks.RECIPE["weight_decay"], weight_decay)):
        if params.get(key) != value:
            params.pop(key, None)
    params.update(lr=lr)
    params.setdefault("muon_lr", muon_checks.DEFAULT_MUON_LR)
    config.setdefault("gradient_clipping", 0.0)  # DeepSpeed's default (1.0) would clip Muon's update (muon_checks)
    return config


def wrap(model, loss=None, device_type="cpu", precision="fp32", *, checkpoint_fn=None, compile=False):
    """Make `model` (a gpt.model.model.GPT) the model a run trains, in place; each step may depend on the one before
    (compile looks at the loss that was chosen):
    1. the loss: the kernel --loss names (gpt.model.loss.KERNELS; `classic` keeps the full fp32 logits), in its
       compiled form under compile; None leaves the model's own loss_fn (tests set one by hand);
    2. activation checkpointing: checkpoint_fn (DeepSpeed's, when the JSON has an activation_checkpointing block)
       recomputes each transformer block in backward; None leaves the model's own (none, unless set by hand);
    3. compile (--compile): compile_regions, the head with the blocks only around the classic loss."""
    if loss is not None:
        kernel = losses.kernel_for(loss, device_type, precision)
        model.loss_fn = kernel.compiled if compile and kernel.compiled else kernel.function
    if checkpoint_fn is not None:
        model.checkpoint_fn = checkpoint_fn
    if compile:
        compile_regions(model, compile_head=model.loss_fn is None)


def compile_regions(model, compile_head):
    """torch.compile applied as torchtitan applies it: each transformer block on its own, in place (parameter
    names and checkpoints unchanged; the identical blocks share one compiled graph), and the head (ln_f and the
    loss or logits) only when compile_head (the classic loss). A loss kernel runs between compiled regions: the
    chunked one with each chunk's math compiled inside its eager autograd.Function (traced whole, it kept every
    chunk's logits for backward), any other library's (liger) eager, never traced by dynamo: liger-kernel's fused
    linear cross-entropy crashed dynamo at step 0 on torch < 2.13 (H100, 2026-11-24), and its issue #1338 reports
    a wrong loss under it."""
    for block in model.transformer.h:
        block.compile()
    if compile_head:
        model.head = torch.compile(model.head)


def forget_compiled_code():
    """Drop torch.compile's graphs, so that the next compiled model compiles for its own static shapes, as a run
    does: otherwise a new batch size recompiles with a dynamic batch dimension, and past dynamo's recompile limit
    (8 per function) the model silently runs eager. After a probe's steps, a first step that ran out of memory,
    another size measured."""
    torch._dynamo.reset()


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


def settle_adam_state(engine):
    """After a checkpoint's optimizer state is loaded: the state in the form the optimizer in use keeps it (the
    checkpoint may be the other Adam's: from_the_other_adam), and on CPU FusedAdam's running products replayed
    (replay_adam_step_count), so that the next step is the one an uninterrupted run takes."""
    from_the_other_adam(engine.basic_optimizer)
    replay_adam_step_count(engine)


def from_the_other_adam(adam):
    """A checkpoint of torch's AdamW (ds_configs/' optimizer) loaded into DeepSpeed's FusedAdam, or the reverse. torch
    keeps each step count as a tensor: DeepSpeed's universal load writes in a FusedAdam checkpoint's int, which torch
    refuses at the next step (`state_steps argument must contain a list of singleton tensors`), and torch's own
    load_state_dict converts in Adam.__setstate__, reused here. FusedAdam takes an int, and its groups' bias_correction
    (torch's Adam always corrects) from the checkpoint's groups, which torch's lack (a KeyError at the next step)."""
    if isinstance(adam, torch.optim.Adam):  # AdamW too
        adam.__setstate__({"state": adam.state, "param_groups": adam.param_groups})
    elif isinstance(adam, FusedAdam):
        for group in adam.param_groups:
            group.setdefault("bias_correction", True)
        for state in adam.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = int(state["step"].item())


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


# The optimizer's inputs DeepSpeed does not provide in our form: the learning-rate schedule (gpt/train/schedule.py) and
# the weight-decay parameter groups. Plain torch: bench/ and tests use them without DeepSpeed.
@dataclass(frozen=True)
class OptimizerSettings:
    """What the run decides about the optimizer and its schedule (betas, eps and clipping are in the JSON)."""
    lr: float
    weight_decay: float
    warmup_steps: int
    max_steps: int
    min_lr_ratio: float
    lr_schedule: str = OptimizerSection.lr_schedule
    cooldown_frac: float = OptimizerSection.cooldown_frac
    cooldown_shape: str = OptimizerSection.cooldown_shape

    @classmethod
    def of(cls, section):
        """From a run's optimizer section (gpt.config.settings.OptimizerSection), which also holds the guard's."""
        return cls(section.lr, section.weight_decay, section.warmup_steps, section.max_steps, section.min_lr_ratio,
                   section.lr_schedule, section.cooldown_frac, section.cooldown_shape)

    SCHEDULE_FLAGS = ("lr", "warmup_steps", "max_steps", "min_lr_ratio", "lr_schedule", "cooldown_frac",
                      "cooldown_shape")

    def as_recorded(self, args):
        """These settings with the schedule's flags as a checkpoint's run recorded them (run_config.json's args);
        one saved before --lr_schedule existed ran cosine, and takes the defaults for the flags it lacks."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{flag: args.get(flag, defaults[flag]) for flag in self.SCHEDULE_FLAGS})

    @property
    def schedule(self):
        return Schedule.of(vars(self))

    def lr_factor(self, step):
        """The schedule as a multiplier of each group's peak (LambdaLR's form). A bound method, not a callable
        object: LambdaLR's state_dict saves a callable object's attributes, and its load would put the
        checkpoint's schedule back over this run's."""
        return self.schedule.factor(step)


def param_groups(model, weight_decay):
    """Weight decay on matrices and embeddings (dim >= 2), none on biases and LayerNorm parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


# Skipping bad updates, as llm.c does: an update is skipped when the step's loss or gradient norm is a
# z-score outlier against the recent window of accepted steps, or not finite; after `max_bad_steps` bad
# steps in a row the run stops.
#
# How a skip happens: every DeepSpeed optimizer used here already skips the whole update (weights, Adam
# moments, LR schedule; counted in engine.skipped_steps) when the global gradient norm is not finite, the
# path fp16 overflows take. So the guard makes an outlier look like one: a loss outlier poisons the last
# micro-step's backward with NaN, and a gradient-norm outlier is reported as NaN by the hook below.
class SpikeGuard:
    def __init__(self, loss_z=0.0, grad_z=0.0, window=100, min_history=10, max_bad_steps=5, fp16=False):
        self.loss_z, self.grad_z = loss_z, grad_z  # 0 = that check is off
        self.fp16 = fp16  # skipped steps without a guard reason are then loss-scale overflows, not bad steps
        self.losses, self.norms = deque(maxlen=window), deque(maxlen=window)
        self.min_history, self.max_bad_steps = min_history, max_bad_steps
        self.bad_in_a_row = 0
        self.skipped = 0
        self.reason = None  # why the current step is being skipped

    @staticmethod
    def _z(value, history):
        mean = sum(history) / len(history)
        std = math.sqrt(sum((v - mean) ** 2 for v in history) / len(history))
        return (value - mean) / std if std > 0 else 0.0

    def _outlier(self, value, history, threshold):
        return threshold > 0 and len(history) >= self.min_history and self._z(value, history) > threshold

    def check_loss(self, loss):
        """Before the last backward of a step: True if the update must be skipped."""
        if not math.isfinite(loss):
            self.reason = f"loss {loss}"
        elif self._outlier(loss, self.losses, self.loss_z):
            self.reason = f"loss {loss:.4f} is {self._z(loss, self.losses):.1f} sigma above the last {len(self.losses)}"
        else:
            self.reason = None
        return self.reason is not None

    def filter_grad_norm(self, norm, loss_scale=1.0):
        """Inside the optimizer step: the norm to act on; NaN makes DeepSpeed skip the update.
        loss_scale: what the norm is scaled by (fp16), so that the history stays comparable."""
        value = float(norm) / loss_scale
        if not math.isfinite(value):
            return norm  # DeepSpeed skips this update by itself; it stays out of the history
        if self.reason is None and self._outlier(value, self.norms, self.grad_z):
            self.reason = f"grad norm {value:.4f} is {self._z(value, self.norms):.1f} sigma above the last {len(self.norms)}"
        if self.reason is not None:
            return norm * float("nan")
        self.norms.append(value)
        return norm

    def end_step(self, loss, skipped):
        """After the step: record it; returns a reason to stop the run, if any."""
        if skipped and self.reason is None and self.fp16:
            self.reason = "fp16 overflow: the loss scale was lowered"
            return None  # DeepSpeed's loss scaler owns these (and stops at min_loss_scale)
        if skipped:
            self.skipped += 1
            self.bad_in_a_row += 1
            self.reason = self.reason or "non-finite gradients"
        else:
            self.losses.append(loss)
            self.bad_in_a_row = 0
            self.reason = None
        if self.bad_in_a_row >= self.max_bad_steps:
            return f"{self.bad_in_a_row} bad steps in a row (last: {self.reason})"
        return None


def _swap_in_guarded_norm(bf16_optimizer, guard):
    """Make bf16_optimizer's module function get_global_norm_of_tensors report through guard.filter_grad_norm;
    returns what it was, to put back. A function already swapped in (a step inside a step) is unwrapped
    first, so that a norm answers to one guard only: the one of the step computing it."""
    current = bf16_optimizer.get_global_norm_of_tensors
    compute = getattr(current, "unguarded", current)

    def global_norm(*args, **kwargs):
        return guard.filter_grad_norm(compute(*args, **kwargs))
    global_norm.unguarded = compute
    bf16_optimizer.get_global_norm_of_tensors = global_norm
    return current


def install_grad_norm_hook(engine, guard):
    """Route the engine's optimizer's global gradient norm through guard.filter_grad_norm. DeepSpeed 0.19
    computes it in DeepSpeedZeroOptimizer.scaled_global_norm (ZeRO 1/2: this optimizer's attribute is wrapped)
    and, for BF16_Optimizer (bf16 + ZeRO-1 + fp32 accumulation), through the module function
    get_global_norm_of_tensors inside its step(): shared by every BF16_Optimizer in the process (the tests and
    the bench build many engines), so this optimizer's step swaps a guarded one in for that step only and
    puts the previous one back when the step ends, however it ends."""
    import deepspeed.runtime.bf16_optimizer as bf16_optimizer

    optimizer = engine.optimizer
    if hasattr(optimizer, "scaled_global_norm"):
        compute = optimizer.scaled_global_norm
        optimizer.scaled_global_norm = lambda *a, **k: guard.filter_grad_norm(compute(*a, **k), optimizer.loss_scale)
        return True
    if isinstance(optimizer, bf16_optimizer.BF16_Optimizer):
        step = optimizer.step

        def guarded_step(*args, **kwargs):
            previous = _swap_in_guarded_norm(bf16_optimizer, guard)
            try:
                return step(*args, **kwargs)
            finally:
                bf16_optimizer.get_global_norm_of_tensors = previous
        optimizer.step = guarded_step
        return True
    return False  # ZeRO-0 optimizers: no skip path to reuse, so no guard
