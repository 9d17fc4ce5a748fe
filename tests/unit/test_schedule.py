"""The learning-rate schedule (gpt/train/schedule.py): cosine as this trainer always had it, wsd's phases and shapes,
where its cooldown starts, and a cooldown that does not fit (a plain PyTorch loop against DeepSpeed's:
tests/integration/test_against_pytorch_runs.py)."""
import math

import pytest

from gpt.config.settings import COOLDOWN_SHAPES, LR_SCHEDULES
from gpt.train.schedule import COOLDOWN, Schedule


def old_cosine(step, max_lr, warmup_steps, max_steps, min_lr_ratio):
    """The trainer's schedule before --lr_schedule, verbatim: cosine must keep its numbers bit for bit."""
    min_lr = max_lr * min_lr_ratio
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps or max_steps == warmup_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


@pytest.mark.parametrize("lr, warmup, steps, ratio", [(6e-4, 10, 50, 0.1), (1.5e-3, 4, 60, 0.0), (3e-3, 0, 7, 1.0),
                                                       (6e-4, 5, 5, 0.1)])
def test_cosine_is_the_old_schedule_bit_for_bit(lr, warmup, steps, ratio):
    schedule = Schedule(lr, warmup, steps, ratio)
    assert [schedule.lr_at(s) for s in range(steps + 3)] == [old_cosine(s, lr, warmup, steps, ratio)
                                                              for s in range(steps + 3)]
    assert schedule.cooldown_start() is None and schedule.problem() is None


def test_cosine_is_warmup_then_cosine():
    lrs = [Schedule(6e-4, 10, 50, 0.1).lr_at(s) for s in range(60)]
    assert lrs[:10] == pytest.approx([6e-5 * (s + 1) for s in range(10)])  # linear warmup to max
    assert lrs[10] == pytest.approx(6e-4) and lrs[30] == pytest.approx(6e-5 + 0.5 * 5.4e-4)  # cosine midpoint
    assert all(a > b for a, b in zip(lrs[10:50], lrs[11:51]))  # decays all the way to max_steps
    assert lrs[50] == lrs[59] == pytest.approx(6e-5)


def test_wsd_warms_up_holds_the_peak_then_cools_down_linearly_to_its_floor():
    schedule = Schedule(1e-3, 4, 40, 0.1, "wsd", 0.5, "linear")
    lrs = [schedule.lr_at(s) for s in range(42)]
    assert schedule.cooldown_start() == 20
    assert lrs[:4] == [old_cosine(s, 1e-3, 4, 40, 0.1) for s in range(4)]  # cosine's warmup
    assert lrs[3:21] == [1e-3] * 18  # the peak from the warmup's last step to the cooldown's first
    assert lrs[21:40] == pytest.approx([1e-4 + 9e-4 * (1 - (s - 20) / 20) for s in range(21, 40)], rel=1e-14)
    assert lrs[40] == lrs[41] == pytest.approx(1e-4)


def test_the_sqrt_cooldown_is_one_minus_the_root_of_its_progress_and_the_floor_may_be_zero():
    linear, sqrt = (Schedule(2e-3, 2, 10, 0.0, "wsd", 0.4, shape) for shape in ("linear", "sqrt"))
    assert [sqrt.lr_at(s) for s in range(6, 11)] == pytest.approx([2e-3, 2e-3 * (1 - 0.5), 2e-3 * (1 - math.sqrt(0.5)),
                                                                   2e-3 * (1 - math.sqrt(0.75)), 0.0], rel=1e-14)
    assert all(sqrt.lr_at(s) < linear.lr_at(s) for s in range(7, 10))  # (1 - sqrt) falls faster at first
    assert sqrt.lr_at(10) == linear.lr_at(10) == 0.0 and sqrt.factor(7) == pytest.approx(0.5)


def test_the_cooldown_start_rounds_its_share_and_a_longer_run_keeps_the_peak_to_its_own():
    assert [Schedule(1e-3, 0, 10, 0.1, "wsd", frac).cooldown_start() for frac in (1.0, 0.45, 0.31, 0.04)] == [0, 5, 7, 10]
    short, extended = (Schedule(1e-3, 4, steps, 0.0, "wsd", 0.5) for steps in (40, 60))
    assert [short.lr_at(s) for s in range(20)] == [extended.lr_at(s) for s in range(20)]  # the same up to the old start
    assert [extended.lr_at(s) for s in range(20, 31)] == [1e-3] * 11


@pytest.mark.parametrize("warmup, frac, problem", [
    (30, 0.5, "--cooldown_frac 0.5: a cooldown of the last 20 of --max_steps 40 steps would start at step 20, inside "
              "the warmup of --warmup_steps 30"),
    (0, 0.01, "--cooldown_frac 0.01: a cooldown of 0.01 x --max_steps 40 rounds to no step"),
    (20, 0.5, None), (0, 1.0, None)])
def test_a_cooldown_must_fit_after_the_warmup(warmup, frac, problem):
    assert Schedule(1e-3, warmup, 40, 0.1, "wsd", frac).problem() == problem
    assert Schedule(1e-3, warmup, 40, 0.1, "cosine", frac).problem() is None  # cosine has no cooldown


def test_every_name_the_flags_take_is_a_schedule():
    assert set(COOLDOWN) == set(COOLDOWN_SHAPES) and set(LR_SCHEDULES) == {"cosine", "wsd"}


def test_the_schedule_in_words():
    assert Schedule(6e-4, 2, 8, 0.1).describe() == "cosine: warmup 2 steps, cosine decay to peak x 0.1 at step 8"
    assert Schedule(6e-4, 0, 40, 0.0, "wsd", 0.5, "sqrt").describe() == (
        "wsd: constant to step 20, then a sqrt cooldown (0.5 of the run) to peak x 0 at step 40")


def test_a_longer_schedule_that_raises_a_decayed_lr_says_so_and_an_extension_from_the_cooldown_start_does_not():
    cosine, wsd = Schedule(6e-4, 2, 4, 0.1), Schedule(6e-4, 2, 40, 0.0, "wsd")
    assert Schedule(6e-4, 2, 8, 0.1).rewarming(cosine, 4) == (
        ": a longer cosine raises a decayed lr again (to extend a run without that, train it with --lr_schedule wsd "
        "and resume from its checkpoint at the cooldown's start)")
    longer = Schedule(6e-4, 2, 60, 0.0, "wsd")
    assert longer.rewarming(wsd, 20) == "" and longer.rewarming(wsd, 30).startswith(": a longer wsd raises")
    assert cosine.rewarming(Schedule(6e-4, 2, 8, 0.1), 3) == ""  # shorter: the lr falls sooner, nothing rises


def test_a_checkpoint_saved_before_the_schedule_flags_existed_was_a_cosine_run():
    from gpt.train.engine import OptimizerSettings
    now = OptimizerSettings(1e-3, 0.1, 2, 20, 0.0, "wsd", 0.4, "sqrt")
    was = now.as_recorded({"lr": 6e-4, "warmup_steps": 2, "max_steps": 10, "min_lr_ratio": 0.1, "seed": 1})
    assert was == OptimizerSettings(6e-4, 0.1, 2, 10, 0.1) and was.lr_schedule == "cosine"
    assert now.as_recorded({**vars(now), "max_steps": 12}) == OptimizerSettings(1e-3, 0.1, 2, 12, 0.0, "wsd", 0.4, "sqrt")
