"""Evaluation during and after training: validation loss and text samples."""
import torch
import torch.distributed as dist

from gpt.model import GPT2_VOCAB_SIZE


@torch.no_grad()
def validation_loss(model, loader, num_batches, device):
    """Mean loss over num_batches micro-batches per rank, averaged over ranks. The loader is reset, so
    every call scores the same tokens."""
    was_training = model.training
    model.eval()
    loader.reset()
    total = torch.zeros((), device=device, dtype=torch.float32)
    for _ in range(num_batches):
        x, y = loader.next_batch()
        _, loss = model(x.to(device), y.to(device))
        total += loss.float()  # accumulate on device: one host sync at the end
    if dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total /= dist.get_world_size()
    model.train(was_training)
    return total.item() / num_batches


@torch.no_grad()
def sample(model, prompt_tokens, max_new_tokens, generator, device, temperature=1.0, top_k=50):
    """Autoregressive top-k sampling. Draws only from `generator`, so the training RNG is untouched and a
    fixed generator seed reproduces the text. Returns the prompt plus the new token ids."""
    was_training = model.training
    model.eval()
    block_size = model.config.block_size
    idx = torch.tensor([prompt_tokens], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -block_size:])
        logits = logits[0, -1, :GPT2_VOCAB_SIZE].float() / temperature  # padded ids are never drawn
        top_values, top_ids = torch.topk(logits, min(top_k, logits.numel()))
        probs = torch.softmax(top_values, dim=-1)
        choice = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
        idx = torch.cat([idx, top_ids[choice].view(1, 1)], dim=1)
    model.train(was_training)
    return idx[0].tolist()
