"""The fused (chunked) loss equals the classic full-logits loss: loss and gradients, fp32 and half precision,
in the model and in real training runs, eager and compiled."""
import pytest
import torch
import torch.nn.functional as F

from conftest import TINY, train, train_losses
from gpt import loss as losses
from gpt.loss import chunked_cross_entropy
from gpt.model import GPT, GPTConfig


def classic(hidden, weight, targets):
    return F.cross_entropy((hidden @ weight.t()).float(), targets)


def loss_and_grads(loss_fn, hidden, weight, targets, grad_scale=1.0):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, targets)
    (loss * grad_scale).backward()
    return loss.detach(), hidden.grad, weight.grad


def inputs(dtype, rows=45, width=24, vocab=300):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, width, generator=generator).to(dtype)
    weight = (torch.randn(vocab, width, generator=generator) * 0.5).to(dtype)
    return hidden, weight, torch.randint(0, vocab, (rows,), generator=generator)


@pytest.mark.parametrize("chunk_rows", [7, 45, 8192])  # several chunks and a ragged last one; one; fewer rows
def test_fp32_loss_and_gradients_equal_the_classic_loss(chunk_rows):
    hidden, weight, targets = inputs(torch.float32)
    ours = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, chunk_rows), hidden, weight, targets)
    theirs = loss_and_grads(classic, hidden, weight, targets)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype,grad_scale", [(torch.bfloat16, 1.0), (torch.float16, 2.0**16)])
def test_half_precision_matches_the_classic_loss(dtype, grad_scale):
    """bf16: loss to 1e-6 (both log-softmax in fp32 over the same bf16 logits), gradients to one bf16
    rounding step; fp16 with a 2^16 loss scale, as DeepSpeed's scaler applies it, matches the same way
    (the scale enters before the cast to fp16, as in the classic backward)."""
    hidden, weight, targets = inputs(dtype)
    ours = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, 7), hidden, weight, targets, grad_scale)
    theirs = loss_and_grads(classic, hidden, weight, targets, grad_scale)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0)
    for got, want in zip(ours[1:], theirs[1:]):
        assert got.dtype == dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2 * want.float().abs().max().item())


def test_the_model_with_the_fused_loss_equals_the_classic_model():
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=200)
    torch.manual_seed(0)
    classic_model, fused_model = GPT(config), GPT(config)
    fused_model.load_state_dict(classic_model.state_dict())
    fused_model.loss_fn = lambda h, w, t: chunked_cross_entropy(h, w, t, chunk_rows=5)
    x = torch.randint(0, 200, (3, 16), generator=torch.Generator().manual_seed(1))
    results = []
    for model in (classic_model, fused_model):
        logits, loss = model(x, x)
        loss.backward()
        results.append((logits, loss, {n: p.grad for n, p in model.named_parameters()}))
    assert results[1][0] is None  # no logits: they never existed as a whole
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-6, atol=0)
    for name, grad in results[0][2].items():
        torch.testing.assert_close(results[1][2][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    logits, _ = fused_model(x)  # without targets (sampling, HellaSwag): the logits, as before
    torch.testing.assert_close(logits, classic_model(x)[0])


def test_training_with_the_fused_loss_equals_the_classic_loss(tmp_path, shakespeare_dir):
    """Default (fused) vs --loss classic, 1 rank fp32: the same losses and validation loss to float rounding.
    (The stored loss curve, recorded with the classic loss, checks 20 fused steps too; the compile tests
    run the fused loss under torch.compile.)"""
    args = [*TINY, "--max_steps", "2", "--total_batch_tokens", "256", "--val_every", "1", "--val_tokens", "1024"]
    runs = {}
    for loss in ("classic", "fused"):
        records, proc = train(tmp_path / loss, shakespeare_dir, *args, "--loss", loss)
        runs[loss] = train_losses(records) + [r["val_loss"] for r in records if "val_loss" in r]
        assert f"loss: {loss} (" in proc.stdout
        assert all(0.1 < r["peak_rss_gib"] < 24 for r in records if "loss" in r)  # the step's memory, logged
    assert "loss: fused (chunked PyTorch)" in proc.stdout and len(runs["classic"]) == 4
    assert runs["fused"] == pytest.approx(runs["classic"], rel=1e-5)


def test_fused_means_the_devices_kernel_and_the_others_name_one(monkeypatch):
    """--loss fused: liger on CUDA in bf16 where installed (FUSED_ON_CUDA_BF16, until measured otherwise), the
    chunked path elsewhere or without liger; --loss chunked is that path on CUDA too; liger refused off CUDA bf16."""
    def kernel(device, precision, choice="fused"):
        return losses.fused_loss(device, precision, choice)[1]
    monkeypatch.setattr(losses, "liger_problem", lambda device, precision: None)  # as if installed
    assert kernel("cuda", "bf16") == kernel("cuda", "bf16", "liger") == "liger-kernel fused linear cross-entropy"
    assert kernel("cuda", "bf16", "chunked") == kernel("cuda", "fp16") == kernel("cpu", "bf16") == "chunked PyTorch"
    monkeypatch.setattr(losses, "FUSED_ON_CUDA_BF16", "chunked")  # the switch a GPU measurement may flip
    assert kernel("cuda", "bf16") == "chunked PyTorch"
    monkeypatch.setattr(losses, "FUSED_ON_CUDA_BF16", "liger")
    monkeypatch.setattr(losses, "liger_problem", lambda device, precision: "not installed")
    assert kernel("cuda", "bf16").startswith("chunked PyTorch (liger-kernel not installed")
    monkeypatch.undo()
    assert losses.liger_problem("cuda", "fp16") == "--loss liger runs on CUDA in bf16 only (this run: cuda, fp16)"
    assert losses.fused_loss("cpu", "fp32", "chunked")[0] is chunked_cross_entropy
