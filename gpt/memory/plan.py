"""Memory planner: how large a micro-batch fits one GPU for a model, DeepSpeed config and world size.

    gpt-plan --model d12 --seq_len 1024 --ds_config ds_configs/zero1_bf16.json --gpu a800-80gb --world_size 8

Per GPU it adds up
- model states, as DeepSpeed 0.19 holds them for the config's precision and ZeRO stage (parameters,
  gradients, fp32 master weights, Adam's two moments, BF16_Optimizer's full fp32 gradient buffer, ZeRO
  communication buckets);
- activations saved for backward, from coefficients *measured* on the real model (`profile`): a short
  CPU pass counts the bytes autograd saves (saved-tensor hooks) at small sizes and fits
      bytes per token = n_layer * (a * n_embd + b * n_head) + c * n_embd + d * vocab + e,
  one fit per precision and checkpointing setting. In Korthikanti et al. (2022) terms a layer saves
  s*b*h*(34 + 5*a*s/h) bytes in 16-bit; with SDPA's flash/memory-efficient kernels the 5as/h score term
  is gone (only a per-head logsumexp remains, the b * n_head term), and the fit measures the 34 term
  for this model (our loss in fp32 makes it larger); full recomputation saves ~2sbh per
  layer (the block input), plus one layer's activations while it is recomputed;
- the loss's transient buffers (the logits gradient in fp32), a framework/context reserve and an
  allocator margin,
and returns the largest micro-batch that fits and the gradient accumulation for --total_batch_tokens."""
import dataclasses
import functools
import hashlib
import json
import os

import numpy as np
import torch

from gpt.config import ds_config as dsc
from gpt.console import BadInput
from gpt.model.loss import CHUNK_ROWS
from gpt.memory.footprint import measure_loss_chunk_bytes, measure_step_bytes
from gpt.memory.muon import muon_optimizer_state_bytes, optimizer_of, uses_muon
from gpt.model.model import GPTConfig, param_count

