"""--micro_batch auto on a GPU: the plan (gpt/memory/plan.py) checked by real training steps. A throwaway engine,
built as the trainer builds its own, takes two forward/backward/steps at the planned micro-batch on random
tokens (the second with Adam's moments, created by the first step, in memory); on out-of-memory it is freed
and smaller sizes are bisected. Every rank probes and all must fit. On CPU the plan alone decides (a CPU
rank swaps or is killed rather than raising out-of-memory). gpt-plan --measure (gpt/memory/measure.py) searches
with the same steps above the plan too."""
import torch

from gpt.model.model import real_vocab_size_of
from gpt.runtime.accelerator import get_accelerator
from gpt.runtime.memory import is_out_of_memory, peak_memory, release_memory, reset_peak_memory
from gpt.runtime.ranks import on_every_rank


def dividing_sizes(total_batch_tokens, seq_len, world_size, largest):
    """Micro-batches up to `largest` that divide the token budget into whole accumulation steps, ascending."""
    per_sequence = seq_len * world_size
    return [b for b in range(1, largest + 1) if total_batch_tokens % (b * per_sequence) == 0]


STEPS = 2  # the first step creates Adam's moments; the second's forward and backward run beside them


def try_step(new_engine, micro_batch, seq_len, vocab_size, device, steps=STEPS):
    """`steps` training steps at micro_batch on a throwaway engine from new_engine(micro_batch). Returns (fits
    on every rank, this rank's peak memory: {name: GiB}); the engine and its memory are released either way.
    A rank out of memory in the forward pass, which holds no collective, tells the others before backward;
    one that runs out later, while the others are inside a gradient reduction, leaves them waiting there
    until the process group's timeout (in practice ranks run out together: the same shapes, the same
    memory)."""
    get_accelerator().empty_cache()
    reset_peak_memory(device.type)
    fits, engine = False, None
    try:
        engine = new_engine(micro_batch)
        fits = all(_step(engine, micro_batch, seq_len, vocab_size, device) for _ in range(steps))
    except Exception as error:  # noqa: BLE001 -- out-of-memory is an answer; anything else is re-raised
        if not is_out_of_memory(error):
            raise
        # leaving this block drops the error, its traceback and the step's tensors with it
    finally:
        peak = peak_memory(device.type)
        if engine is not None:
            engine.destroy()
        del engine
        release_memory()
    return on_every_rank(fits, device), peak


def _step(engine, micro_batch, seq_len, vocab_size, device):
    """A step as the trainer takes it, on random tokens; False if a rank ran out of memory in the forward
    pass. Its tensors die with this frame."""
    tokens = torch.randint(0, real_vocab_size_of(vocab_size), (micro_batch, seq_len), device=device)  # as in data
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


def doubling(sizes):
    """Whether each of `sizes` (ascending) is at least twice the one before: the sizes dividing a power-of-two
    token budget (1, 2, 4, ..., 512 for 524,288 tokens of 1024), not those of 480 sequences (..., 24, 30, 32, ...)."""
    return all(larger >= 2 * smaller for smaller, larger in zip(sizes, sizes[1:]))


def search_largest(fits, start, last, gallop=True):
    """The largest index in 0..last for which fits(index) holds, -1 for none, fits assumed monotone (a size
    that fits makes every smaller one fit). Tries `start` first (the plan's answer, usually close), then away
    from it in doubling strides (+1, +2, +4, ... while it fits; -1, -2, -4, ... while it does not) until the
    answer changes, then bisects: an answer next to the plan costs two tries, and each try may be a compile.
    gallop=False: strides of one, for sizes that already double from one index to the next (doubling()), where a
    stride of two jumps 4x past an answer next to the plan: a try (a compile) more. gpt-plan --measure searches
    those up from the plan rounded down, where the answer is often the next size."""
    low, high = -1, last + 1  # fits(low) holds (-1: none known), fits(high) does not (last + 1: none known)
    index, stride = start, 1
    while low < index < high:  # stops once a stride jumps past the other bound: both are known
        if fits(index):
            low, index = index, min(index + stride, last)
        else:
            high, index = index, max(index - stride, 0)
        stride *= 2 if gallop else 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def probe_micro_batch(new_engine, candidates, seq_len, vocab_size, device, log=print):
    """The largest of `candidates` (ascending; the last is the plan's choice) whose steps fit, trying the
    plan's first and stepping down from it on out-of-memory; None when not even the smallest fits."""
    def fits(index):
        ok, peak = try_step(new_engine, candidates[index], seq_len, vocab_size, device)
        log(f"--micro_batch auto: probe at micro-batch {candidates[index]}: {verdict(ok, peak)}")
        return ok

    best = search_largest(fits, len(candidates) - 1, len(candidates) - 1)
    return candidates[best] if best >= 0 else None


def verdict(fits, peak):
    """'fits (this rank's peak: ...)' or 'out of memory (...)', for the log."""
    return (("fits" if fits else "out of memory") + " (this rank's peak: "
            + ", ".join(f"{name} {gib:.2f}" for name, gib in peak.items()) + ")")
