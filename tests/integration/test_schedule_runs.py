"""The lr schedule, the extension and the target in tiny runs (the schedule's arithmetic: tests/unit/test_schedule.py):
a wsd run holds its peak, then cools down; keeps its checkpoint at the cooldown's start whatever --save_every and
--keep_last; resumed from it with a larger --max_steps, it holds the peak again up to its new cooldown, bit for bit the
run that had that length from the start; --target_val_loss stops a run at the first validation at or below it, on one
rank and on two."""
import pytest

from conftest import TINY, succeeded, train, two_rank_run
from gpt.train.schedule import Schedule

WSD = [*TINY, "--total_batch_tokens", "512", "--lr_schedule", "wsd", "--cooldown_frac", "0.5", "--min_lr_ratio", "0",
       "--val_every", "2", "--val_tokens", "2048", "--save_every", "5", "--keep_last", "1"]
PEAK = 6e-4  # --lr's default


def by_step(records, key):
    return {r["step"]: r[key] for r in records if key in r}


@pytest.fixture(scope="module")
def extended(tmp_path_factory, small_vocab_dir):
    """(8-step wsd run, its extension to 12 steps from its cooldown's start, a 12-step run): records and processes."""
    root = tmp_path_factory.mktemp("wsd")
    short = train(root / "short", small_vocab_dir, *WSD, "--max_steps", "8", "--target_val_loss", "1e-3")
    cooldown = root / "short" / "checkpoints" / "step_00000003"
    longer = train(root / "longer", small_vocab_dir, *WSD, "--max_steps", "12", "--resume", str(cooldown))
    whole = train(root / "whole", small_vocab_dir, *WSD, "--max_steps", "12")
    return root, short, longer, whole


def test_a_wsd_run_holds_its_peak_then_cools_down_and_keeps_the_checkpoint_where_its_cooldown_starts(extended):
    root, (records, proc), _, _ = extended
    assert by_step(records, "lr") == pytest.approx({s: Schedule(PEAK, 2, 8, 0.0, "wsd").lr_at(s) for s in range(8)},
                                                   rel=1e-12)
    lrs = by_step(records, "lr")
    assert [lrs[s] for s in (1, 2, 3, 4)] == [PEAK] * 4 and lrs[4] > lrs[5] > lrs[6] > lrs[7] > 0
    assert "lr schedule wsd: warmup 2 steps, constant to step 4, then a linear cooldown (0.5 of the run) to peak x 0 " \
           "at step 8" in proc.stdout
    # --save_every 5 and --keep_last 1: step 4's checkpoint pruned, the cooldown's (after step 3) kept
    assert sorted(p.name for p in (root / "short" / "checkpoints").glob("step_*")) == ["step_00000003", "step_00000007"]
    vals = by_step(records, "val_loss")
    lowest = min(vals, key=vals.get)
    assert proc.stdout.splitlines()[-1] == (f"--target_val_loss 0.001 not reached: the lowest val_loss was "
                                            f"{vals[lowest]:.4f} at step {lowest}")


def test_a_wsd_run_extended_from_its_cooldown_start_is_the_longer_run_bit_for_bit(extended):
    _, (short, _), (longer, proc), (whole, _) = extended
    assert ("--max_steps 12 (the checkpoint's run had 8): the lr schedule follows the new flags from here on (wsd: "
            "warmup 2 steps, constant to step 6, then a linear cooldown (0.5 of the run) to peak x 0 at step 12); lr "
            "at step 4 is 0.0006 (was 0.0006)") in proc.stdout.splitlines()
    assert [by_step(longer, "lr")[s] for s in (4, 5, 6)] == [PEAK] * 3
    losses = {key: by_step(records, "loss") for key, records in (("short", short), ("longer", longer),
                                                                 ("whole", whole))}
    assert sorted(losses["longer"]) == list(range(4, 12))
    assert losses["longer"] == {s: losses["whole"][s] for s in range(4, 12)}
    assert {s: losses["short"][s] for s in range(4)} == {s: losses["whole"][s] for s in range(4)}


def test_an_extension_into_the_runs_own_out_dir_is_refused_before_it_overwrites_the_cooldown(extended,
                                                                                               small_vocab_dir):
    root = extended[0]
    cooldown = root / "short" / "checkpoints" / "step_00000003"
    _, proc = train(root / "short", small_vocab_dir, *WSD, "--max_steps", "12", "--resume", str(cooldown), check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --resume {cooldown}: the checkpoint at the cooldown's start "
                                                 f"of the run in {root / 'short'}, whose cooldown's checkpoints (up to "
                                                 f"step_00000007) this run would overwrite: extend it into a new "
                                                 f"--out_dir\n")


def test_a_run_stops_at_the_first_validation_at_or_below_its_target(extended, tmp_path, small_vocab_dir):
    """The target: the 12-step run's validation loss at step 4, which the steps before it did not reach."""
    _, _, _, (whole, _) = extended
    vals = by_step(whole, "val_loss")
    assert vals[0] > vals[2] > vals[4]  # it falls: the run with this target stops at step 4
    records, proc = train(tmp_path, small_vocab_dir, *WSD, "--max_steps", "12", "--target_val_loss", repr(vals[4]))
    assert max(r["step"] for r in records) == 4 and (tmp_path / "checkpoints" / "step_00000004").is_dir()
    line = next(line for line in proc.stdout.splitlines() if "reached" in line)
    assert line.startswith(f"step     4 | --target_val_loss {vals[4]!r} reached: val_loss {vals[4]:.4f} after 5 "
                           f"steps, 2,560 tokens, ") and line.endswith(" s since this launch's first step")
    target = records[-1]
    assert (target["step"], target["target_val_loss"], target["target_tokens"]) == (4, vals[4], 2560)
    assert 0 < target["target_seconds"] == pytest.approx(float(line.split(", ")[-1].split(" s ")[0]), abs=0.05)


@pytest.mark.two_rank_runs({"target_on_two_ranks": two_rank_run(
    "--data", "{small_vocab_dir}", *TINY, "--total_batch_tokens", "1024", "--max_steps", "6", "--val_every", "2",
    "--val_tokens", "2048", "--target_val_loss", "100", "--lr_schedule", "wsd",
    ds_config=dict(base="zero2_fp32_muon.json"))})
def test_two_ranks_of_a_muon_run_with_accumulation_stop_together_at_the_target(two_rank_runs):
    records, proc = succeeded(two_rank_runs["target_on_two_ranks"])  # exit 0 on both ranks
    assert max(r["step"] for r in records) == 0 and records[-1]["target_val_loss"] == 100
    assert sum("--target_val_loss 100.0 reached" in line for line in proc.stdout.splitlines()) == 1  # rank 0 says it
    assert "lr schedule wsd: warmup 2 steps, constant to step 3" in proc.stdout and "(each half from its own peak)" \
        in proc.stdout
