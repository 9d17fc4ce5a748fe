"""Training speed and memory on this machine, CPU or GPU (DeepSpeed's accelerator). Every figure is a
ratio against a baseline measured in the same run, steps interleaved (machines are noisy):

  overhead  the trainer's step (gpt.trainer.optimizer_step, DeepSpeed engine) / a plain PyTorch
            AdamW step: same model, initial weights, data and dtype, 1 process; on a GPU also both
            under torch.compile
  mfu       model FLOP/s (6N + attention, per token) / the peak: on CPU this CPU's matmul peak, measured
            here; on a GPU the datasheet's (gpt.metrics.GPU_PEAK_FLOPS)
  zero      ZeRO 0/1/2 on 2 ranks (deepspeed launcher): step time, per-rank model-state bytes
            (measured on the engine, and as the planner predicts them)
  ckpt      activation checkpointing: step-time ratio, activation bytes saved
  allocator the trainer step with glibc's default malloc vs freed memory kept in the heap (--full)
  compile   torch.compile on/off: first-step (compile) time, steady step-time ratio (--full)
  loss      tokens/s of the fused loss at --micro_batch auto's choice (the plan, probed on a GPU) / the
            classic full-logits loss's best over micro-batches doubling up to its first out-of-memory

    python bench/train.py                      # quick: tiny + d12 at 1024 tokens/step (< 3 min); on a GPU
                                               #   d12 at 131k tokens/step, eager and compiled
    python bench/train.py --full               # d12 at 4096 tokens/step, ZeRO on d12, allocator, compile, loss
                                               #   (~15 min); on a GPU also loss: d12, T=1024, up to 512 sequences
    python bench/train.py --only zero ckpt     # some sections
    python bench/train.py --smoke              # overhead, zero, ckpt once on the tiny model (tests/test_bench.py)
    python bench/train.py --json bench.json    # also write the results as JSON
"""
import argparse
import contextlib
import gc
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from deepspeed.accelerator import get_accelerator

import gpt.trainer
from gpt.config import parse

REPO = Path(__file__).resolve().parents[1]
from gpt.data import ShuffledTokenLoader, find_shards, shard_name, write_shard
from gpt.dist import device_type, free_port, return_freed_memory
from gpt.optim import param_groups
from gpt.hardware import cpu_bf16_slowdown, cpu_has_fast_bf16
from gpt.metrics import measure_cpu_peak_flops, peak_flops
from gpt.model import GPT, GPT2_VOCAB_SIZE
from gpt.memory import engine_state_bytes, measure_activation_bytes
from gpt.plan import resident_model_state_bytes
from gpt.probe import is_out_of_memory

DEVICE = device_type()  # "cuda" or "cpu": the accelerator DeepSpeed picks, as in the trainer
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SECTIONS = ["overhead", "zero", "ckpt", "allocator", "compile", "loss"]
CPU_ONLY_SECTIONS = {"zero", "allocator"}  # 2 ranks on one machine's cores; glibc's malloc
# What each mode measures: overhead rows (model, seq_len, micro_batch, grad_accum), in `dtypes`, eager and,
# where `overhead_compile` says so, compiled; the other sections (model, seq_len, micro_batch[, dtypes]);
# `sections` run unless --only names others; loss: (model, seq_len, largest micro-batch). On CPU `peak_max_size` bounds the measured matmul peak.
MODES = {
    "quick": dict(overhead=[("tiny", 256, 8, 1), ("d12", 1024, 1, 1)], zero=("d4", 256, 4),
                  ckpt=("d12", 1024, 1, ("bf16",)), allocator=("d4", 256, 8), compile=("d4", 256, 8), repeats=4,
                  peak_max_size=2048, sections=["overhead", "zero", "ckpt"]),
    "full": dict(overhead=[("tiny", 256, 16, 2), ("d12", 1024, 2, 2)], zero=("d12", 1024, 1),
                 ckpt=("d12", 1024, 2, ("fp32", "bf16")), allocator=("d4", 256, 8), compile=("d4", 256, 8),
                 loss=("d4", 256, 32), repeats=6, peak_max_size=4096, sections=SECTIONS),
    # each default section's code path once on the tiny model, for tests/test_bench.py: the figures mean nothing
    "smoke": dict(overhead=[("tiny", 64, 4, 1)], zero=("tiny", 64, 4), ckpt=("tiny", 64, 4, ("bf16",)),
                  allocator=("tiny", 64, 4), compile=("tiny", 64, 4), loss=("tiny", 64, 2), repeats=1,
                  peak_max_size=256, sections=["overhead", "zero", "ckpt", "loss"]),
    # one GPU (quick or --full there): d12 at 131k tokens/step, bf16, the trainer and the plain loop each
    # eager and compiled (issue 11 measured 0.31 eager, 0.42 compiled MFU on an H100 at 524k tokens/step)
    "gpu": dict(overhead=[("d12", 1024, 32, 4)], dtypes=("bf16",), overhead_compile=(False, True),
                ckpt=("d12", 1024, 32, ("bf16",)), compile=("d12", 1024, 32), loss=("d12", 1024, 512), repeats=5,
                sections=["overhead"]),
}


