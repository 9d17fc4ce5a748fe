"""How large can batches grow: the planner's table (and chart) for GPT-2 sizes on a 32 GB V100 and an
80 GB A800/H800, ZeRO-1/2, activation checkpointing off/on, the classic and the fused loss, seq_len 1024,
8 GPUs, 524288 tokens/step, the trainer's allocator setting (expandable segments); and AdamW against DeepSpeed's
Muon on the same JSONs (model states per GPU, the largest micro-batch).

    python bench/batch_report.py --chart docs/batch_growth.png      # prints docs/memory.md's markdown table
                                                                    # and the targets for d12

Planned, not measured: model states are DeepSpeed 0.19's (tests/unit/test_plan.py), a step's activations and
loss buffers come from a fit of peaks measured on CPU, the allocator's overhead from an H100's measurements
(tests/unit/test_plan.py holds the plan against them); the context reserve is an estimate.
"""
import argparse
from pathlib import Path

from gpt.console import BadInput
from gpt.config.ds_config import load as load_ds_config
from gpt.model.loss import LOSSES
from gpt.model.model import PRESETS
from gpt.memory.muon import muon_twin
from gpt.memory.plan import GPUS, MODEL_STATE_PARTS, GiB, make_plan, per_token_bytes
from gpt.config.settings import GPT3_TOKENS_PER_STEP

REPO = Path(__file__).resolve().parents[1]
MODELS = [("d12", "124M"), ("d24", "350M"), ("d36", "774M"), ("d48", "1.5B")]
SETUPS = [("V100-32GB", "v100-32gb", "fp16"), ("A800/H800-80GB", "a800-80gb", "bf16")]


def rows(world_size=8, seq_len=1024, total_batch_tokens=GPT3_TOKENS_PER_STEP):
    for model, size in MODELS:
        for gpu_label, gpu, precision in SETUPS:
            for stage in (1, 2):
                for checkpointing in (False, True):
                    name = f"zero{stage}_{precision}{'_ckpt' if checkpointing else ''}.json"
                    row = dict(model=model, size=size, gpu=gpu_label, stage=stage, checkpointing=checkpointing,
                               config=name)
                    for loss in LOSSES:
                        try:
                            plan = make_plan(PRESETS[model], seq_len, load_ds_config(REPO / "ds_configs" / name),
                                             world_size, GPUS[gpu], total_batch_tokens, loss)
                            row[loss] = dict(max_micro_batch=plan["max_micro_batch"], micro_batch=plan["micro_batch"],
                                             grad_accum=plan["grad_accum"])
                        except BadInput:
                            row[loss] = dict(max_micro_batch=None, micro_batch=None, grad_accum=None)
                    yield row


def markdown(table):
    lines = ["| model | GPU | ZeRO | ckpt | max micro-batch, classic loss | max micro-batch, fused loss "
             "| fused: micro × accumulation (8 GPUs, 0.5M tokens) |", "|---|---|---|---|---|---|---|"]
    for r in table:
        fused = r["fused"]
        fits = f"{fused['micro_batch']} × {fused['grad_accum']}" if fused["micro_batch"] else "does not fit"
        lines.append(f"| {r['model']} ({r['size']}) | {r['gpu']} | {r['stage']} | {'on' if r['checkpointing'] else 'off'} "
                     f"| {r['classic']['max_micro_batch'] or '—'} | {fused['max_micro_batch'] or '—'} | {fits} |")
    return "\n".join(lines)


def muon_rows(world_size=8, seq_len=1024, total_batch_tokens=GPT3_TOKENS_PER_STEP):
    """AdamW and Muon on each JSON without checkpointing, fused loss: (model, size, GPU, stage, {optimizer: plan})."""
    for model, size in MODELS:
        for gpu_label, gpu, precision in SETUPS:
            for stage in (1, 2):
                adamw = load_ds_config(REPO / "ds_configs" / f"zero{stage}_{precision}.json")
                plans = {}
                for optimizer, ds_config in (("AdamW", adamw), ("Muon", muon_twin(adamw))):
                    try:
                        plans[optimizer] = make_plan(PRESETS[model], seq_len, ds_config, world_size, GPUS[gpu],
                                                     total_batch_tokens)
                    except BadInput:
                        plans[optimizer] = None
                yield model, size, gpu_label, stage, plans


