"""bench/train.py runs end to end (every section's code path once, on the tiny model) and what it
measures is consistent: timings are not asserted (machines are noisy), byte counts are."""
import json
import os
import subprocess
import sys

import pytest

from conftest import NO_BF16_UNITS, REPO
from gpt.hardware import cpu_has_fast_bf16


@pytest.mark.parametrize("cpu", ["this one", "without bf16 units"])
def test_bench_smoke_run_measures_every_section(tmp_path, cpu):
    out = tmp_path / "bench.json"
    env = {**os.environ, **(NO_BF16_UNITS if cpu == "without bf16 units" else {})}
    proc = subprocess.run([sys.executable, "bench/train.py", "--smoke", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "smoke" and all(peak > 0 for peak in results["matmul_peak_flops"].values())
    # bf16 rows where the CPU has bf16 units; where bf16 matmuls are emulated they are skipped, saying why
    bf16 = cpu == "this one" and cpu_has_fast_bf16()
    dtypes = ("fp32", "bf16") if bf16 else ("fp32",)
    if bf16:
        assert results["bf16_skipped"] is None
    else:
        assert results["bf16_skipped"].startswith("bf16 rows skipped: this CPU has no bf16 units")
        assert results["bf16_skipped"] in proc.stdout
    assert [(r["model"], r["dtype"]) for r in results["overhead"]] == [("tiny", d) for d in dtypes]
    assert all(r["trainer_s"] > 0 and r["plain_s"] > 0 and 0 < r["mfu"] for r in results["overhead"])
    assert [(r["dtype"], r["stage"]) for r in results["zero"]] == [(d, s) for d in sorted(dtypes) for s in (0, 1, 2)]
    for row in results["zero"]:  # the engine's real model states, per rank, equal the planner's
        assert row["state_bytes_rank0"] == row["state_bytes_rank1"]
        assert 0 <= row["state_bytes_rank0"] - row["planned_bytes"] <= 16, row
    (ckpt,) = results["ckpt"]
    assert ckpt["dtype"] == dtypes[-1] and ckpt["activations_on"] < ckpt["activations_off"]