def usable_dtypes():
    """(dtypes, why bf16 is left out or None). Where bf16 matmuls are emulated (a CPU without bf16 units,
    e.g. AVX2-only) a bf16 row takes hours and measures the emulation, not the trainer."""
    if DEVICE == "cpu" and not cpu_has_fast_bf16():
        return ("fp32",), (f"bf16 rows skipped: this CPU has no bf16 units (a bf16 matmul takes "
                           f"{cpu_bf16_slowdown():.0f}x the time of fp32 here, measured)")
    if DEVICE == "cuda" and torch.cuda.get_device_capability() < (8, 0):  # before Ampere bf16 is emulated
        return ("fp32",), "bf16 rows skipped: this GPU has no bf16 units (compute capability < 8.0, e.g. a V100)"
    return ("fp32", "bf16"), None


def peaks_for(dtypes, settings):
    """Peak FLOP/s per dtype for MFU: measured on CPU, the datasheet on a GPU (None for one not listed)."""
    if DEVICE == "cuda":
        return {dtype: peak_flops(DEVICE, dtype)[0] for dtype in dtypes}
    return {dtype: measure_cpu_peak_flops(DTYPES[dtype], max_size=settings["peak_max_size"]) for dtype in dtypes}


# -- set-up -----------------------------------------------------------------------------------------
def synthetic_shards(directory, tokens=1 << 21, seed=0):
    """Random GPT-2 token ids in llm.c shards: speed does not depend on what the tokens say."""
    rng = np.random.default_rng(seed)
    for split, index in (("val", 0), ("train", 1)):
        write_shard(Path(directory) / shard_name("synthetic", split, index), rng.integers(0, GPT2_VOCAB_SIZE, tokens))
    return directory


def ds_config_file(directory, dtype, stage=1, checkpointing=False):
    """A ds_configs/ JSON with another precision, ZeRO stage or activation checkpointing."""
    config = json.loads((REPO / "ds_configs" / "zero1_bf16.json").read_text())
    if dtype == "fp32":
        config.pop("bf16"), config.pop("data_types")
    config["zero_optimization"]["stage"] = stage
    if dtype == "bf16" and stage == 0:  # DeepSpeed 0.19 runs bf16 stage 0 only with bf16 accumulation
        config["data_types"]["grad_accum_dtype"] = "bf16"
    if checkpointing:
        with_ckpt = json.loads((REPO / "ds_configs" / "zero1_bf16_ckpt.json").read_text())
        config["activation_checkpointing"] = with_ckpt["activation_checkpointing"]
    path = Path(directory) / f"{dtype}_zero{stage}{'_ckpt' if checkpointing else ''}.json"
    tmp = Path(f"{path}.{os.getpid()}")  # both ZeRO-worker ranks write it: a reader must never see it half-written
    tmp.write_text(json.dumps(config))
    os.replace(tmp, path)
    return str(path)


