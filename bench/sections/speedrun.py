"""speedrun: tokens to a loss as speedruns count them. Per shape, the baseline is AdamW with the cosine schedule at
each learning rate of a sweep, every run the shape's full length; the target is the best final validation loss among
them. Each variant (a JSON and its flags: AdamW with wsd at the baseline's best lr, Muon with cosine, Muon with wsd)
then trains dedicated runs, each run's schedule ending at its own length; its row gives the shortest of the shape's
lengths whose final validation loss is at or below the target, searched by bisection (a longer run of the same
recipe ends no higher), and its tokens as a fraction of the baseline's. Then Muon's step time over AdamW's, steps
interleaved (sections.muon.step_time_row). The same seed, data (Shakespeare), batch and warmup everywhere; one rank in
this process, as the muon section."""
import json
from pathlib import Path

from harness import REPO, TrainerSteps, print_row, quiet, trainer_argv
from sections.muon import CONFIGS, corpus, step_time_row
from train_ds import parse
from gpt.train.evaluate import validation_loss

TITLE = ("tokens to a loss, as speedruns count them: the shortest dedicated run (its schedule ending where it stops) "
         "whose final validation loss is at or below AdamW-with-cosine's best; step time, steps interleaved")
COLUMNS = [("shape", "{}"), ("variant", "{}"), ("settings", "{}"), ("steps", "{}"), ("final_val", "{:.4f}"),
           ("target", "{:.4f}"), ("tokens_vs_baseline", "{:.2f}"), ("step_ratio", "{:.3f}")]


def config_file(tmp, dtype, variant):
    """The variant's JSON (its optimizer, "adamw" or "muon", in this dtype's twin) with its `params` set, in tmp."""
    name = CONFIGS[dtype][variant["optimizer"] == "muon"]
    config = json.loads((REPO / "ds_configs" / name).read_text())
    config["optimizer"].setdefault("params", {}).update(variant.get("params", {}))
    path = Path(tmp) / f"speedrun_{variant['name'].replace(' ', '_')}_{name}"
    path.write_text(json.dumps(config))
    return str(path)


def settings_for(data, out_dir, ds_config, shape, steps, flags):
    """The trainer's settings for one dedicated run of `steps` steps: the shape's model, batch and warmup (None: the
    trainer's default, a tenth of a short run), the variant's flags, validation at the last step alone."""
    argv = trainer_argv(data, out_dir, ds_config, shape["model"], shape["seq_len"], shape["micro_batch"],
                        shape["grad_accum"], max_steps=steps)
    argv = argv[:argv.index("--warmup_steps")] + argv[argv.index("--warmup_steps") + 2:]  # the shape's, or the default
    argv += (["--warmup_steps", str(shape["warmup"])] if shape["warmup"] is not None else []) + [
        "--val_every", str(steps), "--val_tokens", str(shape["val_tokens"])] + (
        ["--n_layer", str(shape["n_layer"])] if "n_layer" in shape else [])
    return parse(argv + [str(flag) for flag in flags])


def final_loss(settings):
    """The validation loss after a run's last step."""
    trainer = TrainerSteps(settings)
    for _ in range(settings.optimizer.max_steps):
        trainer.step()
    with quiet():
        loss = validation_loss(trainer.engine, trainer.trainer.val_set, trainer.trainer.device)
    trainer.close()
    return loss


def shortest(lengths, reaches):
    """The shortest of the sorted lengths for which reaches(length) holds, or None: bisection, reaches being
    monotone (false below some length, true from it on)."""
    low, high = 0, len(lengths)
    while low < high:
        middle = (low + high) // 2
        if reaches(lengths[middle]):
            high = middle
        else:
            low = middle + 1
    return lengths[low] if low < len(lengths) else None


def describe(variant, flags):
    """The settings column: the flags and the JSON's params a variant sets."""
    params = " ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in variant.get("params", {}).items())
    return " ".join(str(f) for f in flags) + (f" ({params})" if params else "")


