"""launch/gpu_summary.py, summary.md of launch/gpu_check.sh, on the report of the H100 run of 2026-11-26
(tests/data/gpu_report_h100_2026-11-26: that call's files, its launcher lines and pytest's log cut; its measure
JSON is tests/data/gpu_measure_h100_zero1_bf16_compiled_2026-11-26.json). Its bench step was cut after the
compiled speed rows, before bench.json held them: the test writes them from its bench.md."""
import json
import shutil

from common import REPO, load_script

DATA = REPO / "tests" / "data"


def report_dir(tmp_path):
    report = tmp_path / "report"
    shutil.copytree(DATA / "gpu_report_h100_2026-11-26", report)
    shutil.copy(DATA / "gpu_measure_h100_zero1_bf16_compiled_2026-11-26.json", report / "measure_zero1_bf16.json")
    return report


def test_the_summary_of_a_real_report_sets_the_main_job_against_the_plain_compiled_loop(tmp_path):
    summary = load_script("launch/gpu_summary.py")
    report = report_dir(tmp_path)
    text = summary.summary(report)
    assert text.startswith("# GPU acceptance run\n\n2026-11-26\nNVIDIA H100 80GB HBM3")
    assert "main: exit 0 in 146 s (limit 180 s)\n" in text and "eval: skipped, the 510 s budget is spent" in text
    # the run's and then the resume's: that call's resume probed again (a resume now keeps the checkpoint's size)
    assert text.count("--micro_batch auto: planned 256 (largest fitting the plan: 260), probed 128: micro_batch 128 x "
                      "grad_accum 4\n") == 2
    assert "resumed from /tmp/report/main/checkpoints/step_00000029 at step 30" in text
    # steps 10..39 of both runs: 30 records, the median the 16th slowest
    assert "steps 10..39: median 488,594 tokens/s, MFU 0.423, peak 42.95 GiB; last val_loss [6.269104957580566]" in text
    assert "the plain compiled PyTorch loop: not measured (bench.json has no speed rows)" in text
    assert "| zero1_bf16.json | fused | expandable_segments | 260 | 128 | 256 | 128-255 |" in text
    assert "| d12 | bf16 | True | fused | 32 | 16 | 439030 |" in text and text.endswith("## eval\n\n(not run)\n")

    # bench.json as a bench step that ended writes it: the plain loop's median over the compiled speed rows
    rows = [dict(compiled=True, loss=loss, plain_compiled=True, plain_tokens_per_s=plain, tokens_per_s=trainer)
            for loss, trainer, plain in (("fused", 439030, 469607), ("classic", 472179, 470540))]
    (report / "bench.json").write_text(json.dumps({"device": "cuda", "speed": rows}))
    assert summary.plain_compiled_tokens_per_s(report) == (469607 + 470540) / 2
    assert ("the plain compiled PyTorch loop (bench, this call): 470,074 tokens/s; the main job 1.039x\n"
            in summary.summary(report))


def test_the_summary_of_a_report_cut_short_says_what_did_not_run(tmp_path):
    summary = load_script("launch/gpu_summary.py")
    report = tmp_path / "report"
    report.mkdir()
    (report / "measure_zero1_bf16.json").write_text('{"model": "d12", "rows": [')  # cut by the step's time limit
    text = summary.summary(report)
    assert text.count("(not run)") == 6  # env, steps, the main job, pytest, bench, eval
    assert "## measure_zero1_bf16\n\nno report (see measure_zero1_bf16.log)\n" in text
    assert "zero1_bf16_muon.json)\n\n(not run: the parts main and muon make it)\n" in text


def test_the_part_muon_is_set_against_the_main_jobs_steps_it_shares(tmp_path):
    """A Muon run of steps 0..29 whose steps take 1.25x the main job's (of the stored H100 report, steps 0..39): the
    medians of the main job's steps 10..29 alone; the validation losses at the last step both validated."""
    summary = load_script("launch/gpu_summary.py")
    report = report_dir(tmp_path)
    records = [json.loads(line) for line in (report / "main" / "metrics.jsonl").read_text().splitlines()]
    muon = [dict(r, dt=r["dt"] * 1.25, tokens_per_s=r["tokens_per_s"] / 1.25) if "dt" in r else
            dict(r, val_loss=r["val_loss"] - 0.5) for r in records if r["step"] < 30]
    (report / "muon").mkdir()
    (report / "muon" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in muon))
    (report / "muon.out").write_text("bf16, ZeRO 1, BF16_Optimizer over MuonWithAuxAdam (Muon at ...), 1 rank(s) x "
                                     "micro_batch 128 x seq_len 1024 x grad_accum 4 = 524,288 tokens/step\nstep 0\n")
    adamw = [r for r in records if "dt" in r and 10 <= r["step"] <= 29]
    dt, tokens_per_s = (sorted(r[key] for r in adamw)[9:11] for key in ("dt", "tokens_per_s"))  # 20: two middles
    assert summary.muon_against_adamw(report) == (
        "## Muon against AdamW (the main job's shape, zero1_bf16_muon.json)\n\n"
        "bf16, ZeRO 1, BF16_Optimizer over MuonWithAuxAdam (Muon at ...), 1 rank(s) x micro_batch 128 x seq_len 1024 "
        "x grad_accum 4 = 524,288 tokens/step\n\n"
        f"Muon: steps 10..29: median step {sum(dt) / 2 * 1.25:.3f} s, {sum(tokens_per_s) / 2 / 1.25:,.0f} tokens/s\n"
        f"AdamW: steps 10..29: median step {sum(dt) / 2:.3f} s, {sum(tokens_per_s) / 2:,.0f} tokens/s\n"
        "Muon / AdamW: step time 1.250x, tokens/s 0.800x\n"
        "val_loss at step 29: Muon 5.8453, AdamW 6.3453\n")
    assert summary.muon_against_adamw(report) in summary.summary(report)