def trainer_settings(data, out_dir, ds_config, model, seq_len, micro_batch, grad_accum, world_size=1, compile=False):
    # compile is always explicit: the trainer's default (None) would turn it on with CUDA, off on CPU
    return parse([
        "--data", str(data), "--out_dir", str(out_dir), "--ds_config", ds_config, "--model", model,
        "--seq_len", str(seq_len), "--micro_batch", str(micro_batch),
        "--total_batch_tokens", str(seq_len * micro_batch * grad_accum * world_size),
        "--max_steps", "1000", "--warmup_steps", "10", "--val_every", "0", "--sample_every", "0",
        "--val_tokens", str(seq_len), "--seed", "0", "--compile" if compile else "--no-compile"])


@contextlib.contextmanager
def quiet():
    """The trainer's console lines and DeepSpeed's INFO logs would bury the table."""
    from deepspeed.utils import logger
    level = logger.level
    logger.setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        yield
    logger.setLevel(level)


class Trainer:
    """The real trainer (gpt.trainer's setup and build), one optimizer_step at a time."""

    def __init__(self, settings):
        with quiet():
            self.run = gpt.trainer.build(gpt.trainer.prepare(settings))
        self.settings, self.step_index = self.run.settings, 0
        self.config = self.run.model.config

    def step(self):
        with quiet():
            loss = gpt.trainer.optimizer_step(self.run, self.step_index)
        self.step_index += 1
        return loss

    def close(self):
        self.run.train_loader.close()
        self.run.logger.close()
        self.run.engine.destroy()
        del self.run
        gc.collect()
        return_freed_memory()


class PlainPyTorch:
    """The baseline: the same model, initial weights, data and schedule in a textbook PyTorch loop on the
    same device, with torch's fastest AdamW (fused), autocast for bf16 and optionally torch.compile. On a
    GPU fp32 matmuls run in TF32 for both: the trainer's setup turned it on for the whole process."""

    def __init__(self, settings, model_config, dtype, compile=False):
        torch.manual_seed(settings.seed)
        self.device = torch.device(DEVICE)
        self.model = GPT(model_config).to(self.device)
        self.forward = torch.compile(self.model) if compile else self.model
        self.optimizer = torch.optim.AdamW(param_groups(self.model, settings.weight_decay), lr=settings.lr, betas=(0.9, 0.95),
                                           eps=1e-8, fused=True)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, settings.optimizer.lr_factor)
        self.loader = ShuffledTokenLoader(find_shards(settings.data, "train"), settings.micro_batch, settings.seq_len, seed=settings.seed,
                                          pin_memory=DEVICE == "cuda")
        self.accum = settings.total_batch_tokens // (settings.micro_batch * settings.seq_len)
        self.autocast = dtype == "bf16"

    def step(self):
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(self.accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.loader.next_batch())
            with torch.autocast(DEVICE, torch.bfloat16, enabled=self.autocast):
                _, loss = self.forward(x, y)
            (loss / self.accum).backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        return loss_sum.item() / self.accum

    def close(self):
        self.loader.close()
        del self.model, self.forward, self.optimizer
        gc.collect()
        return_freed_memory()


def timed_step(stepper):
    """Seconds of one step, all its device work included: a GPU runs kernels asynchronously, and the
    trainer's one host sync (the loss .item()) comes before its last backward and optimizer step."""
    get_accelerator().synchronize()  # a no-op on CPU
    start = time.perf_counter()
    stepper.step()
    get_accelerator().synchronize()
    return time.perf_counter() - start


