"""bench/train.py --smoke runs end to end (the overhead, ZeRO, checkpointing and loss sections once, on the tiny
model; on a GPU too) and what it measures is consistent: timings are not asserted (machines are noisy),
byte counts are, and so are which bf16 rows run or are skipped and why."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import NO_BF16_UNITS, REPO
from gpt.hardware import cpu_has_fast_bf16


def bench_smoke(tmp_path, env):
    """(results JSON, stdout) of `bench/train.py --smoke` under these extra environment variables."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "bench/train.py", "--smoke", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


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


@pytest.mark.parametrize("cpu", ["this one", "without bf16 units"])
def test_bench_smoke_run_measures_every_section(tmp_path, cpu):
    results, stdout = bench_smoke(tmp_path, NO_BF16_UNITS if cpu == "without bf16 units" else {})
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
    # the classic loss at micro-batches 1 and 2, then the fused loss at --micro_batch auto's choice (the plan on CPU)
    assert [(r["loss"], r["micro_batch"], r["grad_accum"]) for r in results["loss"]] == [
        ("classic", 1, 1), ("classic", 2, 1), ("fused (auto)", 2, 1)]
    assert all(r["tokens_per_s"] > 0 for r in results["loss"]) and results["loss"][-1]["ratio_to_classic_best"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_smoke_run_on_cuda(tmp_path):
    """The CUDA path: the plain loop under CUDA autocast, timers after a device sync, MFU against the
    datasheet; the CPU-only ZeRO section skipped."""
    results, stdout = bench_smoke(tmp_path, {"DS_ACCELERATOR": "cuda"})  # conftest pins the CPU accelerator
    assert results["device"] == "cuda" and "zero" not in results and "skipping zero: CPU only" in stdout
    bf16 = torch.cuda.get_device_capability() >= (8, 0)
    assert_bf16_rows_or_skip(results, stdout, bf16, "bf16 rows skipped: this GPU has no bf16 units")
    for row in results["overhead"]:
        assert row["trainer_s"] > 0 and row["plain_s"] > 0
        assert row["mfu"] is None or 0 < row["mfu"] < 1  # None: a GPU not in gpt.metrics.GPU_PEAK_FLOPS
