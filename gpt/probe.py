"""--micro_batch auto on a GPU: the plan (gpt/plan.py) checked by a real training step. A throwaway engine,
built as the trainer builds its own, takes one forward/backward/step at the planned micro-batch on random
tokens; on out-of-memory it is freed and smaller sizes are bisected. Every rank probes and all must fit.
On CPU the plan alone decides (a CPU rank swaps or is killed rather than raising out-of-memory)."""
import gc

import torch
from deepspeed.accelerator import get_accelerator

from gpt import dist, memory

GiB = 2**30


def is_out_of_memory(error):
    """torch's OutOfMemoryError, or a library's RuntimeError saying the same (cuBLAS, NCCL allocations)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def dividing_sizes(total_batch_tokens, seq_len, world_size, largest):
    """Micro-batches up to `largest` that divide the token budget into whole accumulation steps, ascending."""
    per_sequence = seq_len * world_size
    return [b for b in range(1, largest + 1) if total_batch_tokens % (b * per_sequence) == 0]


def try_step(new_engine, micro_batch, seq_len, vocab_size, device):
    """One training step at micro_batch on a throwaway engine from new_engine(micro_batch). Returns (fits on
    every rank, this rank's peak memory: {name: GiB}); the engine and its memory are released either way.
    A rank out of memory in the forward pass, which holds no collective, tells the others before backward;
    one that runs out later, while the others are inside a gradient reduction, leaves them waiting there
    until the process group's timeout (in practice ranks run out together: the same shapes, the same
    memory)."""
    get_accelerator().empty_cache()
    memory.reset_peak_memory(device.type)
    fits, engine = False, None
    try:
        engine = new_engine(micro_batch)
        fits = _step(engine, micro_batch, seq_len, vocab_size, device)
    except Exception as error:  # noqa: BLE001 -- out-of-memory is an answer; anything else is re-raised
        if not is_out_of_memory(error):
            raise
        # leaving this block drops the error, its traceback and the step's tensors with it
    finally:
        peak = memory.peak_memory(device.type)
        if engine is not None:
            engine.destroy()
        del engine
        gc.collect()
        get_accelerator().empty_cache()
    return on_every_rank(fits, device), peak


def _step(engine, micro_batch, seq_len, vocab_size, device):
    """A step as the trainer takes it, on random tokens; False if a rank ran out of memory in the forward
    pass. Its tensors die with this frame."""
    tokens = torch.randint(0, vocab_size, (micro_batch, seq_len), device=device)
    outputs = _forward(engine, tokens)  # the logits (None with the fused loss) held through backward, as in training
    if not on_every_rank(outputs is not None, device):
        return False
    engine.backward(outputs[1])
    engine.step()
    get_accelerator().synchronize()
    return True


def _forward(engine, tokens):
    """(logits, loss), or None on out-of-memory."""
    try:
        return engine(tokens, tokens)
    except Exception as error:  # noqa: BLE001
        if not is_out_of_memory(error):
            raise
    return None


def on_every_rank(flag, device):
    """Whether flag holds on every rank."""
    return dist.mean_over_ranks(torch.tensor(float(flag), device=device)).item() == 1.0


def probe_micro_batch(new_engine, candidates, seq_len, vocab_size, device, log=print):
    """The largest of `candidates` (ascending; the last is the plan's choice) whose step fits, trying the
    plan's first and bisecting below it on out-of-memory; None when not even the smallest fits. The sizes
    are assumed monotone: a size that fits makes every smaller one fit."""
    def fits(index):
        ok, peak = try_step(new_engine, candidates[index], seq_len, vocab_size, device)
        verdict = "fits" if ok else "out of memory"
        log(f"--micro_batch auto: probe at micro-batch {candidates[index]}: {verdict} (this rank's peak: "
            + ", ".join(f"{name} {gib:.2f}" for name, gib in peak.items()) + ")")
        return ok

    if fits(len(candidates) - 1):
        return candidates[-1]
    low, high = -1, len(candidates) - 1  # candidates[high] does not fit; candidates[low] does (-1: none known)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return candidates[low] if low >= 0 else None