def interleaved_seconds(steppers, repeats, warmup=1):
    """Median seconds per step of each stepper, their steps interleaved so drift hits all alike."""
    times = [[] for _ in steppers]
    for i in range(warmup + repeats):
        for stepper, seconds in zip(steppers, times):
            elapsed = timed_step(stepper)
            if i >= warmup:
                seconds.append(elapsed)
    return [statistics.median(t) for t in times]


# -- the measurements -----------------------------------------------------------------------------
def measure_overhead_and_mfu(data, tmp, models, dtypes, compiles, repeats, peaks):
    rows = []
    for model, seq_len, micro_batch, accum in models:
        for dtype in dtypes:
            for compiled in compiles:
                name = f"{model}_{dtype}{'_compiled' if compiled else ''}"
                settings = trainer_settings(data, Path(tmp) / name, ds_config_file(tmp, dtype), model, seq_len,
                                            micro_batch, accum, compile=compiled)
                trainer = Trainer(settings)
                plain = PlainPyTorch(settings, trainer.config, dtype, compile=compiled)
                ds_seconds, plain_seconds = interleaved_seconds([trainer, plain], repeats)
                flops = trainer.run.model.flops_per_token(seq_len) * settings.total_batch_tokens
                mfu = (lambda seconds: flops / seconds / peaks[dtype]) if peaks[dtype] else (lambda seconds: None)
                rows.append(dict(model=model, dtype=dtype, compiled=compiled, tokens_per_step=settings.total_batch_tokens,
                                 plain_s=plain_seconds, trainer_s=ds_seconds, ratio=ds_seconds / plain_seconds,
                                 tflops=flops / ds_seconds / 1e12, mfu=mfu(ds_seconds), plain_mfu=mfu(plain_seconds),
                                 tokens_per_s=settings.total_batch_tokens / ds_seconds,
                                 plain_tokens_per_s=settings.total_batch_tokens / plain_seconds))
                trainer.close()
                plain.close()
                print_row(rows[-1], OVERHEAD_COLUMNS)
    return rows


