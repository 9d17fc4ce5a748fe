"""Training speed and memory on this machine, CPU or GPU (DeepSpeed's accelerator). Every figure is a
ratio against a baseline measured in the same run, steps interleaved (machines are noisy):

  overhead  the trainer's step (gpt.train.trainer.Trainer.step, DeepSpeed engine) / a plain PyTorch
            AdamW step: same model, initial weights, data and dtype, 1 process; on a GPU also both
            under torch.compile
  mfu       model FLOP/s (6N + attention, per token) / the peak: on CPU this CPU's matmul peak, measured
            here; on a GPU the datasheet's (gpt.config.hardware.GPU_PEAK_FLOPS)
  zero      ZeRO 0/1/2 on 2 ranks (deepspeed launcher): step time, per-rank model-state bytes
            (measured on the engine, and as the planner predicts them)
  ckpt      activation checkpointing: step-time ratio, activation bytes saved
  allocator the trainer step with glibc's default malloc vs freed memory kept in the heap (--full)
  compile   torch.compile on/off: first-step (compile) time, steady step-time ratio (--full)
  loss      which kernel --loss fused should mean: each fused kernel (liger where it can run, the
            chunked PyTorch path) and the classic loss at a fixed micro-batch (64 on a GPU) and at --micro_batch
            auto's choice, every row the same tokens/step (compiled on a GPU): tokens/s, peak memory, and the
            ratio to the classic loss's best over micro-batches doubling up to its first out-of-memory; a
            verdict line names the fastest fused kernel and whether it meets that target
  speed     the trainer's tokens/s and MFU, eager and compiled, --loss fused and classic, each against the
            same plain PyTorch loop (compiled where the mode compiles), built once, steps interleaved; on a GPU
            d12, T=1024, 0.5M tokens/step
  deterministic  what --deterministic costs: train_ds.py without and with it in fresh processes, alternating
            (ABAB: the setting is process-global), eager; the median per-step dt from each run's metrics.jsonl
  optimizer which Adam the JSONs name: the trainer's step and the optimizer's own step with torch's AdamW (fused,
            foreach, per-tensor loop; through DeepSpeed's torch_adam) and DeepSpeed's FusedAdam, against the default
  muon      DeepSpeed's Muon against AdamW (bench/sections/muon.py): per shape, AdamW at each lr and Muon at each
            muon_lr from the same seed, data (Shakespeare) and batch; the steps and tokens Muon needs to reach AdamW's
            final validation loss at its best lr; Muon's step time over AdamW's, interleaved. --chart draws the curves
  speedrun  tokens to a loss as speedruns count them (bench/sections/speedrun.py): the target is AdamW-with-cosine's
            best final validation loss over its lr sweep; per recipe (AdamW with wsd, Muon with cosine, the shipped
            Muon with wsd) the shortest dedicated run, its schedule ending where it stops, at or below it, in tokens
            as a fraction of the baseline's; the demo's shape and d4 for 300 steps. --chart draws the final losses
  start     seconds from launching train_ds.py (2 ranks, the CPU demo's shape) to its first step with an empty
            torch extensions directory (cold) and again (warm); with --full also FusedAdam's, whose build cold pays

    python bench/train.py                      # quick: tiny + d12 at 1024 tokens/step (< 3 min); on a GPU
                                               #   d12 at 131k tokens/step, eager and compiled
    python bench/train.py --full               # d12 at 4096 tokens/step, ZeRO on d12, allocator, compile, loss,
                                               #   speed, deterministic (~25 min); on a GPU every GPU section
    python bench/train.py --only zero ckpt     # some sections
    python bench/train.py --only loss speed deterministic  # on a GPU: d12 at 0.5M tokens/step
    python bench/train.py --only speed --modes compiled  # its compiled rows alone (launch/gpu_check.sh)
    python bench/train.py --only optimizer start   # which Adam, and a cold start against a warm one (~2 min on CPU)
    python bench/train.py --smoke              # overhead, zero, ckpt once on the tiny model (tests/unit/test_bench.py)
    python bench/train.py --smoke --only loss speed deterministic  # those once on the tiny model, eager (tests too)
    python bench/train.py --only muon --chart docs/muon_curves.png  # Muon vs AdamW at the demo's shape (~10 min)
    python bench/train.py --full --only muon --chart docs/muon_curves.png  # and d4 / 8 layers for 200 steps
    python bench/train.py --only speedrun --chart docs/speedrun.png  # the demo's shape and d4 x 300 steps (hours)
    python bench/train.py --json bench.json    # also write the results as JSON (after each section)

This file is the entry: the modes, the command line, the order of the sections. Each section is a module of
bench/sections/ (its table's COLUMNS and measure(...)); what they share, the trainer stepped as train_ds.py builds it and
the plain loop, is bench/harness.py.
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

import sections.allocator
import sections.ckpt
import sections.compile
import sections.deterministic
import sections.loss
import sections.muon
import sections.optimizer
import sections.overhead
import sections.speed
import sections.speedrun
import sections.start
import sections.zero
from harness import DEVICE, peaks_for, print_header, synthetic_shards, usable_dtypes
from gpt.model.loss import kernel_for

SECTIONS = ["overhead", "zero", "ckpt", "allocator", "compile", "loss", "speed", "deterministic", "optimizer", "start",
            "muon", "speedrun"]
CPU_ONLY_SECTIONS = {"zero", "allocator"}  # 2 ranks on one machine's cores; glibc's malloc
# What each mode measures: overhead rows (model, seq_len, micro_batch, grad_accum), in `dtypes`, eager and,
# where `overhead_compile` says so, compiled; zero, ckpt, allocator, compile (model, seq_len, micro_batch[, dtypes]);
# loss, speed, deterministic: the keyword arguments of measure_loss, measure_speed, measure_deterministic (`repeats`
# there overrides the mode's); `sections` run unless --only names others (`full_sections` with --full on a GPU).
# On CPU `peak_max_size` bounds the measured matmul peak. muon: sections.muon.measure's keyword arguments.
# The CPU demo's shape (launch/cpu_demo.sh: d4, T=256, 2048 tokens/step, 60 steps, warmup 6, --lr 3e-3), validation
# every 5 steps on its 16384 tokens; and two longer horizons, d4 and an 8-layer d4, 200 steps.
DEMO = dict(name="demo d4 60 steps", model="d4", seq_len=256, micro_batch=4, grad_accum=2, steps=60, warmup=6,
            val_every=5, val_tokens=16384)
LONGER = [{**DEMO, "name": "d4 200 steps", "steps": 200, "warmup": 20, "val_every": 10},
          {**DEMO, "name": "8 layers 200 steps", "n_layer": 8, "steps": 200, "warmup": 20, "val_every": 10}]
# AdamW's sweep reaches below the demo's 3e-3: at its shape 1.5e-3 ended lower (6.37 against 6.49, 2026-11-29)
MUON_LRS = dict(adamw_lrs=(7.5e-4, 1.5e-3, 3e-3, 6e-3), muon_lrs=(0.01, 0.02, 0.04), adam_lr=3e-3,
                corpus_kind="shakespeare")
# speedrun: the baseline is AdamW with cosine at the muon section's learning rates, each run the shape's full length;
# each variant trains dedicated runs at the shape's lengths. Muon's: the twin's JSON as shipped (its muon_lr, adam_lr and
# weight_decay, no --lr), with cosine and with wsd (its default cooldown: linear over the last half, to 0.1x).
# Each dedicated run warms up as the trainer does by default (a tenth of a short run: 6 steps at 60, 2 at 25) at the
# demo's shape; over 20 steps at 300 steps' shape (the muon section's longer horizons).
SPEEDRUN_SHAPES = [{**DEMO, "warmup": None, "lengths": (20, 25, 30, 35, 40, 50, 60)},
                   {**DEMO, "name": "d4 300 steps", "steps": 300, "warmup": 20,
                    "lengths": (75, 90, 105, 120, 135, 150, 180, 240, 300)}]
# at 300 steps AdamW's best lr is lower than at 60 (7.5e-4 ended at 5.6222, 1.5e-3 at 5.6473): the sweep goes below it
SPEEDRUN = dict(baseline_lrs=(3.75e-4, *MUON_LRS["adamw_lrs"]), corpus_kind="shakespeare", variants=[
    dict(name="AdamW wsd", optimizer="adamw", lr="baseline's", flags=("--lr_schedule", "wsd")),
    dict(name="Muon cosine", optimizer="muon"), dict(name="Muon wsd (shipped)", optimizer="muon",
                                                     flags=("--lr_schedule", "wsd"))])
MODES = {
    "quick": dict(overhead=[("tiny", 256, 8, 1), ("d12", 1024, 1, 1)], zero=("d4", 256, 4),
                  ckpt=("d12", 1024, 1, ("bf16",)), allocator=("d4", 256, 8), compile=("d4", 256, 8),
                  loss=dict(model="d4", seq_len=256, sequences=8, micro_batch=4, sweep_from=1, compile=False),
                  speed=dict(model="d4", seq_len=256, micro_batch=4, grad_accum=2, compiles=(False,)),
                  deterministic=dict(model="d4", seq_len=256, micro_batch=4, grad_accum=1, steps=6, rounds=2),
                  optimizer=("d4", 256, 4), start=dict(rounds=2), muon=dict(shapes=[DEMO], **MUON_LRS),
                  speedrun=dict(shapes=SPEEDRUN_SHAPES, **SPEEDRUN), repeats=4, peak_max_size=2048,
                  sections=["overhead", "zero", "ckpt"]),
    "full": dict(overhead=[("tiny", 256, 16, 2), ("d12", 1024, 2, 2)], zero=("d12", 1024, 1),
                 ckpt=("d12", 1024, 2, ("fp32", "bf16")), allocator=("d4", 256, 8), compile=("d4", 256, 8),
                 loss=dict(model="d4", seq_len=256, sequences=32, micro_batch=8, sweep_from=1, compile=False),
                 speed=dict(model="d4", seq_len=256, micro_batch=8, grad_accum=2, compiles=(False, True)),
                 deterministic=dict(model="d4", seq_len=256, micro_batch=8, grad_accum=2, steps=8, rounds=2),
                 optimizer=("d12", 256, 4), start=dict(rounds=3, fused_adam=True),
                 muon=dict(shapes=[DEMO] + LONGER, **MUON_LRS), speedrun=dict(shapes=SPEEDRUN_SHAPES, **SPEEDRUN),
                 repeats=6, peak_max_size=4096,
                 sections=SECTIONS[:-2]),  # the muon and speedrun sections (~1 h each on 2 cores) only when named
    # each section's code path once on the tiny model, for tests/unit/test_bench.py: the figures mean nothing. loss, speed
    # and deterministic only when named with --only (a test of their own), and eager: compiling takes ~60 s on 2 cores
    "smoke": dict(overhead=[("tiny", 64, 4, 1)], zero=("tiny", 64, 4), ckpt=("tiny", 64, 4, ("bf16",)),
                  allocator=("tiny", 64, 4), compile=("tiny", 64, 4),
                  loss=dict(model="tiny", seq_len=64, sequences=2, micro_batch=1, sweep_from=1, compile=False),
                  speed=dict(model="tiny", seq_len=64, micro_batch=2, grad_accum=2, compiles=(False,)),
                  deterministic=dict(model="tiny", seq_len=64, micro_batch=2, grad_accum=1, steps=3, rounds=1),
                  optimizer=("tiny", 64, 4), start=dict(rounds=1),
                  muon=dict(shapes=[dict(name="tiny", model="tiny", seq_len=64, micro_batch=2, grad_accum=2, steps=4,
                                         warmup=1, val_every=2, val_tokens=128)],
                            adamw_lrs=(3e-3,), muon_lrs=(0.02,), adam_lr=3e-3, corpus_kind="synthetic"),
                  speedrun=dict(shapes=[dict(name="tiny", model="tiny", seq_len=64, micro_batch=2, grad_accum=2, steps=4,
                                             warmup=1, val_tokens=128, lengths=(2, 4))],
                                baseline_lrs=(3e-3,), variants=SPEEDRUN["variants"], corpus_kind="synthetic"),
                  repeats=1, peak_max_size=256, sections=["overhead", "zero", "ckpt"]),
    # one GPU (quick or --full there): d12 at 131k tokens/step, bf16, the trainer and the plain loop each
    # eager and compiled (0.31 eager, 0.42 compiled MFU on an H100 at 524k tokens/step, 2026-11-22).
    # loss, speed, deterministic at d12, T=1024, few repeats: compiling each shape takes most of the time.
    # loss: the classic sweep from 32 (d12's classic loss fit 76 sequences eagerly on an H100, so 128 is its
    # out-of-memory); speed: micro-batch 32 so that the trainer and the plain loop fit side by side on 80 GB,
    # compiled first (the default with CUDA: the rows a run cut short by its time limit should have printed).
    "gpu": dict(overhead=[("d12", 1024, 32, 4)], dtypes=("bf16",), overhead_compile=(False, True),
                ckpt=("d12", 1024, 32, ("bf16",)), compile=("d12", 1024, 32),
                loss=dict(model="d12", seq_len=1024, sequences=512, micro_batch=64, sweep_from=32, compile=True,
                          repeats=2),
                speed=dict(model="d12", seq_len=1024, micro_batch=32, grad_accum=16, compiles=(True, False), repeats=3),
                deterministic=dict(model="d12", seq_len=1024, micro_batch=32, grad_accum=4, steps=8, rounds=2),
                optimizer=("d12", 1024, 32), start=dict(rounds=1, fused_adam=True), muon=dict(shapes=[DEMO], **MUON_LRS),
                speedrun=dict(shapes=SPEEDRUN_SHAPES, **SPEEDRUN), repeats=5, sections=["overhead"],
                full_sections=["overhead", "ckpt", "compile", "loss", "speed", "deterministic", "optimizer", "start"]),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="larger batches, more steps, every section")
    parser.add_argument("--smoke", action="store_true",
                        help="each section's code once on the tiny model (for tests): overhead, zero, ckpt "
                             "unless --only names others")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--chart", help="the muon section's validation curves or the speedrun section's final losses, "
                                        "drawn here (a PNG)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS,
                        help="run only these sections")
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"),
                        help="the step modes the overhead and speed sections measure (default: the mode's, eager on "
                             "CPU, both on a GPU); launch/gpu_check.sh: compiled, the step a run takes on a GPU")
    # the ZeRO worker's own arguments (the script re-launches itself on 2 ranks)
    parser.add_argument("--zero_worker", help=argparse.SUPPRESS)
    parser.add_argument("--allocator_worker", help=argparse.SUPPRESS)
    for name in ("data", "tmp", "model"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("seq_len", "micro_batch", "repeats", "local_rank"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args()


def main():
    args = parse_args()
    if args.zero_worker:
        return sections.zero.worker(args)
    if args.allocator_worker:
        return sections.allocator.worker(args)
    mode = "smoke" if args.smoke else "full" if args.full else "quick"
    if DEVICE == "cuda" and mode != "smoke":
        mode = "gpu"
    settings = with_modes(MODES[mode], args.modes)
    chosen = set(args.only or settings["full_sections" if args.full and "full_sections" in settings else "sections"])
    if DEVICE == "cuda" and chosen & CPU_ONLY_SECTIONS:
        print(f"skipping {', '.join(sorted(chosen & CPU_ONLY_SECTIONS))}: CPU only (2 ranks on one machine's "
              f"cores, glibc's malloc)")
        chosen -= CPU_ONLY_SECTIONS
    usable, bf16_skipped = usable_dtypes()
    if bf16_skipped:
        print(bf16_skipped)
    started = time.perf_counter()
    results = {"device": DEVICE, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "mode": mode,
               "bf16_skipped": bf16_skipped}

    def save():  # after each section: a run cut short keeps what it measured
        results["seconds"] = time.perf_counter() - started
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        runs = section_runs(settings, usable, synthetic_shards(Path(tmp)), tmp, results, args.chart)
        save()
        for section in SECTIONS:
            if section in chosen:
                title, columns, run = runs[section]
                print_header(title, columns)
                results.update(run())
                save()
    print(f"\n{results['seconds']:.0f} s")


def with_modes(settings, modes):
    """A mode's settings with its overhead and speed sections measuring `modes` (eager, compiled) alone, each in
    the order the mode gives them; unchanged when None."""
    if not modes:
        return settings
    wanted = {mode == "compiled" for mode in modes}
    ordered = lambda given: tuple(c for c in given if c in wanted) + tuple(sorted(wanted - set(given)))
    return {**settings, "overhead_compile": ordered(settings.get("overhead_compile", (False,))),
            "speed": {**settings["speed"], "compiles": ordered(settings["speed"]["compiles"])}}


def print_peaks(peaks):
    where = torch.cuda.get_device_name() + " datasheet" if DEVICE == "cuda" else \
        f"this CPU ({torch.get_num_threads()} threads), measured"
    print(f"matmul peak on {where}: "
          + ", ".join(f"{d} {p / 1e12:.3f} TFLOP/s" if p else f"{d} unknown" for d, p in peaks.items()))


def section_runs(settings, usable, data, tmp, results, chart=None):
    """section -> (title, columns, what it adds to the results) in this mode's settings, in the order they run;
    measures the matmul peaks first (into results). chart: where the muon section draws its curves."""
    def only_usable(dtypes):  # a section meant for bf16 alone measures fp32 instead where bf16 is skipped
        return tuple(d for d in dtypes if d in usable) or ("fp32",)
    dtypes = only_usable(settings.get("dtypes", usable))
    repeats = settings["repeats"]
    peaks = peaks_for(dtypes, settings)
    results["matmul_peak_flops"] = peaks
    print_peaks(peaks)

    def keywords(section):  # a section's keyword arguments in this mode, the mode's repeats unless it sets its own
        return {"repeats": repeats, **settings[section]}
    speed_variants = " and ".join("compiled" if c else "eager" for c in settings["speed"]["compiles"])
    speed_plain = "compiled " if any(settings["speed"]["compiles"]) else ""
    fused_kernel = kernel_for("fused", DEVICE, dtypes[-1]).label
    return {
        "overhead": ("trainer step vs plain PyTorch AdamW step (1 process); MFU against the matmul peak",
                     sections.overhead.COLUMNS, lambda: {"overhead": sections.overhead.measure(
                         data, tmp, settings["overhead"], dtypes, settings.get("overhead_compile", (False,)),
                         repeats, peaks)}),
        "zero": ("ZeRO stages, 2 ranks: step time and per-rank model-state bytes", sections.zero.COLUMNS,
                 lambda: {"zero": sections.zero.measure(data, tmp, *settings["zero"], dtypes, repeats)}),
        "ckpt": ("activation checkpointing: step time and activation bytes, off vs on", sections.ckpt.COLUMNS,
                 lambda: {"ckpt": sections.ckpt.measure(data, tmp, *settings["ckpt"][:3],
                                                        only_usable(settings["ckpt"][3]), repeats)}),
        "allocator": ("CPU allocator: trainer step with glibc's default malloc vs freed memory kept in the heap",
                      sections.allocator.COLUMNS,
                      lambda: {"allocator": sections.allocator.measure(tmp, *settings["allocator"], dtypes[-1], repeats)}),
        "compile": (f"torch.compile (inductor, {DEVICE}): compile time and steady step time", sections.compile.COLUMNS,
                    lambda: {"compile": sections.compile.measure(data, tmp, *settings["compile"], dtypes, repeats)}),
        "loss": ("the kernel behind --loss fused: each fused kernel and the classic loss at a fixed micro-batch "
                 "and at --micro_batch auto's, against the classic loss's best micro-batch (tokens/s, peak memory)",
                 sections.loss.COLUMNS, lambda: dict(zip(("loss", "loss_verdict"),
                                                         sections.loss.measure(data, tmp, dtypes[-1], **keywords("loss"))))),
        "speed": (f"the trainer's tokens/s and MFU, {speed_variants}, --loss fused ({fused_kernel} here) and "
                  f"classic, against one plain {speed_plain}PyTorch loop, steps interleaved",
                  sections.speed.COLUMNS,
                  lambda: {"speed": sections.speed.measure(data, tmp, dtypes[-1], peaks, **keywords("speed"))}),
        "deterministic": ("--deterministic's cost: median step time of train_ds.py without and with it, fresh "
                          "processes alternating", sections.deterministic.COLUMNS,
                          lambda: {"deterministic": sections.deterministic.measure(data, tmp, dtypes[-1],
                                                                                   **settings["deterministic"])}),
        "optimizer": (sections.optimizer.TITLE, sections.optimizer.COLUMNS, lambda: {
            "optimizer": sections.optimizer.measure(data, tmp, *settings["optimizer"], dtypes, repeats)}),
        "start": (sections.start.TITLE, sections.start.COLUMNS,
                  lambda: {"start": sections.start.measure(data, tmp, dtypes[-1], **settings["start"])}),
        "muon": (sections.muon.TITLE, sections.muon.COLUMNS, lambda: {"muon": sections.muon.measure(
            data, tmp, dtypes[-1], repeats=repeats, chart=chart, **settings["muon"])}),
        "speedrun": (sections.speedrun.TITLE, sections.speedrun.COLUMNS, lambda: {"speedrun": sections.speedrun.measure(
            data, tmp, dtypes[-1], repeats=repeats, chart=chart, **settings["speedrun"])}),
    }


if __name__ == "__main__":
    main()
