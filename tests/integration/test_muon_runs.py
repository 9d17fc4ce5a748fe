"""DeepSpeed's Muon through train_ds.py: a run stopped after step 2 and resumed gives the uninterrupted losses to the
last bit on CPU, under DeepSpeedZeroOptimizer (ZeRO 2, fp32, 2 ranks) and BF16_Optimizer (ZeRO 1, bf16, 1 rank with
gradient accumulation), with the norm named for what it is and no run setting said changed; on 2 ranks under
BF16_Optimizer the step-0 grad_norm is AdamW's; a Muon checkpoint is refused under an AdamW JSON, and on another world
size (DeepSpeed's universal form carries no Muon momentum).
(Checks, tagging, the schedule of both halves, the step-0 norm against AdamW's: tests/unit/test_muon.py.)"""
import pytest

from conftest import TINY, out_dir_of, succeeded, train, two_rank_run, write_ds_config

# 6 steps of 512 tokens (1 rank x grad_accum 2, or 2 ranks x 1), saved after steps 2 and 5; the resume from step 2
FLAGS = [*TINY, "--max_steps", "6", "--total_batch_tokens", "512", "--save_every", "3", "--keep_last", "5",
         "--lr", "3e-3"]
CASES = [("zero2_fp32_muon.json", 2, "update_norm"), ("zero1_bf16_muon.json", 1, "grad_norm")]


def resume_flags(runs, whole):
    return [*FLAGS, "--resume", f"{runs}/{whole}/checkpoints/step_00000002"]


TWO_RANK_RUNS = {
    "muon_whole": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, ds_config=dict(base="zero2_fp32_muon.json")),
    "muon_resumed": two_rank_run("--data", "{small_vocab_dir}", *resume_flags("{runs}", "muon_whole"),
                                 ds_config=dict(base="zero2_fp32_muon.json")),
    "muon_zero1_bf16": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, "--max_steps", "2",
                                    ds_config=dict(base="zero1_bf16_muon.json")),
    "adamw_zero1_bf16": two_rank_run("--data", "{small_vocab_dir}", *FLAGS, "--max_steps", "2",
                                     ds_config=dict(base="zero1_bf16.json")),
}


def runs_of(request, tmp_path, small_vocab_dir, config, ranks):
    """(whole, whole_proc), (resumed, resumed_proc) for the case: the shared 2-rank launch's, or two runs here."""
    if ranks == 2:
        runs = request.getfixturevalue("two_rank_runs")
        return succeeded(runs["muon_whole"]), succeeded(runs["muon_resumed"])
    json_path = write_ds_config(tmp_path / config, base=config)
    whole = train(tmp_path / "muon_whole", small_vocab_dir, *FLAGS, "--ds_config", json_path)
    return whole, train(tmp_path / "muon_resumed", small_vocab_dir, *resume_flags(tmp_path, "muon_whole"),
                        "--ds_config", json_path)


@pytest.mark.two_rank_runs(TWO_RANK_RUNS)
@pytest.mark.parametrize("config,ranks,norm", CASES)
def test_a_muon_run_resumed_gives_the_uninterrupted_losses_bit_for_bit(tmp_path, request, small_vocab_dir, config,
                                                                       ranks, norm):
    (whole, whole_proc), (resumed, proc) = runs_of(request, tmp_path, small_vocab_dir, config, ranks)
    assert "over MuonWithAuxAdam (Muon at muon_lr 0.02 on the block matrices" in whole_proc.stdout
    assert "at step 3" in proc.stdout and "resume: " not in proc.stdout  # nothing changed, nothing said applied
    losses = {r["step"]: (r["loss"], r[norm], r["lr"]) for r in whole if "loss" in r}
    resumed_losses = {r["step"]: (r["loss"], r[norm], r["lr"]) for r in resumed if "loss" in r}
    assert sorted(resumed_losses) == [3, 4, 5]
    assert resumed_losses == {step: losses[step] for step in (3, 4, 5)}
    assert all("grad_norm" not in r for r in whole) if norm == "update_norm" else True


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
