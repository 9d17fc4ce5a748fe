"""The fused (chunked) loss equals the classic full-logits loss: loss and gradients, fp32 and half precision,
in the model and in real training runs, eager and compiled; both over the real vocabulary only."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY, train, train_losses
from gpt.model import loss as losses
from gpt.model.loss import chunked_cross_entropy
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PADDED_VOCAB_SIZE, GPTConfig, mask_padding
from gpt.train.engine import wrap


def classic(hidden, weight, targets, real_vocab_size=None):
    """The reference: the logits' first real_vocab_size columns (all: None) cut out, their fp32 cross-entropy."""
    return F.cross_entropy((hidden @ weight.t()).float()[:, :real_vocab_size], targets)


def loss_and_grads(loss_fn, hidden, weight, targets, grad_scale=1.0):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, targets)
    (loss * grad_scale).backward()
    return loss.detach(), hidden.grad, weight.grad


def inputs(dtype, rows=45, width=24, vocab=300, real_vocab_size=300):
    """hidden, weight and targets below real_vocab_size; the weight's rows beyond it, the padding, are made to
    win every softmax they would enter (a loss that let them in would be far off)."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, width, generator=generator).to(dtype)
    weight = torch.randn(vocab, width, generator=generator) * 0.5
    weight[real_vocab_size:] = hidden.float().mean(0) * 4
    return hidden, weight.to(dtype), torch.randint(0, real_vocab_size, (rows,), generator=generator)


# several chunks and a ragged last one; one; fewer rows than a chunk; with 47 padded columns as GPT-2's
@pytest.mark.parametrize("chunk_rows,real_vocab_size", [(7, 300), (45, 300), (8192, 300), (7, 253), (8192, 253)])
def test_fp32_loss_and_gradients_equal_the_classic_loss(chunk_rows, real_vocab_size):
    hidden, weight, targets = inputs(torch.float32, real_vocab_size=real_vocab_size)
    ours = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, real_vocab_size, chunk_rows),
                          hidden, weight, targets)
    theirs = loss_and_grads(lambda h, w, t: classic(h, w, t, real_vocab_size), hidden, weight, targets)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-5, atol=1e-7)
    assert not ours[2][real_vocab_size:].any()  # the padded rows: exactly zero, no probability went there
    if real_vocab_size < 300:  # the padding would have won: letting it in moves the loss by far more than rounding
        assert classic(hidden, weight, targets) > ours[0] + 1


@pytest.mark.parametrize("dtype,grad_scale", [(torch.bfloat16, 1.0), (torch.bfloat16, 0.25), (torch.float16, 2.0**16)])
def test_half_precision_matches_the_classic_loss(dtype, grad_scale):
    """bf16: loss to 1e-6 (both log-softmax in fp32 over the same bf16 logits), gradients to one bf16
    rounding step, also scaled in backward as DeepSpeed scales for 4 accumulation steps; fp16 with a 2^16 loss
    scale, as DeepSpeed's scaler applies it, matches the same way (the scale enters before the cast to fp16, as
    in the classic backward)."""
    hidden, weight, targets = inputs(dtype, real_vocab_size=253)
    ours = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, 253, 7), hidden, weight, targets, grad_scale)
    theirs = loss_and_grads(lambda h, w, t: classic(h, w, t, 253), hidden, weight, targets, grad_scale)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0)
    for got, want in zip(ours[1:], theirs[1:]):
        assert got.dtype == dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2 * want.float().abs().max().item())
    assert not ours[2][253:].any()


def test_the_model_with_the_fused_loss_equals_the_classic_model():
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=200)
    torch.manual_seed(0)
    classic_model, fused_model = GPT(config), GPT(config)
    fused_model.load_state_dict(classic_model.state_dict())
    fused_model.loss_fn = lambda h, w, t, vocab: chunked_cross_entropy(h, w, t, vocab, chunk_rows=5)
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


def test_training_with_the_fused_loss_equals_the_classic_loss(tmp_path, small_vocab_dir):
    """Default (fused) vs --loss classic, 1 rank fp32: the same losses and validation loss to float rounding.
    (The stored loss curve, recorded with the classic loss, checks 20 fused steps too; the compile tests
    run the fused loss under torch.compile.)"""
    args = [*TINY, "--max_steps", "2", "--total_batch_tokens", "256", "--val_every", "1", "--val_tokens", "1024"]
    runs = {}
    for loss in ("classic", "fused"):
        records, proc = train(tmp_path / loss, small_vocab_dir, *args, "--loss", loss)
        runs[loss] = train_losses(records) + [r["val_loss"] for r in records if "val_loss" in r]
        assert f"loss: {loss} (" in proc.stdout
        assert all(0.1 < r["peak_rss_gib"] < 24 for r in records if "loss" in r)  # the step's memory, logged
    assert "loss: fused (chunked PyTorch)" in proc.stdout and len(runs["classic"]) == 4
    assert runs["fused"] == pytest.approx(runs["classic"], rel=1e-5)


def test_fused_means_the_devices_kernel_and_the_others_name_one(monkeypatch):
    """--loss fused: the chunked path everywhere, on CUDA in bf16 too even with liger installed (FUSED_ON_CUDA_BF16,
    until a GPU measurement says otherwise); liger only by name (or that switch), refused off CUDA bf16."""
    def kernel(device, precision, choice="fused"):
        return losses.kernel_for(choice, device, precision).label

    def liger_problem(problem):
        monkeypatch.setitem(losses.KERNELS, "liger", dataclasses.replace(losses.KERNELS["liger"],
                                                                         problem=lambda device, precision: problem))
    liger_problem(None)  # as if installed
    assert kernel("cuda", "bf16", "liger") == "liger-kernel fused linear cross-entropy"
    assert kernel("cuda", "bf16") == kernel("cuda", "bf16", "chunked") == kernel("cuda", "fp16") == kernel("cpu", "bf16") \
        == "chunked PyTorch"
    monkeypatch.setattr(losses, "FUSED_ON_CUDA_BF16", "liger")  # the switch a GPU measurement may flip
    assert kernel("cuda", "bf16") == "liger-kernel fused linear cross-entropy"
    liger_problem("--loss liger needs liger-kernel: pip install -e .[cuda]")
    assert kernel("cuda", "bf16") == "chunked PyTorch (--loss liger needs liger-kernel: pip install -e .[cuda])"
    monkeypatch.undo()
    assert losses.loss_problem("liger", "cuda", "fp16") == ("--loss liger runs on CUDA in bf16 only (this run: cuda, "
                                                            "fp16)")
    assert losses.loss_problem("chunked", "cpu", "fp16") is None and losses.loss_problem("fused", "cpu", "fp16") is None
    assert losses.kernel_for("chunked", "cpu", "fp32").function is chunked_cross_entropy
    assert [losses.memory_kind(loss) for loss in losses.LOSS_CHOICES] == ["fused", "fused", "fused", "classic"]


def test_the_padded_vocabulary_is_masked_out_of_both_losses_and_the_logits():
    """GPT-2's padded vocabulary: the classic and the fused loss equal the cross-entropy over the first 50257
    logits (the padded rows set to win every softmax), the padded rows get no gradient, and the logits the model
    returns (HellaSwag's, sampling's) are -inf there. Any other vocabulary has no padding."""
    assert (GPTConfig().real_vocab_size, GPTConfig(vocab_size=512).real_vocab_size) == (GPT2_VOCAB_SIZE, 512)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=PADDED_VOCAB_SIZE)
    torch.manual_seed(0)
    classic_model, fused_model = GPT(config), GPT(config)
    x = torch.randint(0, GPT2_VOCAB_SIZE, (2, 8), generator=torch.Generator().manual_seed(1))

    def final_hidden():  # (B, T, C): what lm_head multiplies; independent of the padded rows (never inputs)
        transformer = classic_model.transformer
        return transformer.ln_f(transformer.h[0](transformer.wte(x) + transformer.wpe(torch.arange(8))))
    with torch.no_grad():
        classic_model.transformer.wte.weight[GPT2_VOCAB_SIZE:] = final_hidden().mean((0, 1)) * 10
    fused_model.load_state_dict(classic_model.state_dict())
    fused_model.loss_fn = lambda h, w, t, vocab: chunked_cross_entropy(h, w, t, vocab, chunk_rows=5)
    results = []
    for model in (classic_model, fused_model):
        logits, loss = model(x, x)
        loss.backward()
        results.append((logits, loss, model.lm_head.weight.grad))
    logits = results[0][0]
    assert torch.isinf(logits[..., GPT2_VOCAB_SIZE:]).all() and (logits[..., GPT2_VOCAB_SIZE:] < 0).all()
    assert torch.isfinite(logits[..., :GPT2_VOCAB_SIZE]).all()
    with torch.no_grad():
        unmasked = final_hidden() @ classic_model.lm_head.weight.t()
        reference = F.cross_entropy(unmasked[..., :GPT2_VOCAB_SIZE].reshape(-1, GPT2_VOCAB_SIZE), x.view(-1))
        assert F.cross_entropy(unmasked.view(-1, PADDED_VOCAB_SIZE), x.view(-1)) > reference + 1  # padding would win
    for _, loss, weight_grad in results:
        torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
        assert not weight_grad[GPT2_VOCAB_SIZE:].any() and weight_grad[:GPT2_VOCAB_SIZE].any()
    torch.testing.assert_close(results[1][2], results[0][2], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused_model(x)[0], logits)  # without targets: the same masked logits


# inductor generates the kernels as in training; aot_eager traces the same graph and autograd, quickly
@pytest.mark.parametrize("dtype,backend", [(torch.bfloat16, "inductor"), (torch.float16, "aot_eager")])
def test_the_mask_is_the_dtypes_minus_infinity_under_torch_compile(dtype, backend):
    """Half-precision logits masked in their own dtype, compiled forward and backward: the loss over the real
    columns, no gradient into the padding. Inductor's case, alone on an empty inductor cache, took 12.7 s here
    (~20 s on a 2-core AVX2 EPYC, ~1.6x), of which its own two kernels (C++ through the compiler) ~3 s: the rest is
    what the session's first compile pays whichever test it is, inductor's imports (3.7 s with a warm cache) and its
    dry-compiles of the CPU's vector ISAs (~6 s on an AVX512 EPYC; an AVX2-only one has one ISA to try), 2026-12-06;
    aot_eager compiles nothing."""
    hidden, weight, targets = inputs(dtype, rows=6, width=8, vocab=20, real_vocab_size=13)

    def loss_fn(h, w, t):
        return F.cross_entropy(mask_padding(h @ w.t(), 13).float(), t)
    ours = loss_and_grads(torch.compile(loss_fn, backend=backend, fullgraph=True), hidden, weight, targets)
    theirs = loss_and_grads(lambda h, w, t: classic(h, w, t, 13), hidden, weight, targets)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0)
    assert ours[2].dtype == dtype and not ours[2][13:].any() and torch.isfinite(ours[1]).all()


@pytest.mark.parametrize("dtype, grad, kernels_called", [
    (torch.bfloat16, True, ["forward_and_grad"] * 3),  # one logits matmul per chunk: none recomputed in backward
    (torch.bfloat16, False, ["forward"] * 3),  # validation: no gradient work
    (torch.float16, True, ["forward"] * 3 + ["logits_grad"] * 3),  # the loss scale first, in backward
    (torch.float32, True, ["forward"] * 3 + ["logits_grad"] * 3)])
def test_which_chunk_kernels_run_by_dtype_and_grad_mode(dtype, grad, kernels_called):
    """bf16 turns each chunk's logits into their gradient in the forward pass; fp16 and fp32 recompute them in
    backward; without a gradient only the forward kernel runs. Both ways give the same loss and gradients."""
    called = []

    def spy(name):
        def kernel(*args):
            called.append(name)
            return getattr(losses.EAGER_KERNELS, name)(*args)
        return kernel
    kernels = losses.ChunkKernels(*(spy(name) for name in losses.ChunkKernels._fields))
    hidden, weight, targets = inputs(dtype, rows=45, real_vocab_size=253)
    with torch.set_grad_enabled(grad):
        hidden.requires_grad_(grad)
        loss = losses._chunked(hidden, weight, targets, 253, 16, kernels)
        if grad:
            loss.backward()
    assert called == kernels_called
    torch.testing.assert_close(loss.detach(), classic(hidden.detach(), weight, targets, 253), rtol=1e-6, atol=0)


def saved_for_backward(loss_fn, hidden, weight, targets):
    """(the loss, hidden's and weight's gradients, the bytes autograd kept from forward to backward)."""
    kept = []

    def pack(tensor):
        kept.append(tensor.numel() * tensor.element_size())
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        results = loss_and_grads(loss_fn, hidden, weight, targets)
    return (*results, sum(kept))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_under_compile_the_chunked_loss_keeps_no_logits_for_backward(dtype):
    """--compile's chunked loss (gpt.train.engine.wrap) keeps what the eager one keeps, the inputs and a
    log-sum-exp per row, and equals it. Traced whole by torch.compile, the partitioner kept every chunk's fp32
    logits instead: the full logits, which the chunks exist to avoid (H100 d12 at micro-batch 128: 64.6 GiB
    against 43.2 GiB eager)."""
    hidden, weight, targets = inputs(dtype, rows=512, width=16, vocab=1024, real_vocab_size=1000)
    logits_bytes = 512 * 1024 * 4

    def eager(h, w, t):
        return chunked_cross_entropy(h, w, t, 1000, chunk_rows=128)

    def compiled(h, w, t):
        return losses.compiled_chunked_cross_entropy(h, w, t, 1000, chunk_rows=128)
    *reference, eager_kept = saved_for_backward(eager, hidden, weight, targets)
    *ours, compiled_kept = saved_for_backward(compiled, hidden, weight, targets)
    assert compiled_kept == eager_kept < logits_bytes / 10
    for got, expected in zip(ours, reference):  # bf16: inductor's fused kernels round the gradient differently
        torch.testing.assert_close(got, expected, **(dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}))
    if dtype == torch.bfloat16:
        return  # bf16's gradient is made in forward: traced whole, there is nothing to recompute
    # what wrap's compile avoids: inductor's partitioner (min-cut) on the decomposed graph, with no kernels to build
    *_, traced_kept = saved_for_backward(torch.compile(eager, backend="aot_eager_decomp_partition"), hidden, weight,
                                         targets)
    assert traced_kept >= logits_bytes


def test_wrap_compiles_the_head_around_the_classic_loss_only(monkeypatch):
    """Which region torch.compile covers for each kind of loss, and the chunked loss swapped for its compiled
    twin; nothing is traced here (torch.compile is lazy)."""
    monkeypatch.setitem(losses.KERNELS, "untraceable", losses.Kernel("untraceable", "", UntraceableLoss.apply))
    for loss, head_compiled, installed in [("classic", True, None),
                                           ("chunked", False, losses.compiled_chunked_cross_entropy),
                                           ("untraceable", False, UntraceableLoss.apply)]:
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=32))
        wrap(model, loss, "cpu", "fp32", compile=True)
        assert model.loss_fn == installed
        assert ("head" in vars(model)) == head_compiled  # compiled: an instance attribute over the method
        assert all(block._compiled_call_impl is not None for block in model.transformer.h)


@torch.library.custom_op("dsgpt_test::times_one", mutates_args=())
def times_one(x: torch.Tensor) -> torch.Tensor:
    """x, through a custom op with no fake kernel: dynamo cannot run it on fake tensors and fails, as it failed on
    liger-kernel's loss (H100, 2026-11-24: TorchRuntimeError at step 0)."""
    return x.clone()