MiB, GiB = 2**20, 2**30
# Device memory as CUDA reports it (torch.cuda.get_device_properties().total_memory), which is less than
# the datasheet's GB and than nvidia-smi's MiB: the driver keeps ~480 MiB (H100: 81,559 MiB in nvidia-smi,
# 81,079 MiB to CUDA).
NVIDIA_SMI_TO_CUDA = 480 * MiB
GPUS = {
    "h100-80gb": 85_017_493_504,  # measured, H100 80GB HBM3 (../shared/gpu/h100-memory-2026-11-22.json)
    "h800-80gb": 85_017_493_504,  # assumed the H100's: the same 80 GB HBM3 board
    "a100-80gb": 81_920 * MiB - NVIDIA_SMI_TO_CUDA,  # nvidia-smi 81,920 MiB (modal-labs/modal-client#2797)
    "a800-80gb": 81_920 * MiB - NVIDIA_SMI_TO_CUDA,  # assumed the A100-80GB's (the same memory system)
    "a100-40gb": 42_405_855_232,  # CUDA deviceQuery on an A100-SXM4-40GB (Paderborn PC2 wiki)
    "v100-32gb": 32_512 * MiB,  # 31.75 GiB, what a V100-SXM2-32GB reports (nvidia-smi 32,510 MiB)
    "v100-16gb": 16_160 * MiB - NVIDIA_SMI_TO_CUDA,  # nvidia-smi 16,160 MiB (not verified here)
    "h200-141gb": 143_771 * MiB - NVIDIA_SMI_TO_CUDA,  # nvidia-smi 143,771 MiB (not verified here)
    "rtx3090-24gb": 24_576 * MiB - NVIDIA_SMI_TO_CUDA,  # nvidia-smi 24,576 MiB (not verified here)
    "rtx4090-24gb": 24_564 * MiB - NVIDIA_SMI_TO_CUDA,  # nvidia-smi 24,564 MiB (not verified here)
}
# GPUs without bf16 (Volta, compute capability 7.0; bf16 came with Ampere's 8.0): their config is fp16's
NO_BF16 = {"v100-32gb": "ds_configs/zero2_fp16.json", "v100-16gb": "ds_configs/zero2_fp16.json"}
CONTEXT_RESERVE = 1 * GiB  # CUDA context, NCCL buffers, cuBLAS workspaces: outside PyTorch's allocator
# What the caching allocator reserves above what it allocates, as a fraction of the allocated peak. Measured
# with d12 on an H100 (the shared file): 19-20% by default at micro-batches 32-64 (fitting 64, not 72); at
# most 1% with expandable segments but for a first step (8%), so 3% (fitting 76, not 80). On CPU: glibc's heap.
ALLOCATOR_OVERHEAD = {"default": 0.20, "expandable_segments": 0.03, "cpu": 0.05}
MAX_MICRO_BATCH = 4096
# A CUDA step's per-token bytes over what the CPU profile below predicts, by (loss, compiled): measured with the
# trainer's engine on an H100 (d12, T=1024; tests/data/gpu_measure_*.json, where the test holds the plan to every
# row). Eager (2026-11-24, zero1_bf16 at micro-batch 256/77 and the V100-32GB cap in fp16): the fused step held
# 6% more per token than the CPU fit (cuBLAS and SDPA's CUDA kernels keep other temporaries), the classic 3% less.
# Compiled (2026-11-26, zero1_bf16 at 128): Inductor fuses the classic loss's fp32 logits and their gradient into
# few kernels (0.60 of the eager bytes); the fused step, whose loss stays out of the compiled region, held a little
# more (1.08). Not measured: checkpointing, other models. Rounded up: the GPU probe checks the plan with a real step.
CUDA_PER_TOKEN = {("fused", False): 1.07, ("classic", False): 0.98, ("fused", True): 1.09, ("classic", True): 0.62}
# Shapes the activation fit is measured on (n_layer, n_head, n_embd, vocab, batch, seq_len), each at batch and
# 2 x batch: small and varied, and large enough that the step's per-token phase holds the peak.
PROFILE_SHAPES = [(2, 2, 64, 512, 8, 32), (3, 2, 64, 512, 8, 32), (2, 4, 64, 512, 8, 32),
                  (2, 2, 128, 512, 8, 32), (2, 2, 64, 1024, 8, 32), (2, 2, 64, 512, 16, 64)]


def element_bytes(precision):
    return 2 if precision in ("bf16", "fp16") else 4


# -- model states ----------------------------------------------------------------------------------
def model_state_bytes(n_params, precision, stage, world_size, ds_config=None, model_config=None):
    """Bytes per GPU of what DeepSpeed 0.19 keeps for parameters and the optimizer: AdamW, or Muon when the JSON
    names it and model_config (the GPTConfig) says which parameters are its matrices (gpt/memory/muon.py; without
    model_config a Muon JSON is counted as AdamW, which holds at least as much).

    Half precision: 16-bit parameters and gradients, fp32 master weights, fp32 gradient partition
    (created at the step), two fp32 Adam moments; ZeRO-1 partitions the fp32 states, ZeRO-2 also the
    gradients. bf16 + ZeRO-1 + fp32 gradient accumulation is DeepSpeed's BF16_Optimizer, which keeps a
    full (unpartitioned) fp32 gradient buffer instead. fp32: parameters are the master weights."""
    ds_config = ds_config or {}
    psi, n, e = n_params, world_size, element_bytes(precision)
    partition = (lambda x: x / n) if stage >= 1 else (lambda x: x)
    fp32_accumulation = dsc.grad_accum_dtype(ds_config) == "fp32"
    parts = {"parameters": e * psi}
    if precision == "fp32":  # ZeRO 1/2 still keep their own fp32 copy of each partition as master weights
        parts["gradients"] = 4 * psi / n if stage >= 2 else 4 * psi
        parts["master_weights"] = 4 * psi / n if stage >= 1 else 0
        parts["optimizer_states"] = partition(8 * psi)
    elif precision == "bf16" and stage == 1 and fp32_accumulation:  # BF16_Optimizer
        parts["gradients"] = 4 * psi  # the full fp32 gradient buffer
        parts["master_weights"] = partition(4 * psi)
        parts["optimizer_states"] = partition(8 * psi)
    else:
        parts["gradients"] = e * psi / n if stage >= 2 else e * psi
        parts["fp32_gradients"] = partition(4 * psi) if stage >= 1 else 0
        parts["master_weights"] = partition(4 * psi)
        parts["optimizer_states"] = partition(8 * psi)
    if model_config is not None and uses_muon(ds_config):
        # DeepSpeedZeroOptimizer's gradients arrive in the accumulation dtype at ZeRO 1, in the parameters' at ZeRO 2
        optimizer = ("none" if stage == 0 else "bf16" if precision == "bf16" and stage == 1 and fp32_accumulation
                     else 4 if stage == 1 and fp32_accumulation else e)
        parts["optimizer_states"] = muon_optimizer_state_bytes(model_config, psi, stage, n, optimizer)
    parts["buckets"] = bucket_bytes(ds_config, precision, stage)
    return parts


