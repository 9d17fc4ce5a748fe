"""The one function that turns a GPT into the model a run trains, as torchtitan's parallelize does: the loss,
activation checkpointing, compile, in that order (each step may depend on the one before: compile looks at the
loss that was chosen). The trainer, the probe and gpt-plan --measure all build through it, via
gpt.train.engine.initialize, so that each measures the step the run takes. A module of its own though short: it
is the one place that says how a model is wrapped, and the order."""
from gpt.model import loss as losses
from gpt.model.model import compile_regions


def wrap(model, loss=None, device_type="cpu", precision="fp32", *, checkpoint_fn=None, compile=False):
    """Make `model` (a gpt.model.model.GPT) the model a run trains, in place:
    1. the loss: `classic` keeps the full fp32 logits; `fused`, `chunked` and `liger` attach a kernel that never
       makes them (gpt/model/loss.py); None leaves the model's own loss_fn (tests set one by hand);
    2. activation checkpointing: checkpoint_fn (DeepSpeed's, when the JSON has an activation_checkpointing block)
       recomputes each transformer block in backward; None leaves the model's own (none, unless set by hand);
    3. compile (--compile): each block compiled as a region of its own; the head with them only around the
       classic loss; the chunked loss's per-chunk math compiled inside its eager autograd.Function (traced whole,
       it kept every chunk's logits for backward); any other library's kernel (liger) eager, never traced."""
    if loss is not None:
        model.loss_fn = None if loss == "classic" else losses.fused_loss(device_type, precision, loss)[0]
    if checkpoint_fn is not None:
        model.checkpoint_fn = checkpoint_fn
    if compile:
        if model.loss_fn is losses.chunked_cross_entropy:
            model.loss_fn = losses.compiled_chunked_cross_entropy
        compile_regions(model, compile_head=model.loss_fn is None)


def loss_label(loss, device_type, precision):
    """What --loss means on this device and precision, for the log."""
    return "full fp32 logits" if loss == "classic" else losses.fused_loss(device_type, precision, loss)[1]
