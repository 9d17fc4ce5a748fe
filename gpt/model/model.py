"""GPT-2 as one torch-only nn.Module.

Parameter names follow Hugging Face's GPT-2 (transformer.wte, transformer.h.N.attn.c_attn, ...), so
OpenAI/HF weights map one-to-one (HF's Conv1D stores Linear weights transposed). The module knows
nothing about DeepSpeed or parallelism: the trainer wraps it."""
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

GPT2_VOCAB_SIZE = 50257  # 50000 BPE merges + 256 byte tokens + <|endoftext|>
PADDED_VOCAB_SIZE = 50304  # next multiple of 128: faster matmuls; the extra rows are masked out of every softmax


def real_vocab_size_of(vocab_size):
    """The token ids a model of vocab_size predicts: GPT-2's 50257 in the padded vocabulary, every id in any other
    (a smaller tokenizer's). Its logits beyond them are -inf (mask_padding): as in llm.c, the padding never takes
    probability, and a token id there is refused in the data."""
    return GPT2_VOCAB_SIZE if vocab_size == PADDED_VOCAB_SIZE else vocab_size


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = PADDED_VOCAB_SIZE

    @property
    def real_vocab_size(self):
        """real_vocab_size_of(vocab_size). A property, not a field: checkpoints record the fields, and older ones
        must still compare equal."""
        return real_vocab_size_of(self.vocab_size)

    def problems(self, seq_len, preset=None):
        """Why this shape cannot train on sequences of seq_len tokens, one line each (none: it can); preset: the
        --model it came from, named beside its block size. Its flags are checked to be positive before."""
        problems = []
        if self.n_head > 0 and self.n_embd % self.n_head:
            problems.append(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        if seq_len > self.block_size:
            problems.append(f"--seq_len {seq_len} exceeds the model's block_size {self.block_size}"
                            + (f" ({preset})" if preset else ""))
        if self.vocab_size <= 0:  # smaller than GPT-2's is fine for other tokenizers: the shards' ids are checked
            problems.append(f"--vocab_size must be positive (got {self.vocab_size})")
        return problems


def param_count(config):
    """GPT(config).num_params() from the shape alone, in Python's integers: for shapes too large to build even on
    the meta device (whose storage size overflows int64). wte + wpe + n_layer blocks of 12 C^2 + 13 C (c_attn,
    c_proj, c_fc, mlp.c_proj with their biases, two LayerNorms) + ln_f; lm_head is tied to wte."""
    c = config.n_embd
    return (config.vocab_size + config.block_size) * c + config.n_layer * (12 * c * c + 13 * c) + 2 * c


# GPT-2 sizes (Radford et al. 2019) plus tiny ones that train in minutes on a CPU.
PRESETS = {
    "d12": GPTConfig(n_layer=12, n_head=12, n_embd=768),  # 124M
    "d24": GPTConfig(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "d36": GPTConfig(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "d48": GPTConfig(n_layer=48, n_head=25, n_embd=1600),  # 1558M
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=256),
    "d4": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=512),
}


def preset_config(preset, n_layer=None, n_embd=None, n_head=None, vocab_size=PADDED_VOCAB_SIZE):
    """A preset's GPTConfig with the given overrides (None: the preset's)."""
    overrides = {k: v for k, v in dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head).items() if v is not None}
    return replace(PRESETS[preset], vocab_size=vocab_size, **overrides)


def mask_padding(logits, real_vocab_size):
    """logits (..., vocab) with the columns from real_vocab_size on set to -inf, in place (no second copy of the
    logits; autograd gives those columns a zero gradient) and returned; -inf in any float dtype."""
    if real_vocab_size < logits.shape[-1]:
        logits[..., real_vocab_size:] = float("-inf")
    return logits


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # fused q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj.residual_projection = True

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Flash / memory-efficient kernels on GPU, the fused CPU kernel here; all keep the softmax
        # accumulation in fp32 even for fp16/bf16 inputs.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.c_proj.residual_projection = True

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, config):
        super().__init__()
        # PyTorch's LayerNorm kernels (CPU and CUDA) compute mean and variance in fp32 for fp16/bf16
        # inputs already: an explicit upcast would only add two full-size copies per call.
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying
        # Activation checkpointing: a function with torch.utils.checkpoint's call shape
        # (fn, *args) -> output, set by the trainer (e.g. deepspeed.checkpointing.checkpoint).
        self.checkpoint_fn = None
        # The training loss without the full logits: (hidden (N, C), lm_head weight, targets (N,), real vocabulary
        # size) -> the mean fp32 cross-entropy over the first real_vocab_size columns, set by the trainer
        # (gpt.model.loss); None: the classic loss in forward.
        self.loss_fn = None
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_projection", False):
                std *= (2 * self.config.n_layer) ** -0.5  # GPT-2: keep the residual stream's variance flat
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding=False):
        """Parameter count (tied weights once); non_embedding drops wte and wpe, as in FLOP models."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6N for the weight matmuls (forward + backward; N counts every
        parameter but wpe, a lookup, while wte is also the lm_head matmul) plus attention's
        6 * 2 * n_layer * n_embd * seq_len (PaLM appendix B; causal masking not discounted)."""
        matmul_params = self.num_params() - self.transformer.wpe.weight.numel()
        return 6 * matmul_params + 12 * self.config.n_layer * self.config.n_embd * seq_len

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab), -inf beyond config.real_vocab_size; with targets also the
        mean fp32 loss (and no logits when loss_fn is set)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            if self.checkpoint_fn is not None and self.training and torch.is_grad_enabled():
                x = self.checkpoint_fn(block, x)
            else:
                x = block(x)
        return self.head(x, targets)

    def head(self, x, targets=None):
        """The last LayerNorm and the loss or the logits, as forward returns them (a region of its own for
        gpt.train.engine.compile_regions)."""
        x = self.transformer.ln_f(x)
        if targets is not None and self.loss_fn is not None:
            return None, self.loss_fn(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1),
                                      self.config.real_vocab_size)
        # (B, T, vocab): the matmul keeps the padded width (speed), the softmax sees the real vocabulary only
        logits = mask_padding(self.lm_head(x), self.config.real_vocab_size)
        if targets is None:
            return logits, None
        # log-softmax + NLL in fp32 whatever the compute dtype: fp16/bf16 lose too much over 50k classes
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def state_dict_mismatch(state, config):
    """The parameters a GPT of `config` lacks in `state`, `state` has beyond it, or shapes otherwise (the first
    three named, ', ...' for more), or None when every one fits. Built on the meta device: nothing allocated."""
    with torch.device("meta"):
        expected = {k: v.shape for k, v in GPT(config).state_dict().items()}
    wrong = sorted(set(expected) ^ set(state)) + [k for k in expected if k in state and state[k].shape != expected[k]]
    return ", ".join(wrong[:3]) + (", ..." if len(wrong) > 3 else "") if wrong else None
