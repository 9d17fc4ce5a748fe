"""DeepSpeed's Muon through train_ds.py: a run stopped after step 2 and resumed gives the uninterrupted losses to the
last bit on CPU, under DeepSpeedZeroOptimizer (ZeRO 2, fp32, 2 ranks, the shipped JSON) and BF16_Optimizer (ZeRO 1, bf16,
1 rank with gradient accumulation, `{"type": "Muon"}` with no params), with the norm named for what it is, each half's
learning rate in the header and run_config.json, and no run setting said changed; a resume under a Muon JSON whose
recipe changed applies and says it; on 2 ranks under BF16_Optimizer the step-0 grad_norm is AdamW's; a Muon checkpoint
is refused under an AdamW JSON, and on another world size (DeepSpeed's universal form carries no Muon momentum).
(Checks, tagging, each half's lr after a step, the schedule of both halves, the step-0 norm against AdamW's:
tests/unit/test_muon.py.)"""
import json

import pytest

from common import REPO
from conftest import TINY, out_dir_of, succeeded, train, two_rank_run, write_ds_config

# 6 steps of 512 tokens (1 rank x grad_accum 2, or 2 ranks x 1), saved after steps 2 and 5; the resume from step 2
FLAGS = [*TINY, "--max_steps", "6", "--total_batch_tokens", "512", "--save_every", "3", "--keep_last", "5",
         "--lr", "3e-3"]
BARE = {"type": "Muon"}  # no params: muon_lr's default, the Adam half at --lr
CASES = [("zero2_fp32_muon.json", 2, "update_norm"), ("zero1_bf16_muon.json", 1, "grad_norm")]


def resume_flags(runs, whole, flags=FLAGS):
    return [*flags, "--resume", f"{runs}/{whole}/checkpoints/step_00000002"]


TWO_RANK_RUNS = {
    "muon_whole": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, ds_config=dict(base="zero2_fp32_muon.json")),
    "muon_resumed": two_rank_run("--data", "{small_vocab_dir}", *resume_flags("{runs}", "muon_whole"),
                                 ds_config=dict(base="zero2_fp32_muon.json")),
    "muon_zero1_bf16": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, "--max_steps", "2",
                                    ds_config=dict(base="zero1_bf16_muon.json")),
    "adamw_zero1_bf16": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, "--max_steps", "2",
                                     ds_config=dict(base="zero1_bf16.json")),
}


@pytest.fixture(scope="module")
def one_rank_whole(tmp_path_factory, small_vocab_dir):
    """The 1-rank case's uninterrupted run, under zero1_bf16_muon.json with a bare optimizer block: (records, proc)."""
    runs = tmp_path_factory.mktemp("muon_one_rank")
    json_path = write_ds_config(runs / "bare.json", base="zero1_bf16_muon.json", optimizer=BARE)
    return train(runs / "muon_whole", small_vocab_dir, *FLAGS, "--ds_config", json_path)


def runs_of(request, tmp_path, small_vocab_dir, config, ranks):
    """(whole, whole_proc), (resumed, resumed_proc) for the case: the shared 2-rank launch's, or two runs here."""
    if ranks == 2:
        runs = request.getfixturevalue("two_rank_runs")
        return succeeded(runs["muon_whole"]), succeeded(runs["muon_resumed"])
    whole, whole_proc = request.getfixturevalue("one_rank_whole")
    json_path = write_ds_config(tmp_path / config, base=config, optimizer=BARE)
    return (whole, whole_proc), train(tmp_path / "muon_resumed", small_vocab_dir,
                                      *resume_flags(out_dir_of(whole_proc).parent, "muon_whole"), "--ds_config",
                                      json_path)


def each_halfs_lr(config):
    """(muon_lr, how the header names the Adam half's lr) under FLAGS' --lr 3e-3 for a JSON's optimizer block."""
    params = config.get("params", {})
    return params.get("muon_lr", 0.02), "adam_lr" if params.get("adam_lr") == 3e-3 else "--lr"


@pytest.mark.two_rank_runs(TWO_RANK_RUNS)
@pytest.mark.parametrize("config,ranks,norm", CASES)
def test_a_muon_run_resumed_gives_the_uninterrupted_losses_bit_for_bit(tmp_path, request, small_vocab_dir, config,
                                                                       ranks, norm):
    (whole, whole_proc), (resumed, proc) = runs_of(request, tmp_path, small_vocab_dir, config, ranks)
    muon_lr, adam = each_halfs_lr(BARE if ranks == 1 else
                                  json.loads((REPO / "ds_configs" / config).read_text())["optimizer"])
    assert (f"over MuonWithAuxAdam (Muon at muon_lr {muon_lr:g} on the block matrices, AdamW at {adam} 0.003 on the "
            f"embeddings, head and 1-D parameters)") in whole_proc.stdout
    saved = json.loads((out_dir_of(whole_proc) / "checkpoints" / "step_00000002" / "run_config.json").read_text())
    assert (saved["muon_lr"], saved["args"]["lr"]) == (muon_lr, 3e-3)
    assert "at step 3" in proc.stdout and "resume: " not in proc.stdout  # nothing changed, nothing said applied
    losses = {r["step"]: (r["loss"], r[norm], r["lr"]) for r in whole if "loss" in r}
    resumed_losses = {r["step"]: (r["loss"], r[norm], r["lr"]) for r in resumed if "loss" in r}
    assert sorted(resumed_losses) == [3, 4, 5]
    assert resumed_losses == {step: losses[step] for step in (3, 4, 5)}
    assert all("grad_norm" not in r for r in whole) if norm == "update_norm" else True


