"""HellaSwag: batched and distributed scoring equal a brute-force reference; the jsonl and llm.c .bin
readers agree; bad input is a clear error; evaluation runs in training (2 ranks = 1 rank, compile on =
off) and standalone (gpt-eval, gpt-sample)."""
import json
import struct
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, TINY, succeeded, train, two_rank_run, write_ds_config
from gpt.data import hellaswag
from gpt.commands.eval import main as evaluate_main
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


def scores(records):
    return [(r["step"], r["hellaswag/acc"], r["hellaswag/acc_norm"]) for r in records if "hellaswag/acc" in r]


# lr ~0 keeps every run at the same (seeded) weights, whatever the world size or compilation
IN_TRAINING = [*TINY, "--max_steps", "2", "--total_batch_tokens", "512", "--lr", "1e-12", "--hellaswag",
               "{hellaswag_files}/hellaswag_val.bin", "--eval_every", "1"]
FP32_ZERO1 = dict(stage=1, precision="fp32")


@pytest.mark.two_rank_runs({"hellaswag_in_training": two_rank_run("--data", "{shakespeare_dir}", *IN_TRAINING,
                                                                  ds_config=FP32_ZERO1)})
def test_in_training_two_ranks_equal_one_and_compile_equals_eager(tmp_path, shakespeare_dir, hellaswag_files,
                                                                  two_rank_runs):
    config = write_ds_config(tmp_path / "fp32.json", **FP32_ZERO1)
    args = [arg.format(hellaswag_files=hellaswag_files) for arg in IN_TRAINING] + ["--ds_config", config]
    one, proc = train(tmp_path / "one", shakespeare_dir, *args)
    two, _ = succeeded(two_rank_runs["hellaswag_in_training"])
    compiled, _ = train(tmp_path / "compiled", shakespeare_dir, *args, "--compile")
    assert len(scores(one)) == 2 and scores(one) == scores(two) == scores(compiled)
    assert "hellaswag acc_norm" in proc.stdout and "(10 examples)" in proc.stdout


@pytest.mark.slow
def test_gpt_eval_and_gpt_sample_standalone(tmp_path, shakespeare_dir, hellaswag_files, capsys):
    """gpt-eval in this process (its plain-shell run: tests/test_eval_device.py), gpt-sample as two processes
    that must sample the same text."""
    train(tmp_path / "run", shakespeare_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512")
    checkpoint = str(tmp_path / "run" / "checkpoints")
    evaluate_main(["--checkpoint", checkpoint, "--data", str(shakespeare_dir), "--seq_len", "64", "--val_tokens",
                       "2048", "--hellaswag", str(hellaswag_files / "hellaswag_val.jsonl"), "--json"])
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 9 < results["val_loss"] < 11 and results["hellaswag_examples"] == 10
    assert results["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    assert 0 <= results["hellaswag_acc_norm"] <= 1 and results["hellaswag_examples_per_s"] > 0
    sample = [sys.executable, "-m", "gpt.commands.sample", "--checkpoint", checkpoint, "--prompt", "To be",
              "--max_new_tokens", "8", "--num_samples", "2", "--seed", "7"]
    first, second = (subprocess.run(sample, cwd=REPO, capture_output=True, text=True, check=True).stdout
                     .split("--- sample 0", 1)[1] for _ in range(2))  # past DeepSpeed's timestamped import warning
    assert first == second and first.count("--- sample 1") == 1 and "To be" in first
