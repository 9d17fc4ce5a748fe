"""A CPU rank's thread count is part of its arithmetic: why two nodes equal one node only with equal threads per
rank (docs/multinode.md), and how the trainer chooses the count. (A whole run: tests/integration/test_threads_runs.py.)"""
import pytest
import torch

from gpt.runtime.ranks import threads_per_rank


def layer_norm_gradients(threads):
    torch.manual_seed(0)
    norm, x = torch.nn.LayerNorm(64), torch.randn(256, 64, requires_grad=True)  # the tiny model's rows: 4 x 64
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        norm(x).backward(torch.randn(256, 64))
    finally:
        torch.set_num_threads(before)
    return norm.weight.grad, norm.bias.grad, x.grad


def test_layer_norms_weight_gradient_depends_on_the_thread_count():
    """ATen's LayerNorm backward sums the rows' contributions to the weight and bias gradients per thread, then
    adds the partial sums: another thread count, another order of the additions, other last bits."""
    (weight_1, bias_1, x_1), (weight_2, bias_2, x_2) = layer_norm_gradients(1), layer_norm_gradients(2)
    assert not torch.equal(weight_1, weight_2) and not torch.equal(bias_1, bias_2)
    torch.testing.assert_close(weight_1, weight_2, rtol=1e-4, atol=1e-4)  # a sum of 256 rows of ~1
    assert torch.equal(x_1, x_2)  # each row's own gradient: one thread computes it either way


@pytest.mark.parametrize("environ, threads", [({"OMP_NUM_THREADS": "3"}, 3), ({"LOCAL_WORLD_SIZE": "2"}, 1),
                                              ({"LOCAL_SIZE": "1"}, 2), ({"OMP_NUM_THREADS": ""}, 2)])
def test_a_rank_takes_omp_num_threads_else_its_share_of_the_cores(monkeypatch, environ, threads):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert threads_per_rank() == threads