def bucket_bytes(ds_config, precision, stage):
    """ZeRO's communication buffers: the reduce bucket (twice with overlap_comm, which double-buffers
    it) and the all-gather bucket, in the gradient dtype."""
    if stage == 0:
        return 0
    zero = dsc.zero_config(ds_config)  # DeepSpeed's defaults and coercions
    e = element_bytes(precision)
    reduce = zero.reduce_bucket_size * e * (2 if zero.overlap_comm else 1)
    return reduce + zero.allgather_bucket_size * e


# -- activations and the loss ------------------------------------------------------------------------
def _features(n_layer, n_head, n_embd, vocab):
    return [n_layer * n_embd, n_layer * n_head, n_embd, vocab, 1.0]


@functools.lru_cache(maxsize=None)
def activation_fit(precision, checkpointing, loss):
    """Coefficients (a, b, c, d, e) of a training step's peak bytes per token (activations, the loss's
    buffers, temporaries), least-squares fitted to measurements at two batch sizes per shape: the
    difference is the per-token cost, whatever a step holds independently of the batch."""
    torch.manual_seed(0)
    rows, targets = [], []
    for n_layer, n_head, n_embd, vocab, batch, seq_len in PROFILE_SHAPES:
        config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=seq_len, vocab_size=vocab)
        small, large = (measure_step_bytes(config, b, seq_len, precision, checkpointing, loss) for b in (batch, 2 * batch))
        rows.append(_features(n_layer, n_head, n_embd, vocab))
        targets.append((large - small) / (batch * seq_len))
    coefficients, *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return tuple(float(c) for c in coefficients)


def per_token_bytes(config, precision, checkpointing, loss):
    # fp16 and bf16 hold the same bytes at every step (2-byte activations, the loss in fp32): one fit serves both
    # (tests/unit/test_plan.py measures the two equal): half the fits of gpt-plan and of the README table
    fit = activation_fit("bf16" if precision == "fp16" else precision, checkpointing, loss)
    return float(np.dot(fit, _features(config.n_layer, config.n_head, config.n_embd, config.vocab_size)))


@functools.lru_cache(maxsize=None)
def loss_chunk_element_bytes(precision):
    """Bytes per logit element of one chunk of the fused loss, measured (with the weight-gradient
    accumulator, which fused_loss_bytes counts apart, taken out)."""
    rows, vocab, width = 512, 4096, 64
    accumulator = vocab * width * 4
    return (measure_loss_chunk_bytes(rows, vocab, width, precision) - accumulator) / (rows * vocab)


def fused_loss_bytes(config, tokens, precision):
    """What the fused loss holds independently of the batch: the fp32 weight-gradient accumulator and its
    cast to the weight's dtype, and one chunk of logits in their forms."""
    chunk = min(tokens, CHUNK_ROWS) * config.vocab_size * loss_chunk_element_bytes(precision)
    return config.vocab_size * config.n_embd * (4 + element_bytes(precision)) + chunk


