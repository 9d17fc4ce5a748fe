"""Evaluation during and after training: validation loss, the run's target for it, text samples."""
import torch
import torch.distributed as dist

from gpt.data.tokenizer import gpt2_tokenizer

SAMPLE_PROMPT = "\n"  # a fresh line: the model writes whatever it has learned to write


def never():
    return False


@torch.no_grad()
def validation_loss(model, val_set, device, progress=False, cut_short=never):
    """Mean loss over every sequence of the validation set, whatever the world size: each rank scores its
    share, and the sums of losses and of sequences are reduced over ranks. progress: a bar on stderr (rank 0).
    cut_short: asked before each batch (a stop request); once true the rest is skipped (the reduction still runs,
    once, as on every rank), and every rank returns None: a rank cut short carries its flag into the reduction, so
    a stop that reached one rank alone does not leave the others a loss over part of the set, taken for the whole."""
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    # (sum of per-sequence losses, sequences, ranks cut short); stays on device
    totals = torch.zeros(3, device=device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    for x, y in tqdm(val_set.batches(), desc="val_loss", total=val_set.batch_count(),
                     disable=not (progress and rank == 0)):
        if cut_short():
            totals[2] = 1.0
            break
        _, loss = model(x.to(device), y.to(device))
        totals[:2] += torch.stack([loss.float() * len(x), torch.tensor(float(len(x)), device=device)])
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    model.train(was_training)
    return None if totals[2].item() > 0 else (totals[0] / totals[1]).item()


class Target:
    """--target_val_loss (None: no target): whether a validation reached it, decided by every rank together, what
    the run says and logs when one did, and the lowest loss when none did."""

    def __init__(self, loss, device):
        self.loss, self.device = loss, device
        self.lowest = (None, float("inf"))  # (step, val_loss)

    def reached(self, step, val):
        """Whether `val`, step's validation loss (None: none taken, on every rank alike), is at or below the
        target. The loss is one all-reduced value already; the vote makes a rank that saw otherwise stop too."""
        if self.loss is None or val is None:
            return False
        self.lowest = min(self.lowest, (step, val), key=lambda at: at[1])
        # imported here: the console tools that import this module (gpt-eval, gpt-sample) must not load DeepSpeed's
        # runtime before they parse their flags (its accelerator line would precede their --help)
        from gpt.runtime import ranks
        return ranks.on_every_rank(val <= self.loss, self.device)

    def record(self, step, val, tokens, seconds):
        """(metrics.jsonl's and TensorBoard's values, the console's line) of the validation that reached it."""
        return ({"target_val_loss": self.loss, "target_tokens": tokens, "target_seconds": seconds},
                f"step {step:5d} | --target_val_loss {self.loss} reached: val_loss {val:.4f} after {step + 1} steps, "
                f"{tokens:,} tokens, {seconds:.1f} s since this launch's first step")

    def missed(self):
        """The line of a run that ended without reaching it, or None."""
        if self.loss is None:
            return None
        step, val = self.lowest
        lowest = "no validation loss was taken" if step is None else f"the lowest val_loss was {val:.4f} at step {step}"
        return f"--target_val_loss {self.loss} not reached: {lowest}"


@torch.no_grad()
def sample(model, prompt_tokens, max_new_tokens, generator, device, temperature=1.0, top_k=50, cut_short=never):
    """Autoregressive top-k sampling on `device`. Draws only from `generator`, so the training RNG is untouched
    and a fixed generator seed reproduces the text (on the same device). The generator may live on the CPU
    whatever the device (the top-k probabilities go to it for the draw) or on the device. Returns the prompt
    plus the new token ids: fewer once cut_short(), asked before each token, is true (a stop request)."""
    was_training = model.training
    model.eval()
    block_size = model.config.block_size
    idx = torch.tensor([prompt_tokens], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        if cut_short():
            break
        logits, _ = model(idx[:, -block_size:])
        logits = logits[0, -1, :model.config.real_vocab_size].float()  # padded ids (-inf already) never drawn
        top_values, top_ids = torch.topk(logits, min(top_k, logits.numel()))  # sorted: the largest first
        # in float64, from the largest logit down: any positive temperature is safe (1e-300 would be 0 in float32,
        # and logits / 0 NaN); a tiny one puts all the probability on the likeliest token (greedy)
        probs = torch.softmax((top_values.double() - top_values[0].double()) / temperature, dim=-1).float()
        choice = torch.multinomial(probs.to(generator.device), 1, generator=generator).to(device)
        idx = torch.cat([idx, top_ids[choice].view(1, 1)], dim=1)
    model.train(was_training)
    return idx[0].tolist()


def sample_text(model, max_new_tokens, seed, device, cut_short=never):
    """The trainer's sample: max_new_tokens after SAMPLE_PROMPT, drawn from a generator of its own seeded with
    `seed` (the training RNG untouched), decoded; None when cut_short() stopped it."""
    tokenizer = gpt2_tokenizer()
    tokens = sample(model, tokenizer.encode_ordinary(SAMPLE_PROMPT), max_new_tokens,
                    torch.Generator().manual_seed(seed), device, cut_short=cut_short)
    return None if cut_short() else tokenizer.decode(tokens)
