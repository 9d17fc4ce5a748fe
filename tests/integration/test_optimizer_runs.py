"""The optimizer of ds_configs/: torch's fused AdamW through DeepSpeed (torch_adam), which needs no op built. Runs
checkpointed with DeepSpeed's FusedAdam (the configs' optimizer before it) resume under it, on ZeRO 1 and 2, 1 and 2
ranks, and through DeepSpeed's universal form on another world size. (That a cold 2-rank start in a new shell builds
nothing and makes no shared-memory buffer: tests/integration/test_plain_shell_runs.py.)"""
import torch

import pytest

from conftest import (FUSED_ADAM, RELATIVE_TOLERANCE, TINY, out_dir_of, saved_tensors, succeeded, train, two_rank_run,
                      write_ds_config)

# 6 steps of 512 tokens (1 rank x grad_accum 2, or 2 ranks x 1), saved after steps 2 and 5; the resume from step 2
FLAGS = [*TINY, "--max_steps", "6", "--total_batch_tokens", "512", "--save_every", "3", "--keep_last", "5",
         "--lr", "3e-3"]
CASES = [(1, "bf16", 2), (2, "fp32", 2), (1, "fp32", 1), (2, "bf16", 1)]  # ZeRO stage, precision, ranks


# The moments after the resumed steps 3-5 average those steps' gradients. In bf16 a gradient is computed from
# the bf16 rounding of the fp32 master weights, and the two Adams' last fp32 bits can send a weight to the other
# bf16 neighbour: each gradient element may then differ by bf16's unit roundoff (2^-8) relative, and so may their
# averages, whatever the CPU's bf16 kernels (measured: 0 on an EPYC with AVX512-BF16, 2.4e-4 on a Xeon with AMX).
# In fp32 the weights agree to fp32's last bits and the loss bound applies.
MOMENTS_TOLERANCE = {"bf16": 2 ** -8, "fp32": RELATIVE_TOLERANCE["fp32"]}


def names(stage, precision, ranks):
    return f"fused_adam_{stage}_{precision}_{ranks}", f"resumed_torch_adamw_{stage}_{precision}_{ranks}"


def resume_flags(runs, whole):
    return [*FLAGS, "--resume", f"{runs}/{whole}/checkpoints/step_00000002"]


TWO_RANK_RUNS = {}
for _stage, _precision, _ranks in CASES:
    if _ranks == 2:
        _whole, _resumed = names(_stage, _precision, _ranks)
        TWO_RANK_RUNS[_whole] = two_rank_run("--data", "{small_vocab_dir}", *FLAGS, ds_config=dict(
            stage=_stage, precision=_precision, optimizer=FUSED_ADAM))
        TWO_RANK_RUNS[_resumed] = two_rank_run("--data", "{small_vocab_dir}", *resume_flags("{runs}", _whole),
                                               ds_config=dict(stage=_stage, precision=_precision))


def step_losses(records):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


def largest_relative_difference(resumed, whole):
    return max(abs(resumed[s][0] - whole[s][0]) / abs(whole[s][0]) for s in resumed)


def moments(step_dir):
    """Adam's moments in a checkpoint, flattened in the files' order: FusedAdam and torch's AdamW name them alike."""
    return torch.cat([t.flatten().float() for name, t in saved_tensors(step_dir).items() if "exp_avg" in name])


