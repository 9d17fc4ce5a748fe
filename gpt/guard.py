"""Skipping bad updates, as llm.c does: an update is skipped when the step's loss or gradient norm is a
z-score outlier against the recent window of accepted steps, or not finite; after `max_bad_steps` bad
steps in a row the run stops.

How a skip happens: every DeepSpeed optimizer used here already skips the whole update (weights, Adam
moments, LR schedule; counted in engine.skipped_steps) when the global gradient norm is not finite, the
path fp16 overflows take. So the guard makes an outlier look like one: a loss outlier poisons the last
micro-step's backward with NaN, and a gradient-norm outlier is reported as NaN by the hook below.
"""
import math
from collections import deque


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
