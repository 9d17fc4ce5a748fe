"""Hugging Face interop: an exported checkpoint loads in transformers with the same logits, and with its
tokenizer files transformers' pipeline continues text as our model does; a HF directory imports as initial weights
(round trip); bad directories are clear errors."""
import json
import os
from dataclasses import replace

import pytest
import torch
import transformers

import gpt.train.hf
from conftest import SMALL_VOCAB, TINY, train
from gpt.train.universal import read_weights
from gpt.commands.export import main as export_main
from gpt.console import BadInput
from gpt.train.hf import TOKENIZER_FILES, export, load_hf_weights
from gpt.model.wrap import wrap
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


@pytest.mark.parametrize("loss", ["classic", "chunked"])
def test_the_first_loss_after_init_from_equals_transformers(tmp_path, loss):
    """A fresh transformers GPT-2 of the tiny shape, imported as --init_from does: our loss on a batch equals
    GPT2LMHeadModel's to fp32 rounding (the padded rows, zero on import, are no part of the softmax; letting them in
    added 9.2e-4 to this loss)."""
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=256, vocab_size=GPT2_VOCAB_SIZE)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    hf.save_pretrained(tmp_path / "hf")
    model = GPT(PRESETS["tiny"])
    wrap(model, loss, "cpu", "fp32")
    model.load_state_dict(load_hf_weights(tmp_path / "hf", PRESETS["tiny"]))
    x = torch.randint(0, GPT2_VOCAB_SIZE, (4, 65), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(x, labels=x).loss  # transformers shifts the labels itself
        _, ours = model.eval()(x[:, :-1], x[:, 1:].contiguous())
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


def test_training_starts_from_a_hf_directory(trained_checkpoint, tmp_path, shakespeare_dir):
    export(trained_checkpoint, tmp_path / "hf")
    records, proc = train(tmp_path / "run", shakespeare_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512",
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


def export_random_model(config, tmp_path, monkeypatch):
    """gpt-export of an untrained `config` model (standing in for a checkpoint's weights) into tmp_path/hf, its
    matrices drawn wide (std 0.5) so that greedy decoding wanders through the vocabulary; returns the model."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.5)
    monkeypatch.setattr(gpt.train.hf, "read_weights", lambda path: (model.state_dict(), config))
    (tmp_path / "checkpoint").mkdir()
    export_main([str(tmp_path / "checkpoint"), "--out_dir", str(tmp_path / "hf"), "--overwrite"])
    return model


def test_pipeline_continues_as_our_greedy_decoding(tmp_path, monkeypatch, capsys):
    """transformers.pipeline on the export directory alone: greedy, its text is ours (the argmax over GPT-2's
    50257 logits, token by token; the top two logits are >= 0.68 apart at every step)."""
    model = export_random_model(PRESETS["tiny"], tmp_path, monkeypatch)
    assert capsys.readouterr().err == ""  # no warning: the tokenizer files are there
    generator = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    prompt, new_tokens = "ROMEO:\nBut, soft! what light", 8
    text = generator(prompt, do_sample=False, max_new_tokens=new_tokens)[0]["generated_text"]
    tokens = gpt2_tokenizer().encode_ordinary(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = model(torch.tensor([tokens]))
            token = int(logits[0, -1, :GPT2_VOCAB_SIZE].argmax())
            if token == EOT_TOKEN:  # the pipeline stops at eos
                break
            tokens.append(token)
    assert len(tokens) == len(gpt2_tokenizer().encode_ordinary(prompt)) + new_tokens
    assert text == gpt2_tokenizer().decode(tokens)


def test_a_smaller_vocabulary_exports_without_tokenizer_files(tmp_path, monkeypatch, capsys):
    """A model of another (re-coded) vocabulary is no GPT-2 tokenizer's: the export holds the model only, says so in
    one line, and drops the tokenizer files an earlier export left."""
    config = replace(PRESETS["tiny"], vocab_size=SMALL_VOCAB)
    (tmp_path / "hf").mkdir()
    for name in TOKENIZER_FILES:
        (tmp_path / "hf" / name).write_text("an earlier export's")
    model = export_random_model(config, tmp_path, monkeypatch)
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"warning: {tmp_path / 'hf'}: no tokenizer files: vocab_size {SMALL_VOCAB} is smaller than GPT-2's "
        f"{GPT2_VOCAB_SIZE}, so the model's tokens are not GPT-2's (give transformers token ids, or the tokenizer its "
        f"data was made with)"]
    assert captured.out.startswith("exported ")
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors"]
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.eos_token_id is None
    x = torch.randint(0, SMALL_VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(x)[0], hf(x).logits, atol=1e-4, rtol=1e-4)
