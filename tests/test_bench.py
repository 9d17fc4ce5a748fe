"""bench/train.py runs end to end (every section's code path once, on the tiny model) and what it
measures is consistent: timings are not asserted (machines are noisy), byte counts are."""
import json
import subprocess
import sys

from conftest import REPO


def test_bench_smoke_run_measures_every_section(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "bench/train.py", "--smoke", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "smoke" and all(peak > 0 for peak in results["matmul_peak_flops"].values())
    assert [(r["model"], r["dtype"]) for r in results["overhead"]] == [("tiny", "fp32"), ("tiny", "bf16")]
    assert all(r["trainer_s"] > 0 and r["plain_s"] > 0 and 0 < r["mfu"] for r in results["overhead"])
    assert [(r["dtype"], r["stage"]) for r in results["zero"]] == [(d, s) for d in ("bf16", "fp32") for s in (0, 1, 2)]
    for row in results["zero"]:  # the engine's real model states, per rank, equal the planner's
        assert row["state_bytes_rank0"] == row["state_bytes_rank1"]
        assert 0 <= row["state_bytes_rank0"] - row["planned_bytes"] <= 16, row
    (ckpt,) = results["ckpt"]
    assert ckpt["activations_on"] < ckpt["activations_off"]