def muon_markdown(table):
    lines = ["| model | GPU | ZeRO | model states per GPU, AdamW → Muon (GiB) | max micro-batch, AdamW → Muon |",
             "|---|---|---|---|---|"]

    def states(plan):
        return f"{sum(plan['bytes'][k] for k in MODEL_STATE_PARTS if k in plan['bytes']) / GiB:.2f}" if plan else "—"

    for model, size, gpu, stage, plans in table:
        adamw, muon = plans["AdamW"], plans["Muon"]
        lines.append(f"| {model} ({size}) | {gpu} | {stage} | {states(adamw)} → {states(muon)} "
                     f"| {adamw and adamw['max_micro_batch'] or '—'} → {muon and muon['max_micro_batch'] or '—'} |")
    return "\n".join(lines)


def targets(seq_len=1024):
    """The targets for d12 (docs/memory.md), one GPU, T=1024, as planned: (what, planned, target, met)."""
    d12 = PRESETS["d12"]

    def max_micro_batch(config, gpu):
        return make_plan(d12, seq_len, load_ds_config(REPO / "ds_configs" / config), 1, GPUS[gpu],
                         GPT3_TOKENS_PER_STEP)["max_micro_batch"]

    per_sequence = per_token_bytes(d12, "bf16", False, "fused") * seq_len / GiB
    fits_80gb, fits_v100 = max_micro_batch("zero1_bf16.json", "h100-80gb"), max_micro_batch("zero2_fp16.json", "v100-32gb")
    return [("memory per sequence, fused loss, bf16 (GiB)", round(per_sequence, 3), "<= 0.35", per_sequence <= 0.35),
            ("max micro-batch, zero1_bf16, 80 GB (measured on an H100, compiled, 2026-11-27: 244 fits, 256 not)", fits_80gb, ">= 200", fits_80gb >= 200),
            ("max micro-batch, zero2_fp16, V100-32GB (measured on an H100 capped to 31.75 GiB, compiled, 2026-11-27: 83 fits, 128 not)", fits_v100, ">= 70", fits_v100 >= 70)]


def chart(table, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (gpu_label, _, _) in zip(axes, SETUPS):
        series = [(stage, ckpt) for stage in (1, 2) for ckpt in (False, True)]
        width = 0.2
        for i, (stage, ckpt) in enumerate(series):
            values = [next(r["fused"]["max_micro_batch"] or 0 for r in table if r["model"] == m and r["gpu"] == gpu_label
                           and r["stage"] == stage and r["checkpointing"] == ckpt) for m, _ in MODELS]
            ax.bar([x + (i - 1.5) * width for x in range(len(MODELS))], values, width,
                   label=f"ZeRO-{stage}, checkpointing {'on' if ckpt else 'off'}")
        ax.set_xticks(range(len(MODELS)), [f"{m}\n{s}" for m, s in MODELS])
        ax.set_title(f"{gpu_label}, T=1024, 8 GPUs, fused loss (planned)")
        ax.set_yscale("log", base=2)
    axes[0].set_ylabel("largest micro-batch that fits")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chart", help="write the PNG chart here (needs matplotlib)")
    args = parser.parse_args()
    table = list(rows())
    print(markdown(table))
    print("\nAdamW against Muon, checkpointing off, fused loss (planned)\n" + muon_markdown(list(muon_rows())))
    print("\nd12, 1 GPU, T=1024, fused loss, expandable segments (planned) | target")
    for what, planned, target, met in targets():
        print(f"  {what}: {planned} | {target} {'met' if met else 'MISSED'}")
    if args.chart:
        chart(table, args.chart)


if __name__ == "__main__":
    main()
