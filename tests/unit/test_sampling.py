import torch

from gpt.train.evaluate import sample
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS


def test_sampling_is_reproducible_and_leaves_the_training_rng_untouched():
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    state = torch.get_rng_state()
    runs = [sample(model, [50256], 12, torch.Generator().manual_seed(seed), torch.device("cpu"))
            for seed in (7, 7, 8)]
    assert torch.equal(torch.get_rng_state(), state)
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert len(runs[0]) == 13 and runs[0][0] == 50256
    assert max(runs[0]) < 50257  # padded vocabulary ids are never drawn
    assert model.training


def test_any_positive_temperature_samples():
    """A tiny temperature is greedy (1e-300 used to divide the logits by a float32 zero: NaN probabilities, a
    traceback); a huge one draws among the top k evenly."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"]).eval()
    tokens = sample(model, [50256], 6, torch.Generator().manual_seed(1), torch.device("cpu"), temperature=1e-300)
    greedy = [50256]
    for _ in range(6):
        greedy.append(int(model(torch.tensor([greedy]))[0][0, -1, :50257].argmax()))
    assert tokens == greedy
    assert len(sample(model, [50256], 6, torch.Generator().manual_seed(1), torch.device("cpu"), temperature=1e308)) == 7


def test_padded_ids_are_never_drawn_even_where_they_would_win():
    """Padded rows that would take nearly all the probability (every final hidden state leans along the axis they
    point along), every token a candidate (top_k beyond the vocabulary): only real token ids come out."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"]).eval()
    with torch.no_grad():
        model.transformer.ln_f.bias[0] = 5.0
        model.transformer.wte.weight[GPT2_VOCAB_SIZE:, 0] = 10.0
    tokens = sample(model, [50256], 8, torch.Generator().manual_seed(1), torch.device("cpu"), top_k=10**6)
    assert len(tokens) == 9 and max(tokens) < GPT2_VOCAB_SIZE
