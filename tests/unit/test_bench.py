"""bench/train.py's loss and speedrun sections, bookkeeping only: stand-ins for the trainer and --micro_batch auto (their
runs: tests/integration/test_bench_runs.py)."""
import json
import sys
from pathlib import Path

from common import REPO, load_script
from gpt.model.loss import loss_problem


def bench_script(monkeypatch, path):
    """A bench/ script or section as a module, bench/ on sys.path as when it runs (its siblings: harness, sections)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    for name in [name for name in sys.modules if name == "harness" or name.split(".")[0] == "sections"]:
        monkeypatch.delitem(sys.modules, name)
    return load_script(path)


def test_loss_section_sweep_out_of_memory_and_verdict(tmp_path, monkeypatch, capsys):
    """The loss section's bookkeeping at the GPU's sizes (fixed 64, sweep from 32, 512 sequences per step), with
    stand-ins for the trainer and --micro_batch auto: the classic sweep ends at its first out-of-memory, a size
    past it that auto picked is reported out of memory without a run, and the verdict names the fastest fused
    kernel against the classic loss's best and its memory against the classic loss's at the fixed size."""
    bench = bench_script(monkeypatch, "bench/sections/loss.py")
    runs = []

    def throughput(settings, repeats):
        runs.append((settings.model.loss, settings.data.micro_batch, settings.data.total_batch_tokens))
        if settings.model.loss == "classic" and settings.data.micro_batch >= 64:
            return dict(tokens_per_s=None, note="out of memory")
        return dict(tokens_per_s={"classic": 100.0, "chunked": 90.0}[settings.model.loss] + settings.data.micro_batch / 16,
                    peak_rss_gib=settings.data.micro_batch / 4)
    monkeypatch.setattr(bench, "trainer_throughput", throughput)
    monkeypatch.setattr(bench, "auto_micro_batch", lambda settings: {"classic": 128, "chunked": 256}[settings.model.loss])
    rows, verdict = bench.measure(tmp_path, tmp_path, "fp32", "d12", 1024, sequences=512, micro_batch=64,
                                       sweep_from=32, compile=True, repeats=1)
    assert runs == [("classic", 32, 524288), ("classic", 64, 524288), ("chunked", 64, 524288),
                    ("chunked", 256, 524288)]
    assert [(r["loss"], r["micro_batch"], r["grad_accum"], r["picked_by"], r["tokens_per_s"], r["note"])
            for r in rows] == [
        ("classic", 32, 16, "sweep", 102.0, None), ("classic", 64, 8, "sweep, fixed", None, "out of memory"),
        ("classic", 128, 4, "sweep, auto", None, "out of memory (micro-batch 64 was)"),
        ("chunked", 64, 8, "fixed", 94.0, None), ("chunked", 256, 2, "auto", 106.0, None),
        ("liger", None, None, None, None, f"skipped: {loss_problem('liger', 'cpu', 'fp32')}")]
    assert [r["ratio_to_classic_best"] for r in rows if r["loss"] == "chunked"] == [94 / 102, 106 / 102]
    assert verdict["fastest"] == "chunked" and verdict["meets_target"] and verdict["keeps_memory_gain"]
    assert verdict["line"] == (
        "verdict: the fastest fused kernel is chunked: 106 tokens/s at micro-batch 256, 1.039x the classic loss's "
        "best (102 at micro-batch 32): meets the target (>= the classic loss's best); peak_rss_gib at micro-batch "
        "64: chunked 16.00 GiB, the classic loss out of memory (keeps the memory gain)")
    assert verdict["line"] in capsys.readouterr().out


def test_modes_choose_the_eager_and_compiled_rows_of_the_overhead_and_speed_sections(monkeypatch):
    """--modes compiled (launch/gpu_check.sh) keeps a GPU's compiled rows alone; --modes eager on a GPU, or
    compiled on CPU, measures that mode only; both keep the mode's order; other sections are untouched."""
    bench = bench_script(monkeypatch, "bench/train.py")
    gpu, quick = bench.MODES["gpu"], bench.MODES["quick"]
    assert bench.with_modes(gpu, None) is gpu
    assert (gpu["overhead_compile"], gpu["speed"]["compiles"]) == ((False, True), (True, False))
    for settings, modes, overhead, speed in [
            (gpu, ["compiled"], (True,), (True,)), (gpu, ["eager"], (False,), (False,)),
            (gpu, ["compiled", "eager"], (False, True), (True, False)), (quick, ["compiled"], (True,), (True,)),
            (quick, ["compiled", "eager", "compiled"], (False, True), (False, True))]:
        chosen = bench.with_modes(settings, modes)
        assert (chosen["overhead_compile"], chosen["speed"]["compiles"]) == (overhead, speed), modes
        others = lambda given: {key: value for key, value in given.items() if key not in ("overhead_compile", "speed")}
        assert others(chosen) == others(settings)
        assert {**chosen["speed"], "compiles": None} == {**settings["speed"], "compiles": None}


