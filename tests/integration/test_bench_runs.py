"""bench/train.py --smoke runs end to end (the overhead, ZeRO and checkpointing sections once, on the tiny model;
the loss, speed and deterministic sections in a run of their own; on a GPU too: the first run in
tests/integration/test_gpu.py, the second here) and what it measures is consistent: timings are not asserted
(machines are noisy), byte counts are, and so are which rows run or are skipped and why. bench/checkpoint.py runs
too, on the tiny model: its universal conversion figures; and the muon and speedrun sections in runs of their own."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import NO_BF16_UNITS, REPO, background_run
from gpt.config.hardware import cpu_has_fast_bf16
from gpt.model.loss import loss_problem


def bench_smoke_command(*args):
    return [sys.executable, "bench/train.py", "--smoke", *args, "--json", "{out}/bench.json"]


def bench_smoke(tmp_path, env, *args):
    """(results JSON, stdout) of `bench/train.py --smoke [args]` under these extra environment variables."""
    proc = subprocess.run([arg.format(out=tmp_path) for arg in bench_smoke_command(*args)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **env})
    return bench_results(proc)


def bench_results(proc):
    """(results JSON, stdout) of a bench_smoke_command that ran (here or in background_runs)."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(Path(proc.args[-1]).read_text()), proc.stdout


def assert_bf16_rows_or_skip(results, stdout, bf16, reason):
    """bf16 rows where the device has bf16 units; else none, and the reason said once and recorded."""
    if bf16:
        assert results["bf16_skipped"] is None
    else:
        assert results["bf16_skipped"].startswith(reason), results["bf16_skipped"]
        assert stdout.count(results["bf16_skipped"]) == 1
    dtypes = ("fp32", "bf16") if bf16 else ("fp32",)
    rows = [(r["model"], r["dtype"], r["compiled"]) for r in results["overhead"]]
    assert rows == [("tiny", d, False) for d in dtypes]
    # the checkpointing section is bf16 alone in --smoke: fp32 instead where bf16 is skipped
    (ckpt,) = results["ckpt"]
    assert ckpt["dtype"] == dtypes[-1] and ckpt["activations_on"] < ckpt["activations_off"]
    return dtypes


# the CPU runs go on in the background while other tests run (conftest.background_runs)
@pytest.mark.parametrize("cpu", [
    pytest.param("this one", marks=pytest.mark.background_runs({"bench_smoke": background_run(*bench_smoke_command())})),
    pytest.param("without bf16 units", marks=[
        pytest.mark.skipif(not cpu_has_fast_bf16(), reason="this CPU has no bf16 units: the same run as 'this one'"),
        pytest.mark.background_runs({"bench_smoke_no_bf16_units": background_run(*bench_smoke_command(),
                                                                                  env=NO_BF16_UNITS)})])])
def test_bench_smoke_run_measures_every_section(background_runs, cpu):
    results, stdout = bench_results(background_runs["bench_smoke_no_bf16_units" if cpu == "without bf16 units"
                                                    else "bench_smoke"])
    assert results["mode"] == "smoke" and results["device"] == "cpu"
    # where bf16 matmuls are emulated (AVX2-only) a bf16 row would measure the emulation: skipped, saying why
    bf16 = cpu == "this one" and cpu_has_fast_bf16()
    dtypes = assert_bf16_rows_or_skip(results, stdout, bf16, "bf16 rows skipped: this CPU has no bf16 units")
    assert list(results["matmul_peak_flops"]) == list(dtypes)  # measured here, in every dtype the rows use
    assert all(peak > 0 for peak in results["matmul_peak_flops"].values())
    assert all(r["trainer_s"] > 0 and r["plain_s"] > 0 and 0 < r["mfu"] for r in results["overhead"])
    assert [(r["dtype"], r["stage"]) for r in results["zero"]] == [(d, s) for d in sorted(dtypes) for s in (0, 1, 2)]
    for row in results["zero"]:  # the engine's real model states, per rank, equal the planner's
        assert row["state_bytes_rank0"] == row["state_bytes_rank1"]
        assert 0 <= row["state_bytes_rank0"] - row["planned_bytes"] <= 16, row


