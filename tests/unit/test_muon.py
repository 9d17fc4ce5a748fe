"""DeepSpeed's Muon as this trainer runs it (gpt/config/muon_checks.py, gpt/train/muon.py), on real engines in process:
the JSON's checks line by line, which parameters Muon steps, each group's learning rate through the schedule, the
norm the log reports and its name, and the run settings a resume applies to Muon's three groups. (Runs on 2 ranks,
stop and resume: tests/integration/test_muon_runs.py.)"""
import dataclasses
import json

import pytest
import torch

from common import REPO
from train_ds import parse
from gpt.config import ds_checks, muon_checks
from gpt.model.model import GPT, GPTConfig
from gpt.runtime import accelerator
from gpt.train import engine as ds_engine, metrics, muon, resume_settings
from gpt.train.engine import OptimizerSettings

MODEL = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256)
OPTIMIZER = OptimizerSettings(lr=3e-3, weight_decay=0.1, warmup_steps=2, max_steps=10, min_lr_ratio=0.1)


def shipped(name):
    return json.loads((REPO / "ds_configs" / name).read_text())


MUON = shipped("zero2_fp32_muon.json")


def with_params(**params):
    return {**MUON, "optimizer": {"type": "Muon", "params": {**MUON["optimizer"]["params"], **params}}}


@pytest.mark.parametrize("config, line", [
    (with_params(muon_lr=0), "P: optimizer.params.muon_lr 0 must be a finite number > 0 (Muon's peak learning rate)"),
    (with_params(adam_lr="high"), 'P: optimizer.params.adam_lr "high" must be a finite number > 0 (the Adam half\'s '
                                  'peak learning rate)'),
    (with_params(weight_decay=-0.1), "P: optimizer.params.weight_decay -0.1 must be a finite number >= 0 (on both "
                                     "halves' matrices and embeddings)"),
    (with_params(momentum=1.0), "P: optimizer.params.momentum 1.0 must be a number in [0, 1)"),
    (with_params(ns_method="svd"), 'P: optimizer.params.ns_method "svd" must be "gram" or "standard" (the '
                                   'Newton-Schulz iteration)'),
    (with_params(betas=[0.9]), "P: optimizer.params.betas [0.9] must be two numbers in [0, 1)"),
    (with_params(momentm=0.9), "P: unknown key 'optimizer.params.momentm' (did you mean 'momentum'?)"),
    (with_params(per_head_muon=True), "P: unknown key 'optimizer.params.per_head_muon' (this trainer's Muon takes "
                                      "muon_lr, adam_lr, weight_decay, momentum, ns_method, betas, eps, torch_adam)"),
    (with_params(lr=1e-3), "P: optimizer.params.lr is decided by the trainer (from --lr; a Muon JSON names each "
                           "half's: muon_lr, adam_lr): remove it from the JSON"),
    ({**MUON, "optimizer": {"type": "Muon", "params": []}}, "P: 'optimizer.params' must be a JSON object, got []"),
    ({**MUON, "optimizer": {"type": "AdamW", "params": "fast"}},
     "P: 'optimizer.params' must be a JSON object, got \"fast\""),
    ({**MUON, "gradient_clipping": 1.0}, 'P: gradient_clipping 1.0 with optimizer.type "Muon": DeepSpeed 0.19 would '
     "clip Muon's orthogonalised update, not the gradient (its issue #8439), shrinking every step: set 0 or leave it "
     "out (only bf16 with ZeRO 1 and fp32 grad_accum_dtype clips the gradient)"),
    ({**MUON, "zero_optimization": {**MUON["zero_optimization"], "stage": 0}},
     'P: optimizer.type "Muon" needs zero_optimization.stage 1 or 2 (DeepSpeed runs Muon inside its ZeRO optimizer)'),
    ({**MUON, "optimizer": {"type": "muon", "params": {}, "legacy_fusion": False}},
     "P: unknown key 'optimizer.legacy_fusion' (DeepSpeed's Muon has no such setting)"),
    ({**MUON, "optimizer": {"type": "Muons"}}, 'P: optimizer.type "Muons": this trainer runs AdamW, Adam or Muon'),
])
def test_each_muon_problem_is_one_line(config, line):
    assert ds_checks.problems(config, "P") == [line]


def test_clipping_stays_where_deepspeed_clips_the_gradient():
    """BF16_Optimizer (bf16, ZeRO 1, fp32 accumulation) clips before Muon orthogonalises: a clip is allowed there."""
    assert ds_checks.problems({**shipped("zero1_bf16_muon.json"), "gradient_clipping": 1.0}, "P") == []
    assert muon_checks.clips_the_gradient(shipped("zero1_bf16_muon.json"))
    assert not muon_checks.clips_the_gradient(shipped("zero2_bf16_muon.json"))


