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
  loss      which kernel --loss fused should mean (issue 22): each fused kernel (liger where it can run, the
            chunked PyTorch path) and the classic loss at a fixed micro-batch (64 on a GPU) and at --micro_batch
            auto's choice, every row the same tokens/step (compiled on a GPU): tokens/s, peak memory, and the
            ratio to the classic loss's best over micro-batches doubling up to its first out-of-memory; a
            verdict line names the fastest fused kernel and whether it meets that target
  speed     the trainer's tokens/s and MFU, eager and compiled, --loss fused and classic, each against the
            same plain PyTorch loop (compiled where the mode compiles), built once, steps interleaved; on a GPU
            d12, T=1024, 0.5M tokens/step (issue 22)
  deterministic  what --deterministic costs: train_ds.py without and with it in fresh processes, alternating
            (ABAB: the setting is process-global), eager; the median per-step dt from each run's metrics.jsonl

    python bench/train.py                      # quick: tiny + d12 at 1024 tokens/step (< 3 min); on a GPU
                                               #   d12 at 131k tokens/step, eager and compiled
    python bench/train.py --full               # d12 at 4096 tokens/step, ZeRO on d12, allocator, compile, loss,
                                               #   speed, deterministic (~25 min); on a GPU every GPU section
    python bench/train.py --only zero ckpt     # some sections
    python bench/train.py --only loss speed deterministic  # on a GPU: issue 22's figures, d12 at 0.5M tokens/step
    python bench/train.py --only speed --modes compiled  # its compiled rows alone (launch/gpu_check.sh)
    python bench/train.py --smoke              # overhead, zero, ckpt once on the tiny model (tests/unit/test_bench.py)
    python bench/train.py --smoke --only loss speed deterministic  # those once on the tiny model, eager (tests too)
    python bench/train.py --json bench.json    # also write the results as JSON (after each section)
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
import traceback
from pathlib import Path

import numpy as np
import torch
from deepspeed.accelerator import get_accelerator

from gpt.commands.train import parse
from gpt.data.shards import ShuffledTokenLoader, find_shards, shard_name, write_shard
from gpt.runtime.accelerator import device_type
from gpt.runtime.host import return_freed_memory
from gpt.runtime.memory import is_out_of_memory, peak_memory
from gpt.runtime.ranks import free_port, timed_on_device
from gpt.train.engine import OptimizerSettings, param_groups
from gpt.config.hardware import cpu_bf16_units, measure_cpu_peak_flops, peak_flops
from gpt.model.model import GPT, GPT2_VOCAB_SIZE
from gpt.model.loss import KERNELS, kernel_for, loss_problem
from gpt.model.wrap import forget_compiled_code
from gpt.memory.plan import engine_state_bytes, measure_activation_bytes, resident_model_state_bytes
from gpt.train import start
from gpt.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]

