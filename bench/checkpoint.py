"""Checkpoint save/load time for a model size next to this disk's raw write speed, and the conversion to
DeepSpeed's universal form (its time, its size, its load), measured in one run.

    python bench/checkpoint.py --model d12 --ds_config ds_configs/zero1_bf16.json --out_dir /tmp/ckpt_bench

Raw write: the same number of bytes as the checkpoint, written from memory with one fsync. Save: our
checkpoint.save (DeepSpeed's save_checkpoint on every rank + markers), then an fsync of its files, so
both figures end on disk. Load: checkpoint.load into the engine (files in the page cache). Checksum: the CRC-32 of
every file, as save() records it in complete.json and a resume checks it (files in the page cache): its share of the
save is checksum_vs_save (the save's time includes it once).

Convert: gpt.train.universal.universal_dir on the step just saved (DeepSpeed's ds_to_universal in this process, one
worker), then an fsync of step/universal, so it ends on disk as the save does; step/universal is removed before
each repeat's conversion, so every repeat converts anew. Universal load: gpt.train.universal.load into a second engine,
built with "checkpoint": {"load_universal": true} as the trainer builds one for a universal resume (the flag
changes DeepSpeed's load path; files in the page cache). The run_config saved here is only {"world_size": 1}:
neither the converter nor the universal load reads it (they read universal_checkpoint_info, which save() records).

The d48 (GPT-2 1.5B) figures are not measured: conversion seconds and universal bytes are extrapolated linearly
from this run's model by the ratio of parameter counts (gpt.model.model.param_count), a plan, not a measurement.
"""
import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from gpt.runtime import ranks
from gpt.train import checkpoint, engine as ds_engine, universal
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS, param_count
from gpt.train.engine import OptimizerSettings

EXTRAPOLATE_TO = "d48"  # GPT-2 1.5B


def tree_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def fsync_tree(path):
    """Every file under path on disk; returns path."""
    for file in Path(path).rglob("*"):
        if file.is_file():
            with open(file, "rb+") as f:
                os.fsync(f.fileno())
    return path


def timed(action):
    """(seconds, result) of action()."""
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def raw_write_seconds(path, nbytes):
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(memoryview(data))  # no copy inside the timing
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    os.remove(path)
    return seconds


def engines(model, config, device):
    """An engine one step in (so that the optimizer states exist), and the trainer's engine for a universal resume:
    the same model and JSON with checkpoint.load_universal set."""
    torch.manual_seed(0)
    optimizer = OptimizerSettings(lr=6e-4, weight_decay=0.1, warmup_steps=1, max_steps=10, min_lr_ratio=0.1)
    engine = ds_engine.initialize(GPT(PRESETS[model]), config, micro_batch=1, grad_accum=1, optimizer=optimizer)
    x = torch.randint(0, GPT2_VOCAB_SIZE, (1, 64), device=device)
    _, loss = engine(x, x)
    engine.backward(loss)
    engine.step()
    universal_config = {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}
    return engine, ds_engine.initialize(GPT(PRESETS[model]), universal_config, micro_batch=1, grad_accum=1,
                                        optimizer=optimizer)


def measure(engine, universal_engine, out, repeats):
    """Seconds of each measurement in each of `repeats` rounds, alternating (this disk's speed drifts between runs), and
    the checkpoint's and its universal form's bytes."""
    seconds = {name: [] for name in ("save", "load", "raw_write", "convert", "universal_load", "checksum")}
    for repeat in range(repeats):
        took, path = timed(lambda: fsync_tree(checkpoint.save(engine, out, repeat, {"step": repeat},
                                                              {"world_size": 1}, keep_last=1, keep_every=0)))
        seconds["save"].append(took)
        nbytes = tree_bytes(path)
        seconds["checksum"].append(timed(lambda: checkpoint.checksums(path, list(checkpoint.file_sizes(path))))[0])
        seconds["load"].append(timed(lambda: checkpoint.load(engine, path))[0])
        seconds["raw_write"].append(raw_write_seconds(out / "raw.bin", nbytes))
        shutil.rmtree(path / universal.UNIVERSAL, ignore_errors=True)  # a new step has none; convert anew regardless
        took, universal_path = timed(lambda: fsync_tree(universal.universal_dir(path)))
        seconds["convert"].append(took)
        universal_bytes = tree_bytes(universal_path)
        seconds["universal_load"].append(timed(lambda: universal.load(universal_engine, path))[0])
    return seconds, nbytes, universal_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="d12", choices=sorted(PRESETS))
    parser.add_argument("--ds_config", default="ds_configs/zero1_bf16.json")
    parser.add_argument("--out_dir", default="/tmp/dsgpt_ckpt_bench")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every measurement; the medians are reported")
    args = parser.parse_args()
    out = Path(args.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    device = ranks.setup_distributed()
    seconds, nbytes, universal_bytes = measure(*engines(args.model, json.loads(Path(args.ds_config).read_text()),
                                                        device), out, args.repeats)
    save_s, load_s, raw_s, convert_s, universal_load_s, checksum_s = (
        float(np.median(seconds[name])) for name in ("save", "load", "raw_write", "convert", "universal_load", "checksum"))
    params, target_params = param_count(PRESETS[args.model]), param_count(PRESETS[EXTRAPOLATE_TO])
    scale = target_params / params
    results = {"model": args.model, "ds_config": args.ds_config, "params": params, "checkpoint_bytes": nbytes,
               "repeats": args.repeats, "save_s": save_s, "load_s": load_s, "raw_write_s": raw_s,
               "save_mb_s": nbytes / save_s / 1e6, "load_mb_s": nbytes / load_s / 1e6,
               "raw_write_mb_s": nbytes / raw_s / 1e6, "save_vs_raw_write": raw_s / save_s,
               "checksum_s": checksum_s, "checksum_vs_save": checksum_s / save_s,
               "convert_s": convert_s, "universal_bytes": universal_bytes,
               "universal_vs_checkpoint_bytes": universal_bytes / nbytes, "convert_vs_save": convert_s / save_s,
               "universal_load_s": universal_load_s, **{f"all_{name}_s": v for name, v in seconds.items()}}
    planned = {f"{EXTRAPOLATE_TO}_params": target_params,
               f"{EXTRAPOLATE_TO}_convert_s_extrapolated": convert_s * scale,
               f"{EXTRAPOLATE_TO}_universal_bytes_extrapolated": round(universal_bytes * scale)}
    for name, value in results.items():
        print(f"{name:30s} {value:,.3f}" if isinstance(value, float) else f"{name:30s} {value}")  # lists as-is
    print(f"{EXTRAPOLATE_TO}: planned, extrapolated linearly from {args.model} by parameter count "
          f"(x{scale:.2f}), not measured:")
    for name, value in planned.items():
        print(f"{name:40s} {value:,.3f}" if isinstance(value, float) else f"{name:40s} {value:,}")
    results.update(planned, extrapolated_from=args.model)
    print(json.dumps(results))
    shutil.rmtree(out, ignore_errors=True)

if __name__ == "__main__":
    main()
