"""Hugging Face interop on a trained checkpoint: the export loads in transformers with the same logits and its
tokenizer encodes as ours; a HF directory imports as initial weights (round trip); bad directories are clear
errors. (Without a checkpoint: tests/unit/test_hf.py.)"""
import json

import pytest
import torch
import transformers

from conftest import GPT2_VOCAB, TINY, train
from gpt.train.universal import read_weights
from gpt.console import BadInput
from gpt.train.hf import export, load_hf_weights
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer

TEXTS = ["Hello, world!", "naïve café — déjà vu, 日本語 and 🙂", "  two  spaces,\n\n\ta tab and 3.14159",
         "It's ROMEO's; they'll've", ""]


def our_model(state):
    model = GPT(PRESETS["tiny"]).eval()
    model.load_state_dict(state)
    return model


def test_export_loads_in_transformers_with_the_same_logits(trained_checkpoint, tmp_path):
    export(trained_checkpoint, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    state, config = read_weights(trained_checkpoint)
    x = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = our_model(state)(x)
        theirs = hf(x).logits
    assert theirs.shape == (2, 64, 50257)
    assert torch.allclose(ours[..., :50257], theirs, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(state["transformer.h.0.attn.c_attn.weight"],
                              GPT(PRESETS["tiny"]).state_dict()["transformer.h.0.attn.c_attn.weight"])


def test_import_round_trips_and_matches_transformers(trained_checkpoint, tmp_path):
    export(trained_checkpoint, tmp_path / "hf")
    imported = load_hf_weights(tmp_path / "hf", PRESETS["tiny"])
    state, _ = read_weights(trained_checkpoint)
    for name, tensor in state.items():
        expected = tensor.clone()
        if name in ("transformer.wte.weight", "lm_head.weight"):
            expected[50257:] = 0  # padding rows are not part of GPT-2's vocabulary
        assert torch.equal(imported[name], expected), name


def test_training_starts_from_a_hf_directory(trained_checkpoint, tmp_path, shakespeare_dir):
    export(trained_checkpoint, tmp_path / "hf")
    records, proc = train(tmp_path / "run", shakespeare_dir, *TINY, *GPT2_VOCAB, "--max_steps", "2", "--total_batch_tokens", "512",
                          "--init_from", str(tmp_path / "hf"))
    assert f"initial weights from {tmp_path / 'hf'}" in proc.stdout
    assert records[0]["loss"] < 10.5  # a fresh initialisation starts at ~10.83


def test_a_directory_of_another_shape_is_a_clear_error(trained_checkpoint, tmp_path):
    export(trained_checkpoint, tmp_path / "hf")
    with pytest.raises(BadInput) as error:
        load_hf_weights(tmp_path / "hf", PRESETS["d12"])
    assert str(error.value) == (f"{tmp_path / 'hf'}: does not fit the model: n_layer 2 there, 12 here; "
                                f"n_head 2 there, 12 here; n_embd 64 there, 768 here; "
                                f"n_positions 256 there, block_size 1024 here")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(BadInput, match="model_type 'llama', expected 'gpt2'"):
        load_hf_weights(tmp_path / "other", PRESETS["tiny"])
    with pytest.raises(BadInput, match="no config.json"):
        load_hf_weights(tmp_path, PRESETS["tiny"])


def test_exported_tokenizer_encodes_as_ours(trained_checkpoint, tmp_path):
    export(trained_checkpoint, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.model_max_length == PRESETS["tiny"].block_size
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == ("<|endoftext|>",) * 3
    assert tokenizer.eos_token_id == EOT_TOKEN and len(tokenizer) == GPT2_VOCAB_SIZE
    for text in TEXTS:
        tokens = gpt2_tokenizer().encode_ordinary(text)
        assert tokenizer.encode(text) == tokens, text
        assert tokenizer.decode(tokens) == text, text