DEVICE = device_type()  # "cuda" or "cpu": the accelerator DeepSpeed picks, as in the trainer
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SECTIONS = ["overhead", "zero", "ckpt", "allocator", "compile", "loss", "speed", "deterministic"]
CPU_ONLY_SECTIONS = {"zero", "allocator"}  # 2 ranks on one machine's cores; glibc's malloc
# What each mode measures: overhead rows (model, seq_len, micro_batch, grad_accum), in `dtypes`, eager and,
# where `overhead_compile` says so, compiled; zero, ckpt, allocator, compile (model, seq_len, micro_batch[, dtypes]);
# loss, speed, deterministic: the keyword arguments of measure_loss, measure_speed, measure_deterministic (`repeats`
# there overrides the mode's); `sections` run unless --only names others (`full_sections` with --full on a GPU).
# On CPU `peak_max_size` bounds the measured matmul peak.
MODES = {
    "quick": dict(overhead=[("tiny", 256, 8, 1), ("d12", 1024, 1, 1)], zero=("d4", 256, 4),
                  ckpt=("d12", 1024, 1, ("bf16",)), allocator=("d4", 256, 8), compile=("d4", 256, 8),
                  loss=dict(model="d4", seq_len=256, sequences=8, micro_batch=4, sweep_from=1, compile=False),
                  speed=dict(model="d4", seq_len=256, micro_batch=4, grad_accum=2, compiles=(False,)),
                  deterministic=dict(model="d4", seq_len=256, micro_batch=4, grad_accum=1, steps=6, rounds=2),
                  repeats=4, peak_max_size=2048, sections=["overhead", "zero", "ckpt"]),
    "full": dict(overhead=[("tiny", 256, 16, 2), ("d12", 1024, 2, 2)], zero=("d12", 1024, 1),
                 ckpt=("d12", 1024, 2, ("fp32", "bf16")), allocator=("d4", 256, 8), compile=("d4", 256, 8),
                 loss=dict(model="d4", seq_len=256, sequences=32, micro_batch=8, sweep_from=1, compile=False),
                 speed=dict(model="d4", seq_len=256, micro_batch=8, grad_accum=2, compiles=(False, True)),
                 deterministic=dict(model="d4", seq_len=256, micro_batch=8, grad_accum=2, steps=8, rounds=2),
                 repeats=6, peak_max_size=4096, sections=SECTIONS),
    # each section's code path once on the tiny model, for tests/unit/test_bench.py: the figures mean nothing. loss, speed
    # and deterministic only when named with --only (a test of their own), and eager: compiling takes ~60 s on 2 cores
    "smoke": dict(overhead=[("tiny", 64, 4, 1)], zero=("tiny", 64, 4), ckpt=("tiny", 64, 4, ("bf16",)),
                  allocator=("tiny", 64, 4), compile=("tiny", 64, 4),
                  loss=dict(model="tiny", seq_len=64, sequences=2, micro_batch=1, sweep_from=1, compile=False),
                  speed=dict(model="tiny", seq_len=64, micro_batch=2, grad_accum=2, compiles=(False,)),
                  deterministic=dict(model="tiny", seq_len=64, micro_batch=2, grad_accum=1, steps=3, rounds=1),
                  repeats=1, peak_max_size=256, sections=["overhead", "zero", "ckpt"]),
    # one GPU (quick or --full there): d12 at 131k tokens/step, bf16, the trainer and the plain loop each
    # eager and compiled (issue 11 measured 0.31 eager, 0.42 compiled MFU on an H100 at 524k tokens/step).
    # Issue 22 (loss, speed, deterministic) at d12, T=1024, few repeats: compiling each shape takes most of the time.
    # loss: the classic sweep from 32 (d12's classic loss fit 76 sequences eagerly on an H100, so 128 is its
    # out-of-memory); speed: micro-batch 32 so that the trainer and the plain loop fit side by side on 80 GB,
    # compiled first (the default with CUDA: the rows a run cut short by its time limit should have printed).
    "gpu": dict(overhead=[("d12", 1024, 32, 4)], dtypes=("bf16",), overhead_compile=(False, True),
                ckpt=("d12", 1024, 32, ("bf16",)), compile=("d12", 1024, 32),
                loss=dict(model="d12", seq_len=1024, sequences=512, micro_batch=64, sweep_from=32, compile=True,
                          repeats=2),
                speed=dict(model="d12", seq_len=1024, micro_batch=32, grad_accum=16, compiles=(True, False), repeats=3),
                deterministic=dict(model="d12", seq_len=1024, micro_batch=32, grad_accum=4, steps=8, rounds=2),
                repeats=5, sections=["overhead"],
                full_sections=["overhead", "ckpt", "compile", "loss", "speed", "deterministic"]),
}


def usable_dtypes():
    """(dtypes, why bf16 is left out or None). Where bf16 matmuls are emulated (a CPU without bf16 units,
    e.g. AVX2-only) a bf16 row takes hours and measures the emulation, not the trainer."""
    fast, why = cpu_bf16_units() if DEVICE == "cpu" else (True, None)
    if not fast:
        return ("fp32",), f"bf16 rows skipped: this CPU has no bf16 units ({why})"
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