def test_speedrun_section_finds_each_recipes_shortest_dedicated_run(tmp_path, monkeypatch, capsys):
    """The speedrun section's bookkeeping, a stand-in for the runs (final loss = 10 - slope x steps): the target is
    the baseline's best final loss over its learning rates at the full length; each variant's dedicated runs are
    found by bisection over the lengths, its answer the shortest at or below the target (None where none is), as a
    fraction of the baseline's tokens; a variant asking for the baseline's lr gets its best one."""
    bench = bench_script(monkeypatch, "bench/sections/speedrun.py")
    runs = []
    slopes = {("adamw", 1e-3): 0.03, ("adamw", 2e-3): 0.05, ("adamw", 4e-3): 0.04, ("muon", 3e-3): 0.1,
              ("muon", 1e-3): 0.01}

    def final_loss(settings):
        optimizer = "muon" if "muon" in settings.run.ds_config else "adamw"
        runs.append((optimizer, settings.optimizer.lr, settings.optimizer.max_steps, settings.optimizer.min_lr_ratio))
        return 10 - slopes[optimizer, settings.optimizer.lr] * settings.optimizer.max_steps
    monkeypatch.setattr(bench, "final_loss", final_loss)
    shape = dict(name="demo", model="tiny", seq_len=64, micro_batch=2, grad_accum=2, steps=60, warmup=2,
                 val_tokens=128, lengths=(20, 25, 30, 35, 40, 50, 60))
    variants = [dict(name="AdamW to 0", optimizer="adamw", lr="baseline's", flags=("--min_lr_ratio", 0)),
                dict(name="Muon", optimizer="muon", params={"muon_lr": 0.03}, flags=("--lr", 3e-3)),
                dict(name="Muon slow", optimizer="muon", flags=("--lr", 1e-3))]
    rows = bench.shape_rows(tmp_path, tmp_path, shape, "fp32", (1e-3, 2e-3, 4e-3), variants)
    assert runs == [("adamw", 1e-3, 60, 0.1), ("adamw", 2e-3, 60, 0.1), ("adamw", 4e-3, 60, 0.1),
                    ("adamw", 2e-3, 35, 0.0), ("adamw", 2e-3, 50, 0.0), ("adamw", 2e-3, 60, 0.0),  # 7.0 at 60 steps
                    ("muon", 3e-3, 35, 0.1), ("muon", 3e-3, 25, 0.1), ("muon", 3e-3, 30, 0.1),  # 7.0 at 30 steps
                    ("muon", 1e-3, 35, 0.1), ("muon", 1e-3, 50, 0.1), ("muon", 1e-3, 60, 0.1)]  # never
    assert {r["target"] for r in rows} == {7.0}
    assert [(r["variant"], r["steps"], r["tokens_vs_baseline"]) for r in rows if r["shortest"]] == [
        ("AdamW cosine", 60, 1.0), ("AdamW to 0", 60, 1.0), ("Muon", 30, 0.5)]
    assert rows[6]["settings"] == "--lr 0.003 (muon_lr 0.03)"
    muon_json = json.loads(Path(bench.config_file(tmp_path, "fp32", variants[1])).read_text())
    assert muon_json["optimizer"]["type"] == "Muon" and muon_json["optimizer"]["params"]["muon_lr"] == 0.03
