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
