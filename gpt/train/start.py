"""A run's start, before its first step: prepare(settings) -> Setup. Every check before launch
(gpt/train/preflight.py), out_dir's run lock, the process group, then --micro_batch auto's size: on a resume of
the same run on a like device the checkpoint's, else on a GPU the probe's by real steps; and new_engine, which
builds every engine a run steps (the probe's throwaway ones too), so that the probe measures the step the run
takes."""
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from gpt.runtime import accelerator, host, ranks  # first: DeepSpeed imported with its logs on stderr
from gpt.config import ds_config as dsc, hardware
from gpt.train.preflight import AUTO, gradient_accumulation, model_flags, preflight, run_config_of
from gpt.console import BadInput, exit_if, exit_with, launch_problem, launched_rank, launched_world_size, say, say0
from gpt.memory.plan import GiB, model_state_bytes, use_expandable_segments
from gpt.memory.probe import dividing_sizes, probe_micro_batch
from gpt.model.model import GPT, param_count
from gpt.model import wrap
from gpt.train import resume, run_lock, universal
from gpt.train.out_dir import check_fresh_out_dir
from gpt.train.engine import OptimizerSettings, initialize
from gpt.train.hf import load_hf_weights


def prepare(settings):
    """setup(); then --micro_batch auto: on a resume where the size was chosen for this same run and device, that size
    (kept_micro_batch), else on a GPU probe() (on CPU the plan alone decides)."""
    prepared = setup(settings)
    if prepared.auto_plan is None:
        return prepared
    return kept_micro_batch(prepared) or (probe(prepared) if prepared.device.type != "cpu" else prepared)


def setup(settings):
    """Every check before launch (gpt/train/preflight.py), then rank 0 takes out_dir's lock (and converts a
    checkpoint to resume on another layout), and every rank joins the process group."""
    # the device asked for; the world size every plan below is made for, as the group will have it; the port its store
    # will listen on; where DeepSpeed's ops are built
    exit_if([accelerator.accelerator_problem(), launch_problem(), ranks.store_port_problem(),
             host.extensions_dir_problem()], 2)
    world_size = launched_world_size()
    device_type = accelerator.device_type()
    if device_type == "cuda":
        say0(use_expandable_segments())  # before anything starts CUDA's allocator (the planner may)
    try:
        prepared = preflight(settings, world_size, device_type)
    except BadInput as e:
        exit_with(e, 2)
    settings, resume_from, kind = prepared.settings, prepared.resume_from, prepared.resume_kind
    lock, refusal = lock_out_dir(settings, resume_from)  # last: every check before it writes nothing
    if kind == "universal" and refusal is None and launched_rank() == 0:
        refusal = convert_to_universal(resume_from)  # the other ranks wait for it in the rendezvous below
    if refusal and launched_world_size() == 1:
        exit_with(refusal, 2)
    if device_type == "cuda":
        arch_note = hardware.fix_cuda_arch_list()  # every rank, before DeepSpeed JIT-builds FusedAdam
        if arch_note:
            say0(arch_note)
    elif prepared.precision == "bf16" and launched_rank() == 0:
        warning = hardware.cpu_bf16_warning()
        if warning:
            say(warning, sys.stderr)
    if settings.run.deterministic:
        hardware.make_deterministic(device_type)
    device = ranks.setup_distributed(allow_cpu_fp16=settings.run.cpu_fp16 and prepared.precision == "fp16",
                                    timeout_s=settings.run.collective_timeout)
    if launched_world_size() > 1:  # only rank 0 knows: every rank ends now, not at the collective timeout
        if ranks.mean_over_ranks(torch.tensor(float(refusal is not None), device=device)).item() > 0:
            # Hard: the rank that hosted the group's store may be gone already, and tearing the group down then
            # aborted another node's rank (SIGABRT, `terminate called without an active exception`, in CI).
            host.release_cpu_comm_buffer()  # an atexit handler, which a hard exit skips
            exit_with(refusal or "refused by rank 0", 2, hard=True)
    torch.manual_seed(settings.run.seed)  # the same initial weights on every rank
    # MFU is rank 0's to say; on CPU the peak is a ~1 s matmul measurement, which the other ranks would make at
    # the same moment on the same cores
    peak = hardware.peak_flops(device.type, prepared.precision) if ranks.rank() == 0 else (None, None)
    return replace(prepared, device=device, lock=lock, peak_flops=peak)


