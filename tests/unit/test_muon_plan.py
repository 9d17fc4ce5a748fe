"""The planner under DeepSpeed's Muon (gpt/memory/muon.py): which parameters are Muon's, the momentum it keeps per ZeRO
optimizer, and a plan that names its optimizer. (The bytes real 2-rank Muon engines hold:
tests/integration/test_plan_runs.py.)"""
import json

import pytest

from common import REPO
from gpt.config.ds_config import load as load_ds_config
from gpt.memory.muon import muon_matrix_shapes, muon_twin, overlapping_elements
from gpt.memory.plan import MODEL_STATE_PARTS, GiB, format_plan, make_plan, model_state_bytes
from gpt.model.model import GPT, PRESETS, GPTConfig, param_count
from gpt.train.muon import block_matrices


def with_muon(name):
    return muon_twin(load_ds_config(REPO / "ds_configs" / name))


def test_muon_has_the_block_matrices_and_adam_the_embeddings_head_and_1d_parameters():
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=128)
    model = GPT(config)
    chosen = block_matrices(model)
    assert [tuple(p.shape) for p in model.parameters() if id(p) in chosen] == muon_matrix_shapes(config)
    adam = {name for name, p in model.named_parameters() if id(p) not in chosen}
    assert {name for name in adam if model.get_parameter(name).dim() >= 2} == {"transformer.wte.weight",
                                                                               "transformer.wpe.weight"}
    assert model.lm_head.weight is model.transformer.wte.weight  # the tied head is wte: Adam's


def test_a_rank_keeps_whole_every_matrix_that_overlaps_its_partition():
    # largest shape first: 6, 6, 4 elements; 16 split in two partitions of 8: rank 0 holds 6 and the straddling 6
    assert overlapping_elements([(4, 1), (6, 1), (6, 1)], 2) == 12
    assert overlapping_elements([(8, 1), (4, 1), (4, 1)], 2) == 8  # no matrix straddles
    assert overlapping_elements([(8, 1), (4, 1), (4, 1)], 1) == 16


@pytest.mark.parametrize("name, precision, stage", [("zero1_bf16.json", "bf16", 1), ("zero2_bf16.json", "bf16", 2),
                                                    ("zero1_fp16.json", "fp16", 1), ("zero2_fp16.json", "fp16", 2)])
def test_muon_changes_only_the_optimizer_states_by_its_momentum(name, precision, stage):
    """d12 on 8 ranks: Adam's two fp32 moments on what Muon does not take; for Muon's matrices one fp32 momentum
    partitioned as the master weights (BF16_Optimizer), or whole matrices, twice, in the gradients' dtype."""
    config, world = PRESETS["d12"], 8
    n_params = param_count(config)
    n_muon = sum(rows * columns for rows, columns in muon_matrix_shapes(config))
    adamw = model_state_bytes(n_params, precision, stage, world, load_ds_config(REPO / "ds_configs" / name), config)
    muon = model_state_bytes(n_params, precision, stage, world, with_muon(name), config)
    assert {k: v for k, v in muon.items() if k != "optimizer_states"} == \
        {k: v for k, v in adamw.items() if k != "optimizer_states"}
    assert adamw["optimizer_states"] == 8 * n_params / world
    adam = 8 * (n_params - n_muon) / world
    if (name, stage) == ("zero1_bf16.json", 1):
        assert muon["optimizer_states"] == adam + 4 * n_muon / world
    else:
        held = overlapping_elements(muon_matrix_shapes(config), world)
        assert n_muon / world <= held <= n_muon / world + 3 * 768 * 768
        assert muon["optimizer_states"] == adam + 2 * 2 * held


def test_a_plan_names_its_optimizer_and_muon_holds_less_on_a_v100():
    adamw = make_plan(PRESETS["d12"], 1024, load_ds_config(REPO / "ds_configs" / "zero1_fp16.json"), 8, 32 * GiB, 524288)
    muon = make_plan(PRESETS["d12"], 1024, with_muon("zero1_fp16.json"), 8, 32 * GiB, 524288)
    assert (adamw["optimizer"], muon["optimizer"]) == ("AdamW", "Muon")
    assert "124M parameters, Muon, fp16, ZeRO 1" in format_plan(muon, "d12")
    assert muon["bytes"]["optimizer_states"] < adamw["bytes"]["optimizer_states"]
    assert muon["max_micro_batch"] >= adamw["max_micro_batch"]


def test_gpt_plan_gives_muon_and_adamw_different_model_states(capsys):
    from gpt.commands.plan import main

    main(["--model", "d12", "--gpu", "v100-32gb", "--world_size", "8", "--json", "--ds_config",
          "ds_configs/zero2_fp16.json", "ds_configs/zero2_fp16_muon.json"])
    adamw, muon = json.loads(capsys.readouterr().out)
    assert (adamw["optimizer"], muon["optimizer"]) == ("AdamW", "Muon")
    states = [sum(plan["bytes"][k] for k in MODEL_STATE_PARTS if k in plan["bytes"]) for plan in (adamw, muon)]
    assert states[0] - states[1] == adamw["bytes"]["optimizer_states"] - muon["bytes"]["optimizer_states"] > 0
