"""Shared fixtures: the Shakespeare shards (prepared once per session) and a runner for real training
runs through train_ds.py, under `python` (1 rank) or the deepspeed launcher (2 CPU ranks)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt.engine import free_port

REPO = Path(__file__).resolve().parents[1]
# A tiny model and batch that keep each run to seconds on 2 CPU cores.
TINY = ["--model", "tiny", "--seq_len", "64", "--micro_batch", "4", "--warmup_steps", "2",
        "--val_every", "0", "--sample_every", "0", "--seed", "1234"]


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("shakespeare")
    subprocess.run([sys.executable, "-m", "gpt.prepare", "shakespeare", "--out_dir", str(out)],
                   cwd=REPO, check=True)
    return out


@pytest.fixture(scope="module")
def single_rank_group():
    """A one-rank gloo process group inside the test process, for in-process DeepSpeed engines."""
    import deepspeed
    import torch.distributed as dist

    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def write_ds_config(path, base="zero1_bf16.json", stage=None, precision=None, **extra):
    """A DeepSpeed JSON derived from one of ds_configs/: another ZeRO stage, precision or extra keys."""
    config = json.loads((REPO / "ds_configs" / base).read_text())
    if stage is not None:
        config["zero_optimization"]["stage"] = stage
    if precision is not None:
        config.pop("bf16", None), config.pop("fp16", None)
        if precision != "fp32":
            config[precision] = {"enabled": True}
    config.update(extra)
    Path(path).write_text(json.dumps(config))
    return str(path)


def train(out_dir, data_dir, *args, ranks=1, launcher=None, check=True, extra=(), port=None):
    """Run train_ds.py; return (records from metrics.jsonl, completed process)."""
    port = port or free_port()
    launcher = launcher or ("python" if ranks == 1 else "deepspeed")
    script = [str(REPO / "train_ds.py"), "--data", str(data_dir), "--out_dir", str(out_dir), *args, *extra]
    if launcher == "python":
        cmd = [sys.executable, *script]
    elif launcher == "deepspeed":
        cmd = ["deepspeed", "--num_gpus", str(ranks), "--master_port", str(port), *script]
    else:  # torchrun
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_port", str(free_port()), *script]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    metrics = Path(out_dir) / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return records, proc


def train_losses(records):
    return [r["loss"] for r in records if "loss" in r]