def step_bytes(config, batch, seq_len, precision, checkpointing, loss, cuda_step=None):
    """Predicted peak of a training step beyond the model states (what measure_step_bytes measures, plus
    the fused loss's chunk at full size). cuda_step: None for the CPU, else whether the CUDA step is compiled
    (CUDA_PER_TOKEN)."""
    tokens = batch * seq_len
    factor = 1.0 if cuda_step is None else CUDA_PER_TOKEN[loss, cuda_step]
    total = factor * per_token_bytes(config, precision, checkpointing, loss) * tokens
    return total + (fused_loss_bytes(config, tokens, precision) if loss == "fused" else 0)


# -- the plan --------------------------------------------------------------------------------------
def plan_bytes(config, n_params, batch, seq_len, precision, stage, world_size, ds_config, checkpointing, loss,
               allocator, context_bytes, compiled=None):
    """A training step's peak device memory, by part: model states, activations with the loss's buffers,
    what the caching allocator reserves beyond that, and what lies outside PyTorch (context_bytes).
    compiled: whether the CUDA step is compiled; None on the CPU (allocator 'cpu')."""
    parts = dict(model_state_bytes(n_params, precision, stage, world_size, ds_config, config))
    parts["activations_and_loss"] = step_bytes(config, batch, seq_len, precision, checkpointing, loss,
                                               None if allocator == "cpu" else bool(compiled))
    parts["allocator_overhead"] = ALLOCATOR_OVERHEAD[allocator] * sum(parts.values())
    parts["context_reserve"] = context_bytes
    return parts


def make_plan(config, seq_len, ds_config, world_size, device_bytes, total_batch_tokens, loss="fused",
              allocator="expandable_segments", context_bytes=CONTEXT_RESERVE, compiled=True):
    """The largest micro-batch whose step fits device_bytes, and the one that also divides the token
    budget. allocator: 'expandable_segments', 'default' or 'cpu' (ALLOCATOR_OVERHEAD); compiled: a GPU step under
    torch.compile (the trainer's default on CUDA) or eager."""
    precision = dsc.precision(ds_config)
    stage = dsc.zero_stage(ds_config)
    checkpointing = dsc.uses_activation_checkpointing(ds_config)
    n_params = param_count(config)  # a closed form: an absurd shape would overflow even the meta device

    def parts(batch):
        return plan_bytes(config, n_params, batch, seq_len, precision, stage, world_size, ds_config, checkpointing,
                          loss, allocator, context_bytes, compiled)

    states = sum(v for k, v in parts(1).items() if k in MODEL_STATE_PARTS)
    if states > device_bytes:  # whatever the batch: no checkpointing helps
        raise BadInput(f"the model states alone ({n_params:.3g} parameters: weights, gradients, optimizer states) "
                       f"need {states / GiB:,.1f} GiB per GPU, more than its {device_bytes / GiB:,.1f} GiB: choose a "
                       f"smaller model, or more GPUs with ZeRO 1 or 2")
    if sum(parts(1).values()) > device_bytes:
        raise BadInput(f"even micro-batch 1 needs {sum(parts(1).values()) / GiB:,.1f} GiB of the GPU's "
                       f"{device_bytes / GiB:,.1f} GiB (model states {states / GiB:,.1f} GiB); "
                       f"use ZeRO-2, activation checkpointing, more GPUs or a GPU with more memory")
    low, high = 1, MAX_MICRO_BATCH  # the total grows with the batch: bisect for the largest that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if sum(parts(mid).values()) <= device_bytes else (low, mid - 1)
    per_micro_step = seq_len * world_size
    fitting = [b for b in range(low, 0, -1) if total_batch_tokens % (b * per_micro_step) == 0]
    micro = fitting[0] if fitting else None
    chosen = parts(micro or low)
    return {"max_micro_batch": low, "micro_batch": micro,
            "grad_accum": total_batch_tokens // (micro * per_micro_step) if micro else None,
            "total_bytes": sum(chosen.values()), "gpu_bytes": device_bytes, "bytes": chosen,
            "n_params": n_params, "optimizer": optimizer_of(ds_config), "precision": precision, "zero_stage": stage,
            "checkpointing": checkpointing,
            "loss": loss, "allocator": allocator, "compiled": compiled and allocator != "cpu", "world_size": world_size,
            "seq_len": seq_len}


