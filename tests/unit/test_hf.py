"""Hugging Face interop without a trained checkpoint: a fresh transformers GPT-2 imported gives its loss, and an
export's tokenizer files let transformers' pipeline continue text as our model does; a smaller vocabulary exports
without them. (On a trained checkpoint: tests/integration/test_hf_runs.py.)"""
import os
from dataclasses import replace

import pytest
import torch
import transformers

import gpt.train.universal
from common import SMALL_VOCAB
from gpt.commands.export import main as export_main
from gpt.train.hf import TOKENIZER_FILES, load_hf_weights
from gpt.train.engine import wrap
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer


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


def export_random_model(config, tmp_path, monkeypatch):
    """gpt-export of an untrained `config` model (standing in for a checkpoint's weights) into tmp_path/hf, its
    matrices drawn wide (std 0.5) so that greedy decoding wanders through the vocabulary; returns the model."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.5)
    monkeypatch.setattr(gpt.train.universal, "read_weights", lambda path: (model.state_dict(), config))
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
