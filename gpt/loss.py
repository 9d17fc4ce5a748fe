"""The training loss without the full (B, T, vocab) logits: lm_head and cross-entropy fused, chunk by chunk.

The classic loss materialises the logits in the compute dtype, their fp32 copy for the log-softmax and,
in backward, the fp32 and half-precision logits gradients: measured on an H100, two thirds of a d12
sequence's memory. Here at most `chunk_rows` rows of logits exist at a time:
- on CUDA in bf16 with liger-kernel installed (`pip install -e .[cuda]`), its Triton fused linear
  cross-entropy (gradients computed in the forward pass, accumulated in fp32);
- everywhere else the chunked PyTorch path below: the same math as the classic loss (fp32
  log-softmax), each chunk's logits recomputed in backward. It is written by hand because no well-kept
  CPU library does it; liger is not used for fp16 because it computes gradients before the loss scale
  is applied, where fp16 underflows.
Both take the model's real vocabulary size (GPTConfig.real_vocab_size): the columns beyond it (GPT-2's padding)
get no probability and no gradient, as in the classic loss.
"""
import torch

from gpt.model import GPT, mask_padding

CHUNK_ROWS = 8192  # rows (tokens) of logits alive at a time: 8192 x 50304 fp32 = 1.6 GB at the peak
LOSSES = ("fused", "classic")  # what the memory planner tells apart: logits in chunks, or whole
# --loss: `fused` is the fastest fused kernel for the device; `chunked` and `liger` name one (to measure them:
# bench/train.py --only loss); `classic` the full fp32 logits.
LOSS_CHOICES = ("fused", "chunked", "liger", "classic")
# The kernel `fused` means on CUDA in bf16: the chunked path until a GPU run of `bench/train.py --only loss` under
# the trainer's real step says otherwise. Measured in the trainer on an H100 (2026-11-24, d12, zero1_bf16, 0.5M
# tokens/step): chunked compiled 500-506k tokens/s at micro-batch 128 (64.6 GiB), classic compiled 491-522k at
# 128 (76.65 GiB), liger eager 285-287k at 256; under whole-model compile liger crashed at step 0.
FUSED_ON_CUDA_BF16 = "chunked"


def memory_kind(loss):
    """A --loss as the memory planner sees it (LOSSES): every fused kernel holds one chunk of logits at most."""
    return "classic" if loss == "classic" else "fused"


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean over rows of cross_entropy(hidden @ weight.T in fp32, columns from real_vocab_size on masked to -inf,
    targets), without keeping the logits:
    forward keeps each row's log-sum-exp; backward recomputes a chunk's logits, turns them into the
    gradient in fp32 (scaled by the incoming gradient, so fp16 loss scaling acts as in the classic loss),
    casts it to the compute dtype and multiplies it out, accumulating the weight gradient in fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, real_vocab_size, chunk_rows):
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = mask_padding((hidden[rows] @ weight.t()).float(), real_vocab_size)
            lse[rows] = torch.logsumexp(logits, dim=-1)
            loss_sum += (lse[rows] - logits.gather(1, targets[rows, None]).squeeze(1)).sum()
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.real_vocab_size, ctx.chunk_rows = real_vocab_size, chunk_rows
        return loss_sum / hidden.shape[0]

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets, lse = ctx.saved_tensors
        scale = grad_loss.float() / hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            # the softmax; exp(-inf) = 0: the padded columns, and the weight's padded rows, get a zero gradient
            grad_logits = mask_padding((hidden[rows] @ weight.t()).float(), ctx.real_vocab_size)
            grad_logits = grad_logits.sub_(lse[rows, None]).exp_()
            grad_logits[torch.arange(grad_logits.shape[0], device=grad_logits.device), targets[rows]] -= 1
            grad_logits = grad_logits.mul_(scale).to(hidden.dtype)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += (grad_logits.t() @ hidden[rows]).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def chunked_cross_entropy(hidden, weight, targets, real_vocab_size, chunk_rows=CHUNK_ROWS):
    """hidden (N, C), weight (vocab, C), targets (N,) -> the mean fp32 cross-entropy of hidden @ weight.T over
    its first real_vocab_size columns (the rest masked, the matmul kept at the full width)."""
    return ChunkedLinearCrossEntropy.apply(hidden, weight, targets, real_vocab_size, chunk_rows)


def compile_safe(loss_fn):
    """Whether dynamo may trace this loss (gpt.model.compile_regions): the classic loss (None) and the chunked
    path, our own code; never another library's kernel."""
    return loss_fn is None or loss_fn is chunked_cross_entropy


def liger_problem(device_type, precision):
    """Why liger-kernel's loss cannot run here, or None."""
    if device_type != "cuda" or precision != "bf16":
        return f"--loss liger runs on CUDA in bf16 only (this run: {device_type}, {precision})"
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        return "--loss liger needs liger-kernel: pip install -e .[cuda]"
    return None


def liger_cross_entropy(hidden, weight, targets, real_vocab_size):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    # liger has no column mask (ce_weight weighs targets, ignore_index drops rows): its vocabulary is the weight's
    # rows, so it gets the real ones, a contiguous view. The cost: its matmuls run 50257 wide instead of 50304
    # (the width padding is for), and autograd spreads the weight gradient into a new zero-filled full-size tensor.
    return liger_fused_linear_cross_entropy(hidden, weight[:real_vocab_size], targets, accum_dtype=torch.float32)


def fused_loss(device_type, precision, kernel="fused"):
    """The fused loss (kernel: 'fused' for the device's default, 'chunked' or 'liger') and its name for the
    log. Check liger_problem first for 'liger'."""
    if kernel == "fused" and device_type == "cuda" and precision == "bf16" and FUSED_ON_CUDA_BF16 == "liger":
        if liger_problem(device_type, precision) is None:
            kernel = "liger"
        else:
            return chunked_cross_entropy, "chunked PyTorch (liger-kernel not installed: pip install -e .[cuda])"
    if kernel == "liger":
        return liger_cross_entropy, "liger-kernel fused linear cross-entropy"
    return chunked_cross_entropy, "chunked PyTorch"


def model_with_loss(model_config, loss, device_type, precision):
    """(a GPT with this --loss, the loss's name for the log); initial weights random."""
    model = GPT(model_config)
    if loss == "classic":
        return model, "full fp32 logits"
    model.loss_fn, loss_label = fused_loss(device_type, precision, loss)
    return model, loss_label