def assert_loss_section(results, stdout):
    """Each loss kernel at the fixed micro-batch (1 in --smoke) and at --micro_batch auto's choice (2: the whole
    step), 2 sequences per step in every row; the classic loss also in its sweep (1, 2); liger skipped with
    its reason where it cannot run; fused rows against the classic loss's best; the verdict line."""
    rows, dtype = results["loss"], results["loss"][0]["dtype"]
    memory = ["peak_alloc_gib", "peak_reserved_gib"] if results["device"] == "cuda" else ["peak_rss_gib"]
    liger = loss_problem("liger", results["device"], dtype)
    expected = [("classic", 1, 2, "sweep, fixed"), ("classic", 2, 1, "sweep, auto"), ("chunked", 1, 2, "fixed"),
                ("chunked", 2, 1, "auto")] + ([] if liger else [("liger", 1, 2, "fixed"), ("liger", 2, 1, "auto")])
    measured = [r for r in rows if r["tokens_per_s"]]
    assert [(r["loss"], r["micro_batch"], r["grad_accum"], r["picked_by"]) for r in measured] == expected, rows
    assert all(r["note"] is None and all(r[key] > 0 for key in memory) for r in measured)
    assert all((r["ratio_to_classic_best"] is None) == (r["loss"] == "classic") for r in measured)
    assert all(r["ratio_to_classic_best"] > 0 for r in measured if r["loss"] != "classic")
    if liger:  # e.g. on CPU: one row that says why
        assert [(r["loss"], r["note"]) for r in rows if not r["tokens_per_s"]] == [("liger", f"skipped: {liger}")]
    verdict = results["loss_verdict"]
    assert verdict["line"] in stdout
    assert verdict["line"].startswith(f"verdict: the fastest fused kernel is {verdict['fastest']}:")
    assert verdict["fastest"] in {"chunked", "liger"} and verdict["ratio"] > 0
    assert verdict["meets_target"] == (verdict["ratio"] >= 1)


ISSUE_22_SECTIONS = ("--only", "loss", "speed", "deterministic")


@pytest.mark.slow
@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.background_runs({
        "bench_smoke_issue_22": background_run(*bench_smoke_command(*ISSUE_22_SECTIONS))})),
    # not marked gpu: at ~1.5 min on an H100 it does not fit `pytest -m gpu`'s 150 s in launch/gpu_check.sh, whose
    # bench step runs the speed and deterministic sections on the GPU at d12 (here: pytest tests/integration/test_bench_runs.py -k cuda)
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_bench_smoke_loss_speed_and_deterministic(request, tmp_path, device):
    """The loss and speed sections, eager in --smoke (compiling takes a minute on CPU): the loss kernels
    (assert_loss_section); the trainer's speed with --loss fused and classic, each against the one plain loop;
    train_ds.py without and with --deterministic. On CPU in the background (conftest.background_runs)."""
    if device == "cpu":
        results, stdout = bench_results(request.getfixturevalue("background_runs")["bench_smoke_issue_22"])
    else:  # conftest pins the CPU accelerator
        results, stdout = bench_smoke(tmp_path, {"DS_ACCELERATOR": device}, *ISSUE_22_SECTIONS)
    assert results["device"] == device and "overhead" not in results
    assert_loss_section(results, stdout)
    assert "## the trainer's tokens/s and MFU, eager, --loss fused" in stdout and "## --deterministic's cost" in stdout
    speed = results["speed"]
    assert [(r["compiled"], r["loss"], r["plain_compiled"]) for r in speed] == [(False, "fused", False),
                                                                              (False, "classic", False)]
    for row in speed:
        assert row["tokens_per_step"] == 2 * 2 * 64 and row["tokens_per_s"] > 0 and row["plain_tokens_per_s"] > 0
        assert row["ratio_to_plain"] == pytest.approx(row["tokens_per_s"] / row["plain_tokens_per_s"])
        if device == "cpu" or row["mfu"] is not None:  # None: a GPU not in gpt.config.hardware.GPU_PEAK_FLOPS
            assert row["mfu"] > 0 and row["plain_mfu"] > 0
    (row,) = results["deterministic"]
    assert row["note"] is None and row["default_s"] > 0 and row["deterministic_s"] > 0
    assert row["ratio"] == pytest.approx(row["deterministic_s"] / row["default_s"])
    assert len(row["default_runs_s"]) == len(row["deterministic_runs_s"]) == row["runs"] == 1


