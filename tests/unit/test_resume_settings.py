"""What a resume re-applies over a loaded checkpoint, against torch's own AdamW loading a state dict as DeepSpeed's
optimizers do (through real runs: tests/integration/test_checkpoint_runs.py)."""
import types

import torch

from gpt.train import resume_settings


def engine_around(adam, json_params):
    """The engine's parts resume_settings reads: an optimizer without clipping or loss scaling (as ZeRO 0's)."""
    return types.SimpleNamespace(basic_optimizer=adam, optimizer=object(), optimizer_params=lambda: json_params,
                                 gradient_clipping=lambda: 0.0, fp16_enabled=lambda: False)


def adamw(**params):
    weights = [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))]
    return torch.optim.AdamW([{"params": [weights[0]], "weight_decay": 0.1},
                              {"params": [weights[1]], "weight_decay": 0.0}], lr=1e-3, **params)


def resumed(saved, built_params, json_params):
    """(the lines said, the groups after) for an AdamW built with built_params, loading `saved`'s state dict."""
    adam = adamw(**built_params)
    engine = engine_around(adam, json_params)
    built = resume_settings.built(engine)
    adam.load_state_dict(saved)  # as DeepSpeed's load does: the checkpoint's groups replace the built ones
    return resume_settings.reapply(engine, built), adam.param_groups


def test_keys_removed_from_the_json_go_back_to_their_defaults_and_are_said():
    """The checkpoint's run had betas [0.8, 0.9] and eps 1e-6; this run's JSON names neither: torch's defaults."""
    saved = adamw(betas=(0.8, 0.9), eps=1e-6).state_dict()
    notes, groups = resumed(saved, {}, {"lr": 1e-3, "weight_decay": 0.1, "torch_adam": True})
    assert notes == ["optimizer.params.betas [0.9, 0.999] (its default) applied (the checkpoint's run had [0.8, 0.9])",
                     "optimizer.params.eps 1e-08 (its default) applied (the checkpoint's run had 1e-06)"]
    assert [(g["betas"], g["eps"]) for g in groups] == [((0.9, 0.999), 1e-08)] * 2


def test_a_key_the_json_names_is_said_without_default():
    saved = adamw(eps=1e-6).state_dict()
    notes, _ = resumed(saved, {"eps": 1e-7}, {"eps": 1e-7})
    assert notes == ["optimizer.params.eps 1e-07 applied (the checkpoint's run had 1e-06)"]


def test_the_other_adams_checkpoint_gets_adamws_own_keys_back_without_a_line():
    """A FusedAdam checkpoint's groups lack torch's keys and hold FusedAdam's bias_correction: nothing the JSON
    changed, nothing said; AdamW's own keys as built."""
    saved = adamw().state_dict()
    for group in saved["param_groups"]:
        for key in ("decoupled_weight_decay", "amsgrad", "maximize", "foreach", "capturable", "differentiable",
                    "fused"):
            group.pop(key)
        group["bias_correction"] = True
    notes, groups = resumed(saved, {}, {})
    assert notes == [] and all(g["decoupled_weight_decay"] is True for g in groups)


def test_nothing_changed_says_nothing():
    saved = adamw(betas=(0.9, 0.95)).state_dict()
    assert resumed(saved, {"betas": (0.9, 0.95)}, {"betas": [0.9, 0.95]})[0] == []