def flags(*argv):
    """The optimizer section of a command line, before the run's start decides what it left out."""
    return parse(["--ds_config", "P", *argv]).optimizer


def test_a_muon_jsons_recipe_is_the_flags_default_and_a_flag_given_wins_in_one_line():
    """adam_lr and weight_decay in a Muon JSON stand for --lr's and --weight_decay's defaults (GPT-3 small's 6e-4 and
    0.1 otherwise); a flag given keeps its value, and one line says which JSON value it overrode."""
    recipe = with_params(adam_lr=5e-3, weight_decay=0.05)
    bare = {**MUON, "optimizer": {"type": "Muon"}}
    assert muon_checks.flag_values(flags(), recipe) == {"lr": 5e-3, "weight_decay": 0.05}
    assert muon_checks.flag_values(flags(), bare) == muon_checks.flag_values(flags(), shipped("zero2_fp32.json")) == {
        "lr": 6e-4, "weight_decay": 0.1}
    given = flags("--lr", "1e-3", "--weight_decay", "0.05")
    assert muon_checks.flag_values(given, recipe) == {}
    assert muon_checks.overridden(given, recipe, "P") == ["--lr 0.001 given: it wins over optimizer.params.adam_lr "
                                                          "0.005 of P"]  # weight_decay: the JSON's value, no line
    assert muon_checks.overridden(given, shipped("zero2_fp32.json"), "P") == []
    assert muon_checks.recorded(bare) == {"optimizer": "Muon", "muon_lr": 0.02}  # run_config.json: the default
    assert muon_checks.recorded(recipe) == {"optimizer": "Muon", "muon_lr": MUON["optimizer"]["params"]["muon_lr"]}


def test_tensorboards_hparams_show_muons_peak_beside_the_adam_halfs_lr():
    """run_config.json's muon_lr (the recorded default where the JSON has none) as setup/muon_lr; an AdamW run's
    hparams stay as they were."""
    run = {"args": parse(["--lr", "3e-3"]).recorded(), "model": {"n_layer": 2, "n_embd": 32, "n_head": 2},
           "world_size": 1, "precision": "fp32", "zero_stage": 2}
    muon_run = {**run, **muon_checks.recorded({**MUON, "optimizer": {"type": "Muon"}})}
    hparams, adamw = (metrics.hparams_of(r, 1, "fused") for r in (muon_run, run))
    assert (hparams["lr"], hparams["setup/muon_lr"]) == (3e-3, 0.02)
    assert hparams.keys() - adamw.keys() == {"setup/muon_lr"}


def test_skip_grad_z_is_refused_where_deepspeed_measures_muons_update_not_the_gradient():
    assert muon_checks.guard_problem(3, MUON, "P") == (
        "--skip_grad_z 3: under P's Muon DeepSpeed measures the norm of Muon's orthogonalised update, not the "
        "gradient's (its ZeRO optimizer; the log's update_norm), so the guard could not see a gradient spike: use "
        "--skip_loss_z, or bf16 with ZeRO 1 and fp32 grad_accum_dtype (ds_configs/zero1_bf16_muon.json), where the "
        "norm is the gradient's")
    assert [muon_checks.guard_problem(z, config, "P") for z, config in (
        (0, MUON), (3, shipped("zero1_bf16_muon.json")), (3, shipped("zero2_fp32.json")))] == [None, None, None]


def build(config, weight_decay=0.1, seed=0):
    torch.manual_seed(seed)
    optimizer = OptimizerSettings(OPTIMIZER.lr, weight_decay, OPTIMIZER.warmup_steps, OPTIMIZER.max_steps,
                                  OPTIMIZER.min_lr_ratio)
    return ds_engine.initialize(GPT(MODEL), config, micro_batch=2, grad_accum=1, optimizer=optimizer)


def step(engine):
    x = torch.randint(0, MODEL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(engine.global_steps))
    _, loss = engine(x, x)
    engine.backward(loss)
    engine.step()
    return loss.item()


@pytest.fixture(scope="module")
def muon_engine(single_rank_group):
    return build(no_clip(MUON))


def no_clip(config):
    return {key: value for key, value in config.items() if key != "gradient_clipping"}  # the trainer pins 0


