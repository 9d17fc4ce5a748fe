"""gpt-plan: one GPU's memory planned before a launch (gpt/memory/plan.py), and with --measure also found by training
on this GPU (measure_here: engines built as the trainer builds them, searched by gpt/memory/measure.py).

    gpt-plan --model d12 --seq_len 1024 --ds_config ds_configs/zero1_bf16.json --gpu a800-80gb --world_size 8
    python -m gpt.commands.plan ...                                   # the same without installing
"""
import argparse
import json
import math
import os
import sys

from gpt.config import ds_checks, ds_config as dsc
from gpt.console import BadInput, Parser, exit_if, exit_with, one_line_on_ctrl_c
from gpt.model.loss import LOSSES
from gpt.memory.plan import (ALLOCATOR_OVERHEAD, GPUS, NO_BF16, GiB, format_plan, make_plan,
                             trainer_uses_expandable_segments)
from gpt.model.model import PRESETS, preset_config
from gpt.config.settings import GPT3_TOKENS_PER_STEP, add_setting_arguments, path_arg, range_of, range_problems


def build_parser():
    p = Parser(description="Plan per-GPU memory and the largest micro-batch; with --measure, also find it on this GPU.")
    # the model's shape, as the trainer takes it
    add_setting_arguments(p, names=("model", "n_layer", "n_embd", "n_head"), choices={"model": sorted(PRESETS)})
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--ds_config", nargs="+", type=path_arg,
                   help=f"DeepSpeed JSON file(s) (default: {DEFAULT_DS_CONFIG})")
    p.add_argument("--gpu", choices=sorted(GPUS), help="GPU type")
    p.add_argument("--gpu_mem", type=float, help="device memory in GiB as CUDA reports it, for a GPU not in the table; "
                                                 "with --measure, the memory of the card this GPU stands in for")
    p.add_argument("--loss", nargs="+", default=["fused"], choices=LOSSES, help="the trainer's --loss (several: each)")
    p.add_argument("--allocator", choices=sorted(ALLOCATOR_OVERHEAD.keys() - {"cpu"}),
                   help="CUDA caching allocator setting (default: the trainer's: expandable_segments unless "
                        "PYTORCH_CUDA_ALLOC_CONF says otherwise)")
    p.add_argument("--world_size", type=int, help=f"GPUs the run shards ZeRO over (default {DEFAULT_WORLD_SIZE}; "
                                                  f"--measure: 1, the GPU here)")
    p.add_argument("--total_batch_tokens", type=int, default=GPT3_TOKENS_PER_STEP)
    p.add_argument("--measure", action="store_true",
                   help="train on this machine's GPU to find the largest micro-batch that fits, next to the plan "
                        "(gpt/memory/measure.py)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="the step planned (and with --measure, run) compiled as the trainer runs it on CUDA (default; "
                        "--measure compiles per size, so it tries only sizes dividing --total_batch_tokens); "
                        "--no-compile: eager (--measure: every size, the exact largest)")
    p.add_argument("--all", action="store_true",
                   help="with --measure: every ds_configs/*.json whose precision this GPU has")
    p.add_argument("--json", action="store_true", help="print JSON: one object per plan (a list for several), or "
                                                       "--measure's report")
    return p


DEFAULT_DS_CONFIG = "ds_configs/zero1_bf16.json"
MAX_GPU_MEM_GIB = 1024  # 3.5x the largest GPUs' (288 GB: B300, MI355X)
DEFAULT_WORLD_SIZE = 8


def check_args(args):
    """Everything gpt-plan can check before planning, one line per problem; returns (problems, model config).
    Fills the defaults that depend on --measure."""
    problems = range_problems(args, [range_of("seq_len"), ("world_size", 1, True), range_of("total_batch_tokens"),
                                     ("gpu_mem", 0, False), ("n_layer", 1, True), ("n_embd", 1, True),
                                     ("n_head", 1, True)])
    if args.gpu_mem is not None and MAX_GPU_MEM_GIB < args.gpu_mem < math.inf:  # 1e308 GiB: inf bytes, planned
        problems.append(f"--gpu_mem {args.gpu_mem:g} GiB is beyond any GPU: at most {MAX_GPU_MEM_GIB} GiB")
    if args.measure:
        if args.gpu:
            problems.append("--measure measures the GPU it runs on: drop --gpu (--gpu_mem GiB stands in for a "
                            "smaller card)")
        if args.world_size not in (None, 1):
            problems.append(f"--measure runs one rank on this GPU: --world_size {args.world_size} cannot be measured "
                            f"here (plan it without --measure)")
        args.world_size = 1
    else:
        if args.all:
            problems.append("--all applies to --measure (the GPU it runs on decides which precisions)")
        if (args.gpu is None) == (args.gpu_mem is None):
            problems.append("give --gpu (one of " + ", ".join(sorted(GPUS)) + ") or --gpu_mem GiB" +
                            (", not both" if args.gpu else ""))
        args.world_size = args.world_size or DEFAULT_WORLD_SIZE
    if args.all and args.ds_config:
        problems.append("give --ds_config or --all, not both")
    args.ds_config = args.ds_config or ([] if args.all else [DEFAULT_DS_CONFIG])
    if problems:  # the checks below assume sane numbers
        return problems, None
    config = preset_config(args.model, args.n_layer, args.n_embd, args.n_head)
    problems += config.problems(args.seq_len, args.model)
    per_micro_batch = args.seq_len * args.world_size  # tokens of one sequence per rank
    if args.total_batch_tokens % per_micro_batch:
        problems.append(f"--total_batch_tokens {args.total_batch_tokens} is not divisible by seq_len x world = "
                        f"{args.seq_len} x {args.world_size} = {per_micro_batch}, so by no micro_batch x seq_len x world")
    for path in args.ds_config:
        try:
            ds_config = ds_checks.load_checked(path)
        except BadInput as e:
            problems.append(str(e))
            continue
        if args.gpu in NO_BF16 and dsc.precision(ds_config) == "bf16":
            problems.append(f"{path}: bf16 on a {args.gpu}, which has no bf16 (a V100, compute capability 7.0; bf16 "
                            f"needs 8.0): plan {NO_BF16[args.gpu]}, the V100's config")
    return problems, config


@one_line_on_ctrl_c("nothing was written")
def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.measure and "deepspeed" not in sys.modules:
        # a plan for a named GPU runs on this CPU: DeepSpeed is told so, rather than saying that it found no GPU
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    problems, config = check_args(args)
    exit_if(problems)
    if args.measure:
        return measure_main(args, config)
    allocator = args.allocator or ("expandable_segments" if trainer_uses_expandable_segments() else "default")
    device_bytes = args.gpu_mem * GiB if args.gpu_mem is not None else GPUS[args.gpu]
    try:
        plans = [make_plan(config, args.seq_len, ds_checks.load_checked(path), args.world_size, device_bytes,
                           args.total_batch_tokens, loss, allocator, compiled=args.compile)
                 for path in args.ds_config for loss in args.loss]
    except BadInput as e:
        exit_with(e)
    if args.json:
        print(json.dumps(plans[0] if len(plans) == 1 else plans))
    else:
        gpu = args.gpu or f"{args.gpu_mem:g} GiB"
        print("\n\n".join(format_plan(plan, f"{args.model} on {gpu}" + (f", {path}" if len(plans) > 1 else ""))
                           for plan, path in zip(plans, [p for p in args.ds_config for _ in args.loss])))


def measure_main(args, config):
    """gpt-plan --measure: the plan and the GPU's answer per config and loss (gpt/memory/measure.py)."""
    from gpt.memory import measure

    def plan_for(ds_config, loss, allocator, device_bytes):
        try:
            return make_plan(config, args.seq_len, ds_config, 1, device_bytes, args.total_batch_tokens, loss,
                             allocator, compiled=args.compile)
        except BadInput:  # not even micro-batch 1 planned to fit: the search starts at 1
            return None

    with measure.stdout_to_stderr():  # DeepSpeed's and NCCL's logs: stdout is the report's
        report = measure_here(args, config, plan_for)
    print(json.dumps(report) if args.json else measure.format_report(report))


def measure_here(args, config, plan_for):
    """gpt-plan --measure on this machine's GPU (main has checked the flags): the report (gpt/memory/measure.py's
    search per config and loss), or a one-line reason on stderr and exit 1. plan_for(ds_config, loss, allocator,
    device_bytes) is the plan."""
    import torch

    from gpt.runtime import ranks  # first: DeepSpeed imported with its logs on stderr
    from deepspeed.utils import logger

    from gpt.config import hardware
    from gpt.memory import measure
    from gpt.memory.plan import expandable_segments

    ds_configs = gpu_and_configs(args)
    arch_note = hardware.fix_cuda_arch_list()  # before DeepSpeed JIT-builds FusedAdam, as the trainer does
    if arch_note:
        print(arch_note, file=sys.stderr)
    logger.setLevel("WARNING")  # each engine's start-up INFO lines would bury the search's
    device = ranks.setup_distributed()
    try:
        cap, outside = measure.cap_allocator(args.gpu_mem)
    except ValueError as e:
        exit_with(e)
    total = torch.cuda.get_device_properties(device).total_memory
    allocator = "expandable_segments" if expandable_segments() else "default"
    report = measure.report_header(torch.cuda.get_device_name(device), total, outside, cap, args.model, config,
                                   args.seq_len, args.total_batch_tokens, compiled=args.compile)
    device_bytes = args.gpu_mem * GiB if args.gpu_mem else total
    for path in ds_configs:
        report["rows"] += measured_rows(args, config, path, plan_for, allocator, device_bytes, device)
    ranks.leave_process_group()
    return report


def gpu_and_configs(args):
    """The DeepSpeed JSONs --measure searches, once the GPU is there, DeepSpeed's accelerator is CUDA and the
    allocator is set (before CUDA's allocator starts); else one line and exit 1."""
    import torch

    from gpt.runtime import accelerator
    from gpt.memory import measure
    from gpt.memory.plan import set_allocator, use_expandable_segments

    if not torch.cuda.is_available():
        exit_with("--measure trains on a CUDA GPU, and this machine has none (torch.cuda.is_available() is "
                  "False); without --measure, gpt-plan plans for the GPU you name")
    if args.allocator:  # before CUDA's allocator starts
        set_allocator(args.allocator == "expandable_segments")
    else:
        use_expandable_segments()
    if accelerator.device_type() != "cuda":
        exit_with(f"--measure: DeepSpeed's accelerator is {accelerator.device_type()!r}, not 'cuda' "
                  f"(DS_ACCELERATOR?)")
    ds_configs = measure.configs_for_gpu() if args.all else args.ds_config
    if not ds_configs:
        exit_with("--all: no ds_configs/*.json for this GPU's precisions here (run from the repository root)")
    return ds_configs


def measured_rows(args, config, path, plan_for, allocator, device_bytes, device):
    """The report's rows of one DeepSpeed JSON, one per --loss: the largest micro-batch that trains, next to the plan."""
    from gpt.memory import measure
    from gpt.model.model import GPT
    from gpt.train import engine as ds_engine

    optimizer = ds_engine.OptimizerSettings(6e-4, 0.1, 10, 100, 0.1)  # memory does not depend on the schedule
    ds_config, rows = ds_checks.load_checked(path), []
    for loss in args.loss:
        def new_engine(micro_batch):
            if args.compile:
                ds_engine.forget_compiled_code()  # the last size's graphs: this one compiles for its own static shapes
            return ds_engine.initialize(GPT(config), ds_config, micro_batch, 1, optimizer, loss, args.compile)
        plan = plan_for(ds_config, loss, allocator, device_bytes)
        print(f"{path}, {loss} loss, {allocator} allocator: planned {plan and plan['max_micro_batch']}",
              file=sys.stderr, flush=True)
        row = measure.measure_row(new_engine, plan, args.total_batch_tokens, args.seq_len, config.vocab_size,
                                  device, log=lambda line: print(line, file=sys.stderr, flush=True),
                                  dividing_only=args.compile)
        rows.append({"ds_config": path, "loss": loss, "allocator": allocator, **row})
    return rows

if __name__ == "__main__":
    main()
