"""Memory measured on real objects, where the planner (gpt/plan.py) predicts it: the bytes autograd
saves in a forward of the real model, and the model-state bytes a live DeepSpeed engine owns."""
import torch

from gpt.model import GPT


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

    x = torch.randint(0, config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x, x)
    return sum(saved.values())


def engine_state_bytes(engine):
    """Model-state bytes a DeepSpeed engine really holds: the storages reachable from the module's
    parameters (and grads) and the optimizer's attributes, each counted once."""
    seen = {}

    def walk(obj, depth=0):
        if depth > 8:
            return
        if isinstance(obj, torch.Tensor):
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