MODEL_STATE_PARTS = ("parameters", "gradients", "fp32_gradients", "master_weights", "optimizer_states", "buckets")


def resident_model_state_bytes(n_params, precision, stage, world_size, ds_config, model_config=None):
    """The model states that stay allocated between steps (gradients and ZeRO buckets exist only during
    backward and the step; BF16_Optimizer's fp32 gradient buffer stays)."""
    parts = model_state_bytes(n_params, precision, stage, world_size, ds_config, model_config)
    bf16_optimizer = precision == "bf16" and stage == 1 and "fp32_gradients" not in parts
    resident = ["parameters", "master_weights", "optimizer_states"] + (["gradients"] if bf16_optimizer else [])
    return sum(parts.get(name, 0) for name in resident)


def device_memory_bytes(device_type):
    """This rank's device memory: the GPU's total, or on CPU the available RAM shared by the local ranks.
    device_type is DeepSpeed's accelerator: a run pinned to the CPU on a GPU machine plans for RAM."""
    import os

    if device_type == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, torch.cuda.get_device_name()
    import psutil
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
    return psutil.virtual_memory().available / local_ranks, f"CPU RAM / {local_ranks} local rank(s)"


def device_total_bytes(device_type):
    """All of one rank's device memory, whatever is in use now: the GPU's total, or the machine's physical RAM
    shared by the local ranks. (device_memory_bytes plans with what is free; a refusal needs what never fits.)"""
    import os

    if device_type == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return total, f"the GPU's {total / GiB:,.1f} GiB"
    import psutil
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))
    total = psutil.virtual_memory().total
    return total / local_ranks, f"this machine's {total / GiB:,.1f} GiB of RAM" + (
        f" shared by {local_ranks} local ranks" if local_ranks > 1 else "")


def auto_record(config, seq_len, ds_config, world_size, device_type, loss, compiled, deterministic):
    """What --micro_batch auto's choice depends on but the token budget, as a checkpoint records it: the device (its
    name, all its memory, the CUDA allocator's mode), the run's shape (model, seq_len, world size, a digest of the
    DeepSpeed JSON) and its step (loss, compile, --deterministic). A resume whose record is equal keeps the
    checkpoint's micro-batch (gpt.train.start.kept_micro_batch)."""
    total, _ = device_total_bytes(device_type)
    cuda = device_type == "cuda"
    digest = hashlib.sha256(json.dumps(ds_config, sort_keys=True).encode()).hexdigest()[:16]
    return {"device": torch.cuda.get_device_name() if cuda else device_type, "memory_bytes": int(total),
            "allocator": ("expandable_segments" if expandable_segments() else "default") if cuda else "cpu",
            "model": dataclasses.asdict(config), "seq_len": seq_len, "world_size": world_size,
            "ds_config_sha256": digest, "loss": loss, "compile": compiled, "deterministic": deterministic}


def model_memory_problem(label, config, ds_config, world_size, device_type):
    """Why the model's states alone (weights, gradients, Adam's moments and master weights, ZeRO's buckets, as
    model_state_bytes counts them per rank) cannot fit this rank's device however small the batch, or None.
    label: the flags that chose the model."""
    n_params = param_count(config)
    precision, stage = dsc.precision(ds_config), dsc.zero_stage(ds_config)
    need = sum(model_state_bytes(n_params, precision, stage, world_size, ds_config, config).values())
    have, what = device_total_bytes(device_type)
    if need <= have:
        return None
    return (f"{label}: {n_params:.3g} parameters, whose weights, gradients and optimizer states need "
            f"{need / GiB:,.1f} GiB per rank ({precision}, ZeRO {stage}, {world_size} rank(s)), more than {what}: "
            f"choose a smaller model, or more ranks with ZeRO 1 or 2")


