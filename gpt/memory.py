"""Memory on real objects, where the planner (gpt/plan.py) predicts it: the bytes autograd saves in a
forward of the real model, the model-state bytes a live DeepSpeed engine owns, a training step's peak;
and the CUDA caching allocator's setting, which decides how much of the device those bytes can use."""
import os
import sys

import torch

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"
GiB = 2**30

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


def use_expandable_segments(environ=os.environ):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the user set the variable: measured on an
    H100 with d12, the allocator then reserved ~1% above what it allocated instead of ~20%, and the
    largest micro-batch grew from 64 to 76. Call before CUDA's allocator starts. Returns the log line."""
    if ALLOC_CONF in environ:
        return f"{ALLOC_CONF}={environ[ALLOC_CONF]} (yours, kept)"
    environ[ALLOC_CONF] = EXPANDABLE_SEGMENTS
    return f"{ALLOC_CONF}={EXPANDABLE_SEGMENTS} (the trainer's default on CUDA: set the variable to choose otherwise)"


def expandable_segments(environ=os.environ):
    """Whether the CUDA allocator runs (or will run) with expandable segments."""
    settings = ",".join(environ.get(name, "") for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF")).replace(" ", "")
    return "expandable_segments:true" in settings.lower()


def reset_peak_memory(device_type):
    """Start a new peak: on CUDA the caching allocator's, on CPU the resident set's (Linux's VmHWM, reset
    through /proc/self/clear_refs; elsewhere the lifetime peak stays)."""
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def peak_memory(device_type):
    """This process's peak memory (GiB) since reset_peak_memory: on CUDA what the caching allocator
    allocated and reserved; on CPU the resident set."""
    if device_type == "cuda":
        return {"peak_alloc_gib": torch.cuda.max_memory_allocated() / GiB,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB}
    try:
        with open("/proc/self/status") as status:
            peak_bytes = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB
    return {"peak_rss_gib": peak_bytes / GiB}
