"""The learning-rate schedule: linear warmup, then cosine to min_lr_ratio at max_steps (DeepSpeed against a plain
PyTorch loop: tests/integration/test_against_pytorch_runs.py)."""
import pytest

from gpt.train.engine import lr_at


def test_learning_rate_schedule_is_warmup_then_cosine():
    lrs = [lr_at(s, 6e-4, 10, 50, 0.1) for s in range(60)]
    assert lrs[:10] == pytest.approx([6e-5 * (s + 1) for s in range(10)])  # linear warmup to max
    assert lrs[10] == pytest.approx(6e-4) and lrs[30] == pytest.approx(6e-5 + 0.5 * 5.4e-4)  # cosine midpoint
    assert all(a > b for a, b in zip(lrs[10:50], lrs[11:51]))  # decays all the way to max_steps
    assert lrs[50] == lrs[59] == pytest.approx(6e-5)