class UntraceableLoss(torch.autograd.Function):
    """The chunked loss behind a host sync (.item()) and an op dynamo cannot trace: a kernel not known to be
    compile-safe, like liger's."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, real_vocab_size):
        ctx.save_for_backward(hidden, weight, targets)
        ctx.real_vocab_size = real_vocab_size
        loss = chunked_cross_entropy(hidden, weight, targets, real_vocab_size)
        assert math.isfinite(loss.item())
        return times_one(loss)

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets = ctx.saved_tensors
        with torch.enable_grad():
            hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            loss = chunked_cross_entropy(hidden, weight, targets, ctx.real_vocab_size)
            return (*torch.autograd.grad(loss, (hidden, weight), grad_loss), None, None)


@pytest.mark.slow
def test_a_loss_kernel_dynamo_cannot_trace_trains_under_compile(tmp_path, small_vocab_dir, monkeypatch):
    """--compile compiles the blocks, and the head only around our own losses (gpt.train.engine.compile_regions): another
    kernel runs eagerly between them, so compiled training gives eager's losses. Whole-model compile traced it and
    failed at the first step."""
    monkeypatch.setattr(losses, "kernel_for", lambda *args: losses.Kernel("untraceable test kernel", "",
                                                                          UntraceableLoss.apply))
    args = [*TINY, "--max_steps", "3", "--total_batch_tokens", "512"]
    eager, _ = train(tmp_path / "eager", small_vocab_dir, *args, "--no-compile")
    compiled, proc = train(tmp_path / "compiled", small_vocab_dir, *args, "--compile")
    assert "loss: fused (untraceable test kernel)" in proc.stdout
    assert train_losses(compiled) == pytest.approx(train_losses(eager), rel=1e-5) and len(train_losses(eager)) == 3
