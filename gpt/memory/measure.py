"""gpt-plan --measure's search and report (gpt/commands/plan.py runs it): on the GPU it runs on, the largest
micro-batch that really trains, for each DeepSpeed config and loss given, next to what the planner
(gpt/memory/plan.py) says for the same GPU:

    gpt-plan --measure --model d12 --ds_config ds_configs/zero1_bf16.json ds_configs/zero2_fp16.json --loss fused classic
    gpt-plan --measure --all --gpu_mem 31.75 --json    # every config whose precision the GPU has, on a V100-32GB's memory

Each size is tried as --micro_batch auto's probe tries it (gpt/memory/probe.py): a fresh engine built as the trainer
builds its own, two forward/backward/optimizer steps on random tokens, compiled as the trainer compiles on CUDA
(gpt.train.engine.wrap; its graphs dropped before each size, so each compiles for its own static shapes) or,
with --no-compile, eager. A compile per size costs tens of seconds, so compiled, only the sizes that divide
--total_batch_tokens (the ones a run can use) are tried, and the plan's own answer where it lies between the
largest of them that fits and the first that does not: the raw maximum lies between the largest size that fitted
(`largest_fitting`) and the first out of memory (the report's `raw max`, e.g. 244-255); eager, every size is
tried and the raw maximum is exact. The search starts at the plan, goes up in doubling strides to the first
out-of-memory (or down), then bisects; through sizes that already double (those dividing 524,288 tokens of 1024),
one size at a time. It stops at the token budget: a micro-batch above --total_batch_tokens / seq_len would be
a step of its own on one GPU.

--gpu_mem GiB stands in for a smaller card: PyTorch's allocator is capped
(torch.cuda.set_per_process_memory_fraction) at GiB less what this process holds outside it (CUDA context,
cuBLAS workspaces, NCCL), measured after a warm-up, as a card of that size would leave it."""
import contextlib
import datetime
import math
import os
import sys
import time
from pathlib import Path

import torch

from gpt.config import ds_checks, ds_config as dsc
from gpt.memory.probe import dividing_sizes, doubling, search_largest, try_step, verdict

GiB = 2**30


def measure_largest(new_engine, planned, sizes, seq_len, vocab_size, device, log=print):
    """Search `sizes` (ascending micro-batches) for the largest whose steps fit, starting at the largest not above
    `planned` (None: at the smallest); then, if `planned` is not one of `sizes` and lies between the answer and the
    first size out of memory, try it too: one more try (a compile) says whether the planner's own answer fits.
    Returns {max_micro_batch (of `sizes`; None: not even the smallest fits), capped (the largest size fitted),
    largest_fitting (of every size tried), first_out_of_memory (the smallest size tried that did not fit, None if
    none), max_micro_batch's peak memory, tries (each size's verdict and peak, in order), search_s}."""
    tries, started = [], time.perf_counter()

    def fits_size(size):
        ok, peak = try_step(new_engine, size, seq_len, vocab_size, device)
        tries.append({"micro_batch": size, "fits": ok, **peak})
        log(f"  micro-batch {size}: {verdict(ok, peak)}")
        return ok

    def first_out_of_memory():
        return min((t["micro_batch"] for t in tries if not t["fits"]), default=None)

    start = max(sum(size <= (planned or 1) for size in sizes) - 1, 0)
    best = search_largest(lambda index: fits_size(sizes[index]), start, len(sizes) - 1, gallop=not doubling(sizes))
    if best >= 0 and sizes[best] < (planned or 0) < (first_out_of_memory() or math.inf):
        fits_size(planned)
    peak = next((t for t in tries if t["micro_batch"] == sizes[best]), {}) if best >= 0 else {}
    return {"max_micro_batch": sizes[best] if best >= 0 else None, "capped": best == len(sizes) - 1,
            "largest_fitting": max((t["micro_batch"] for t in tries if t["fits"]), default=None),
            "first_out_of_memory": first_out_of_memory(),
            "peak": {k: v for k, v in peak.items() if k not in ("micro_batch", "fits")}, "tries": tries,
            "search_s": time.perf_counter() - started}


def gpu_precisions():
    """The precisions this GPU trains in: bf16 from Ampere (compute capability 8.0) on; fp16 and fp32 on all."""
    return ("fp32", "fp16", "bf16") if torch.cuda.get_device_capability() >= (8, 0) else ("fp32", "fp16")


def configs_for_precisions(paths, precisions):
    """The DeepSpeed JSON files among `paths` whose precision is one of `precisions`, in order."""
    return [path for path in paths if dsc.precision(ds_checks.load_checked(path)) in precisions]


def configs_for_gpu(directory="ds_configs"):
    """--all: every DeepSpeed JSON in `directory` whose precision this GPU has."""
    return configs_for_precisions(sorted(str(p) for p in Path(directory).glob("*.json")), gpu_precisions())


