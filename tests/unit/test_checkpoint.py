"""DeepSpeed's CPU Adam resumed at its 6th step (checkpoints through real runs:
tests/integration/test_checkpoint_runs.py)."""
import copy
import types

import pytest
import torch
from deepspeed.ops.adam import FusedAdam

from gpt.train.engine import replay_adam_step_count


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
