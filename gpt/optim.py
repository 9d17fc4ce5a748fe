"""The optimizer's inputs DeepSpeed does not provide in our form: the GPT-3 learning-rate schedule and
the weight-decay parameter groups. Plain torch: bench/ and tests use them without DeepSpeed."""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerSettings:
    """What the run decides about AdamW and its schedule (betas, eps and clipping are in the JSON)."""
    lr: float
    weight_decay: float
    warmup_steps: int
    max_steps: int
    min_lr_ratio: float

    @classmethod
    def of(cls, settings):
        """The optimizer's part of a run's Settings (gpt/settings.py)."""
        return cls(settings.lr, settings.weight_decay, settings.warmup_steps, settings.max_steps, settings.min_lr_ratio)

    def lr_factor(self, step):
        """The schedule as a multiplier of lr (LambdaLR's form)."""
        return lr_at(step, self.lr, self.warmup_steps, self.max_steps, self.min_lr_ratio) / self.lr


def lr_at(step, max_lr, warmup_steps, max_steps, min_lr_ratio):
    """GPT-3 / llm.c schedule: linear warmup from max_lr/warmup_steps to max_lr, then cosine decay to
    max_lr * min_lr_ratio at max_steps. (DeepSpeed's WarmupCosineLR starts warmup at 0 and shifts the
    cosine by one step, so it is not this schedule.)"""
    min_lr = max_lr * min_lr_ratio
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps or max_steps == warmup_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def param_groups(model, weight_decay):
    """Weight decay on matrices and embeddings (dim >= 2), none on biases and LayerNorm parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
