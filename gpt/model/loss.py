"""The training loss without the full (B, T, vocab) logits: lm_head and cross-entropy fused, chunk by chunk.

The classic loss materialises the logits in the compute dtype, their fp32 copy for the log-softmax and,
in backward, the fp32 and half-precision logits gradients: measured on an H100, two thirds of a d12
sequence's memory. Here at most `chunk_rows` rows of logits exist at a time:
- `--loss liger` on CUDA in bf16 with liger-kernel installed (`pip install -e .[cuda]`): its Triton fused linear
  cross-entropy (gradients computed in the forward pass, accumulated in fp32);
- `fused` (the default) and `chunked`: the chunked PyTorch path below, the same math as the classic loss (fp32
  log-softmax). In bf16 each chunk's gradient is made in the forward pass as liger does; in fp16 and fp32 each
  chunk's logits are recomputed in backward, since fp16's loss scale must act before the gradient is rounded,
  where small gradients underflow (the reason liger is not used for fp16). Under --compile each chunk's math is
  compiled (gpt.train.engine.wrap). It is written by hand because no well-kept CPU library does it.
Both take the model's real vocabulary size (GPTConfig.real_vocab_size): the columns beyond it (GPT-2's padding)
get no probability and no gradient, as in the classic loss."""
import collections
import dataclasses
import functools

import torch

from gpt.model.model import mask_padding

CHUNK_ROWS = 8192  # rows (tokens) of logits alive at a time: 8192 x 50304 fp32 = 1.6 GB at the peak
LOSSES = ("fused", "classic")  # what the memory planner tells apart: logits in chunks, or whole
# The kernel `fused` means on CUDA in bf16: the chunked path until a GPU run of `bench/train.py --only loss` under
# the trainer's real step says otherwise. Measured in the trainer on an H100 (d12, zero1_bf16, 0.5M tokens/step,
# micro-batch 128): chunked, bf16 gradient made in the forward pass 481-495k tokens/s at 42.95 GiB (2026-11-26,
# the main job with every default); with each chunk's logits recomputed 451-461k at 42.3 GiB; chunked traced
# whole 488-506k at 64.2-64.6 GiB (it kept the logits); classic compiled 491-522k at 76.65 GiB; liger eager
# 285-287k at 256 (2026-11-24); under whole-model compile liger crashed at step 0.
FUSED_ON_CUDA_BF16 = "chunked"


def chunk_forward(hidden, weight, targets, real_vocab_size):
    """One chunk of rows: (each row's log-sum-exp, the chunk's summed loss), its logits dropped at return."""
    logits = mask_padding((hidden @ weight.t()).float(), real_vocab_size)
    lse = torch.logsumexp(logits, dim=-1)
    return lse, (lse - logits.gather(1, targets[:, None]).squeeze(1)).sum()


def chunk_logits_grad(hidden, weight, targets, lse, scale, real_vocab_size):
    """One chunk's gradient of the loss in its logits, in the compute dtype: softmax - one-hot, times scale. The
    softmax from the recomputed logits and the forward's log-sum-exp; exp(-inf) = 0, so the padded columns, and
    the weight's padded rows, get a zero gradient."""
    grad = mask_padding((hidden @ weight.t()).float(), real_vocab_size).sub_(lse[:, None]).exp_()
    grad[torch.arange(grad.shape[0], device=grad.device), targets] -= 1
    return grad.mul_(scale).to(hidden.dtype)


def chunk_forward_and_grad(hidden, weight, targets, scale, real_vocab_size):
    """chunk_forward and chunk_logits_grad from one matmul: (log-sum-exp, summed loss, the logits' gradient)."""
    logits = mask_padding((hidden @ weight.t()).float(), real_vocab_size)
    lse = torch.logsumexp(logits, dim=-1)
    loss = (lse - logits.gather(1, targets[:, None]).squeeze(1)).sum()
    # in place: the loss has been read from the logits, and a second fp32 copy is 1.5 GiB per 8192-row chunk (on an
    # H100, 2026-11-26: the bf16 fused loss peaked 1.65 GiB above the plan with it)
    grad = logits.sub_(lse[:, None]).exp_()
    grad[torch.arange(grad.shape[0], device=grad.device), targets] -= 1
    return lse, loss, grad.mul_(scale).to(hidden.dtype)


