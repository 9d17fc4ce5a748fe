"""Resume anywhere: a checkpoint continues on another world size, ZeRO stage or micro-batch with its Adam moments,
its schedule and exactly the next global batch (gpt/train/universal.py, gpt/data/shards.py). The losses after such a resume
are the uninterrupted run's up to the order of the sums: ranks and micro-steps add a step's gradients in another
order. Measured on CPU (2026-11-24): RELATIVE_TOLERANCE's comments."""
import json
import shutil

import pytest
import torch

from conftest import (RELATIVE_TOLERANCE, TINY, out_dir_of, reseal, succeeded, train, two_rank_run,
                      write_ds_config)

# 1024 tokens a step: 2 ranks x micro_batch 4 x seq_len 64 x grad_accum 2, or 1 rank x grad_accum 4
CHAIN = [*TINY, "--total_batch_tokens", "1024", "--save_every", "2", "--keep_last", "10", "--lr", "3e-3"]
# name: (the 1-rank runs' DeepSpeed JSON, the 2-rank run's, data fixture, extra flags)
CASES = {
    "zero1_fp32": (dict(stage=1, precision="fp32"), dict(stage=1, precision="fp32"), "small_vocab_dir", []),
    "zero2_fp32": (dict(stage=2, precision="fp32"), dict(stage=2, precision="fp32"), "small_vocab_dir", []),
    # bf16 ZeRO 1 is DeepSpeed's BF16_Optimizer (fp32 gradient accumulation), ZeRO 2 its ZeRO optimizer
    "bf16_zero2_to_zero1_and_back": (dict(stage=2), dict(stage=1), "small_vocab_dir", []),
    # ZeRO 0 needs no conversion: its optimizer state is whole in the checkpoint
    "zero0_fp32": (dict(stage=0, precision="fp32"), dict(stage=0, precision="fp32"), "small_vocab_dir", []),
}
# The chain's first two legs in the session's shared 2-rank launch: the uninterrupted run on one rank (in the test
# process, before the launch) and its resume from step 1 on two ranks; the test resumes that on one rank again.
CHAINS = {**{f"whole_{name}": two_rank_run("--data", f"{{{data}}}", *CHAIN, *flags, "--max_steps", "6", ds_config=one,
                                           ranks=1) for name, (one, _, data, flags) in CASES.items()},
          **{f"two_{name}": two_rank_run("--data", f"{{{data}}}", *CHAIN, *flags, "--max_steps", "6", "--resume",
                                         f"{{runs}}/whole_{name}/checkpoints/step_00000001", ds_config=two)
             for name, (_, two, data, flags) in CASES.items()}}
ZERO2_CHAIN = {name: CHAINS[name] for name in ("whole_zero2_fp32", "two_zero2_fp32")}


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def largest_relative_difference(resumed, whole):
    assert resumed and set(resumed) <= set(whole)
    return max(abs(resumed[s] - whole[s]) / abs(whole[s]) for s in resumed)


def assert_converted(stdout, step_dir, stage):
    if stage == 0:
        assert "ZeRO 0 keeps it whole" in stdout
    else:
        assert f"converted {step_dir} to DeepSpeed's universal form" in stdout
        assert "Adam's moments (through its universal form" in stdout


@pytest.mark.two_rank_runs(CHAINS)
@pytest.mark.parametrize("name", CASES)
def test_one_rank_then_two_then_one_continue_the_uninterrupted_run(tmp_path, request, two_rank_runs, name):
    one, two, data, flags = CASES[name]
    data = request.getfixturevalue(data)
    tolerance = RELATIVE_TOLERANCE[one.get("precision", "bf16")]
    whole_records, whole_proc = succeeded(two_rank_runs[f"whole_{name}"])
    whole = losses(whole_records)
    two_records, two_proc = succeeded(two_rank_runs[f"two_{name}"])
    step_1 = out_dir_of(whole_proc) / "checkpoints" / "step_00000001"
    assert "resumed from" in two_proc.stdout and "at step 2" in two_proc.stdout and "data position" in two_proc.stdout
    assert_converted(two_proc.stdout, step_1, two["stage"])
    assert sorted(losses(two_records)) == [2, 3, 4, 5]
    step_3 = out_dir_of(two_proc) / "checkpoints" / "step_00000003"
    config = write_ds_config(tmp_path / "one.json", **one)
    records, proc = train(tmp_path / "one", data, *CHAIN, *flags, "--max_steps", "6", "--ds_config", config,
                          "--resume", str(step_3))
    assert "at step 4" in proc.stdout and sorted(losses(records)) == [4, 5]
    assert_converted(proc.stdout, step_3, one["stage"])
    if name == "zero1_fp32":  # a second resume from the same step reuses its universal form
        _, proc = train(tmp_path / "again", data, *CHAIN, *flags, "--max_steps", "5", "--ds_config", config,
                        "--resume", str(step_3))
        assert f"reusing {step_3 / 'universal'}, converted by an earlier resume" in proc.stdout
    differences = {"1 -> 2 ranks": largest_relative_difference(losses(two_records), whole),
                   "2 -> 1 ranks": largest_relative_difference(losses(records), whole)}
    print(f"{name}: largest relative difference from the uninterrupted run: {differences}")
    assert max(differences.values()) < tolerance, differences
    assert min(whole[s] for s in (4, 5)) < whole[0] - 0.5  # it learns: the comparison is between trained weights


