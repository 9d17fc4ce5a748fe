"""Checkpoint save/load time for a model size next to this disk's raw write speed, measured in one run.

    python bench/checkpoint.py --model d12 --ds_config ds_configs/zero1_bf16.json --out_dir /tmp/ckpt_bench

Raw write: the same number of bytes as the checkpoint, written from memory with one fsync. Save: our
checkpoint.save (DeepSpeed's save_checkpoint on every rank + markers), then an fsync of its files, so
both figures end on disk. Load: checkpoint.load into the engine (files in the page cache).
"""
import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from gpt import checkpoint
from gpt import dist as gpt_dist
from gpt import engine as ds_engine
from gpt.model import GPT, GPT2_VOCAB_SIZE, PRESETS
from gpt.optim import OptimizerSettings

REPEATS = 3


def fsync_tree(path):
    for file in Path(path).rglob("*"):
        if file.is_file():
            with open(file, "rb+") as f:
                os.fsync(f.fileno())


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="d12", choices=sorted(PRESETS))
    parser.add_argument("--ds_config", default="ds_configs/zero1_bf16.json")
    parser.add_argument("--out_dir", default="/tmp/dsgpt_ckpt_bench")
    args = parser.parse_args()
    out = Path(args.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    device = gpt_dist.setup_distributed()
    config = json.loads(Path(args.ds_config).read_text())
    torch.manual_seed(0)
    optimizer = OptimizerSettings(lr=6e-4, weight_decay=0.1, warmup_steps=1, max_steps=10, min_lr_ratio=0.1)
    engine = ds_engine.initialize(GPT(PRESETS[args.model]), config, micro_batch=1, grad_accum=1, optimizer=optimizer)
    x = torch.randint(0, GPT2_VOCAB_SIZE, (1, 64), device=device)
    _, loss = engine(x, x)  # one step, so that the optimizer states exist
    engine.backward(loss)
    engine.step()

    # Alternate the three measurements and take medians: this disk's speed drifts between runs.
    saves, loads, raws = [], [], []
    for repeat in range(REPEATS):
        start = time.perf_counter()
        path = checkpoint.save(engine, out, repeat, {"step": repeat}, {"world_size": 1}, keep_last=1, keep_every=0)
        fsync_tree(path)
        saves.append(time.perf_counter() - start)
        nbytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        start = time.perf_counter()
        checkpoint.load(engine, path)
        loads.append(time.perf_counter() - start)
        raws.append(raw_write_seconds(out / "raw.bin", nbytes))
    save_s, load_s, raw_s = (float(np.median(v)) for v in (saves, loads, raws))
    results = {"model": args.model, "ds_config": args.ds_config, "checkpoint_bytes": nbytes, "repeats": REPEATS,
               "save_s": save_s, "load_s": load_s, "raw_write_s": raw_s,
               "save_mb_s": nbytes / save_s / 1e6, "load_mb_s": nbytes / load_s / 1e6,
               "raw_write_mb_s": nbytes / raw_s / 1e6, "save_vs_raw_write": raw_s / save_s,
               "all_save_s": saves, "all_load_s": loads, "all_raw_write_s": raws}
    for name, value in results.items():
        print(f"{name:20s} {value:,.3f}" if isinstance(value, float) else f"{name:20s} {value}")  # lists as-is
    print(json.dumps(results))
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
