"""summary.md of launch/gpu_check.sh: its report directory as one page, for README, docs/ and the session note.
The main job's figures (what --micro_batch auto chose, steady tokens/s, MFU, peak memory) are set against the plain
compiled PyTorch loop that the bench step measured in the same call, and its Muon twin's step time against its own.

    python launch/gpu_summary.py REPORT_DIR > REPORT_DIR/summary.md
"""
import json
import statistics
import sys
from pathlib import Path

from gpt.memory.measure import format_report

STEADY_FROM = 10  # the main job's steps before this one compile, probe and warm up


def text(report, name):
    path = report / name
    return path.read_text() if path.exists() else "(not run)\n"


def plain_compiled_tokens_per_s(report):
    """The plain compiled loop's tokens/s from bench.json's speed rows (its median over them), or None."""
    path = report / "bench.json"
    rows = json.loads(path.read_text()).get("speed", []) if path.exists() else []
    plain = [r["plain_tokens_per_s"] for r in rows if r["plain_compiled"]]
    return statistics.median(plain) if plain else None


def records_of(out_dir):
    """The records of a run's metrics.jsonl; none if it wrote none."""
    metrics = out_dir / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def main_job(report):
    """The main job's lines: what auto chose in the run and in its resume, the resume, steps STEADY_FROM.. (median
    tokens/s and its MFU, the peak), and the ratio to the plain compiled loop."""
    records = records_of(report / "main")
    if not records:
        return "## The main job (every default)\n\n(not run)\n"
    said = [line for line in text(report, "main.out").splitlines() if "--micro_batch auto:" in line]
    said += [line for line in text(report, "main_resume.out").splitlines()  # auto there: kept, or probed again
             if "--micro_batch auto:" in line or "resumed from" in line]
    lines = ["## The main job (every default)", "", *said, ""]
    steady = sorted((r for r in records if "tokens_per_s" in r and r["step"] >= STEADY_FROM),
                    key=lambda r: r["tokens_per_s"])
    if steady:
        middle = steady[len(steady) // 2]
        val_losses = [r["val_loss"] for r in records if "val_loss" in r]
        lines.append(f"steps {min(r['step'] for r in steady)}..{max(r['step'] for r in steady)}: median "
                     f"{middle['tokens_per_s']:,.0f} tokens/s, MFU {middle.get('mfu', float('nan')):.3f}, peak "
                     f"{max(r.get('peak_alloc_gib', 0) for r in steady):.2f} GiB; last val_loss {val_losses[-1:]}")
        plain = plain_compiled_tokens_per_s(report)
        lines.append(f"the plain compiled PyTorch loop (bench, this call): {plain:,.0f} tokens/s; the main job "
                     f"{middle['tokens_per_s'] / plain:.3f}x" if plain else
                     "the plain compiled PyTorch loop: not measured (bench.json has no speed rows)")
    return "\n".join(lines) + "\n"


def muon_against_adamw(report):
    """The part muon's lines: the main job's shape under zero1_bf16_muon.json, its median step time and tokens/s
    over its steps from STEADY_FROM against the main job's (AdamW) over the same steps, as ratios; and the
    validation loss of both at Muon's last validation."""
    said = [line for line in text(report, "muon.out").splitlines() if " over " in line and "tokens/step" in line]
    lines = ["## Muon against AdamW (the main job's shape, zero1_bf16_muon.json)", "", *said, *([""] if said else [])]
    muon_records, adamw_records = records_of(report / "muon"), records_of(report / "main")
    muon = [r for r in muon_records if "dt" in r and r["step"] >= STEADY_FROM]
    adamw = [r for r in adamw_records if "dt" in r and r["step"] in {m["step"] for m in muon}]
    if not (muon and adamw):
        return "\n".join(lines + ["(not run: the parts main and muon make it)"]) + "\n"
    medians = {}
    for name, records in (("Muon", muon), ("AdamW", adamw)):
        medians[name] = statistics.median(r["dt"] for r in records), statistics.median(r["tokens_per_s"] for r in records)
        lines.append(f"{name}: steps {records[0]['step']}..{records[-1]['step']}: median step {medians[name][0]:.3f} s, "
                     f"{medians[name][1]:,.0f} tokens/s")
    lines.append(f"Muon / AdamW: step time {medians['Muon'][0] / medians['AdamW'][0]:.3f}x, "
                 f"tokens/s {medians['Muon'][1] / medians['AdamW'][1]:.3f}x")
    val = {name: {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
           for name, records in (("Muon", muon_records), ("AdamW", adamw_records))}
    common = sorted(set(val["Muon"]) & set(val["AdamW"]))
    if common:
        lines.append(f"val_loss at step {common[-1]}: Muon {val['Muon'][common[-1]]:.4f}, "
                     f"AdamW {val['AdamW'][common[-1]]:.4f}")
    return "\n".join(lines) + "\n"


def summary(report):
    parts = ["# GPU acceptance run\n\n" + text(report, "env.txt") + "\n## Steps\n\n" + text(report, "steps.txt"),
             main_job(report), muon_against_adamw(report),
             "## pytest -m gpu\n\n" + "\n".join(text(report, "pytest.txt").splitlines()[-25:]) + "\n"]
    for path in sorted(report.glob("measure_*.json")):
        try:
            parts.append(f"## {path.stem}\n\n" + format_report(json.loads(path.read_text())) + "\n")
        except (ValueError, KeyError):  # cut short: no JSON, or not all of it
            parts.append(f"## {path.stem}\n\nno report (see {path.stem}.log)\n")
    parts.append("## bench\n\n" + text(report, "bench.md") + "\n## eval\n\n" + text(report, "eval.txt"))
    if (report / "levers.md").exists():  # the part speed (bench/levers.py)
        parts.append("## speed: where a step's time goes, each lever against the default\n\n" + text(report, "levers.md"))
    return "\n".join(parts)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
