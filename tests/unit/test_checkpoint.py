"""DeepSpeed's CPU Adam resumed at its 6th step; a checkpoint's files summed beside its universal form being made; a
resume of a checkpoint whose validation loss reached --target_val_loss (checkpoints through real runs:
tests/integration/test_checkpoint_runs.py)."""
import copy
import errno
import os
import types
from pathlib import Path

import pytest
import torch
from deepspeed.ops.adam import FusedAdam

from gpt.console import BadInput
from gpt.train import checkpoint, universal
from gpt.train.engine import replay_adam_step_count
from gpt.train.resume import check_target_left


@pytest.mark.parametrize("replayed", [True, False])
def test_cpu_adam_resumed_at_its_6th_step_steps_as_the_uninterrupted_one_only_when_replayed(replayed):
    """DeepSpeed's C++ Adam on CPU is one per process; a second FusedAdam given the first's state after 5 steps
    is a resume. Without the replay its 6th step's beta2^t comes from pow and the weights differ."""
    torch.manual_seed(0)
    grads = [[torch.randn(1000), torch.randn(10)] for _ in range(7)]

    def adam_over(params):
        return FusedAdam([{"params": [params[0]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}],
                         lr=1e-3, betas=(0.9, 0.95))

    def steps(adam, params, grads):
        for step_grads in grads:
            for param, grad in zip(params, step_grads):
                param.grad = grad.clone()
            adam.step()
    params = [torch.nn.Parameter(torch.randn(1000)), torch.nn.Parameter(torch.randn(10))]
    adam = adam_over(params)
    steps(adam, params, grads[:5])
    saved_state, saved_params = copy.deepcopy(adam.state_dict()), [p.detach().clone() for p in params]
    steps(adam, params, grads[5:])  # uninterrupted

    resumed_params = [torch.nn.Parameter(p) for p in saved_params]
    resumed = adam_over(resumed_params)
    resumed.load_state_dict(saved_state)
    if replayed:
        replay_adam_step_count(types.SimpleNamespace(basic_optimizer=resumed))
    steps(resumed, resumed_params, grads[5:])
    assert all(torch.equal(p, q) for p, q in zip(params, resumed_params)) == replayed


def test_a_checkpoints_files_are_summed_without_walking_its_universal_form_being_made(tmp_path, monkeypatch):
    """Every rank sums a checkpoint's files before the process group exists (its completeness, check_space) while
    rank 0 may be making its universal form inside it (gpt/train/universal.py): universal.tmp/ is renamed and
    removed under the walk. Emulated: scanning any folder of the universal form fails as a vanished one does."""
    step = tmp_path / "step_00000003"
    for folder in ("universal.tmp/universal/zero", "universal/zero", "zero/wte"):
        (step / folder).mkdir(parents=True)
    (step / "mp_rank_00_model_states.pt").write_bytes(b"m" * 10)
    (step / "zero" / "wte" / "fp32.pt").write_bytes(b"w" * 3)
    (step / checkpoint.COMPLETE).write_text("{}")
    scandir = os.scandir

    def vanishing(path="."):
        if {universal.UNIVERSAL, universal.UNIVERSAL_TEMPORARY} & set(Path(path).relative_to(tmp_path).parts):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return scandir(path)
    monkeypatch.setattr(os, "scandir", vanishing)
    assert checkpoint.file_sizes(step) == {"mp_rank_00_model_states.pt": 10, "zero/wte/fp32.pt": 3}


@pytest.mark.parametrize("marker, target, refused", [
    ('{"step": 4, "val_loss": 5.5}', 5.5, True), ('{"step": 4, "val_loss": 5.5}', 6.0, True),
    ('{"step": 4, "val_loss": 5.5}', 5.4, False), ('{"step": 4, "val_loss": 5.5}', None, False),
    ('{"step": 4}', 6.0, False), ('{"step": 4, "val_loss": NaN}', 6.0, False), ('{"step": 4, "val_loss": "5"}', 6.0,
                                                                                 False)])
def test_a_resume_of_a_checkpoint_whose_val_loss_reached_the_target_is_refused(tmp_path, marker, target, refused):
    """A run stopped at its target and resumed under it (`--resume auto` again) would train on to its next validation:
    nothing is left to train. A lower target, none, or a save without a validation (or an odd value) trains on."""
    (tmp_path / checkpoint.COMPLETE).write_text(marker)
    if not refused:
        assert check_target_left(tmp_path, target) is None
        return
    with pytest.raises(BadInput) as error:
        check_target_left(tmp_path, target)
    assert str(error.value) == (f"--target_val_loss {target}: nothing left to train: {tmp_path} was saved after step 4 "
                                f"at val_loss 5.5000, at or below it; lower --target_val_loss or leave it out to train "
                                f"on")