ChunkKernels = collections.namedtuple("ChunkKernels", "forward logits_grad forward_and_grad")
EAGER_KERNELS = ChunkKernels(chunk_forward, chunk_logits_grad, chunk_forward_and_grad)


@functools.cache
def compiled_chunk_kernels():
    """The chunk kernels under torch.compile, each a graph of its own with static shapes (the elementwise work on
    a chunk's logits fused into few kernels)."""
    return ChunkKernels(*(torch.compile(kernel, dynamic=False) for kernel in EAGER_KERNELS))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean over rows of cross_entropy(hidden @ weight.T in fp32, columns from real_vocab_size on masked to -inf,
    targets), without keeping the logits. Two ways, by the compute dtype:
    - bf16, when a gradient is wanted: forward also turns each chunk's logits into their gradient and multiplies
      it out (as liger-kernel does), keeping the input gradients for backward, which scales them by the
      incoming gradient: one logits matmul per chunk, none recomputed;
    - otherwise forward keeps each row's log-sum-exp, and backward recomputes a chunk's logits and turns them
      into the gradient in fp32, scaled by the incoming gradient first: fp16's loss scale must act before the
      cast, where small gradients would underflow (and fp32 runs keep their bits: tests/data's loss curve).
    Either way the gradient is cast to the compute dtype and multiplied out, the weight gradient accumulated in
    fp32. `kernels` does each chunk's math: EAGER_KERNELS or compiled_chunk_kernels()."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, real_vocab_size, chunk_rows, kernels, with_grad):
        grads_now = with_grad and hidden.dtype == torch.bfloat16
        rows_total = hidden.shape[0]
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        lse = torch.empty(rows_total, dtype=torch.float32, device=hidden.device)
        if grads_now:
            scale = torch.tensor(1.0 / rows_total, dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, rows_total, chunk_rows):
            rows = slice(start, start + chunk_rows)
            if grads_now:
                lse[rows], chunk_loss, grad_logits = kernels.forward_and_grad(hidden[rows], weight, targets[rows],
                                                                              scale, real_vocab_size)
                grad_hidden[rows] = grad_logits @ weight
                grad_weight += (grad_logits.t() @ hidden[rows]).float()
            else:
                lse[rows], chunk_loss = kernels.forward(hidden[rows], weight, targets[rows], real_vocab_size)
            loss_sum += chunk_loss
        ctx.grads_now = grads_now
        if grads_now:
            ctx.save_for_backward(grad_hidden, grad_weight)
            ctx.weight_dtype = weight.dtype
        else:
            ctx.save_for_backward(hidden, weight, targets, lse)
            ctx.real_vocab_size, ctx.chunk_rows, ctx.logits_grad = real_vocab_size, chunk_rows, kernels.logits_grad
        return loss_sum / rows_total

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.grads_now:
            grad_hidden, grad_weight = ctx.saved_tensors
            return (grad_hidden * grad_loss.to(grad_hidden.dtype), (grad_weight * grad_loss).to(ctx.weight_dtype),
                    None, None, None, None, None)
        hidden, weight, targets, lse = ctx.saved_tensors
        scale = grad_loss.float() / hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            grad_logits = ctx.logits_grad(hidden[rows], weight, targets[rows], lse[rows], scale, ctx.real_vocab_size)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += (grad_logits.t() @ hidden[rows]).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def _chunked(hidden, weight, targets, real_vocab_size, chunk_rows, kernels):
    chunk_rows = chunk_rows or CHUNK_ROWS  # read at the call: bench/levers.py measures other sizes
    with_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return ChunkedLinearCrossEntropy.apply(hidden, weight, targets, real_vocab_size, chunk_rows, kernels, with_grad)


def chunked_cross_entropy(hidden, weight, targets, real_vocab_size, chunk_rows=None):
    """hidden (N, C), weight (vocab, C), targets (N,) -> the mean fp32 cross-entropy of hidden @ weight.T over
    its first real_vocab_size columns (the rest masked, the matmul kept at the full width)."""
    return _chunked(hidden, weight, targets, real_vocab_size, chunk_rows, EAGER_KERNELS)


def compiled_chunked_cross_entropy(hidden, weight, targets, real_vocab_size, chunk_rows=None):
    """chunked_cross_entropy with each chunk's math compiled, for --compile. The autograd.Function itself stays
    out of dynamo: traced whole (the head compiled around it), AOTAutograd's partitioner kept every chunk's fp32
    logits for backward instead of recomputing them, the full logits again (tests/integration/test_loss.py; on an H100 at
    d12 micro-batch 128: 64.6 GiB compiled against 43.2 GiB eager, 2026-11-24)."""
    return _chunked(hidden, weight, targets, real_vocab_size, chunk_rows, compiled_chunk_kernels())


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


# -- the registry: what --loss can name ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kernel:
    """A --loss kernel: all that the trainer, its checks, the planner, --help and the bench know of it. A new kernel
    is an entry in KERNELS (and its test); gpt.train.engine.wrap attaches it, in its compiled form under --compile."""
    label: str  # what the log calls it
    help: str  # what --help says of it
    function: object = None  # (hidden, weight, targets, real_vocab_size) -> mean loss; None: the full logits' loss
    compiled: object = None  # its form under --compile; None: eager between the compiled regions, never traced
    problem: object = None  # (device_type, precision) -> why it cannot run there, or None


# --loss fused is the fastest fused kernel for the device (kernel_for); each of these names one (to measure them:
# bench/train.py --only loss)
KERNELS = {
    "chunked": Kernel("chunked PyTorch", "the chunked PyTorch kernel (any device)", chunked_cross_entropy,
                      compiled=compiled_chunked_cross_entropy),
    "liger": Kernel("liger-kernel fused linear cross-entropy", "liger-kernel's (CUDA bf16, pip install -e .[cuda])",
                    liger_cross_entropy, problem=liger_problem),
    "classic": Kernel("full fp32 logits", "full fp32 logits"),
}
LOSS_CHOICES = ("fused", *KERNELS)
LOSS_HELP = ("fused: lm_head + cross-entropy chunk by chunk, never the full logits (half the memory per sequence), "
             "with the device's fastest kernel; " + "; ".join(f"{name}: {k.help}" for name, k in KERNELS.items()))


def kernel_for(loss, device_type, precision):
    """The Kernel --loss `loss` names on this device and precision: 'fused' is FUSED_ON_CUDA_BF16 on CUDA in bf16
    where it can run, the chunked one everywhere else. A kernel named outright: check loss_problem first."""
    if loss != "fused":
        return KERNELS[loss]
    if device_type == "cuda" and precision == "bf16" and FUSED_ON_CUDA_BF16 != "chunked":
        best = KERNELS[FUSED_ON_CUDA_BF16]
        problem = best.problem(device_type, precision) if best.problem else None
        if problem is None:
            return best
        return dataclasses.replace(KERNELS["chunked"], label=f"chunked PyTorch ({problem})")
    return KERNELS["chunked"]


def loss_problem(loss, device_type, precision):
    """Why --loss `loss` cannot run on this device and precision, or None."""
    kernel = KERNELS.get(loss)
    return kernel.problem(device_type, precision) if kernel is not None and kernel.problem else None


def memory_kind(loss):
    """A --loss as the memory planner sees it (LOSSES): a fused kernel holds one chunk of logits at most, the full
    logits' loss (no function of its own) all of them."""
    return "classic" if loss != "fused" and KERNELS[loss].function is None else "fused"