@pytest.mark.two_rank_runs(TWO_RANK_RUNS)
@pytest.mark.parametrize("stage,precision,ranks", CASES)
def test_a_fused_adam_checkpoint_resumes_under_torchs_adamw(tmp_path, request, small_vocab_dir, stage, precision,
                                                             ranks):
    whole_name, resumed_name = names(stage, precision, ranks)
    if ranks == 2:
        runs = request.getfixturevalue("two_rank_runs")
        (whole, whole_proc), (resumed, proc) = succeeded(runs[whole_name]), succeeded(runs[resumed_name])
    else:
        fused = write_ds_config(tmp_path / "fused_adam.json", stage=stage, precision=precision, optimizer=FUSED_ADAM)
        default = write_ds_config(tmp_path / "default.json", stage=stage, precision=precision)
        whole, whole_proc = train(tmp_path / whole_name, small_vocab_dir, *FLAGS, "--ds_config", fused)
        resumed, proc = train(tmp_path / resumed_name, small_vocab_dir, *resume_flags(tmp_path, whole_name),
                              "--ds_config", default)
    assert "over FusedAdam" in whole_proc.stdout and "over AdamW" in proc.stdout and "at step 3" in proc.stdout
    whole, resumed = step_losses(whole), step_losses(resumed)
    assert sorted(resumed) == [3, 4, 5]
    assert resumed[3] == whole[3]  # the checkpoint's weights, exactly: the first resumed step's loss and norm
    difference = largest_relative_difference(resumed, whole)
    # measured on a 2-core AMD EPYC with AVX512-BF16 (2026-11-28): fp32 8.6e-8, bf16 0 to 3e-6 (CPU FusedAdam and
    # torch's fused AdamW round differently in the last bits, which bf16 weights turn into visible steps)
    print(f"ZeRO {stage} {precision} {ranks} rank(s): FusedAdam -> torch's AdamW, largest relative loss difference "
          f"{difference:.2g}")
    assert difference < RELATIVE_TOLERANCE[precision]
    # Adam's moments were carried over, not restarted (a restart differs by tens of percent): they agree with the
    # uninterrupted run's at the last step
    whole_moments, resumed_moments = (moments(out_dir_of(p) / "checkpoints" / "step_00000005")
                                      for p in (whole_proc, proc))
    assert whole_moments.shape == resumed_moments.shape
    relative = ((whole_moments - resumed_moments).norm() / whole_moments.norm()).item()
    print(f"largest relative moment difference {relative:.2g}")
    assert relative < MOMENTS_TOLERANCE[precision]


@pytest.mark.parametrize("stage", [1, 2])
def test_a_torch_adamw_checkpoint_resumes_under_fused_adam(tmp_path, small_vocab_dir, stage):
    """FusedAdam stays selectable (a JSON without torch_adam): it loads torch's AdamW's state too (a KeyError at
    its first step before gpt/train/engine.py from_the_other_adam)."""
    fused = write_ds_config(tmp_path / "fused_adam.json", stage=stage, precision="fp32", optimizer=FUSED_ADAM)
    default = write_ds_config(tmp_path / "default.json", stage=stage, precision="fp32")
    whole, whole_proc = train(tmp_path / "whole", small_vocab_dir, *FLAGS, "--ds_config", default)
    resumed, proc = train(tmp_path / "resumed", small_vocab_dir, *resume_flags(tmp_path, "whole"), "--ds_config",
                          fused)
    assert "over AdamW" in whole_proc.stdout and "over FusedAdam" in proc.stdout
    whole, resumed = step_losses(whole), step_losses(resumed)
    assert sorted(resumed) == [3, 4, 5] and resumed[3] == whole[3]
    assert largest_relative_difference(resumed, whole) < RELATIVE_TOLERANCE["fp32"]


@pytest.mark.two_rank_runs({name: TWO_RANK_RUNS[name] for name in names(2, "fp32", 2)})
def test_a_two_rank_fused_adam_checkpoint_resumes_on_one_rank_through_the_universal_form(tmp_path, two_rank_runs,
                                                                                         small_vocab_dir):
    whole_name, _ = names(2, "fp32", 2)
    whole, whole_proc = succeeded(two_rank_runs[whole_name])
    default = write_ds_config(tmp_path / "default.json", stage=1, precision="fp32")
    resumed, proc = train(tmp_path / "one_rank", small_vocab_dir, *resume_flags(out_dir_of(whole_proc).parent,
                                                                                 whole_name), "--ds_config", default)
    assert "over AdamW" in proc.stdout and "Adam's moments (through its universal form" in proc.stdout
    whole, resumed = step_losses(whole), step_losses(resumed)
    assert sorted(resumed) == [3, 4, 5]
    assert largest_relative_difference(resumed, whole) < RELATIVE_TOLERANCE["fp32"]