def test_a_resume_under_a_changed_recipe_applies_it_and_a_flag_given_over_the_json_wins(tmp_path, one_rank_whole,
                                                                                       small_vocab_dir):
    """The 1-rank run resumed at step 3 under a JSON with muon_lr 0.01, adam_lr 6e-3 and weight_decay 0.05, no --lr
    and --weight_decay 0.1 given: each half at its new peak from there, said; the flag's weight decay, said."""
    whole, whole_proc = one_rank_whole
    recipe = {"type": "Muon", "params": {"muon_lr": 0.01, "adam_lr": 6e-3, "weight_decay": 0.05}}
    json_path = write_ds_config(tmp_path / "recipe.json", base="zero1_bf16_muon.json", optimizer=recipe)
    flags = [*FLAGS[:FLAGS.index("--lr")], "--weight_decay", "0.1", "--ds_config", json_path]
    resumed, proc = train(tmp_path / "resumed", small_vocab_dir, *resume_flags(out_dir_of(whole_proc).parent,
                                                                               "muon_whole", flags))
    lines = proc.stdout.splitlines()
    assert f"--weight_decay 0.1 given: it wins over optimizer.params.weight_decay 0.05 of {json_path}" in lines
    assert ("over MuonWithAuxAdam (Muon at muon_lr 0.01 on the block matrices, AdamW at adam_lr 0.006 on the "
            "embeddings") in proc.stdout
    assert [line for line in lines if line.startswith("resume: ")] == [
        "resume: optimizer.params.muon_lr 0.01 applied (the checkpoint's run had 0.02)"]
    assert any(line.startswith("optimizer.params.adam_lr 0.006 (the checkpoint's run had 0.003): the lr schedule "
                               "follows") for line in lines)
    first = next(r for r in resumed if "loss" in r)
    assert first["step"] == 3 and first["lr"] == pytest.approx(2 * next(r["lr"] for r in whole if r.get("step") == 3
                                                                        and "loss" in r), rel=1e-12)


@pytest.mark.two_rank_runs(TWO_RANK_RUNS)
def test_on_2_ranks_muons_grad_norm_under_bf16_optimizer_is_adamws_at_step_0(two_rank_runs):
    """Same weights, batch and loss at step 0: the gradient's norm, whichever optimizer steps after it."""
    (muon_records, muon_proc), (adamw_records, _) = (succeeded(two_rank_runs[name])
                                                     for name in ("muon_zero1_bf16", "adamw_zero1_bf16"))
    assert "BF16_Optimizer over MuonWithAuxAdam" in muon_proc.stdout
    muon_step, adamw_step = (next(r for r in records if "loss" in r) for records in (muon_records, adamw_records))
    assert muon_step["loss"] == adamw_step["loss"]
    assert muon_step["grad_norm"] == pytest.approx(adamw_step["grad_norm"], abs=1e-3)


@pytest.mark.two_rank_runs(TWO_RANK_RUNS)
def test_a_muon_checkpoint_is_refused_under_adamw_and_on_another_world_size(tmp_path, two_rank_runs,
                                                                            small_vocab_dir):
    _, whole_proc = succeeded(two_rank_runs["muon_whole"])
    step = out_dir_of(whole_proc) / "checkpoints" / "step_00000005"
    muon_json = write_ds_config(tmp_path / "muon.json", base="zero2_fp32_muon.json")
    adamw_json = write_ds_config(tmp_path / "adamw.json", base="zero2_fp32.json")
    lines = {}
    for name, json_path in {"adamw": adamw_json, "one_rank": muon_json}.items():  # refused before any step
        _, proc = train(tmp_path / name, small_vocab_dir, *FLAGS, "--max_steps", "8", "--resume", str(step),
                        "--ds_config", json_path, check=False)
        lines[name] = (proc.returncode, proc.stderr.strip().splitlines()[-1])
    assert lines == {
        "adamw": (2, f"error: {step}: cannot resume: optimizer Muon in the checkpoint, AdamW now (--ds_config): their "
                     f"states differ; resume with a Muon JSON, or start a new run from its weights (gpt-export, then "
                     f"--init_from)"),
        "one_rank": (2, f"error: {step}: cannot resume Muon on another layout (saved on 2 rank(s) with ZeRO 2, now 1 "
                        f"with ZeRO 2): DeepSpeed's universal checkpoint carries Adam's moments only, not Muon's "
                        f"momentum; resume on the saved layout")}
