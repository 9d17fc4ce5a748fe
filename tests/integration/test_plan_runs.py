"""The memory planner against what runs hold: model states equal the bytes a real 2-rank engine holds;
activations measured at unseen sizes match the fitted prediction; gpt-plan in a plain shell; the docs' table is
the report's. (The planner's own checks: tests/unit/test_plan.py.)"""
import json
import subprocess
import sys

import pytest
import torch

from common import load_script
from conftest import REPO, out_dir_of, plain_shell_env, succeeded, two_rank_run
from gpt.memory.footprint import measure_step_bytes
from gpt.model.model import GPTConfig
from gpt.memory.plan import per_token_bytes, step_bytes

ENGINE_SETTINGS = ["zero1_bf16.json:0:fp32", "zero1_bf16.json:1:fp32", "zero1_bf16.json:2:fp32", "zero1_bf16.json:1:bf16",
                   "zero2_bf16.json:2:bf16", "zero1_fp16.json:1:fp16"]
# The same JSONs with DeepSpeed's Muon: MuonWithAuxAdam's own step (ZeRO 0), BF16_Optimizer, DeepSpeedZeroOptimizer
# at ZeRO 1 (fp32, fp16) and 2 (bf16); on these ranks a Muon matrix straddles the partition boundary.
MUON_SETTINGS = ["zero1_bf16.json:0:fp32:muon", "zero1_bf16.json:1:fp32:muon", "zero1_bf16.json:1:bf16:muon",
                 "zero2_bf16.json:2:bf16:muon", "zero1_fp16.json:1:fp16:muon"]


@pytest.mark.two_rank_runs({"engine_memory": two_rank_run(*(f"ds_configs/{setting}" for setting in ENGINE_SETTINGS
                                                             + MUON_SETTINGS),
                                                           script="tests/integration/engine_memory.py")})
def test_resident_model_states_equal_what_a_two_rank_engine_holds(two_rank_runs):
    """ZeRO 0/1/2 in fp32, bf16 (BF16_Optimizer and ZeRO-2) and fp16, AdamW and Muon, on 2 ranks
    (tests/integration/engine_memory.py). The plan is per GPU: the rank that holds the most."""
    _, proc = succeeded(two_rank_runs["engine_memory"])
    reports = [report for rank in (0, 1)
               for report in json.loads((out_dir_of(proc) / f"engine_memory_rank{rank}.json").read_text())]
    assert sorted(r["setting"] for r in reports) == sorted(f"ds_configs/{s}" for s in 2 * (ENGINE_SETTINGS + MUON_SETTINGS)), \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    assert {r["optimizer"] for r in reports} >= {"BF16_Optimizer", "DeepSpeedZeroOptimizer", "MuonWithAuxAdam"}
    for setting in {r["setting"] for r in reports}:
        both = [r for r in reports if r["setting"] == setting]
        # equal to the byte but for the optimizer's own scalars (grad-norm and overflow flags, 4 bytes each)
        assert 0 <= max(r["owned"] for r in both) - both[0]["planned"] <= 16, both
        assert all(r["owned"] - r["planned"] <= 16 for r in both), both
    # the planner's Muon matrices are the ones the engine ran Muon on
    assert all(r["muon_shapes"] == r["planned_muon_shapes"] for r in reports if r["setting"].endswith(":muon"))
    straddled = [r for r in reports if r["setting"].endswith("1:fp32:muon")]
    assert straddled[0]["owned"] != straddled[1]["owned"], straddled


UNSEEN = GPTConfig(n_layer=3, n_head=3, n_embd=192, block_size=40, vocab_size=2000)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # fp16 holds what bf16 does (tests/unit/test_plan.py)
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("loss", ["classic", "fused"])
def test_a_steps_measured_peak_matches_the_prediction_at_an_unseen_size(precision, checkpointing, loss):
    """Per token (the difference between two batch sizes) within 5%; with checkpointing, whose peak moves
    between phases (the loss, a block's recompute), at most 5% below the measurement and 50% above it;
    the whole step never above the plan."""
    seq_len = UNSEEN.block_size
    small, large = (measure_step_bytes(UNSEEN, batch, seq_len, precision, checkpointing, loss) for batch in (8, 16))
    measured = (large - small) / (8 * seq_len)
    predicted = per_token_bytes(UNSEEN, precision, checkpointing, loss)
    if checkpointing:
        assert 0.95 * measured <= predicted <= 1.5 * measured, (predicted, measured)
    else:
        assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)
    assert large <= step_bytes(UNSEEN, 16, seq_len, precision, checkpointing, loss) * 1.05


@pytest.mark.slow
def test_gpt_plan_in_a_plain_shell_prints_only_json_and_measure_needs_a_gpu():
    """As a user runs it: DeepSpeed picks its accelerator itself and may log; stdout holds nothing but the
    JSON. Without a GPU, --measure is one line and exit 1."""
    run = lambda *args: subprocess.run([sys.executable, "-m", "gpt.commands.plan", "--model", "tiny", "--seq_len", "64",  # noqa: E731
                                        "--ds_config", "ds_configs/zero2_fp32.json", *args], cwd=REPO,
                                       capture_output=True, text=True, timeout=300, env=plain_shell_env())
    planned = run("--gpu", "v100-32gb", "--json")
    assert planned.returncode == 0 and json.loads(planned.stdout)["seq_len"] == 64, planned.stderr[-2000:]
    assert "Setting accelerator to CPU" not in planned.stderr  # a plan for a named GPU needs no accelerator
    if torch.cuda.is_available():
        return  # the GPU side: tests/integration/test_gpu.py
    measured = run("--measure", "--json")
    assert measured.returncode == 1 and measured.stdout == "", measured.stdout + measured.stderr
    assert measured.stderr.splitlines()[-1] == (
        "error: --measure trains on a CUDA GPU, and this machine has none (torch.cuda.is_available() is False); "
        "without --measure, gpt-plan plans for the GPU you name")
    assert "Traceback" not in measured.stderr


def batch_report():
    return load_script("bench/batch_report.py")


@pytest.mark.slow
def test_readme_table_and_chart_are_what_the_report_gives(tmp_path):
    report = batch_report()
    table = list(report.rows())
    markdown = report.markdown(table)
    assert markdown.count("\n") == 33 and markdown in (REPO / "docs" / "memory.md").read_text()
    muon = report.muon_markdown(list(report.muon_rows()))
    assert muon.count("\n") == 17 and muon in (REPO / "docs" / "memory.md").read_text()
    assert all(met for *_, met in report.targets()), report.targets()  # docs/memory.md's planned targets for d12
    report.chart(table, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