@contextlib.contextmanager
def stdout_to_stderr():
    """Everything written to stdout (file descriptor 1) goes to stderr meanwhile: DeepSpeed's logger and NCCL
    write there, and stdout is kept for the report (--json)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cap_allocator(gpu_mem_gib):
    """Cap PyTorch's allocator so that, with what this process holds outside it, the GPU looks gpu_mem_gib
    large. Returns (the cap in bytes or None, the bytes outside the allocator)."""
    dummy = torch.ones(256, 256, device="cuda")
    dummy @ dummy  # cuBLAS's handle and workspace exist from the first matmul on
    torch.distributed.barrier()  # and NCCL's communicator from the first collective
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    if gpu_mem_gib is None:
        return None, outside
    cap = int(gpu_mem_gib * GiB) - outside
    if cap <= 0 or cap > total:
        raise ValueError(f"--gpu_mem {gpu_mem_gib:g}: this process already holds {outside / GiB:.2f} GiB outside "
                         f"PyTorch's allocator, of this GPU's {total / GiB:.2f} GiB")
    torch.cuda.set_per_process_memory_fraction(cap / total)
    return cap, outside


def measure_row(new_engine, plan, total_batch_tokens, seq_len, vocab_size, device, log=print, dividing_only=False):
    """One (config, loss) on one rank: the plan's answer (None: not even micro-batch 1 planned to fit) and the
    measured one side by side. dividing_only: try only the sizes that divide the token budget (compiled: each
    size is a compile)."""
    largest = total_batch_tokens // seq_len
    sizes = dividing_sizes(total_batch_tokens, seq_len, 1, largest) if dividing_only else list(range(1, largest + 1))
    found = measure_largest(new_engine, plan and plan["max_micro_batch"], sizes, seq_len, vocab_size, device, log)
    measured = found["max_micro_batch"]
    dividing = dividing_sizes(total_batch_tokens, seq_len, 1, measured or 0)
    return {"planned_max_micro_batch": plan and plan["max_micro_batch"],
            "planned_over_measured": plan["max_micro_batch"] / measured if plan and measured else None,
            "measured_max_micro_batch": measured, "capped_at_budget": found["capped"],
            "first_out_of_memory": found["first_out_of_memory"], "largest_fitting": found["largest_fitting"],
            "measured_micro_batch": dividing[-1] if dividing else None,
            "peak_alloc_gib": found["peak"].get("peak_alloc_gib"),
            "peak_reserved_gib": found["peak"].get("peak_reserved_gib"),
            "tries": found["tries"], "search_s": found["search_s"]}


def report_header(device_name, total_bytes, outside_bytes, cap_bytes, model, config, seq_len, total_batch_tokens,
                  compiled=False):
    """What every row shares: the GPU, the software, the date, the model, whether the steps were compiled."""
    import deepspeed
    return {"measured": datetime.date.today().isoformat(), "device": device_name, "total_memory_bytes": total_bytes,
            "outside_allocator_bytes": outside_bytes, "allocator_cap_bytes": cap_bytes,
            "torch": torch.__version__, "deepspeed": deepspeed.__version__, "model": model,
            "model_config": {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "vocab_size")},
            "seq_len": seq_len, "total_batch_tokens": total_batch_tokens, "world_size": 1, "steps_per_try": 2,
            "compiled": compiled, "rows": []}


COLUMNS = [("ds_config", "{}"), ("loss", "{}"), ("allocator", "{}"), ("planned_max_micro_batch", "{}"),
           ("measured_max_micro_batch", "{}"), ("first_out_of_memory", "{}"), ("raw_max", "{}"),
           ("planned_over_measured", "{:.2f}"), ("peak_alloc_gib", "{:.2f}"), ("peak_reserved_gib", "{:.2f}"),
           ("tries", "{}"), ("search_s", "{:.0f}")]
HEADINGS = ["ds_config", "loss", "allocator", "planned", "measured", "out of memory at", "raw max", "planned/measured",
            "peak alloc GiB", "peak reserved GiB", "tries", "search s"]


def raw_max(row):
    """Where the raw maximum lies, as the tries bound it: '13', '12-15' (compiled: between the largest size that
    fitted and the first out of memory), '>= 32' (the budget fitted) or None (not even 1)."""
    low = row.get("largest_fitting", row["measured_max_micro_batch"])
    if low is None or "first_out_of_memory" not in row:  # before 2026-11-26 every report was eager: exact
        return None if low is None else str(low)
    high = row["first_out_of_memory"]
    if row["capped_at_budget"] or high is None:
        return f">= {low}"
    return str(low) if high == low + 1 else f"{low}-{high - 1}"


def format_report(report):
    """The report as text: one line about the GPU and the software, then a markdown table."""
    cap = report["allocator_cap_bytes"]
    memory = (f"allocator capped at {cap / GiB:.2f} GiB + {report['outside_allocator_bytes'] / GiB:.2f} GiB outside "
              f"it = {(cap + report['outside_allocator_bytes']) / GiB:.2f} GiB" if cap else
              f"{report['total_memory_bytes'] / GiB:.2f} GiB")
    # reports from before 2026-11-26 have no "compiled": they were eager
    steps = "2 compiled steps per try, sizes dividing the budget" if report.get("compiled") else "2 eager steps per try"
    lines = [f"{report['model']}, seq_len {report['seq_len']}, 1 rank, {steps}, on {report['device']} "
             f"({memory}); {report['measured']}, torch {report['torch']}, DeepSpeed {report['deepspeed']}",
             "", "| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
    for row in report["rows"]:
        cells = []
        for name, fmt in COLUMNS:
            value = (len(row[name]) if name == "tries" else raw_max(row) if name == "raw_max"
                     else row.get(name))  # first_out_of_memory: from 2026-11-26
            cells.append("-" if value is None else fmt.format(value))
        if row["capped_at_budget"]:
            cells[4] = f">= {cells[4]} (budget)"
        cells[0] = cells[0].rsplit("/", 1)[-1]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
