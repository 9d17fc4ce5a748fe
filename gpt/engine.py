"""Everything DeepSpeed: process group, config filling, the engine, precision switches, step statistics."""
import atexit
import contextlib
import ctypes
import math
import os
import socket
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime import bf16_optimizer

from gpt import ds_config as dsc


def launched_rank():
    """This process's rank as the launcher (deepspeed, torchrun) set it; 0 for a plain `python` run."""
    return int(os.environ.get("RANK", 0))


def launched_world_size():
    return int(os.environ.get("WORLD_SIZE", 1))


def device_type():
    """'cuda' or 'cpu': the accelerator DeepSpeed picked (DS_ACCELERATOR, else what it detects)."""
    return get_accelerator().device_name()


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed(allow_cpu_fp16=False):
    """Join the process group (NCCL on GPUs, gloo on CPU) and return this rank's device. A plain
    `python train_ds.py` becomes a one-rank group, so the same code path serves every launch."""
    if "RANK" not in os.environ:  # no launcher: a single local process
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    accelerator = get_accelerator()
    if allow_cpu_fp16:
        enable_cpu_fp16()
    if accelerator.device_name() == "cpu":
        if os.environ.get("DSGPT_MALLOC_CACHE", "1") != "0":  # 0: glibc's defaults (bench/train.py's baseline)
            keep_freed_memory_in_heap()
        # Each rank would otherwise start one thread per core: 2 ranks on 2 cores oversubscribe.
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
        atexit.register(release_cpu_comm_buffer)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    accelerator.set_device(local_rank)
    return torch.device(accelerator.device_name(local_rank))


def keep_freed_memory_in_heap():
    """CPU tensors come from glibc malloc, which serves every block over 32 MB (logits, activations,
    gradient buffers) with fresh mmap pages and unmaps them on free: each step page-faults its whole
    working set again, and the kernel time rivalled the compute (sys ~ user). Keep freed memory in the
    heap for reuse instead, as CUDA's caching allocator does on GPUs: 1.99x faster d4 bf16 steps
    (python bench/train.py --only allocator). The price: RSS stays at its peak."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
    libc.mallopt(M_MMAP_MAX, 0)  # large blocks from the heap, not mmap
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # and never handed back to the kernel mid-run


def return_freed_memory():
    """Hand the heap's free memory back to the kernel (keep_freed_memory_in_heap never does by itself):
    for a process that builds one engine after another, such as bench/train.py."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def release_cpu_comm_buffer():
    """DeepSpeed's CPU shared-memory allreduce creates a 66 MB buffer per rank in /dev/shm and never
    unlinks it (its shared_close is not called at exit), so every run would leak RAM: remove ours."""
    env = os.environ
    for rank_key in ("RANK", "LOCAL_RANK"):
        name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR')}_{env.get('MASTER_PORT')}"
                f"_{env.get(rank_key)}")
        Path("/dev/shm", name).unlink(missing_ok=True)


def enable_cpu_fp16():
    """Let DeepSpeed run fp16 configs on its CPU accelerator, which refuses fp16 where oneDNN lacks fp16
    kernels. Only for exercising the fp16 loss-scaling path without a GPU; refused on anything else."""
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        raise SystemExit(f"error: --cpu_fp16 is only for the CPU accelerator, not {accelerator.device_name()}")
    accelerator.is_fp16_supported = lambda: True


def lr_at(step, max_lr, warmup_steps, max_steps, min_lr_ratio):
    """GPT-3 / llm.c schedule: linear warmup from max_lr/warmup_steps to max_lr, then cosine decay to
    max_lr * min_lr_ratio at max_steps. (DeepSpeed's WarmupCosineLR starts warmup at 0 and shifts the
    cosine by one step, so it is not this schedule.)"""
    min_lr = max_lr * min_lr_ratio
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps or max_steps == warmup_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def param_groups(model, weight_decay):
    """Weight decay on matrices and embeddings (dim >= 2), none on biases and LayerNorm parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def initialize(model, args, ds_config, grad_accum):
    """The DeepSpeed engine around model; with an `activation_checkpointing` block in the JSON, every
    transformer block is recomputed in backward through DeepSpeed's checkpoint API."""
    config = dsc.fill(ds_config, args.micro_batch, grad_accum, args.total_batch_tokens // args.seq_len, args.lr,
                      args.weight_decay)
    if dsc.uses_activation_checkpointing(config):
        deepspeed.checkpointing.configure(mpu_=None, deepspeed_config=config)
        model.checkpoint_fn = deepspeed.checkpointing.checkpoint  # reentrant: block inputs carry grad
    schedule = lambda step: lr_at(step, args.lr, args.warmup_steps, args.max_steps, args.min_lr_ratio) / args.lr
    with no_memory_dumps():
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, args.weight_decay), config=config,
            lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, schedule))
    return engine


@contextlib.contextmanager
def no_memory_dumps():
    """DeepSpeed 0.19's BF16_Optimizer prints 18 lines of memory statistics (see_memory_usage with
    force=True) to stdout while it builds; silence those, and only those: warnings go through DeepSpeed's
    logger, untouched."""
    original = bf16_optimizer.see_memory_usage
    bf16_optimizer.see_memory_usage = lambda *args, **kwargs: None
    try:
        yield
    finally:
        bf16_optimizer.see_memory_usage = original


def mean_over_ranks(tensor):
    if dist.is_initialized() and dist.get_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor


def step_stats(engine):
    """grad_norm (before clipping); with fp16 also the loss scale and the count of skipped steps."""
    stats = {}
    grad_norm = engine.get_global_grad_norm()
    if grad_norm is not None:
        stats["grad_norm"] = float(grad_norm)
    if engine.fp16_enabled():
        stats["loss_scale"] = float(engine.optimizer.cur_scale)
        stats["skipped_steps"] = int(engine.skipped_steps)
    return stats