def auto_micro_batch(config, seq_len, ds_config, world_size, total_batch_tokens, device_type, loss, compiled):
    """(the plan, the plan as text) for --micro_batch auto on this machine's device, with the allocator
    setting the trainer runs with and its step (compiled or eager)."""
    device_bytes, device = device_memory_bytes(device_type)
    allocator = ("expandable_segments" if expandable_segments() else "default") if device_type == "cuda" else "cpu"
    plan = make_plan(config, seq_len, ds_config, world_size, device_bytes, total_batch_tokens, loss, allocator,
                     CONTEXT_RESERVE if device_type == "cuda" else 0, compiled)
    if plan["micro_batch"] is None:
        raise BadInput(f"no micro-batch up to {plan['max_micro_batch']} divides --total_batch_tokens "
                       f"{total_batch_tokens} into seq_len {seq_len} x {world_size} rank(s)")
    return plan, format_plan(plan, f"--micro_batch auto on {device}")


def format_plan(plan, label):
    lines = [f"{label}: {plan['n_params'] / 1e6:.0f}M parameters, {plan['optimizer']}, {plan['precision']}, "
             f"ZeRO {plan['zero_stage']}, "
             f"checkpointing {'on' if plan['checkpointing'] else 'off'}, {plan['loss']} loss"
             f"{'' if plan['allocator'] == 'cpu' else ', compiled' if plan['compiled'] else ', eager'}, "
             f"{plan['allocator']} allocator, {plan['world_size']} rank(s), seq_len {plan['seq_len']}"]
    for name, value in plan["bytes"].items():
        lines.append(f"  {name:18s} {value / GiB:8.2f} GiB")
    lines.append(f"  {'total':18s} {plan['total_bytes'] / GiB:8.2f} GiB of {plan['gpu_bytes'] / GiB:.2f} GiB "
                 f"at micro-batch {plan['micro_batch'] or plan['max_micro_batch']}")
    lines.append(f"max micro-batch {plan['max_micro_batch']}; for the token budget: micro-batch "
                 f"{plan['micro_batch']} x grad_accum {plan['grad_accum']}")
    return "\n".join(lines)


# The CUDA caching allocator's setting (PYTORCH_CUDA_ALLOC_CONF): the trainer's default of expandable
# segments, gpt-plan --measure --allocator's choice, and reading which one a run has or will have. It decides
# how much of the device the planned bytes can use; set it before CUDA's allocator starts.
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def use_expandable_segments(environ=os.environ):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the user set the variable: measured on an
    H100 with d12, the allocator then reserved ~1% above what it allocated instead of ~20%, and the
    largest micro-batch grew from 64 to 76. Call before CUDA's allocator starts. Returns the log line."""
    for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF"):  # the second: its name since PyTorch 2.9
        if name in environ:
            return f"{name}={environ[name]} (yours, kept)"
    environ[ALLOC_CONF] = EXPANDABLE_SEGMENTS
    return f"{ALLOC_CONF}={EXPANDABLE_SEGMENTS} (the trainer's default on CUDA: set the variable to choose otherwise)"


def set_allocator(expandable, environ=os.environ):
    """Choose the CUDA allocator's expandable segments on or off, whatever the environment said (gpt-plan
    --measure --allocator). Call before CUDA's allocator starts."""
    environ.pop("PYTORCH_ALLOC_CONF", None)
    environ[ALLOC_CONF] = f"expandable_segments:{expandable}"


def expandable_segments(environ=os.environ):
    """Whether the CUDA allocator runs (or will run) with expandable segments."""
    settings = ",".join(environ.get(name, "") for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF")).replace(" ", "")
    return "expandable_segments:true" in settings.lower()


def trainer_uses_expandable_segments(environ=os.environ):
    """Whether the trainer will run with expandable segments: its default, unless the variable is set."""
    return not {ALLOC_CONF, "PYTORCH_ALLOC_CONF"} & environ.keys() or expandable_segments(environ)
