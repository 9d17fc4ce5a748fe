"""The one function that turns a GPT into the model a run trains, as torchtitan's parallelize does: the loss,
activation checkpointing, compile, in that order (each step may depend on the one before: compile looks at the
loss that was chosen). The trainer, the probe and gpt-plan --measure all build through it, via
gpt.train.engine.initialize, so that each measures the step the run takes. It is the one place that says how a
model is wrapped and compiled, and how compiled code is dropped again (forget_compiled_code)."""
import torch

from gpt.model import loss as losses


def wrap(model, loss=None, device_type="cpu", precision="fp32", *, checkpoint_fn=None, compile=False):
    """Make `model` (a gpt.model.model.GPT) the model a run trains, in place:
    1. the loss: the kernel --loss names (gpt.model.loss.KERNELS; `classic` keeps the full fp32 logits), in its
       compiled form under compile; None leaves the model's own loss_fn (tests set one by hand);
    2. activation checkpointing: checkpoint_fn (DeepSpeed's, when the JSON has an activation_checkpointing block)
       recomputes each transformer block in backward; None leaves the model's own (none, unless set by hand);
    3. compile (--compile): compile_regions, the head with the blocks only around the classic loss."""
    if loss is not None:
        kernel = losses.kernel_for(loss, device_type, precision)
        model.loss_fn = kernel.compiled if compile and kernel.compiled else kernel.function
    if checkpoint_fn is not None:
        model.checkpoint_fn = checkpoint_fn
    if compile:
        compile_regions(model, compile_head=model.loss_fn is None)


def compile_regions(model, compile_head):
    """torch.compile applied as torchtitan applies it: each transformer block on its own, in place (parameter
    names and checkpoints unchanged; the identical blocks share one compiled graph), and the head (ln_f and the
    loss or logits) only when compile_head (the classic loss). A loss kernel runs between compiled regions: the
    chunked one with each chunk's math compiled inside its eager autograd.Function (traced whole, it kept every
    chunk's logits for backward), any other library's (liger) eager, never traced by dynamo: liger-kernel's fused
    linear cross-entropy crashed dynamo at step 0 on torch < 2.13 (H100, 2026-11-24), and its issue #1338 reports
    a wrong loss under it."""
    for block in model.transformer.h:
        block.compile()
    if compile_head:
        model.head = torch.compile(model.head)


def forget_compiled_code():
    """Drop torch.compile's graphs, so that the next compiled model compiles for its own static shapes, as a run
    does: otherwise a new batch size recompiles with a dynamic batch dimension, and past dynamo's recompile limit
    (8 per function) the model silently runs eager. After a probe's steps, a first step that ran out of memory,
    another size measured."""
    torch._dynamo.reset()


def loss_label(loss, device_type, precision):
    """What --loss means on this device and precision, for the log."""
    return losses.kernel_for(loss, device_type, precision).label
