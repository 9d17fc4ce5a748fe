"""The harness every bench/ measurement of training shares (bench/train.py's sections, bench/levers.py): the trainer
prepared as train_ds.py prepares it and stepped one optimizer step at a time (TrainerSteps), the plain PyTorch loop it
is measured against (PlainPyTorch), steps interleaved (machines are noisy), synthetic data and DeepSpeed JSONs, the
usable dtypes and matmul peaks, and the markdown table rows. Settings come from train_ds.py's own command line
(trainer_argv -> train_ds.parse), the path a user's flags take."""
import contextlib
import gc
import io
import json
import logging
import os
import statistics
from pathlib import Path

import numpy as np
import torch
from deepspeed.accelerator import get_accelerator

from train_ds import parse
from gpt.config.hardware import cpu_bf16_units, measure_cpu_peak_flops, peak_flops
from gpt.data.shards import ShuffledTokenLoader, find_shards, shard_name, write_shard
from gpt.model.model import GPT, GPT2_VOCAB_SIZE
from gpt.train.engine import forget_compiled_code
from gpt.runtime.accelerator import device_type
from gpt.runtime.host import return_freed_memory
from gpt.runtime.memory import is_out_of_memory, peak_memory
from gpt.runtime.ranks import timed_on_device
from gpt.train import start
from gpt.train.engine import OptimizerSettings, param_groups
from gpt.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]

DEVICE = device_type()  # "cuda" or "cpu": the accelerator DeepSpeed picks, as in the trainer
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# peak memory as gpt.runtime.memory.peak_memory reports it here
MEMORY_COLUMNS = [("peak_alloc_gib", "{:.2f}"), ("peak_reserved_gib", "{:.2f}")] if DEVICE == "cuda" else \
    [("peak_rss_gib", "{:.2f}")]


# -- what this machine can measure ----------------------------------------------------------------
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
def synthetic_shards(directory, tokens=1 << 21, seed=0, vocab_size=None):
    """Random GPT-2 token ids (or ids below vocab_size) in llm.c shards: speed does not depend on what the tokens
    say."""
    rng, high = np.random.default_rng(seed), vocab_size or GPT2_VOCAB_SIZE
    for split, index in (("val", 0), ("train", 1)):
        write_shard(Path(directory) / shard_name("synthetic", split, index), rng.integers(0, high, tokens))
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
                 loss="fused", max_steps=1000, vocab_size=None):
    """train_ds.py's command line for these settings (no validation, no samples; the model's own vocabulary unless
    vocab_size)."""
    # compile is always explicit: the trainer's default (None) would turn it on with CUDA, off on CPU
    return [
        "--data", str(data), "--out_dir", str(out_dir), "--ds_config", ds_config, "--model", model,
        "--seq_len", str(seq_len), "--micro_batch", str(micro_batch),
        "--total_batch_tokens", str(seq_len * micro_batch * grad_accum * world_size), "--loss", loss,
        "--max_steps", str(max_steps), "--warmup_steps", str(min(10, max_steps)), "--val_every", "0",
        "--sample_every", "0", "--val_tokens", str(seq_len), "--seed", "0", "--compile" if compile else "--no-compile",
        *(["--vocab_size", str(vocab_size)] if vocab_size else [])]


def trainer_settings(*args, **kwargs):
    """The trainer's settings for trainer_argv(*args, **kwargs)."""
    return parse(trainer_argv(*args, **kwargs))


def worker_env():
    """This process's environment minus the process-group variables setup_distributed put there."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                            "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONPATH": str(REPO)}


@contextlib.contextmanager
def quiet():
    """The trainer's console lines and DeepSpeed's INFO logs would bury the table."""
    from deepspeed.utils import logger
    level = logger.level
    logger.setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        yield
    logger.setLevel(level)


# -- the steppers and their clock ----------------------------------------------------------------------
class TrainerSteps:
    """The real trainer (gpt.train.trainer.Trainer, prepared as train_ds.py prepares it), stepped through its public
    methods one optimizer step per step(), as PlainPyTorch is; its console lines silenced. Built with Trainer(), not
    the run's Trainer.build_or_exit: a size that does not fit is an answer here (trainer_throughput), not an exit."""

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
    GPU fp32 matmuls run in TF32 for both: the trainer's setup turned it on for the whole process. settings: the
    trainer's, as its start decided them (--lr and --weight_decay among them)."""

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


def auto_micro_batch(settings):
    """The micro-batch --micro_batch auto picks for these settings (the plan, probed on a GPU)."""
    with quiet():
        chosen = start.prepare(settings).settings.data.micro_batch
    gc.collect()
    get_accelerator().empty_cache()
    return chosen


# -- the report -------------------------------------------------------------------------------------
def blank_row(columns):
    """A row with every column, each None (printed '-') until measured."""
    return {name: None for name, _ in columns}


def print_header(title, columns):
    print(f"\n## {title}\n\n| " + " | ".join(name for name, _ in columns) + " |\n|" + "---|" * len(columns), flush=True)


def print_row(row, columns):
    print("| " + " | ".join("-" if row[name] is None else fmt.format(row[name]) for name, fmt in columns) + " |",
          flush=True)