def trainer_argv(data, out_dir, ds_config, model, seq_len, micro_batch, grad_accum, world_size=1, compile=False,
                 loss="fused", max_steps=1000):
    """train_ds.py's command line for these settings (no validation, no samples)."""
    # compile is always explicit: the trainer's default (None) would turn it on with CUDA, off on CPU
    return [
        "--data", str(data), "--out_dir", str(out_dir), "--ds_config", ds_config, "--model", model,
        "--seq_len", str(seq_len), "--micro_batch", str(micro_batch),
        "--total_batch_tokens", str(seq_len * micro_batch * grad_accum * world_size), "--loss", loss,
        "--max_steps", str(max_steps), "--warmup_steps", str(min(10, max_steps)), "--val_every", "0",
        "--sample_every", "0", "--val_tokens", str(seq_len), "--seed", "0", "--compile" if compile else "--no-compile"]


def trainer_settings(*args, **kwargs):
    """The trainer's settings for trainer_argv(*args, **kwargs)."""
    return parse(trainer_argv(*args, **kwargs))


@contextlib.contextmanager
def quiet():
    """The trainer's console lines and DeepSpeed's INFO logs would bury the table."""
    from deepspeed.utils import logger
    level = logger.level
    logger.setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        yield
    logger.setLevel(level)


class TrainerSteps:
    """The real trainer (gpt.train.trainer.Trainer, prepared as train_ds.py prepares it), stepped through its public
    methods one optimizer step per step(), as PlainPyTorch is; its console lines silenced."""

    def __init__(self, settings):
        with quiet():
            self.trainer = Trainer(start.prepare(settings))
        self.settings, self.model, self.engine = self.trainer.settings, self.trainer.model, self.trainer.engine
        self.config, self.steps = self.model.config, 0

    def step(self):
        with quiet():
            loss = self.trainer.step(self.steps)
        self.steps += 1
        return loss

    def close(self):
        self.trainer.close()
        del self.trainer, self.model, self.engine
        gc.collect()
        return_freed_memory()


class PlainPyTorch:
    """The baseline: the same model, initial weights, data and schedule in a textbook PyTorch loop on the
    same device, with torch's fastest AdamW (fused), autocast for bf16 and optionally torch.compile. On a
    GPU fp32 matmuls run in TF32 for both: the trainer's setup turned it on for the whole process."""

    def __init__(self, settings, model_config, dtype, compile=False):
        torch.manual_seed(settings.run.seed)
        self.device = torch.device(DEVICE)
        self.model = GPT(model_config).to(self.device)
        self.forward = torch.compile(self.model) if compile else self.model
        optimizer, data = settings.optimizer, settings.data
        self.optimizer = torch.optim.AdamW(param_groups(self.model, optimizer.weight_decay), lr=optimizer.lr, betas=(0.9, 0.95),
                                           eps=1e-8, fused=True)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, OptimizerSettings.of(optimizer).lr_factor)
        self.loader = ShuffledTokenLoader(find_shards(data.dir, "train"), data.micro_batch, data.seq_len,
                                          seed=settings.run.seed, windows_per_batch=data.total_batch_tokens // data.seq_len,
                                          pin_memory=DEVICE == "cuda")
        self.accum = settings.data.total_batch_tokens // (settings.data.micro_batch * settings.data.seq_len)
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
    """Seconds of one step, all its device work included (a GPU runs kernels asynchronously)."""
    return timed_on_device(stepper.step)[1]


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
                trainer = TrainerSteps(settings)
                plain = PlainPyTorch(settings, trainer.config, dtype, compile=compiled)
                ds_seconds, plain_seconds = interleaved_seconds([trainer, plain], repeats)
                flops = trainer.model.flops_per_token(seq_len) * settings.data.total_batch_tokens
                mfu = (lambda seconds: flops / seconds / peaks[dtype]) if peaks[dtype] else (lambda seconds: None)
                rows.append(dict(model=model, dtype=dtype, compiled=compiled, tokens_per_step=settings.data.total_batch_tokens,
                                 plain_s=plain_seconds, trainer_s=ds_seconds, ratio=ds_seconds / plain_seconds,
                                 tflops=flops / ds_seconds / 1e12, mfu=mfu(ds_seconds), plain_mfu=mfu(plain_seconds),
                                 tokens_per_s=settings.data.total_batch_tokens / ds_seconds,
                                 plain_tokens_per_s=settings.data.total_batch_tokens / plain_seconds))
                trainer.close()
                plain.close()
                print_row(rows[-1], OVERHEAD_COLUMNS)
    return rows