@pytest.mark.background_runs({"bench_smoke_optimizer_start": background_run(
    *bench_smoke_command("--only", "optimizer", "start"))})
def test_bench_smoke_optimizer_and_start(background_runs):
    """Which Adam (each variant's step and optimizer step against the default's), and the seconds from launch to
    the first step, cold against warm, of 2 ranks that build nothing."""
    results, stdout = bench_results(background_runs["bench_smoke_optimizer_start"])
    assert "## which Adam" in stdout and "## seconds from launch to the first step" in stdout
    rows = results["optimizer"]
    assert [r["optimizer"] for r in rows[:4]] == ["torch fused (default)", "torch foreach", "torch per-tensor loop",
                                                 "DeepSpeed FusedAdam"]
    assert rows[0]["step_ratio"] == rows[0]["optimizer_ratio"] == 1.0
    for row in rows:  # each dtype's rows against its default, the first of them
        default = next(r for r in rows if r["dtype"] == row["dtype"])
        assert row["step_s"] > row["optimizer_s"] > 0
        assert row["optimizer_ratio"] == pytest.approx(row["optimizer_s"] / default["optimizer_s"])
    (row,) = results["start"]
    assert row["optimizer"] == "torch AdamW (default)" and row["built_ops"] == "none"
    assert row["cold_s"] > 0 and row["warm_s"] > 0
    assert row["cold_vs_warm"] == pytest.approx(row["cold_s"] / row["warm_s"])


@pytest.mark.background_runs({"bench_smoke_muon": background_run(
    *bench_smoke_command("--only", "muon", "--chart", "{out}/muon_curves.png"))})
def test_bench_smoke_muon_against_adamw(background_runs):
    """Muon against AdamW on the tiny model: each curve's validation points, the target (AdamW's final loss at its
    best lr), the first step at or below it and its tokens as a fraction of AdamW's; the step-time ratio; the chart."""
    results, stdout = bench_results(background_runs["bench_smoke_muon"])
    assert "## Muon against AdamW" in stdout
    *runs, timing = results["muon"]
    assert [(r["optimizer"], r["lr"]) for r in runs] == [("AdamW", 3e-3), ("Muon", 0.02)]
    for run in runs:
        steps, losses = zip(*run["curve"])
        assert steps == (0, 2, 3) and run["final_val"] == losses[-1] and run["target"] == runs[0]["final_val"]
        reached = [step for step, loss in run["curve"] if loss <= run["target"]]
        assert run["steps_to_target"] == (reached[0] if reached else None)
        assert run["tokens_vs_adamw"] == (None if not reached else (reached[0] + 1) / 4)
    assert timing["optimizer"] == "Muon / AdamW step time" and timing["step_ratio"] == timing["muon_s"] / timing["adamw_s"]
    chart = Path(background_runs["bench_smoke_muon"].args[-1]).parent / "muon_curves.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.background_runs({"bench_smoke_speedrun": background_run(
    *bench_smoke_command("--only", "speedrun", "--chart", "{out}/speedrun.png"))})
