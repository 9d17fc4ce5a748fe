"""start: seconds from launching train_ds.py to its first step, 2 ranks under the deepspeed launcher, the CPU demo's
shape (d4, T=256, micro-batch 4, 2048 tokens a step; 2 GPUs where there are), with an empty torch extensions
directory (a fresh machine) and again with the same directory (warm), in each round; the default optimizer (torch's AdamW) and, with --full,
DeepSpeed's FusedAdam, whose JIT build a cold start pays."""
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from harness import DEVICE, REPO, ds_config_file, print_row, trainer_argv, worker_env
from gpt.runtime.ranks import free_port

TITLE = ("seconds from launch to the first step, 2 ranks, the CPU demo's shape: an empty extensions directory (cold) "
         "against the same again (warm)")
COLUMNS = [("optimizer", "{}"), ("cold_s", "{:.1f}"), ("warm_s", "{:.1f}"), ("cold_vs_warm", "{:.2f}"),
           ("built_ops", "{}")]
FIRST_STEP = "step     0/"  # the trainer's line after its first optimizer step


def seconds_to_first_step(argv, extensions):
    """Seconds from starting argv until it prints its first step's line (it then runs to its end)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env={**worker_env(), "TORCH_EXTENSIONS_DIR": str(extensions)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = next((time.perf_counter() - started for line in proc.stdout if line.startswith(FIRST_STEP)), None)
    _, stderr = proc.communicate()
    if proc.returncode or seconds is None:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return seconds


def measure(data, tmp, dtype, rounds=2, fused_adam=False):
    ranks = 2 if DEVICE == "cpu" else min(2, torch.cuda.device_count())
    config = json.loads(Path(ds_config_file(tmp, dtype, stage=2)).read_text())
    variants = {"torch AdamW (default)": config}
    if fused_adam:
        params = {k: v for k, v in config["optimizer"]["params"].items() if k not in ("torch_adam", "fused")}
        variants["DeepSpeed FusedAdam"] = {**config, "optimizer": {**config["optimizer"], "params": params}}
    rows = []
    for index, (name, variant) in enumerate(variants.items()):
        path = Path(tmp) / f"start_{index}.json"
        path.write_text(json.dumps(variant))
        cold, warm, built = [], [], set()
        for round_ in range(rounds if index == 0 else 1):  # FusedAdam's build: minutes on 2 cores, once
            with tempfile.TemporaryDirectory(dir=tmp) as extensions:
                for label, times in (("cold", cold), ("warm", warm)):
                    out = Path(tmp) / f"start_{index}_{round_}_{label}"
                    argv = ["deepspeed", "--num_gpus", str(ranks), "--master_port", str(free_port()),
                            str(REPO / "train_ds.py"), *trainer_argv(data, out, str(path), "d4", 256, 4, 1, ranks,
                                                                     max_steps=1)]
                    times.append(seconds_to_first_step(argv, extensions))
                built |= set(os.listdir(extensions))
        cold_s, warm_s = statistics.median(cold), statistics.median(warm)
        rows.append(dict(optimizer=name, dtype=dtype, rounds=len(cold), cold_s=cold_s, warm_s=warm_s,
                         cold_vs_warm=cold_s / warm_s, built_ops=", ".join(sorted(built)) or "none"))
        print_row(rows[-1], COLUMNS)
    return rows
