import pytest
import torch

from gpt.model.model import GPT, GPTConfig, PRESETS, param_count

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=128)


def hf_gpt2_names(n_layer):
    """Parameter names of transformers' GPT2LMHeadModel (lm_head.weight is tied to wte)."""
    names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    for i in range(n_layer):
        for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            names |= {f"transformer.h.{i}.{part}.weight", f"transformer.h.{i}.{part}.bias"}
    return names


def test_parameter_names_match_hugging_face_gpt2():
    model = GPT(TINY)
    assert set(dict(model.named_parameters())) == hf_gpt2_names(TINY.n_layer)
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("preset,gpt2_params", [
    ("d12", 124_439_808), ("d24", 354_823_168), ("d36", 774_030_080), ("d48", 1_557_611_200)])
def test_gpt2_sizes(preset, gpt2_params):
    # HF GPT-2's parameter counts with the 50257 vocab; padding to 50304 adds 47 rows of n_embd.
    # Built on the meta device: no memory is allocated.
    with torch.device("meta"):
        model = GPT(PRESETS[preset])
    assert model.num_params() == gpt2_params + 47 * PRESETS[preset].n_embd == param_count(PRESETS[preset])


def test_param_count_without_a_model():
    """The closed form the planner and the trainer's memory check use, for shapes no device could hold."""
    config = GPTConfig(n_layer=3, n_head=3, n_embd=96, block_size=77, vocab_size=1001)
    with torch.device("meta"):
        assert param_count(config) == GPT(config).num_params()
    assert param_count(GPTConfig(n_embd=10**9, n_head=1)) > 2**63  # beyond int64: the meta device would overflow


def test_initialisation_scales_residual_projections():
    torch.manual_seed(0)
    config = GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=16, vocab_size=1024)
    model = GPT(config)
    block = model.transformer.h[0]
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)  # (2 * 8) ** -0.5
    assert block.attn.c_proj.bias.abs().sum() == 0


def test_sequence_longer_than_block_size_is_a_clear_error():
    model = GPT(TINY)
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_model_is_causal():
    torch.manual_seed(0)
    model = GPT(TINY)
    x = torch.randint(0, 128, (1, 16))
    changed = x.clone()
    changed[0, 10] = (x[0, 10] + 1) % 128
    logits, _ = model(x)
    logits_changed, _ = model(changed)
    assert torch.equal(logits[0, :10], logits_changed[0, :10])
    assert not torch.allclose(logits[0, 10:], logits_changed[0, 10:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loss_and_layernorm_are_fp32_in_half_precision(dtype):
    torch.manual_seed(0)
    model = GPT(TINY).to(dtype)
    x = torch.randint(0, 128, (2, 16))
    logits, loss = model(x, x)
    assert logits.dtype == dtype and loss.dtype == torch.float32
    # LayerNorm statistics in fp32 (the kernel's own accumulation): within one rounding of the fp32
    # result, where half-precision statistics are off by far more on large activations.
    ln = model.transformer.ln_f
    h = (torch.randn(64, 32) * 100 + 1000).to(dtype)
    reference = torch.nn.functional.layer_norm(h.float(), (32,), ln.weight.float(), ln.bias.float())
    ulp = torch.finfo(dtype).eps * reference.abs().clamp(min=1)
    assert ((ln(h).float() - reference).abs() <= ulp).all()
    mean = h.mean(-1, keepdim=True)
    half_stats = (h - mean) / ((h - mean).pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()
    assert ((half_stats.float() - reference).abs() > 4 * ulp).any()
