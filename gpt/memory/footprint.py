"""Bytes measured on real objects, what the planner (gpt/memory/plan.py) fits its coefficients to and the bench and
tests check its predictions against: the bytes autograd saves in a forward of the real model, a forward + backward's
peak beyond the model states, the chunked loss's peak over one chunk, and the model-state bytes a live DeepSpeed
engine owns. Nothing here runs in training."""
import warnings

import torch

from gpt.model.model import GPT


def measure_activation_bytes(config, batch, seq_len, precision, checkpointing):
    """Bytes autograd saves for backward in one forward of the real model (parameters excluded), as
    DeepSpeed runs it: the whole model cast to the half dtype, loss in fp32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    model = GPT(config).to(dtype)
    if checkpointing:
        model.checkpoint_fn = lambda fn, *args: torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randint(0, config.real_vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x, x)
    return sum(saved.values())


def measure_step_bytes(config, batch, seq_len, precision, checkpointing, loss="classic", chunk_rows=32):
    """Peak bytes of one forward + backward of the real model, parameters and gradients excluded (the
    planner counts those as model states), temporaries included: PyTorch's MemTracker follows every live
    tensor. As DeepSpeed runs it: the model cast to the half dtype, the loss in fp32, the trainer holding
    the forward's outputs, and each gradient handed off (freed) once accumulated, as ZeRO's hooks do.
    loss 'fused' runs the chunked loss with `chunk_rows` rows per chunk."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    from gpt.model.loss import chunked_cross_entropy

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    model = GPT(config).to(dtype)
    if checkpointing:
        model.checkpoint_fn = lambda fn, *args: torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    if loss == "fused":
        model.loss_fn = lambda hidden, weight, targets, vocab: chunked_cross_entropy(hidden, weight, targets, vocab,
                                                                                     chunk_rows)
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(lambda parameter: setattr(parameter, "grad", None))
    x = torch.randint(0, config.real_vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Expected a tensor")  # the fused loss's logits: None
        logits, step_loss = model(x, x)  # held through backward, as the trainer holds them
        step_loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return peak["Total"] - peak.get(_MemRefType.PARAM, 0) - peak.get(_MemRefType.GRAD, 0)


def measure_loss_chunk_bytes(rows, vocab, width, precision):
    """Peak bytes of the chunked loss's forward + backward over one chunk of `rows` rows, beyond its
    inputs and their gradients: the chunk's logits in their forms (compute dtype, fp32, gradient) and the
    fp32 weight-gradient accumulator."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from gpt.model.loss import chunked_cross_entropy

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, width, generator=generator).to(dtype).requires_grad_()
    weight = torch.randn(vocab, width, generator=generator).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    tracker = MemTracker()
    with tracker:
        chunked_cross_entropy(hidden, weight, targets, vocab, rows).backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return peak - 2 * (hidden.numel() + weight.numel()) * hidden.element_size()


def engine_state_bytes(engine):
    """Model-state bytes a DeepSpeed engine really holds: the storages reachable from the module's
    parameters (and grads) and the optimizer's attributes, each counted once. Scalars are not model states but
    bookkeeping (torch's AdamW keeps each parameter's step count as one: 4 bytes a tensor under ZeRO 0)."""
    seen = {}

    def walk(obj, depth=0):
        if depth > 8:
            return
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 0:
                return
            storage = obj.untyped_storage()
            if storage.data_ptr():
                seen[storage.data_ptr()] = storage.nbytes()
            if obj.is_leaf and obj.grad is not None:
                walk(obj.grad, depth + 1)
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value, depth + 1)
        elif type(obj).__module__.startswith(("deepspeed", "torch.optim")) and hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                walk(value, depth + 1)

    for parameter in engine.module.parameters():
        walk(parameter)
    walk(engine.optimizer)
    return sum(seen.values())
