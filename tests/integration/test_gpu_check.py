"""launch/gpu_check.sh, the GPU acceptance run, where there is no GPU: one line and exit 1; under DRY_RUN its
steps' command lines, of which the parts main and muon are then trained here on the tiny model and summarised as
launch/gpu_summary.py does after a real call. Its other steps' CPU twins run elsewhere: gpt-plan --measure's search
(test_probe.py), the bench sections (test_bench_runs.py), gpt-eval's device choice (tests/unit/test_eval_device.py)."""
import json
import os
import shutil
import statistics
import subprocess

import pytest
import torch

from common import SMALL_VOCAB, load_script
from conftest import REPO, read_metrics, train

# The main job's flags as the script gives them, then the tiny model's: 3 steps, validation at the first and last
# (the script's --val_every 10 is kept), no sample
TINY_MAIN_JOB = ["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--total_batch_tokens", "256",
                 "--vocab_size", str(SMALL_VOCAB), "--max_steps", "3", "--val_tokens", "512", "--sample_every", "0"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it is the acceptance run itself")
def test_gpu_check_without_a_gpu_says_so_and_exits_1_and_its_report_dir_is_the_callers(tmp_path):
    """Started from another directory with a relative REPORT_DIR: the report goes where the caller stands."""
    proc = subprocess.run(["bash", str(REPO / "launch" / "gpu_check.sh"), "report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", (
        "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False); this is the GPU acceptance run\n"))
    assert (tmp_path / "report").is_dir() and not (REPO / "report").exists()


@pytest.mark.slow
def test_the_part_muon_trains_the_main_job_under_its_muon_json_and_sets_its_step_time_against_adamws(
        tmp_path, small_vocab_dir, monkeypatch):
    """The muon step is the main step's command with zero1_bf16_muon.json, at the micro-batch the main job chose
    (its main.out: that of the H100 call of 2026-11-26, 128), and out_dir muon; both trained (tiny, in this process,
    each log written where the step writes it) give summary.md's ratios, over steps 1..2 here."""
    report = tmp_path / "report"
    report.mkdir()
    shutil.copy(REPO / "tests" / "data" / "gpu_report_h100_2026-11-26" / "main.out", report)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DRY_RUN": "1", "GPUS": "1", "DATA": str(small_vocab_dir)}
    proc = subprocess.run(["bash", "launch/gpu_check.sh", str(report), "muon", "main"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    job = (f"deepspeed --num_gpus 1 train_ds.py --ds_config ds_configs/zero1_bf16{{}}.json --micro_batch {{}} "
           f"--data {small_vocab_dir} --out_dir {report}/{{}} --val_every 10 --sample_every 30 --max_steps ")
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "DRY_RUN: nothing runs\n"
        f"main: {job.format('', 'auto', 'main')}30\n"
        f"main_resume: {job.format('', 'auto', 'main')}40 --resume auto\n"
        f"muon: {job.format('_muon', 128, 'muon')}30\n")
    assert sorted(path.name for path in report.iterdir()) == ["main.out"]  # nothing ran, nothing written

    commands = dict(line.split(": ", 1) for line in proc.stdout.splitlines()[1:])
    for name in ("main", "muon"):
        argv = commands[name].split()
        _, ran = train(report / name, small_vocab_dir, *argv[argv.index("train_ds.py") + 1:], *TINY_MAIN_JOB)
        (report / f"{name}.out").write_text(ran.stdout)
    summary = load_script("launch/gpu_summary.py")
    monkeypatch.setattr(summary, "STEADY_FROM", 1)
    text = summary.muon_against_adamw(report)
    recipe = json.loads((REPO / "ds_configs" / "zero1_bf16_muon.json").read_text())["optimizer"]["params"]
    assert (f"bf16, ZeRO 1, BF16_Optimizer over MuonWithAuxAdam (Muon at muon_lr {recipe['muon_lr']:g} on the block "
            f"matrices, AdamW at adam_lr {recipe['adam_lr']:g} on the embeddings, head and 1-D parameters), 1 rank(s) "
            f"x micro_batch 4") in text  # the main job's flags, no --lr: the JSON's recipe
    (muon_dt, muon_tps), (adamw_dt, adamw_tps) = (
        [statistics.median(r[key] for r in read_metrics(report / name) if r["step"] in (1, 2) and key in r)
         for key in ("dt", "tokens_per_s")] for name in ("muon", "main"))
    val_losses = [[r["val_loss"] for r in read_metrics(report / name) if "val_loss" in r] for name in ("muon", "main")]
    assert text.endswith(
        f"Muon: steps 1..2: median step {muon_dt:.3f} s, {muon_tps:,.0f} tokens/s\n"
        f"AdamW: steps 1..2: median step {adamw_dt:.3f} s, {adamw_tps:,.0f} tokens/s\n"
        f"Muon / AdamW: step time {muon_dt / adamw_dt:.3f}x, tokens/s {muon_tps / adamw_tps:.3f}x\n"
        f"val_loss at step 2: Muon {val_losses[0][-1]:.4f}, AdamW {val_losses[1][-1]:.4f}\n")