def lock_out_dir(settings, resume_from):
    """Rank 0 takes out_dir's run lock (gpt/train/run_lock.py), then checks again, under it, that out_dir holds
    nothing this run would overwrite: a run that checked before another took the lock may find it written to
    now. Returns (the lock or None, why this run is refused or None); other ranks take nothing."""
    if launched_rank() != 0:
        return None, None
    try:
        lock = run_lock.acquire(settings.run.out_dir)
    except BadInput as e:
        return None, e
    try:
        if not settings.checkpoint.resume:
            check_fresh_out_dir(settings.run.out_dir)
        elif resume_from is not None:
            resume.check_resume_target(resume_from, settings.run.out_dir)
    except BadInput as e:
        lock.close()
        return None, e
    return lock, None


def convert_to_universal(path):
    """Rank 0, before the process group exists: the checkpoint's universal form for a resume on another world size
    or ZeRO stage (gpt/train/universal.py), converted once and reused. Returns why it failed, or None."""
    target = Path(path) / universal.UNIVERSAL
    if target.is_dir():
        say(f"reusing {target}, converted by an earlier resume")
        return None
    start = time.perf_counter()
    try:
        universal.universal_dir(path)
    except BadInput as e:
        return e
    say(f"converted {path} to DeepSpeed's universal form in {time.perf_counter() - start:.1f}s ({target})")
    return None


def new_engine(setup, micro_batch, grad_accum, initial_weights=True):
    """(the DeepSpeed engine, the model, the loss's name for the log) as the run steps them: a GPT of the run's
    shape, --init_from's weights when initial_weights, wrapped with its loss, activation checkpointing and
    --compile (gpt.model.wrap.wrap)."""
    settings = setup.settings
    model = GPT(setup.model_config)
    if initial_weights and settings.checkpoint.init_from:
        model.load_state_dict(load_hf_weights(settings.checkpoint.init_from, setup.model_config))
        say0(f"initial weights from {settings.checkpoint.init_from}")
    engine = initialize(model, setup.ds_config, micro_batch, grad_accum, OptimizerSettings.of(settings.optimizer),
                        settings.model.loss, settings.model.compile)
    return engine, model, wrap.loss_label(settings.model.loss, setup.device.type, setup.precision)


def with_micro_batch(setup, micro_batch):
    """The setup at another micro-batch: its accumulation and run config follow."""
    settings, world_size = setup.settings.replace(micro_batch=micro_batch), ranks.world_size()
    return replace(setup, settings=settings, grad_accum=gradient_accumulation(settings.data, world_size),
                   run_config=run_config_of(settings, setup.ds_config, setup.model_config, world_size,
                                            setup.run_config.get(AUTO)))


def forget_compiled_code(setup):
    """Drop torch.compile's graphs after steps at another micro-batch (a probe's, a first step that ran out of
    memory), so that the next engine compiles for its own static shapes, not a dynamic batch dimension."""
    if setup.settings.model.compile:
        wrap.forget_compiled_code()