def test_muon_steps_the_block_matrices_and_adam_the_embeddings_head_and_vectors(muon_engine):
    tagged = {name for name, p in muon_engine.module.named_parameters() if p.use_muon}
    assert tagged == {f"transformer.h.{i}.{name}.weight" for i in range(MODEL.n_layer)
                      for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    groups = muon_engine.optimizer.param_groups
    assert [(g["name"], g["use_muon"], g["weight_decay"]) for g in groups] == [
        ("group0-muon-params", True, 0.1), ("group0-adam-params", False, 0.1), ("group1-adam-params", False, 0.0)]
    assert muon_engine.gradient_clipping() == 0.0  # not DeepSpeed's default, 1.0


def test_the_schedule_scales_each_half_from_its_own_peak(muon_engine):
    """Warmup from step 0: each group's lr is its peak (muon_lr 0.02, --lr 3e-3) times the same factor."""
    factor = OPTIMIZER.lr_factor(muon_engine.lr_scheduler.last_epoch)
    assert [g["lr"] for g in muon_engine.optimizer.param_groups] == pytest.approx(
        [0.02 * factor, 3e-3 * factor, 3e-3 * factor], rel=1e-12)
    assert muon.lr_flag_lr(muon_engine) == pytest.approx(3e-3 * factor)
    assert muon.base_lrs(muon_engine, 1e-3) == [0.02, 1e-3, 1e-3]


@pytest.mark.parametrize("params, adam_name, decay_name", [
    ({}, "--lr", "--weight_decay"),  # DeepSpeed alone would give Muon's half --lr
    ({"muon_lr": 0.01, "adam_lr": OPTIMIZER.lr, "weight_decay": 0.05}, "adam_lr", "--weight_decay"),
    ({"adam_lr": 1e-3, "weight_decay": OPTIMIZER.weight_decay}, "--lr", "optimizer.params.weight_decay")])
def test_after_a_step_each_halfs_lr_is_the_one_the_header_names(single_rank_group, params, adam_name, decay_name):
    """{"type": "Muon"} with no params, the JSON's recipe, and flags given over it (--lr 3e-3, --weight_decay 0.1):
    after step 1 Muon's half is at muon_lr (0.02 where the JSON has none) and the rest at the run's lr, each times the
    schedule's factor, as the header says; a JSON value a flag overrode is named by the flag."""
    engine = build({**no_clip(MUON), "optimizer": {"type": "Muon", "params": params}})
    step(engine)
    muon_lr, factor = params.get("muon_lr", 0.02), OPTIMIZER.lr_factor(engine.lr_scheduler.last_epoch)
    assert [(g["lr"], g["weight_decay"]) for g in engine.optimizer.param_groups] == pytest.approx(
        [(muon_lr * factor, 0.1), (OPTIMIZER.lr * factor, 0.1), (OPTIMIZER.lr * factor, 0.0)], rel=1e-12)
    assert muon.describe(engine) == (f"MuonWithAuxAdam (Muon at muon_lr {muon_lr:g} on the block matrices, AdamW at "
                                     f"{adam_name} 0.003 on the embeddings, head and 1-D parameters)")
    assert muon.setting_name(engine, "weight_decay") == decay_name


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the position set by hand
def test_a_wsd_schedule_holds_each_halfs_peak_then_cools_each_down_from_it(single_rank_group):
    """--lr_schedule wsd, 10 steps, the last 4 a linear cooldown to 0: both halves at their peaks (muon_lr 0.02, --lr
    3e-3) from the warmup's end to the cooldown's start, both at half their peaks halfway through the cooldown."""
    wsd = dataclasses.replace(OPTIMIZER, lr_schedule="wsd", cooldown_frac=0.4, min_lr_ratio=0.0)
    engine = ds_engine.initialize(GPT(MODEL), {key: value for key, value in MUON.items() if key != "gradient_clipping"},
                                  micro_batch=2, grad_accum=1, optimizer=wsd)
    lrs = {}
    for position in (1, 2, 6, 8):
        engine.lr_scheduler.last_epoch = position - 1
        engine.lr_scheduler.step()
        lrs[position] = [g["lr"] for g in engine.optimizer.param_groups]
    assert lrs[1] == lrs[2] == lrs[6] == [0.02, 3e-3, 3e-3]
    assert lrs[8] == pytest.approx([0.01, 1.5e-3, 1.5e-3], rel=1e-12)


def test_a_resume_applies_muons_settings_by_group_and_says_only_what_changed(muon_engine):
    """What a checkpoint of a run with weight decay 0, momentum 0.9, eps 1e-10 and muon_lr 0.01 loads in place of
    this run's (0.1, 0.95, 1e-8, 0.02): each put back on its own half's groups, said once."""
    built = resume_settings.built(muon_engine)
    assert resume_settings.reapply(muon_engine, built) == []  # nothing changed: nothing said
    groups, scheduler = muon_engine.optimizer.param_groups, muon_engine.lr_scheduler
    saved = [dict(g) for g in groups], list(scheduler.base_lrs)
    try:
        for group in groups:
            group.update(weight_decay=0.0, **({"momentum": 0.9} if group["use_muon"] else {"eps": 1e-10}))
        scheduler.base_lrs[0] = 0.01
        lines = resume_settings.reapply(muon_engine, built)
        assert sorted(lines) == ["optimizer.params.eps 1e-08 applied (the checkpoint's run had 1e-10)",
                                 "optimizer.params.momentum 0.95 applied (the checkpoint's run had 0.9)",
                                 "optimizer.params.muon_lr 0.02 applied (the checkpoint's run had 0.01)",
                                 "optimizer.params.weight_decay 0.1 applied (the checkpoint's run had 0.0)"]
        assert [g["weight_decay"] for g in groups] == [0.1, 0.1, 0.0] and groups[0]["momentum"] == 0.95
        assert [g["eps"] for g in groups[1:]] == [1e-8, 1e-8] and scheduler.base_lrs[0] == 0.02
        assert groups[0]["lr"] == pytest.approx(0.02 * OPTIMIZER.lr_factor(scheduler.last_epoch))
    finally:
        for group, before in zip(groups, saved[0]):
            group.update(before)
        scheduler.base_lrs[:] = saved[1]


def test_the_norm_under_bf16_optimizer_is_the_gradients_as_adamws_and_zero2s_is_named_update_norm(single_rank_group):
    """Same weights and batch at step 0: Muon's norm under BF16_Optimizer equals AdamW's gradient norm; under ZeRO 2
    DeepSpeed measures Muon's update, which the log calls update_norm."""
    norms = {}
    for name in ("zero1_bf16.json", "zero1_bf16_muon.json", "zero2_bf16_muon.json"):
        engine = build(shipped(name))
        step(engine)
        norms[name] = (muon.norm_name(engine), float(engine.get_global_grad_norm()))
    assert norms["zero1_bf16_muon.json"][0] == norms["zero1_bf16.json"][0] == "grad_norm"
    assert norms["zero1_bf16_muon.json"][1] == pytest.approx(norms["zero1_bf16.json"][1], abs=1e-3)
    assert norms["zero2_bf16_muon.json"][0] == "update_norm"


@pytest.mark.parametrize("name", ["zero2_fp32_muon.json", "zero1_bf16_muon.json", "zero2_fp16_muon.json"])
def test_activation_checkpointing_and_gradient_accumulation_leave_muons_steps_as_they_are(single_rank_group, name):
    """Every block recomputed in backward (an activation_checkpointing block), and one batch in two micro-steps, in
    each precision: the losses and norms of three steps are the plain run's (to rounding: the sums go in another order)."""
    from deepspeed.runtime.zero.muon.original_muon import ns_compute_dtype  # built by the engines below
    if "fp16" in name:
        accelerator.enable_cpu_fp16()  # as the fp16 tests run it on CPU
    runs = []
    for extra, micro_batch, grad_accum in (({}, 2, 1), ({"activation_checkpointing": {}}, 2, 1), ({}, 1, 2)):
        torch.manual_seed(0)
        engine = ds_engine.initialize(GPT(MODEL), {**shipped(name), **extra}, micro_batch=micro_batch,
                                      grad_accum=grad_accum, optimizer=OPTIMIZER)
        runs.append([accumulated_step(engine, grad_accum) for _ in range(3)])
    plain, checkpointed, accumulated = runs
    flat = lambda run: [value for pair in run for value in pair]  # noqa: E731
    assert flat(checkpointed) == pytest.approx(flat(plain), rel=1e-5)
    # A micro-batch of 1 rounds apart from one of 2: one ulp of the training dtype (the gradient), and one of the dtype
    # Newton-Schulz runs in (fp16 where the accelerator says it has fp16: enable_cpu_fp16, here or in another test)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name.split("_")[1], torch.float32)
    rounding = torch.finfo(ns_compute_dtype("gram")).eps + torch.finfo(dtype).eps
    assert flat(accumulated) == pytest.approx(flat(plain), rel=max(rounding, 1e-5))


def accumulated_step(engine, grad_accum):
    """One optimizer step over the batch step() takes, in grad_accum micro-steps: (mean loss, DeepSpeed's norm)."""
    x = torch.randint(0, MODEL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(engine.global_steps))
    losses = []
    for part in x.chunk(grad_accum):
        _, loss = engine(part, part)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return sum(losses) / len(losses), float(engine.get_global_grad_norm())
