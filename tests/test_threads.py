"""A CPU rank's thread count is part of its arithmetic: why two nodes equal one node only with equal threads per
rank (docs/multinode.md), and how the trainer chooses the count."""
import pytest
import torch

from conftest import RELATIVE_TOLERANCE, TINY, train
from gpt.train.dist import threads_per_rank


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


def test_the_same_run_on_one_and_two_threads_differs_in_the_last_bits(tmp_path, shakespeare_dir, monkeypatch):
    """The cause of two nodes' losses differing from one node's on a 2-core machine, before each node was given
    one thread (tests/test_multinode.py): each node's rank took both cores, one node's 2 ranks one each."""
    runs = {}
    for threads in (1, 2, 1):
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        records, _ = train(tmp_path / f"threads_{threads}_{len(runs)}", shakespeare_dir, *TINY, "--max_steps", "4",
                           "--total_batch_tokens", "256")
        runs.setdefault(threads, []).append([r["loss"] for r in records if "loss" in r])
    assert runs[1][0] == runs[1][1]  # the same thread count: the same bits
    assert runs[1][0] != runs[2][0]
    assert max(abs(a / b - 1) for a, b in zip(runs[1][0], runs[2][0])) < RELATIVE_TOLERANCE["fp32"]
