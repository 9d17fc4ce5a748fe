"""HellaSwag: batched and distributed scoring equal a brute-force reference; the jsonl and llm.c .bin
readers agree; bad input is a clear error. (Evaluation in training and standalone:
tests/integration/test_hellaswag_runs.py.)"""
import json
import struct

import pytest
import torch
import torch.nn.functional as F

from gpt.data import hellaswag
from gpt.console import BadInput
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS


def brute_force(model, examples):
    """One unpadded forward per ending, straight from the definition."""
    correct = correct_norm = 0
    for example in examples:
        sums, means = [], []
        for ending in example.endings:
            tokens = torch.tensor([example.context + ending])
            logits, _ = model(tokens[:, :-1])
            losses = F.cross_entropy(logits[0].float(), tokens[0, 1:], reduction="none")[-len(ending):]
            sums.append(losses.sum().item())
            means.append(losses.mean().item())
        correct += min(range(4), key=sums.__getitem__) == example.label
        correct_norm += min(range(4), key=means.__getitem__) == example.label
    return correct / len(examples), correct_norm / len(examples)


def test_readers_agree(hellaswag_files):
    assert hellaswag.load(hellaswag_files / "hellaswag_val.jsonl") == hellaswag.load(hellaswag_files / "hellaswag_val.bin")


def test_batched_scores_equal_the_brute_force_reference(hellaswag_files):
    torch.manual_seed(3)
    model = GPT(PRESETS["tiny"]).eval()
    examples = hellaswag.load(hellaswag_files / "hellaswag_val.jsonl")
    with torch.no_grad():
        acc, acc_norm = brute_force(model, examples)
        for batch in (1, 3, 8):
            scores = hellaswag.evaluate(model, examples, torch.device("cpu"), 256, batch_examples=batch)
            assert (scores["acc"], scores["acc_norm"], scores["examples"]) == (acc, acc_norm, len(examples))
        summed, mean = hellaswag.example_losses(model, examples[:2], torch.device("cpu"), 256)
        tokens = torch.tensor([examples[1].context + examples[1].endings[2]])
        logits, _ = model(tokens[:, :-1])
        reference = F.cross_entropy(logits[0], tokens[0, 1:], reduction="none")[-len(examples[1].endings[2]):]
        assert summed[1, 2].item() == pytest.approx(reference.sum().item(), rel=1e-5)
        assert mean[1, 2].item() == pytest.approx(reference.mean().item(), rel=1e-5)


def test_an_ending_longer_than_the_block_scores_its_last_tokens():
    """The block holds the ending's last block_size + 1 tokens: each of them but the first is scored, from the ones
    before it (a negative start used to score the padding at the row's end instead)."""
    torch.manual_seed(3)
    model = GPT(PRESETS["tiny"]).eval()
    block = PRESETS["tiny"].block_size
    example = hellaswag.Example(context=(5, 6), endings=(tuple(range(100, 100 + block + 40)), (7,), (8,), (9,)), label=0)
    with torch.no_grad():
        summed, mean = hellaswag.example_losses(model, [example], torch.device("cpu"), block)
        tokens = torch.tensor([list(example.endings[0][-block - 1:])])
        reference = F.cross_entropy(model(tokens[:, :-1])[0][0], tokens[0, 1:], reduction="none")
    assert summed[0, 0].item() == pytest.approx(reference.sum().item(), rel=1e-5)
    assert mean[0, 0].item() == pytest.approx(reference.mean().item(), rel=1e-5)


def test_the_padded_vocabulary_takes_no_part_in_the_scores():
    """Padded rows made to win every softmax (the final hidden states all lean along one axis, the padded rows
    point along it) leave the ending losses as they are with zero padded rows: the padding is masked out."""
    torch.manual_seed(3)
    zero, winning = GPT(PRESETS["tiny"]).eval(), GPT(PRESETS["tiny"]).eval()
    examples = [hellaswag.Example(context=(5, 6, 7), endings=((8, 9), (10,), (11, 12, 13), (14,)), label=2)]
    unmasked = []  # lm_head's output before the mask: what the padding would have taken
    winning.lm_head.register_forward_hook(lambda module, args, output: unmasked.append(output.clone()))
    with torch.no_grad():
        winning.transformer.ln_f.bias[0] = 5.0
        winning.transformer.wte.weight[GPT2_VOCAB_SIZE:] = 0
        zero.load_state_dict(winning.state_dict())
        winning.transformer.wte.weight[GPT2_VOCAB_SIZE:, 0] = 10.0
        ours = hellaswag.example_losses(winning, examples, torch.device("cpu"), 256)
        assert (unmasked[0].softmax(-1)[..., GPT2_VOCAB_SIZE:].sum(-1) > 0.99).all()  # unmasked, the padding wins
        for got, want in zip(ours, hellaswag.example_losses(zero, examples, torch.device("cpu"), 256)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("corrupt,message", [
    (lambda raw: raw[:-7], "example 9 is truncated or misaligned"),
    (lambda raw: struct.pack("<i", 1) + raw[4:], "bad header (magic 1, version 1; expected 20240522, 1)"),
])
def test_bad_bin_files(hellaswag_files, tmp_path, corrupt, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(corrupt((hellaswag_files / "hellaswag_val.bin").read_bytes()))
    with pytest.raises(BadInput) as error:
        hellaswag.load(path)
    assert str(error.value) == f"{path}: {message}"


def test_bad_jsonl_and_missing_files(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"ctx": "a", "endings": ["b"] * 4, "label": 1}) + "\n" + '{"ctx": "a"}\n')
    with pytest.raises(BadInput, match=r"bad.jsonl:2: no 'endings' field"):
        hellaswag.load(path)
    with pytest.raises(BadInput, match="nope.jsonl: file not found"):
        hellaswag.load(tmp_path / "nope.jsonl")
