"""Run by conftest's two_rank_runs fixture under `deepspeed --num_gpus 2`: the 2-rank runs that the selected
tests read, one after another in the same two rank processes, each as `python SCRIPT ARGV` would run
(in_process.py); SCRIPT is train_ds.py, probe_ranks.py or engine_memory.py, found by its file name (a test may
name it by another path). One launch instead of one per run: a launch costs ~10 s before its first step.
Usage: two_rank_runs.py RUNS_JSON, a {name: [script, argv]} object; each rank writes NAME.rank<R>.json beside it
with its exit status, stdout, stderr and seconds."""
import json
import os
import sys
import time
from pathlib import Path

import engine_memory
import probe_ranks
import train_ds
from gpt import console
from in_process import run_main

MAINS = {"train_ds.py": train_ds.main, "probe_ranks.py": probe_ranks.main, "engine_memory.py": engine_memory.main}


def main():
    runs_path = Path(next(a for a in sys.argv[1:] if not a.startswith("--local_rank")))  # the launcher adds it
    rank = int(os.environ["RANK"])
    # A rank that leaves a refusal's line to rank 0 waits for the launcher to end it (gpt.console.exit_with); no
    # launcher ends a rank between these runs: it goes on to the next run at once.
    console.SILENT_RANK_WAIT_S = 0.0
    for name, (script, argv) in json.loads(runs_path.read_text()).items():
        started = time.perf_counter()
        code, stdout, stderr = run_main(argv, MAINS[Path(script).name])
        (runs_path.parent / f"{name}.rank{rank}.json").write_text(json.dumps(
            {"returncode": code, "stdout": stdout, "stderr": stderr, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
