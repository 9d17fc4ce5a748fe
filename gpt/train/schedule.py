"""The learning-rate schedule (--lr_schedule): each step's learning rate as a multiple of a param group's peak, so that
every group follows it from its own (Muon's half from muon_lr, the rest from --lr). Plain Python, no torch: the
trainer's LambdaLR (gpt/train/engine.py), bench/ and the tests use it alike (it reads only the flags' names and
defaults, gpt/config/settings.py, which imports nothing).

    cosine  GPT-3's and llm.c's: a linear warmup to the peak, then a cosine decay to peak x --min_lr_ratio at
            --max_steps.
    wsd     warmup-stable-decay: the same warmup, the peak held, then a cooldown over the last --cooldown_frac of
            --max_steps to the same floor, linear or (1 - sqrt) (Hägele et al. 2024). Its checkpoint at the
            cooldown's start (cooldown_start) continues the constant phase when resumed with a larger --max_steps."""
import math
from dataclasses import dataclass, fields

from gpt.config.settings import OptimizerSection

# The names --lr_schedule and --cooldown_shape take: gpt/config/settings.py's LR_SCHEDULES and COOLDOWN_SHAPES.
COOLDOWN = {"linear": lambda progress: 1.0 - progress, "sqrt": lambda progress: 1.0 - math.sqrt(progress)}


@dataclass(frozen=True)
class Schedule:
    """The learning rate of step 0, 1, ... for the peak lr (the schedule's own arithmetic is in lr units, so that
    cosine's numbers are the ones this trainer always had)."""
    lr: float
    warmup_steps: int
    max_steps: int
    min_lr_ratio: float
    lr_schedule: str = OptimizerSection.lr_schedule  # the fields are named as the flags are, with their defaults
    cooldown_frac: float = OptimizerSection.cooldown_frac
    cooldown_shape: str = OptimizerSection.cooldown_shape

    @classmethod
    def of(cls, flags):
        """The schedule of a run's flags (a dict with at least the fields' names: run_config.json's args)."""
        return cls(**{f.name: flags[f.name] for f in fields(cls)})

    def factor(self, step):
        """lr_at(step) as a multiplier of the peak (LambdaLR's form)."""
        return self.lr_at(step) / self.lr

    def lr_at(self, step):
        """The learning rate of `step` (counted from 0): the warmup from lr/warmup_steps, then the schedule's decay;
        at and after max_steps the floor."""
        max_lr, min_lr = self.lr, self.lr * self.min_lr_ratio
        if step < self.warmup_steps:
            return max_lr * (step + 1) / self.warmup_steps
        decay_start = self.warmup_steps if self.lr_schedule == "cosine" else self.cooldown_start()
        if step >= self.max_steps or self.max_steps == decay_start:
            return min_lr
        if step < decay_start:  # wsd's constant phase
            return max_lr
        progress = (step - decay_start) / (self.max_steps - decay_start)
        if self.lr_schedule == "cosine":  # (DeepSpeed's WarmupCosineLR starts warmup at 0, its cosine a step later)
            return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
        return min_lr + COOLDOWN[self.cooldown_shape](progress) * (max_lr - min_lr)

    def cooldown_steps(self):
        """wsd: how many of the last steps decay (the share rounded, half up)."""
        return math.floor(self.cooldown_frac * self.max_steps + 0.5)

    def cooldown_start(self):
        """wsd: the first step of the cooldown, still at the peak (the decay shows from the next one on); None for
        cosine. A run saves its state there (before this step), to be extended from."""
        return self.max_steps - self.cooldown_steps() if self.lr_schedule == "wsd" else None

    def problem(self):
        """Why a wsd cooldown does not fit into the run after its warmup, in one line; or None."""
        if self.lr_schedule != "wsd":
            return None
        if self.cooldown_steps() < 1:
            return (f"--cooldown_frac {self.cooldown_frac}: a cooldown of {self.cooldown_frac} x --max_steps "
                    f"{self.max_steps} rounds to no step")
        if self.cooldown_start() < self.warmup_steps:
            return (f"--cooldown_frac {self.cooldown_frac}: a cooldown of the last {self.cooldown_steps()} of "
                    f"--max_steps {self.max_steps} steps would start at step {self.cooldown_start()}, inside the "
                    f"warmup of --warmup_steps {self.warmup_steps}")
        return None

    def rewarming(self, was, step):
        """What this schedule, resumed at `step` from a run that had `was`, does to a decayed lr when it is longer
        (it rises again: a finished cosine cannot be extended), at the end of the resume's line; else ""."""
        if self.max_steps <= was.max_steps or self.lr_at(step) <= was.lr_at(step):
            return ""
        return (f": a longer {self.lr_schedule} raises a decayed lr again (to extend a run without that, train it "
                "with --lr_schedule wsd and resume from its checkpoint at the cooldown's start)")

    def describe(self):
        """The schedule in words, for the log's header and TensorBoard's hparams."""
        warmup = f"warmup {self.warmup_steps} steps, " if self.warmup_steps else ""
        floor = f"peak x {self.min_lr_ratio:g} at step {self.max_steps}"
        if self.lr_schedule == "cosine":
            return f"cosine: {warmup}cosine decay to {floor}"
        return (f"wsd: {warmup}constant to step {self.cooldown_start()}, then a {self.cooldown_shape} cooldown "
                f"({self.cooldown_frac:g} of the run) to {floor}")
