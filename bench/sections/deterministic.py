"""deterministic: what --deterministic costs, train_ds.py without and with it in fresh processes, alternating."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

from harness import REPO, ds_config_file, print_row, trainer_argv, worker_env

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens_per_step", "{}"), ("steps", "{}"), ("runs", "{}"),
           ("default_s", "{:.4f}"), ("deterministic_s", "{:.4f}"), ("ratio", "{:.3f}"), ("note", "{}")]


def measure(data, tmp, dtype, model, seq_len, micro_batch, grad_accum, steps, rounds):
    """What --deterministic costs: train_ds.py (eager) without and with it, each in a fresh process, alternating
    `rounds` times (the setting is process-global, and cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when it
    starts); per run the median of metrics.jsonl's dt over steps >= 2, per setting the median over runs."""
    config, seconds, note = ds_config_file(tmp, dtype), {False: [], True: []}, None
    # each run as set: --deterministic sets CUBLAS_WORKSPACE_CONFIG itself, and the default run must not inherit it
    env = {k: v for k, v in worker_env().items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    for round_index in range(rounds):
        for deterministic in (False, True):
            out = Path(tmp) / f"deterministic_{deterministic}_{round_index}"
            argv = trainer_argv(data, out, config, model, seq_len, micro_batch, grad_accum, max_steps=steps)
            cmd = [sys.executable, "train_ds.py", *argv] + (["--deterministic"] if deterministic else [])
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            if proc.returncode:
                print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
                note = (f"{'--deterministic' if deterministic else 'the default'} run failed (exit {proc.returncode}): "
                        + (proc.stderr.strip().splitlines() or ["no output"])[-1][:200])
                break
            metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            seconds[deterministic].append(statistics.median(m["dt"] for m in metrics if "dt" in m and m["step"] >= 2))
        if note:
            break
    default_s, deterministic_s = (statistics.median(s) if s and not note else None for s in seconds.values())
    row = dict(model=model, dtype=dtype, tokens_per_step=seq_len * micro_batch * grad_accum, steps=steps,
               runs=rounds, default_s=default_s, deterministic_s=deterministic_s,
               ratio=deterministic_s / default_s if default_s and deterministic_s else None, note=note,
               default_runs_s=seconds[False], deterministic_runs_s=seconds[True])
    print_row(row, COLUMNS)
    return [row]
