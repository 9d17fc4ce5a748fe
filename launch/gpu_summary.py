"""summary.md of launch/gpu_check.sh: its report directory as one page, for README, docs/ and the session note.
The main job's figures (what --micro_batch auto chose, steady tokens/s, MFU, peak memory) are set against the plain
compiled PyTorch loop that the bench step measured in the same call.

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


def main_job(report):
    """The main job's lines: what auto chose in the run and in its resume, the resume, steps STEADY_FROM.. (median
    tokens/s and its MFU, the peak), and the ratio to the plain compiled loop."""
    metrics = report / "main" / "metrics.jsonl"
    if not metrics.exists():
        return "## The main job (every default)\n\n(not run)\n"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
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


def summary(report):
    parts = ["# GPU acceptance run\n\n" + text(report, "env.txt") + "\n## Steps\n\n" + text(report, "steps.txt"),
             main_job(report),
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