def kept_micro_batch(setup):
    """--micro_batch auto resuming a checkpoint whose micro-batch auto chose for what this run is, on a device like
    this one (run_config's AUTO records equal: gpt.memory.plan.auto_record): the setup at that size, when it still
    divides the token budget within the plan, else None. No probe then, and the resumed run takes the steps the
    interrupted one would have taken: a probe or the plan may choose otherwise today (free memory, a first step's
    fallback, free RAM on CPU). Every rank must agree (one collective); the first step's fallback still applies."""
    saved = setup.saved_run_config or {}
    size, data, record = saved.get("args", {}).get("micro_batch"), setup.settings.data, setup.run_config.get(AUTO)
    fits = dividing_sizes(data.total_batch_tokens, data.seq_len, ranks.world_size(), setup.auto_plan["micro_batch"])
    if not ranks.on_every_rank(record is not None and saved.get(AUTO) == record and size in fits, setup.device):
        return None
    setup = with_micro_batch(setup, size)
    say0(f"--micro_batch auto: kept micro_batch {size} x grad_accum {setup.grad_accum}, which the checkpoint's run "
         f"chose for this same run on {record['device']}")
    return setup


def probe(setup):
    """--micro_batch auto on a GPU: one real step at the planned micro-batch on a throwaway engine built as the
    run's (compiled when the run compiles), smaller sizes that divide the token budget tried on out-of-memory
    (gpt/memory/probe.py). Returns the setup at the largest that fits."""
    settings, plan, world_size = setup.settings, setup.auto_plan, ranks.world_size()
    data = settings.data
    candidates = dividing_sizes(data.total_batch_tokens, data.seq_len, world_size, plan["micro_batch"])

    def throwaway_engine(micro_batch):
        forget_compiled_code(setup)  # each size compiled for its static shape, as the run will be
        return new_engine(setup, micro_batch, 1, initial_weights=False)[0]

    probed = probe_micro_batch(throwaway_engine, candidates, settings.data.seq_len, setup.model_config.vocab_size,
                               setup.device, log=say0)
    torch.manual_seed(settings.run.seed)  # the probe drew random numbers: the same initial weights as without it
    forget_compiled_code(setup)
    if probed is None:
        exit_with(f"--micro_batch auto: even micro-batch {candidates[0]} runs out of memory on this GPU; use ZeRO-2, "
                  f"activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more GPUs", 2)
    setup = with_micro_batch(setup, probed)
    say0(f"--micro_batch auto: planned {plan['micro_batch']} (largest fitting the plan: {plan['max_micro_batch']}), "
         f"probed {probed}: micro_batch {probed} x grad_accum {setup.grad_accum}")
    return setup


def smaller_micro_batch(setup):
    """--micro_batch auto after its size ran out of memory in the run's first step on every rank: the setup at the
    next smaller size that divides the token budget, said in one line; exits when there is none."""
    settings = setup.settings
    data = settings.data
    smaller = dividing_sizes(data.total_batch_tokens, data.seq_len, ranks.world_size(), data.micro_batch - 1)
    if not smaller:
        exit_with(f"--micro_batch auto: even micro-batch {data.micro_batch} ran out of memory in the run's first "
                  f"step; use ZeRO-2, activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more "
                  f"GPUs", 1, every_rank=True)
    say0(f"--micro_batch auto: micro-batch {settings.data.micro_batch} ran out of memory in the run's first step; "
         f"falling back to {smaller[-1]}")
    torch.manual_seed(settings.run.seed)  # the same initial weights as a run started at that size
    forget_compiled_code(setup)
    return with_micro_batch(setup, smaller[-1])


def out_of_memory_message(setup, error):
    """One line for an allocation that failed while the model and its engine were built: the model, what its
    states need per rank (the planner's count), what to do, and the allocator's own first line."""
    n_params = param_count(setup.model_config)
    need = sum(model_state_bytes(n_params, dsc.precision(setup.ds_config), dsc.zero_stage(setup.ds_config),
                                 ranks.world_size(), setup.ds_config).values())
    reason = (str(error).splitlines() or [type(error).__name__])[0][:200]
    return (f"out of memory building the model and its DeepSpeed engine ({model_flags(setup.settings)}: "
            f"{n_params:.3g} parameters, whose weights, gradients and optimizer states need {need / GiB:,.1f} GiB per "
            f"rank): choose a smaller model, more ranks with ZeRO 1 or 2, or a device with more memory ({reason})")
