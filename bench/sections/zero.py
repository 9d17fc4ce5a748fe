"""zero: ZeRO 0/1/2 on 2 ranks under the deepspeed launcher (bench/train.py relaunched as the worker): step time,
per-rank model-state bytes, measured on the engine and as the planner predicts them."""
import json
import subprocess
from pathlib import Path

from harness import REPO, TrainerSteps, ds_config_file, interleaved_seconds, print_row, trainer_settings, worker_env
from gpt.memory.footprint import engine_state_bytes
from gpt.memory.plan import resident_model_state_bytes
from gpt.runtime.ranks import free_port

ENTRY = REPO / "bench" / "train.py"  # relaunched on 2 ranks as the worker (--zero_worker)

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("stage", "{}"), ("optimizer", "{}"), ("step_s", "{:.3f}"),
           ("state_bytes_rank0", "{:,}"), ("state_bytes_rank1", "{:,}"), ("planned_bytes", "{:,.0f}")]


def measure(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    """2 ranks under the deepspeed launcher, one engine per stage in turn (this script as the worker)."""
    out = Path(tmp) / "zero.json"
    cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), str(ENTRY), "--zero_worker", str(out),
           "--data", str(data), "--tmp", str(tmp), "--model", model, "--seq_len", str(seq_len),
           "--micro_batch", str(micro_batch), "--repeats", str(repeats), "--dtypes", *dtypes]
    proc = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"ZeRO worker failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = json.loads(out.read_text())
    for row in rows:
        print_row(row, COLUMNS)
    return rows


def worker(args):
    """One rank of measure: ZeRO 0, 1, 2 in each dtype (bf16 first)."""
    import torch.distributed as dist
    rows = []
    for dtype in sorted(args.dtypes):
        for stage in (0, 1, 2):
            trainer = TrainerSteps(trainer_settings(args.data, Path(args.tmp) / f"zero{stage}_{dtype}",
                                           ds_config_file(args.tmp, dtype, stage), args.model, args.seq_len,
                                           args.micro_batch, 1, world_size=2))
            (seconds,) = interleaved_seconds([trainer], args.repeats)
            engine = trainer.engine
            owned = [None, None]
            dist.all_gather_object(owned, engine_state_bytes(engine))
            planned = resident_model_state_bytes(trainer.model.num_params(), dtype, stage, 2,
                                                 json.loads(Path(trainer.settings.run.ds_config).read_text()))
            rows.append(dict(model=args.model, dtype=dtype, stage=stage, optimizer=type(engine.optimizer).__name__,
                             step_s=seconds, tokens_per_step=trainer.settings.data.total_batch_tokens,
                             state_bytes_rank0=owned[0], state_bytes_rank1=owned[1], planned_bytes=planned))
            trainer.close()
    if dist.get_rank() == 0:
        Path(args.zero_worker).write_text(json.dumps(rows))