def measure_checkpointing(data, tmp, model, seq_len, micro_batch, dtypes, repeats):
    rows = []
    for dtype in dtypes:
        trainers = [TrainerSteps(trainer_settings(data, Path(tmp) / f"ckpt_{dtype}_{on}", ds_config_file(tmp, dtype, checkpointing=on),
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
        eager, compiled = (TrainerSteps(trainer_settings(data, Path(tmp) / f"compile_{dtype}_{on}", ds_config_file(tmp, dtype),
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


LOSS_KERNELS = ("classic", *(k for k in KERNELS if k != "classic"))  # classic first: the target


def measure_loss(data, tmp, dtype, model, seq_len, sequences, micro_batch, sweep_from, compile, repeats):
    """Issue 22's choice of the kernel behind --loss fused: the classic loss and each fused kernel at micro-batch
    `micro_batch` ("fixed") and at --micro_batch auto's choice for that loss ("auto"); the classic loss also at
    micro-batches doubling from `sweep_from` up to its first out-of-memory ("sweep"), its best tokens/s the
    target. Every row `sequences` x seq_len tokens per step (accumulating), compiled as `compile` says. Returns
    (rows, the verdict)."""
    config, rows = ds_config_file(tmp, dtype), []

    def settings(kernel, size):
        return trainer_settings(data, Path(tmp) / f"loss_{kernel}_{size}", config, model, seq_len, size,
                                sequences // size, compile=compile, loss=kernel)
    for kernel in LOSS_KERNELS:
        base = dict(blank_row(LOSS_COLUMNS), model=model, dtype=dtype, loss=kernel, compiled=compile)
        problem = loss_problem(kernel, DEVICE, dtype)
        if problem:
            rows.append(dict(base, note=f"skipped: {problem}"))
            print_row(rows[-1], LOSS_COLUMNS)
            continue
        try:
            picks = {micro_batch: ["fixed"]}  # micro-batch: why it is measured
            auto = auto_micro_batch(settings(kernel, sequences).replace(micro_batch="auto",
                                                                        out_dir=str(Path(tmp) / f"loss_{kernel}_auto")))
            picks.setdefault(auto, []).append("auto")
            if kernel == "classic":
                size = sweep_from
                while size <= sequences:
                    picks.setdefault(size, []).insert(0, "sweep")
                    size *= 2
            out_of_memory_at = None
            for size in sorted(picks):
                if out_of_memory_at is not None and picks[size] == ["sweep"]:
                    continue  # the sweep ends at its first out-of-memory: larger ones will not fit either
                row = dict(base, micro_batch=size, grad_accum=sequences // size, picked_by=", ".join(picks[size]))
                if out_of_memory_at is None:
                    row.update(trainer_throughput(settings(kernel, size), repeats))
                    out_of_memory_at = size if row["tokens_per_s"] is None else None
                else:
                    row["note"] = f"out of memory (micro-batch {out_of_memory_at} was)"
                best = fastest_row(r for r in rows if r["loss"] == "classic")  # the classic rows come first
                if kernel != "classic" and row["tokens_per_s"] and best:
                    row["ratio_to_classic_best"] = row["tokens_per_s"] / best["tokens_per_s"]
                rows.append(row)
                print_row(row, LOSS_COLUMNS)
        except Exception as error:  # noqa: BLE001 -- a fused kernel that fails here is an answer (liger has open bugs)
            if kernel == "classic":
                raise
            traceback.print_exc()
            rows.append(dict(base, note=f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"))
            print_row(rows[-1], LOSS_COLUMNS)
    verdict = loss_verdict(rows, micro_batch, dtype)
    print(f"\n{verdict['line']}", flush=True)
    return rows, verdict


def fastest_row(rows):
    """The row with the most tokens/s, or None if none ran."""
    return max((r for r in rows if r["tokens_per_s"]), key=lambda r: r["tokens_per_s"], default=None)


def loss_verdict(rows, micro_batch, dtype):
    """The fastest fused kernel against the classic loss's best (the target), and its memory against the
    classic loss's at `micro_batch`."""
    best = fastest_row(r for r in rows if r["loss"] == "classic")
    winner = fastest_row(r for r in rows if r["loss"] != "classic")
    if not best or not winner:
        return dict(line=f"verdict: nothing to compare: {'no fused kernel' if best else 'the classic loss never'} ran",
                    fastest=None, ratio=None, meets_target=None, keeps_memory_gain=None)
    ratio, memory = winner["ratio_to_classic_best"], MEMORY_COLUMNS[0][0]
    kernel = winner["loss"]
    at_fixed = {r["loss"]: r for r in rows if r["micro_batch"] == micro_batch and r["loss"] in ("classic", kernel)}
    fused_gib, classic_gib = (at_fixed.get(loss, {}).get(memory) for loss in (kernel, "classic"))
    if fused_gib is None:
        keeps, memory_text = None, f"no {kernel} figure at micro-batch {micro_batch}"
    elif classic_gib is None:  # the classic loss ran out of memory there
        keeps, memory_text = True, f"{kernel} {fused_gib:.2f} GiB, the classic loss out of memory"
    else:
        keeps, memory_text = fused_gib < classic_gib, f"{kernel} {fused_gib:.2f} GiB vs classic {classic_gib:.2f}"
    line = (f"verdict: the fastest fused kernel is {kernel}: {winner['tokens_per_s']:,.0f} tokens/s at micro-batch "
            f"{winner['micro_batch']}, {ratio:.3f}x the classic loss's best ({best['tokens_per_s']:,.0f} at "
            f"micro-batch {best['micro_batch']}): {'meets' if ratio >= 1 else 'misses'} the target (>= the classic "
            f"loss's best); {memory} at micro-batch {micro_batch}: {memory_text}"
            + ("" if keeps is None else f" ({'keeps' if keeps else 'loses'} the memory gain)"))
    if DEVICE == "cuda" and dtype == "bf16":
        line += f'. For gpt/model/loss.py: FUSED_ON_CUDA_BF16 = "{kernel}"'
    return dict(line=line, fastest=kernel, ratio=ratio, meets_target=ratio >= 1, keeps_memory_gain=keeps)


def auto_micro_batch(settings):
    """The micro-batch --micro_batch auto picks for these settings (the plan, probed on a GPU)."""
    with quiet():
        chosen = start.prepare(settings).settings.data.micro_batch
    gc.collect()
    get_accelerator().empty_cache()
    return chosen


def trainer_throughput(settings, repeats):
    """The trainer's tokens/s with these settings and its last step's peak memory (gpt.runtime.memory.peak_memory, reset
    at each step), or tokens_per_s None and a note if it runs out of memory (then freed)."""
    trainer, result = None, dict(tokens_per_s=None, note="out of memory")
    if settings.model.compile:
        forget_compiled_code()
    try:
        trainer = TrainerSteps(settings)
        seconds, = interleaved_seconds([trainer], repeats)
        result = dict(tokens_per_s=settings.data.total_batch_tokens / seconds, **peak_memory(DEVICE))
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


def measure_speed(data, tmp, dtype, peaks, model, seq_len, micro_batch, grad_accum, compiles, repeats):
    """Issue 22's trainer speed: tokens/s and MFU, eager and compiled (`compiles`), --loss fused and classic, each
    variant's steps interleaved with one plain PyTorch loop built once (compiled if any variant is), so that
    every variant is measured against the same baseline."""
    config, rows, plain = ds_config_file(tmp, dtype), [], None
    forget_compiled_code()  # whatever an earlier section compiled
    for compiled in compiles:
        for loss in ("fused", "classic"):
            settings = trainer_settings(data, Path(tmp) / f"speed_{loss}_{'compiled' if compiled else 'eager'}", config,
                                        model, seq_len, micro_batch, grad_accum, compile=compiled, loss=loss)
            trainer = TrainerSteps(settings)
            if plain is None:
                plain = PlainPyTorch(settings, trainer.config, dtype, compile=any(compiles))
            trainer_s, plain_s = interleaved_seconds([trainer, plain], repeats)
            flops = trainer.model.flops_per_token(seq_len) * settings.data.total_batch_tokens
            trainer.close()
            rows.append(dict(model=model, dtype=dtype, compiled=compiled, loss=loss, micro_batch=micro_batch,
                             grad_accum=grad_accum, tokens_per_step=settings.data.total_batch_tokens,
                             tokens_per_s=settings.data.total_batch_tokens / trainer_s,
                             mfu=flops / trainer_s / peaks[dtype] if peaks[dtype] else None,
                             plain_compiled=any(compiles), plain_tokens_per_s=settings.data.total_batch_tokens / plain_s,
                             plain_mfu=flops / plain_s / peaks[dtype] if peaks[dtype] else None,
                             ratio_to_plain=plain_s / trainer_s))
            print_row(rows[-1], SPEED_COLUMNS)
    plain.close()
    return rows


def measure_deterministic(data, tmp, dtype, model, seq_len, micro_batch, grad_accum, steps, rounds):
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
    print_row(row, DETERMINISTIC_COLUMNS)
    return [row]


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


def measure_allocator(tmp, model, seq_len, micro_batch, dtype, repeats, rounds=2):
    """Trainer step with glibc's default malloc vs freed memory kept in the heap (gpt.runtime.host's
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
    trainer = TrainerSteps(trainer_settings(data, Path(data) / "run", ds_config_file(data, args.dtypes[0]), args.model, args.seq_len,
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
# peak memory as gpt.runtime.memory.peak_memory reports it here
MEMORY_COLUMNS = [("peak_alloc_gib", "{:.2f}"), ("peak_reserved_gib", "{:.2f}")] if DEVICE == "cuda" else \
    [("peak_rss_gib", "{:.2f}")]
LOSS_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("loss", "{}"), ("compiled", "{}"), ("micro_batch", "{}"),
                ("grad_accum", "{}"), ("picked_by", "{}"), ("tokens_per_s", "{:.0f}"), *MEMORY_COLUMNS,
                ("ratio_to_classic_best", "{:.3f}"), ("note", "{}")]
SPEED_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("compiled", "{}"), ("loss", "{}"), ("micro_batch", "{}"),
                 ("grad_accum", "{}"), ("tokens_per_s", "{:.0f}"), ("mfu", "{:.3f}"), ("plain_tokens_per_s", "{:.0f}"),
                 ("plain_mfu", "{:.3f}"), ("ratio_to_plain", "{:.3f}")]
DETERMINISTIC_COLUMNS = [("model", "{}"), ("dtype", "{}"), ("tokens_per_step", "{}"), ("steps", "{}"), ("runs", "{}"),
                         ("default_s", "{:.4f}"), ("deterministic_s", "{:.4f}"), ("ratio", "{:.3f}"), ("note", "{}")]


def blank_row(columns):
    """A row with every column, each None (printed '-') until measured."""
    return {name: None for name, _ in columns}


def print_header(title, columns):
    print(f"\n## {title}\n\n| " + " | ".join(name for name, _ in columns) + " |\n|" + "---|" * len(columns), flush=True)


def print_row(row, columns):
    print("| " + " | ".join("-" if row[name] is None else fmt.format(row[name]) for name, fmt in columns) + " |",
          flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="larger batches, more steps, every section")
    parser.add_argument("--smoke", action="store_true",
                        help="each section's code once on the tiny model (for tests): overhead, zero, ckpt "
                             "unless --only names others")
    parser.add_argument("--json", help="write the results here")
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
        return zero_worker(args)
    if args.allocator_worker:
        return allocator_worker(args)
    mode = "smoke" if args.smoke else "full" if args.full else "quick"
    if DEVICE == "cuda" and mode != "smoke":
        mode = "gpu"
    settings = with_modes(MODES[mode], args.modes)
    sections = set(args.only or settings["full_sections" if args.full and "full_sections" in settings else "sections"])
    if DEVICE == "cuda" and sections & CPU_ONLY_SECTIONS:
        print(f"skipping {', '.join(sorted(sections & CPU_ONLY_SECTIONS))}: CPU only (2 ranks on one machine's "
              f"cores, glibc's malloc)")
        sections -= CPU_ONLY_SECTIONS
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
        runs = section_runs(settings, usable, synthetic_shards(Path(tmp)), tmp, results)
        save()
        for section in SECTIONS:
            if section in sections:
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


def section_runs(settings, usable, data, tmp, results):
    """section -> (title, columns, what it adds to the results) in this mode's settings, in the order they run;
    measures the matmul peaks first (into results)."""
    def only_usable(dtypes):  # a section meant for bf16 alone measures fp32 instead where bf16 is skipped
        return tuple(d for d in dtypes if d in usable) or ("fp32",)
    dtypes = only_usable(settings.get("dtypes", usable))
    repeats = settings["repeats"]
    peaks = peaks_for(dtypes, settings)
    results["matmul_peak_flops"] = peaks
    where = torch.cuda.get_device_name() + " datasheet" if DEVICE == "cuda" else \
        f"this CPU ({torch.get_num_threads()} threads), measured"
    print(f"matmul peak on {where}: "
          + ", ".join(f"{d} {p / 1e12:.3f} TFLOP/s" if p else f"{d} unknown" for d, p in peaks.items()))

    def keywords(section):  # a section's keyword arguments in this mode, the mode's repeats unless it sets its own
        return {"repeats": repeats, **settings[section]}
    speed_variants = " and ".join("compiled" if c else "eager" for c in settings["speed"]["compiles"])
    speed_plain = "compiled " if any(settings["speed"]["compiles"]) else ""
    fused_kernel = kernel_for("fused", DEVICE, dtypes[-1]).label
    return {
        "overhead": ("trainer step vs plain PyTorch AdamW step (1 process); MFU against the matmul peak",
                     OVERHEAD_COLUMNS, lambda: {"overhead": measure_overhead_and_mfu(
                         data, tmp, settings["overhead"], dtypes, settings.get("overhead_compile", (False,)),
                         repeats, peaks)}),
        "zero": ("ZeRO stages, 2 ranks: step time and per-rank model-state bytes", ZERO_COLUMNS,
                 lambda: {"zero": measure_zero_stages(data, tmp, *settings["zero"], dtypes, repeats)}),
        "ckpt": ("activation checkpointing: step time and activation bytes, off vs on", CKPT_COLUMNS,
                 lambda: {"ckpt": measure_checkpointing(data, tmp, *settings["ckpt"][:3],
                                                        only_usable(settings["ckpt"][3]), repeats)}),
        "allocator": ("CPU allocator: trainer step with glibc's default malloc vs freed memory kept in the heap",
                      ALLOCATOR_COLUMNS,
                      lambda: {"allocator": measure_allocator(tmp, *settings["allocator"], dtypes[-1], repeats)}),
        "compile": (f"torch.compile (inductor, {DEVICE}): compile time and steady step time", COMPILE_COLUMNS,
                    lambda: {"compile": measure_compile(data, tmp, *settings["compile"], dtypes, repeats)}),
        "loss": ("the kernel behind --loss fused: each fused kernel and the classic loss at a fixed micro-batch "
                 "and at --micro_batch auto's, against the classic loss's best micro-batch (tokens/s, peak memory)",
                 LOSS_COLUMNS, lambda: dict(zip(("loss", "loss_verdict"),
                                                measure_loss(data, tmp, dtypes[-1], **keywords("loss"))))),
        "speed": (f"the trainer's tokens/s and MFU, {speed_variants}, --loss fused ({fused_kernel} here) and "
                  f"classic, against one plain {speed_plain}PyTorch loop, steps interleaved",
                  SPEED_COLUMNS,
                  lambda: {"speed": measure_speed(data, tmp, dtypes[-1], peaks, **keywords("speed"))}),
        "deterministic": ("--deterministic's cost: median step time of train_ds.py without and with it, fresh "
                          "processes alternating", DETERMINISTIC_COLUMNS,
                          lambda: {"deterministic": measure_deterministic(data, tmp, dtypes[-1],
                                                                          **settings["deterministic"])}),
    }

if __name__ == "__main__":
    main()