def test_another_micro_batch_on_the_same_world_size_continues_the_uninterrupted_run(tmp_path, small_vocab_dir):
    """A V100 node in place of an A800 node: the same ranks, a smaller micro-batch and more accumulation."""
    whole, _ = train(tmp_path / "whole", small_vocab_dir, *CHAIN, "--max_steps", "4")
    resumed, proc = train(tmp_path / "resumed", small_vocab_dir, *CHAIN, "--max_steps", "4", "--micro_batch", "2",
                          "--resume", str(tmp_path / "whole" / "checkpoints" / "step_00000001"))
    assert "weights, optimizer, schedule, data position and RNG" in proc.stdout
    assert "micro_batch 2" in proc.stdout and "grad_accum 8" in proc.stdout
    difference = largest_relative_difference(losses(resumed), losses(whole))
    print(f"micro_batch 4 -> 2: largest relative difference from the uninterrupted run: {difference:.3g}")
    assert sorted(losses(resumed)) == [2, 3] and difference < RELATIVE_TOLERANCE["fp32"]


def as_saved_before_format_2(step_dir):
    """Make a checkpoint as this trainer saved them before checkpoint format 2: no "format" in run_config.json, no
    universal_checkpoint_info nor run_config in the client state, the loader's position in global batches of one
    micro-step (micro_batch x world_size windows); complete.json's sizes updated to match, and no checksums."""
    run = json.loads((step_dir / "run_config.json").read_text())
    del run["format"]
    (step_dir / "run_config.json").write_text(json.dumps(run))
    states = step_dir / "mp_rank_00_model_states.pt"
    state = torch.load(states, weights_only=False)
    for key in ("universal_checkpoint_info", "run_config"):
        state.pop(key, None)
    loader = state["loader"]
    micro_steps = loader.pop("windows_per_batch") // (run["args"]["micro_batch"] * run["world_size"])
    state["loader"] = {**loader, "batch": loader["batch"] * micro_steps, "world_size": run["world_size"],
                       "micro_batch": run["args"]["micro_batch"]}
    torch.save(state, states)
    reseal(step_dir, checksums=False)


@pytest.mark.two_rank_runs(ZERO2_CHAIN)
def test_an_older_checkpoint_on_another_world_size_restarts_from_its_weights(tmp_path, small_vocab_dir, two_rank_runs):
    whole_records, _ = succeeded(two_rank_runs["whole_zero2_fp32"])
    _, two_proc = succeeded(two_rank_runs["two_zero2_fp32"])  # its step 3: saved on 2 ranks
    old = tmp_path / "old" / "checkpoints" / "step_00000003"
    shutil.copytree(out_dir_of(two_proc) / "checkpoints" / "step_00000003", old)
    as_saved_before_format_2(old)
    records, proc = train(tmp_path / "b", small_vocab_dir, *CHAIN, "--max_steps", "6", "--ds_config",
                          write_ds_config(tmp_path / "ds.json", **CASES["zero2_fp32"][0]), "--resume", str(old))
    assert (f"resumed from {old} at step 4 with WEIGHTS ONLY (saved on 2 rank(s) with ZeRO 2, now 1 with ZeRO 2; "
            f"saved before checkpoints recorded what a conversion needs): optimizer moments restart from zero; "
            f"schedule; data in global batches of 16 windows, 8 when saved: from batch ") in proc.stdout
    steps = [r for r in records if "loss" in r]
    whole = {r["step"]: r for r in whole_records if "loss" in r}
    assert [r["step"] for r in steps] == [4, 5] and steps[0]["lr"] == whole[4]["lr"]  # the schedule's position
    assert steps[0]["loss"] < whole[0]["loss"] - 0.5  # the trained weights, not a new initialisation
    assert abs(steps[0]["loss"] / whole[4]["loss"] - 1) < RELATIVE_TOLERANCE["fp32"]  # and the same next batch
    assert steps[1]["loss"] != pytest.approx(whole[5]["loss"], rel=1e-4)  # but Adam's moments are gone


def test_an_older_checkpoint_on_its_own_world_size_resumes_exactly(tmp_path, small_vocab_dir):
    whole, _ = train(tmp_path / "whole", small_vocab_dir, *CHAIN, "--max_steps", "4")
    old = tmp_path / "old" / "checkpoints" / "step_00000001"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step_00000001", old)
    as_saved_before_format_2(old)
    resumed, proc = train(tmp_path / "resumed", small_vocab_dir, *CHAIN, "--max_steps", "4", "--resume", str(old))
    assert ("weights, optimizer, schedule, data in the order of the checkpoint's run (saved before global batches "
            "were a step's windows: one micro-step of 4 windows each) and RNG") in proc.stdout
    assert losses(resumed) == {s: l for s, l in losses(whole).items() if s >= 2}  # bit for bit


@pytest.mark.two_rank_runs(ZERO2_CHAIN)
def test_a_conversion_that_fails_is_one_line_and_leaves_the_checkpoint_untouched(tmp_path, small_vocab_dir,
                                                                                 two_rank_runs):
    _, two_proc = succeeded(two_rank_runs["two_zero2_fp32"])
    step = tmp_path / "run" / "checkpoints" / "step_00000005"
    shutil.copytree(out_dir_of(two_proc) / "checkpoints" / "step_00000005", step)
    optim = step / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(b"\0" * optim.stat().st_size)  # garbled in place, and sealed: what the conversion meets
    reseal(step)
    before = {p.name: p.read_bytes() for p in step.iterdir()}
    _, proc = train(tmp_path / "b", small_vocab_dir, *CHAIN, "--max_steps", "7", "--ds_config",
                    write_ds_config(tmp_path / "ds.json", **CASES["zero2_fp32"][0]), "--resume", str(step), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: {step}: could not convert it to a universal checkpoint (")
    assert proc.stderr.strip().splitlines()[-1].endswith("); the checkpoint is untouched")
    assert {p.name: p.read_bytes() for p in step.iterdir()} == before  # nothing added, nothing changed