def test_bench_smoke_speedrun(background_runs):
    """Tokens to a loss as speedruns count them, on the tiny model: the baseline's run sets the target; each variant's
    dedicated runs, its answer the shortest at or below the target as a fraction of the baseline's tokens; the
    step-time ratio; the chart."""
    results, stdout = bench_results(background_runs["bench_smoke_speedrun"])
    assert "## tokens to a loss, as speedruns count them" in stdout
    *runs, timing = results["speedrun"]
    (baseline,) = [r for r in runs if r["variant"] == "AdamW cosine"]
    assert baseline["steps"] == 4 and baseline["shortest"] and baseline["tokens_vs_baseline"] == 1.0
    for variant in ("AdamW wsd", "Muon cosine", "Muon wsd (shipped)"):
        mine = [r for r in runs if r["variant"] == variant]
        reached = sorted(r["steps"] for r in mine if r["final_val"] <= baseline["final_val"])
        assert [r for r in mine if r["shortest"]] == [r for r in mine if reached and r["steps"] == reached[0]]
        assert all(r["target"] == baseline["final_val"] for r in mine) and {r["steps"] for r in mine} <= {2, 4}
    assert timing["variant"] == "Muon / AdamW step time" and timing["step_ratio"] == timing["muon_s"] / timing["adamw_s"]
    chart = Path(background_runs["bench_smoke_speedrun"].args[-1]).parent / "speedrun.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_checkpoint_bench_measures_universal_conversion(tmp_path):
    """bench/checkpoint.py on the tiny model: the universal conversion is measured next to the save (time, bytes,
    its load into a load_universal engine) and extrapolated to d48 by parameter count; it cleans up after itself."""
    from gpt.model.model import PRESETS, param_count

    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "bench/checkpoint.py", "--model", "tiny", "--out_dir", str(out),
                           "--repeats", "1"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert results["save_s"] > 0 and results["checkpoint_bytes"] > 0
    assert results["convert_s"] > 0 and results["universal_bytes"] > 0 and results["universal_load_s"] > 0
    assert len(results["all_convert_s"]) == results["repeats"] == len(results["all_universal_load_s"])
    assert results["universal_vs_checkpoint_bytes"] == results["universal_bytes"] / results["checkpoint_bytes"]
    assert results["convert_vs_save"] == results["convert_s"] / results["save_s"]
    assert len(results["all_checksum_s"]) == results["repeats"] and results["checksum_s"] > 0
    assert results["checksum_vs_save"] == results["checksum_s"] / results["save_s"]
    scale = param_count(PRESETS["d48"]) / param_count(PRESETS["tiny"])
    assert results["extrapolated_from"] == "tiny" and results["d48_params"] == param_count(PRESETS["d48"])
    assert results["d48_convert_s_extrapolated"] == pytest.approx(results["convert_s"] * scale)
    assert results["d48_universal_bytes_extrapolated"] == round(results["universal_bytes"] * scale)
    assert "d48: planned, extrapolated linearly from tiny" in proc.stdout
    assert not out.exists()


def test_levers_smoke_profiles_the_default_and_measures_each_lever_against_it(tmp_path):
    """bench/levers.py --smoke, the CPU twin of launch/gpu_check.sh's part speed: the default step profiled (its work
    summed by kind, the matmuls among them), DeepSpeed's wall_clock_breakdown timers read, each lever named with --only
    run against the default in the order the script gives them (a CUDA-only one skipped with its reason), the
    default again last. Over 15 s only where it is the suite's first to load DeepSpeed's FusedAdam: its one JIT
    build (~45 s on a 2-core EPYC; test_optimizer_runs.py and the bench's optimizer section load the same build)."""
    only = ["loss_chunk_16384", "micro_batch_1", "attention_cudnn", "deepspeed_fused_adam"]  # each kind of change once
    out = tmp_path / "levers.json"
    proc = subprocess.run([sys.executable, "bench/levers.py", "--smoke", "--only", *only, "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = {row["lever"]: row for row in results["rows"]}
    assert list(rows) == ["default", "default+wall_clock_breakdown", "deepspeed_fused_adam", "attention_cudnn",
                          "micro_batch_1", "loss_chunk_16384", "default (again)"]
    assert rows.pop("attention_cudnn")["note"] == "skipped: needs cuda"
    assert all(row["tokens_per_s"] > 0 and row["note"] is None for row in rows.values()), rows
    assert rows["default"]["ratio"] == 1.0 and rows["micro_batch_1"]["micro_batch"] == 1
    breakdown = results["wall_clock_breakdown"]
    assert {"fwd", "bwd", "step"} <= set(breakdown) and all(breakdown[k] > 0 for k in ("fwd", "bwd", "step"))
    assert results["profile"]["by_kind"]["matmul"] > 0 and results["profile"]["busy_ms"] > 0
    assert "## where one step's time goes" in proc.stdout
