"""allocator: the trainer's step with glibc's default malloc against freed memory kept in the heap, in fresh
processes (bench/train.py relaunched as the worker) run alternately: the setting is process-wide."""
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import (REPO, TrainerSteps, ds_config_file, interleaved_seconds, print_row, synthetic_shards, trainer_settings,
                     worker_env)

ENTRY = REPO / "bench" / "train.py"  # relaunched as the worker (--allocator_worker)

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens_per_step", "{}"), ("glibc_default_s", "{:.3f}"),
           ("heap_kept_s", "{:.3f}"), ("speedup", "{:.2f}")]


def measure(tmp, model, seq_len, micro_batch, dtype, repeats, rounds=2):
    """Trainer step with glibc's default malloc vs freed memory kept in the heap (gpt.runtime.host's
    keep_freed_memory_in_heap), in fresh processes run alternately: the setting is process-wide."""
    seconds = {"0": [], "1": []}
    for _ in range(rounds):
        for cache in seconds:
            out = Path(tmp) / f"allocator_{cache}.json"
            cmd = [sys.executable, str(ENTRY), "--allocator_worker", str(out), "--tmp", str(tmp), "--model", model,
                   "--seq_len", str(seq_len), "--micro_batch", str(micro_batch), "--repeats", str(repeats),
                   "--dtypes", dtype]
            subprocess.run(cmd, cwd=REPO, env={**worker_env(), "DSGPT_MALLOC_CACHE": cache}, check=True,
                           capture_output=True)
            seconds[cache].append(json.loads(out.read_text())["seconds"])
    default_s, cached_s = statistics.median(seconds["0"]), statistics.median(seconds["1"])
    row = dict(model=model, dtype=dtype, tokens_per_step=seq_len * micro_batch, glibc_default_s=default_s,
               heap_kept_s=cached_s, speedup=default_s / cached_s)
    print_row(row, COLUMNS)
    return [row]


def worker(args):
    data = synthetic_shards(Path(tempfile.mkdtemp(dir=args.tmp)))
    trainer = TrainerSteps(trainer_settings(data, Path(data) / "run", ds_config_file(data, args.dtypes[0]), args.model, args.seq_len,
                                   args.micro_batch, 1))
    (seconds,) = interleaved_seconds([trainer], args.repeats)
    Path(args.allocator_worker).write_text(json.dumps({"seconds": seconds}))