def shape_rows(data, tmp, shape, dtype, baseline_lrs, variants, redraw=lambda rows: None):
    """The baseline's rows (AdamW, cosine, each lr at the shape's full length) and each variant's: every dedicated run
    it trained, its row the shortest length reaching the target. Rows are printed as their run ends and redraw(the rows
    so far) called: a run cut short keeps what it measured."""
    rows, steps = [], shape["steps"]

    def run(variant, length, flags):
        out_dir = Path(tmp) / f"speedrun_{shape['name'].replace(' ', '_')}_{len(rows)}"
        loss = final_loss(settings_for(data, out_dir, config_file(tmp, dtype, variant), shape, length, flags))
        rows.append(dict(shape=shape["name"], variant=variant["name"], settings=describe(variant, flags), steps=length,
                         final_val=loss, target=None, tokens_vs_baseline=None, step_ratio=None, shortest=False))
        print_row(rows[-1], COLUMNS)
        redraw(rows)
        return loss
    baseline = dict(name="AdamW cosine", optimizer="adamw")
    finals = {lr: run(baseline, steps, ["--lr", lr]) for lr in baseline_lrs}
    best_lr = min(finals, key=finals.get)
    target = finals[best_lr]
    for variant in variants:
        flags = list(variant.get("flags", ())) + (["--lr", best_lr] if variant.get("lr") == "baseline's" else [])
        length = shortest(shape["lengths"], lambda n: run(variant, n, flags) <= target)
        for row in rows:
            if row["variant"] == variant["name"] and row["steps"] == length:
                row.update(shortest=True, tokens_vs_baseline=length / steps)
    for row in rows:
        row["target"] = target
        if row["variant"] == baseline["name"] and row["final_val"] == target:
            row.update(shortest=True, tokens_vs_baseline=1.0)
    return rows


def measure(data, tmp, dtype, shapes, baseline_lrs, variants, corpus_kind, repeats, chart=None):
    """Every shape's rows, then the step-time row at the first shape; the final losses drawn to chart (a PNG) if
    given. The rows that answer (the baseline's best, each variant's shortest) are printed again at the end."""
    text, rows = corpus(tmp, corpus_kind, data), []

    def redraw(shape_so_far):
        if chart:
            draw(rows + shape_so_far, chart)
    for shape in shapes:
        rows += shape_rows(text, tmp, shape, dtype, baseline_lrs, variants, redraw)
    print("\nthe answers:")
    for row in rows:
        if row["shortest"]:
            print_row(row, COLUMNS)
    timing = step_time_row(data, tmp, {**shapes[0], "warmup": 1}, dtype, repeats)  # the warmup: no matter to time
    rows.append({**{name: None for name, _ in COLUMNS}, "shape": timing["shape"], "variant": timing["optimizer"],
                 "step_ratio": timing["step_ratio"], "adamw_s": timing["adamw_s"], "muon_s": timing["muon_s"]})
    return rows


def draw(rows, path):
    """One panel per shape: each recipe's final validation loss against its run's tokens (a fraction of the
    baseline's), the target dashed; the baseline's learning rates at 1.0, each variant's shortest run ringed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows if r.get("final_val") is not None))
    colours = dict(zip(dict.fromkeys(r["variant"] for r in rows if r.get("final_val") is not None),
                       ("tab:blue", "tab:cyan", "tab:orange", "tab:red", "tab:purple", "tab:green")))  # alike in each panel
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        mine = [r for r in rows if r["shape"] == shape and r.get("final_val") is not None]
        full = max(r["steps"] for r in mine if r["variant"] == mine[0]["variant"])
        for variant in dict.fromkeys(r["variant"] for r in mine):
            colour = colours[variant]
            points = sorted((r["steps"] / full, r["final_val"], r["shortest"]) for r in mine if r["variant"] == variant)
            joined = variant != mine[0]["variant"]  # the baseline's points are learning rates, not lengths
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-" if joined else "o", color=colour,
                    label=variant + ("" if joined else " (each lr)"), alpha=0.8)
            for x, y, answer in points:
                if answer:
                    ax.plot(x, y, "o", markersize=12, markerfacecolor="none", color=colour)
        target = min(r["final_val"] for r in mine if r["variant"] == mine[0]["variant"])
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:.4f}")
        ax.set_title(f"{shape}: final val loss of dedicated runs")
        ax.set_xlabel("tokens (fraction of the baseline's)")
        ax.set_xlim(0, 1.05)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