def measure_checkpointing(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        trainers = [Trainer(trainer_settings(data, Path(tmp) / f"ckpt_{dtype}_{on}", ds_config_file(tmp, dtype, checkpointing=on),
                                         model, seq_len, micro_batch, 1)) for on in (False, True)]
        off_s, on_s = interleaved_seconds(trainers, repeats)
        config = trainers[0].config
        off_bytes, on_bytes = (measure_activation_bytes(config, micro_batch, seq_len, dtype, on) for on in (False, True))
        rows.append(dict(model=model, dtype=dtype, tokens=micro_batch * seq_len, off_s=off_s, on_s=on_s,
                         time_ratio=on_s / off_s, activations_off=off_bytes, activations_on=on_bytes,
                         bytes_saved=1 - on_bytes / off_bytes))
        for trainer in trainers:
            trainer.close()
        print_row(rows[-1], CKPT_COLUMNS)
    return rows


def measure_compile(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        eager, compiled = (Trainer(trainer_settings(data, Path(tmp) / f"compile_{dtype}_{on}", ds_config_file(tmp, dtype),
                                                model, seq_len, micro_batch, 1, compile=on))
                           for on in (False, True))
        first = timed_step(compiled)  # compiles
        eager_s, compiled_s = interleaved_seconds([eager, compiled], repeats)
        rows.append(dict(model=model, dtype=dtype, first_step_s=first, eager_s=eager_s, compiled_s=compiled_s,
                         speedup=eager_s / compiled_s))
        eager.close()
        compiled.close()
        print_row(rows[-1], COMPILE_COLUMNS)
    return rows


def measure_loss(data, tmp, model, seq_len, largest, dtype, repeats):
    """Issue 13's speed target: the fused loss at the micro-batch --micro_batch auto picks (budget: `largest`
    sequences per step) no slower in tokens/s than the classic loss's best, each micro-batch one step."""
    config, rows = ds_config_file(tmp, dtype), []
    micro_batch = 1
    while micro_batch <= largest:
        classic = replace(trainer_settings(data, Path(tmp) / f"classic{micro_batch}", config, model, seq_len,
                                           micro_batch, 1), loss="classic")
        measured = tokens_per_second(classic, repeats)
        rows.append(dict(model=model, dtype=dtype, loss="classic", micro_batch=micro_batch, grad_accum=1,
                         tokens_per_s=measured, ratio_to_classic_best=None))
        print_row(rows[-1], LOSS_COLUMNS)
        if measured is None:  # out of memory: larger ones will not fit either
            break
        micro_batch *= 2
    auto = replace(trainer_settings(data, Path(tmp) / "fused", config, model, seq_len, largest, 1), micro_batch="auto")
    trainer = Trainer(auto)
    seconds, = interleaved_seconds([trainer], repeats)
    chosen, accumulation = trainer.settings.micro_batch, trainer.run.grad_accum
    trainer.close()
    best = max((r["tokens_per_s"] for r in rows if r["tokens_per_s"]), default=None)
    rows.append(dict(model=model, dtype=dtype, loss="fused (auto)", micro_batch=chosen, grad_accum=accumulation,
                     tokens_per_s=auto.total_batch_tokens / seconds,
                     ratio_to_classic_best=auto.total_batch_tokens / seconds / best if best else None))
    print_row(rows[-1], LOSS_COLUMNS)
    return rows


def tokens_per_second(settings, repeats):
    """The trainer's tokens/s with these settings, or None if it runs out of memory (then freed)."""
    trainer, result = None, None
    try:
        trainer = Trainer(settings)
        seconds, = interleaved_seconds([trainer], repeats)
        result = settings.total_batch_tokens / seconds
    except Exception as error:  # noqa: BLE001 -- out-of-memory is an answer here; anything else is re-raised
        if not is_out_of_memory(error):
            raise
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        gc.collect()
        get_accelerator().empty_cache()
    return result


def measure_zero_stages(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    """2 ranks under the deepspeed launcher, one engine per stage in turn (this script as the worker)."""
    out = Path(tmp) / "zero.json"
    cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), __file__, "--zero_worker", str(out),
           "--data", str(data), "--tmp", str(tmp), "--model", model, "--seq_len", str(seq_len),
           "--micro_batch", str(micro_batch), "--repeats", str(repeats), "--dtypes", *dtypes]
    proc = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"ZeRO worker failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = json.loads(out.read_text())
    for row in rows:
        print_row(row, ZERO_COLUMNS)
    return rows


def zero_worker(args):
    """One rank of measure_zero_stages: ZeRO 0, 1, 2 in each dtype (bf16 first)."""
    import torch.distributed as dist
    rows = []
    for dtype in sorted(args.dtypes):
        for stage in (0, 1, 2):
            trainer = Trainer(trainer_settings(args.data, Path(args.tmp) / f"zero{stage}_{dtype}",
                                           ds_config_file(args.tmp, dtype, stage), args.model, args.seq_len,
                                           args.micro_batch, 1, world_size=2))
            (seconds,) = interleaved_seconds([trainer], args.repeats)
            engine = trainer.run.engine
            owned = [None, None]
            dist.all_gather_object(owned, engine_state_bytes(engine))
            planned = resident_model_state_bytes(trainer.run.model.num_params(), dtype, stage, 2,
                                                 json.loads(Path(trainer.settings.ds_config).read_text()))
            rows.append(dict(model=args.model, dtype=dtype, stage=stage, optimizer=type(engine.optimizer).__name__,
                             step_s=seconds, tokens_per_step=trainer.settings.total_batch_tokens,
                             state_bytes_rank0=owned[0], state_bytes_rank1=owned[1], planned_bytes=planned))
            trainer.close()
    if dist.get_rank() == 0:
        Path(args.zero_worker).write_text(json.dumps(rows))


def measure_allocator(tmp, model, seq_len, micro_batch, dtype, repeats, rounds=2):
    """Trainer step with glibc's default malloc vs freed memory kept in the heap (gpt.dist's
    keep_freed_memory_in_heap), in fresh processes run alternately: the setting is process-wide."""
    seconds = {"0": [], "1": []}
    for _ in range(rounds):
        for cache in seconds:
            out = Path(tmp) / f"allocator_{cache}.json"
            cmd = [sys.executable, __file__, "--allocator_worker", str(out), "--tmp", str(tmp), "--model", model,
                   "--seq_len", str(seq_len), "--micro_batch", str(micro_batch), "--repeats", str(repeats),
                   "--dtypes", dtype]
            subprocess.run(cmd, cwd=REPO, env={**worker_env(), "DSGPT_MALLOC_CACHE": cache}, check=True,
                           capture_output=True)
            seconds[cache].append(json.loads(out.read_text())["seconds"])
    default_s, cached_s = statistics.median(seconds["0"]), statistics.median(seconds["1"])
    row = dict(model=model, dtype=dtype, tokens_per_step=seq_len * micro_batch, glibc_default_s=default_s,
               heap_kept_s=cached_s, speedup=default_s / cached_s)
    print_row(row, ALLOCATOR_COLUMNS)
    return [row]


def allocator_worker(args):
    data = synthetic_shards(Path(tempfile.mkdtemp(dir=args.tmp)))
    trainer = Trainer(trainer_settings(data, Path(data) / "run", ds_config_file(data, args.dtypes[0]), args.model, args.seq_len,
                                   args.micro_batch, 1))
    (seconds,) = interleaved_seconds([trainer], args.repeats)
    Path(args.allocator_worker).write_text(json.dumps({"seconds": seconds}))


def worker_env():
    """This process's environment minus the process-group variables setup_distributed put there."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                            "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONPATH": str(REPO)}


# -- the report -------------------------------------------------------------------------------------
OVERHEAD_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("compiled", "{}"), ("tokens_per_step", "{}"),
                    ("plain_s", "{:.3f}"), ("trainer_s", "{:.3f}"), ("ratio", "{:.3f}"), ("tflops", "{:.3f}"),
                    ("mfu", "{:.2f}"), ("plain_mfu", "{:.2f}"), ("tokens_per_s", "{:.0f}"),
                    ("plain_tokens_per_s", "{:.0f}")]
ZERO_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("stage", "{}"), ("optimizer", "{}"), ("step_s", "{:.3f}"),
                ("state_bytes_rank0", "{:,}"), ("state_bytes_rank1", "{:,}"), ("planned_bytes", "{:,.0f}")]
CKPT_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens", "{}"), ("off_s", "{:.3f}"), ("on_s", "{:.3f}"),
                ("time_ratio", "{:.2f}"), ("activations_off", "{:,}"), ("activations_on", "{:,}"),
                ("bytes_saved", "{:.0%}")]
ALLOCATOR_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens_per_step", "{}"), ("glibc_default_s", "{:.3f}"),
                     ("heap_kept_s", "{:.3f}"), ("speedup", "{:.2f}")]
COMPILE_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("first_step_s", "{:.1f}"), ("eager_s", "{:.3f}"),
                   ("compiled_s", "{:.3f}"), ("speedup", "{:.2f}")]
LOSS_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("loss", "{}"), ("micro_batch", "{}"), ("grad_accum", "{}"),
                ("tokens_per_s", "{:.0f}"), ("ratio_to_classic_best", "{:.2f}")]


def print_header(title, columns):
    print(f"\n## {title}\n\n| " + " | ".join(name for name, _ in columns) + " |\n|" + "---|" * len(columns), flush=True)


def print_row(row, columns):
    print("| " + " | ".join("-" if row[name] is None else fmt.format(row[name]) for name, fmt in columns) + " |",
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="larger batches, more steps, allocator, compile")
    parser.add_argument("--smoke", action="store_true", help="overhead, zero, ckpt once on the tiny model (for tests)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", nargs="+", choices=SECTIONS,
                        help="run only these sections")
    # the ZeRO worker's own arguments (the script re-launches itself on 2 ranks)
    parser.add_argument("--zero_worker", help=argparse.SUPPRESS)
    parser.add_argument("--allocator_worker", help=argparse.SUPPRESS)
    for name in ("data", "tmp", "model"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("seq_len", "micro_batch", "repeats", "local_rank"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.zero_worker:
        return zero_worker(args)
    if args.allocator_worker:
        return allocator_worker(args)

    mode = "smoke" if args.smoke else "full" if args.full else "quick"
    if DEVICE == "cuda" and mode != "smoke":
        mode = "gpu"
    settings = MODES[mode]
    sections = set(args.only or settings["sections"])
    if DEVICE == "cuda" and sections & CPU_ONLY_SECTIONS:
        print(f"skipping {', '.join(sorted(sections & CPU_ONLY_SECTIONS))}: CPU only (2 ranks on one machine's "
              f"cores, glibc's malloc)")
        sections -= CPU_ONLY_SECTIONS
    usable, bf16_skipped = usable_dtypes()
    if bf16_skipped:
        print(bf16_skipped)

    def only_usable(dtypes):  # a section meant for bf16 alone measures fp32 instead where bf16 is skipped
        return tuple(d for d in dtypes if d in usable) or ("fp32",)
    dtypes = only_usable(settings.get("dtypes", usable))
    repeats = settings["repeats"]
    started = time.perf_counter()
    results = {"device": DEVICE, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "mode": mode,
               "bf16_skipped": bf16_skipped}
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_shards(Path(tmp))
        peaks = peaks_for(dtypes, settings)
        results["matmul_peak_flops"] = peaks
        where = torch.cuda.get_device_name() + " datasheet" if DEVICE == "cuda" else \
            f"this CPU ({torch.get_num_threads()} threads), measured"
        print(f"matmul peak on {where}: "
              + ", ".join(f"{d} {p / 1e12:.3f} TFLOP/s" if p else f"{d} unknown" for d, p in peaks.items()))
        if "overhead" in sections:
            print_header("trainer step vs plain PyTorch AdamW step (1 process); MFU against the matmul peak",
                         OVERHEAD_COLUMNS)
            results["overhead"] = measure_overhead_and_mfu(data, tmp, settings["overhead"], dtypes,
                                                           settings.get("overhead_compile", (False,)), repeats, peaks)
        if "zero" in sections:
            print_header("ZeRO stages, 2 ranks: step time and per-rank model-state bytes", ZERO_COLUMNS)
            results["zero"] = measure_zero_stages(data, tmp, *settings["zero"], dtypes, repeats)
        if "ckpt" in sections:
            print_header("activation checkpointing: step time and activation bytes, off vs on", CKPT_COLUMNS)
            model, seq_len, micro_batch, ckpt_dtypes = settings["ckpt"]
            results["ckpt"] = measure_checkpointing(data, tmp, model, seq_len, micro_batch, only_usable(ckpt_dtypes),
                                                    repeats)
        if "allocator" in sections:
            print_header("CPU allocator: trainer step with glibc's default malloc vs freed memory kept in the heap",
                         ALLOCATOR_COLUMNS)
            results["allocator"] = measure_allocator(tmp, *settings["allocator"], dtypes[-1], repeats)
        if "compile" in sections:
            print_header(f"torch.compile (inductor, {DEVICE}): compile time and steady step time", COMPILE_COLUMNS)
            results["compile"] = measure_compile(data, tmp, *settings["compile"], dtypes, repeats)
        if "loss" in sections:
            print_header("fused loss at --micro_batch auto vs the classic loss's best micro-batch (tokens/s)",
                         LOSS_COLUMNS)
            results["loss"] = measure_loss(data, tmp, *settings["loss"], dtypes[-1], repeats)
    results["seconds"] = time.perf_counter() - started
    print(f"\n{results['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
