import torch

from gpt.evaluate import sample
from gpt.model import GPT, PRESETS


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
