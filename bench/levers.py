"""Where a training step's time goes, and what each speed lever is worth, in one process:

  profile   one step of the trainer (today's defaults: zero1_bf16, --loss fused, compiled) under torch.profiler,
            its device time summed by kind of work (matmuls, attention, the loss's own kernels, other compiled
            kernels, eager elementwise work, the optimizer, copies, communication) against the step's wall time
            (the rest: the device idle, waiting on the host); the host syncs counted; DeepSpeed's
            wall_clock_breakdown timers (fwd, bwd, step) of the same settings; --trace keeps the Chrome trace
  levers    the same step with one setting changed at a time, tokens/s against the default measured first
            (and again last, so drift shows): DeepSpeed's bf16 overflow check, contiguous gradients and
            overlap_comm off, DeepSpeed's FusedAdam in place of torch's fused AdamW, each SDPA backend, the loss's
            chunk size, compile with coordinate-descent tuning or max-autotune, other micro-batches

    python bench/levers.py                         # on a GPU: d12, T=1024, 0.5M tokens/step at micro-batch 128
    python bench/levers.py --budget 250 --json levers.json --trace step.json.gz   # launch/gpu_check.sh's part speed
    python bench/levers.py --smoke                 # every row once on the tiny model (CPU, tests): figures mean nothing

Rows run in the order of LEVERS; the ones a budget leaves no time for are reported skipped. Every figure is a
ratio against the default of the same process: machines are noisy.
"""
import argparse
import contextlib
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import (DEVICE, MEMORY_COLUMNS, TrainerSteps, blank_row, ds_config_file, usable_dtypes, print_header,
                     print_row, synthetic_shards, timed_step, trainer_settings)  # bench/harness.py
from gpt.config.hardware import peak_flops
from gpt.model import loss as losses
from gpt.train.engine import forget_compiled_code
from gpt.runtime.memory import is_out_of_memory, peak_memory

# the size each mode measures: (model, seq_len, micro_batch, total tokens per step), timed steps, micro-batch levers,
# the vocabulary (None: the model's, GPT-2's). The smoke's 512 ids (GPT-2's 50304-wide logits are ~97% of the tiny
# model's FLOPs) and one micro-batch a step: every row runs, in seconds
SIZES = {
    "gpu": dict(model="d12", seq_len=1024, micro_batch=128, tokens=524_288, repeats=4, micro_batches=(64,),
                vocab_size=None),
    "cpu": dict(model="d4", seq_len=256, micro_batch=4, tokens=2048, repeats=3, micro_batches=(2,), vocab_size=None),
    "smoke": dict(model="tiny", seq_len=64, micro_batch=2, tokens=128, repeats=1, micro_batches=(1,), vocab_size=512),
}


@dataclass
class Lever:
    """One setting changed from the default: `ds` edits the DeepSpeed JSON, `during` is a process-wide setting held
    while its trainer is built and stepped, `settings` overrides the trainer's (micro_batch, loss); `recompiles`
    when the compiled code differs (dynamo's cache is dropped first, as a new run starts without it)."""
    name: str
    what: str
    ds: callable = None
    during: callable = contextlib.nullcontext
    settings: dict = field(default_factory=dict)
    recompiles: bool = False
    needs: str = None  # "cuda": skipped elsewhere
    tunes: bool = False  # the compile searches kernel configurations: minutes on a GPU


def sdpa(backend):
    """Scaled-dot-product attention restricted to one backend (torch picks among the enabled ones)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return lambda: sdpa_kernel([getattr(SDPBackend, backend)])


@contextlib.contextmanager
def chunk_rows(rows):
    """The fused loss with `rows` rows of logits per chunk (gpt/model/loss.py's CHUNK_ROWS)."""
    default, losses.CHUNK_ROWS = losses.CHUNK_ROWS, rows
    try:
        yield
    finally:
        losses.CHUNK_ROWS = default


def inductor(**options):
    """torch.compile with these inductor options (torch._inductor.config), e.g. what a compile mode sets."""
    import torch._inductor.config
    return lambda: torch._inductor.config.patch(**options)


def set_in(path, value):
    """A DeepSpeed JSON edit: config[a][b]... = value for path 'a.b...'."""
    *parents, key = path.split(".")

    def edit(config):
        for name in parents:
            config = config.setdefault(name, {})
        config[key] = value
    return edit


def fused_adam(config):
    """A DeepSpeed JSON edit: DeepSpeed's FusedAdam, the optimizer block without torch_adam and fused."""
    for key in ("torch_adam", "fused"):
        config["optimizer"]["params"].pop(key, None)


def levers(size):
    """The rows after the default, in the order they are worth measuring when time is short: the optimizer
    DeepSpeed builds, DeepSpeed's per-step work, attention, the micro-batch, the loss, compile."""
    accumulation = lambda m: size["tokens"] // size["seq_len"] // m
    return [
        Lever("deepspeed_fused_adam", "DeepSpeed's FusedAdam in place of torch's fused AdamW (torch_adam): a JIT "
              "build at the first start", ds=fused_adam),
        Lever("no_overflow_check", "bf16.check_grad_overflow false: no fp32 upcast, all-reduce and .item() of every "
              "gradient per step", ds=set_in("bf16.check_grad_overflow", False)),
        Lever("attention_cudnn", "SDPA: cuDNN attention only", during=sdpa("CUDNN_ATTENTION"), recompiles=True,
              needs="cuda"),
        *(Lever(f"micro_batch_{m}", f"micro-batch {m} (gradient accumulation {accumulation(m)})",
                settings=dict(micro_batch=m), recompiles=True) for m in size["micro_batches"]),
        Lever("no_contiguous_gradients", "zero_optimization.contiguous_gradients false: no per-parameter hook copying "
              "each gradient into one buffer", ds=set_in("zero_optimization.contiguous_gradients", False)),
        Lever("no_overlap_comm", "zero_optimization.overlap_comm false: reduction on the compute stream (nothing to "
              "overlap with one rank)", ds=set_in("zero_optimization.overlap_comm", False)),
        Lever(f"loss_chunk_{losses.CHUNK_ROWS * 2}", f"the fused loss in chunks of {losses.CHUNK_ROWS * 2} rows "
              f"(default {losses.CHUNK_ROWS})", during=lambda: chunk_rows(losses.CHUNK_ROWS * 2), recompiles=True),
        Lever("attention_flash", "SDPA: the flash kernel only", during=sdpa("FLASH_ATTENTION"), recompiles=True),
        Lever("attention_efficient", "SDPA: the memory-efficient kernel only", during=sdpa("EFFICIENT_ATTENTION"),
              recompiles=True),
        Lever("loss_classic", "--loss classic: the full fp32 logits, compiled with the head",
              settings=dict(loss="classic"), recompiles=True),
        Lever(f"loss_chunk_{losses.CHUNK_ROWS * 4}", f"the fused loss in chunks of {losses.CHUNK_ROWS * 4} rows",
              during=lambda: chunk_rows(losses.CHUNK_ROWS * 4), recompiles=True),
        Lever("coordinate_descent", "inductor coordinate_descent_tuning (tunes each Triton kernel's launch)",
              during=inductor(coordinate_descent_tuning=True), recompiles=True, tunes=True),
        Lever("max_autotune", "compile mode max-autotune-no-cudagraphs (GEMM autotuning + coordinate descent)",
              during=inductor(max_autotune=True, coordinate_descent_tuning=True), recompiles=True, needs="cuda",
              tunes=True),
    ]


# -- one row ------------------------------------------------------------------------------------------
def build(lever, data, tmp, size, compile):
    """The trainer for this lever: the default settings with the lever's changes."""
    config = json.loads(Path(ds_config_file(tmp, "bf16" if bf16_usable() else "fp32")).read_text())
    if lever.ds:
        lever.ds(config)
    path = Path(tmp) / f"levers_{lever.name}.json"
    path.write_text(json.dumps(config))
    micro_batch = lever.settings.get("micro_batch", size["micro_batch"])
    settings = trainer_settings(data, Path(tmp) / lever.name, str(path), size["model"], size["seq_len"], micro_batch,
                                size["tokens"] // size["seq_len"] // micro_batch, compile=compile,
                                loss=lever.settings.get("loss", "fused"), vocab_size=size["vocab_size"])
    return TrainerSteps(settings)


def bf16_usable():
    """bf16 where the trainer's default config (zero1_bf16) can run it at speed: any GPU from Ampere on; on CPU the
    bench's own answer (bench/harness.py usable_dtypes)."""
    return "bf16" in usable_dtypes()[0]


def measure(lever, data, tmp, size, compile, profile=None):
    """A row: tokens/s (median of the timed steps after one warm-up step), peak memory, and `profile(trainer)`'s
    result on the same trainer, or a note (out of memory, failed)."""
    row = dict(blank_row(LEVER_COLUMNS), lever=lever.name, what=lever.what,
               micro_batch=lever.settings.get("micro_batch", size["micro_batch"]))
    trainer = None
    if lever.recompiles and compile:
        forget_compiled_code()
    began = time.perf_counter()
    try:
        with lever.during():
            trainer = build(lever, data, tmp, size, compile)
            first = timed_step(trainer)  # compiles
            seconds = statistics.median(timed_step(trainer) for _ in range(size["repeats"]))
            row.update(first_step_s=first, step_s=seconds, tokens_per_s=size["tokens"] / seconds, **peak_memory(DEVICE))
            if profile:
                row["profile"] = profile(trainer)
    except (Exception, SystemExit) as error:  # noqa: BLE001 -- a lever that cannot run here is an answer (SystemExit:
        if lever.name.startswith("default"):  # the trainer's check refused it); the default's failure is not
            raise
        row["note"] = "out of memory" if is_out_of_memory(error) else \
            f"failed: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}"
    finally:
        if trainer is not None:
            trainer.close()
        if lever.recompiles and compile:
            forget_compiled_code()  # the next row compiles the default's code again
    row["seconds"] = time.perf_counter() - began
    return row


# -- where the time goes --------------------------------------------------------------------------------
# Device work by kind, from kernel names (the first pattern that matches): cuBLAS/CUTLASS GEMMs, the SDPA kernels,
# the loss's chunk kernels (compiled: softmax/log-sum-exp math), other compiled (Triton) kernels, the optimizer's
# multi-tensor kernels, NCCL, and eager elementwise work (DeepSpeed's gradient copies, overflow check, clipping).
KINDS = [
    ("attention", r"flash|fmha|sdpa|attention|cudnn"),
    ("optimizer", r"multi_tensor|adam|Adam"),
    ("communication", r"nccl"),
    ("matmul", r"gemm|Gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_|aten::(addmm|mm|bmm|matmul|linear)$"),
    ("loss", r"triton.*(softmax|logsumexp|nll|amax|exp|lse)|logsumexp|log_softmax|nll_loss"),
    ("other compiled", r"^triton_"),
    ("copies", r"^Memcpy|^Memset|copy_|CatArray"),
]


def kind_of(name):
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "eager elementwise")


def step_profile(trace_path):
    """profile(trainer): one step under torch.profiler; (device ms by kind, wall ms, host syncs), the trace kept."""
    def profile(trainer):
        from torch.profiler import ProfilerActivity
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
        with torch.profiler.profile(activities=activities) as prof:
            wall = timed_step(trainer)
        with tempfile.NamedTemporaryFile(suffix=".json") as raw:
            prof.export_chrome_trace(raw.name)
            trace = json.loads(Path(raw.name).read_text())
        if trace_path:
            with gzip.open(trace_path, "wt") as out:
                json.dump(trace, out)
        return summarize(trace.get("traceEvents", []), wall)
    return profile


def summarize(events, wall_s):
    """Device time by kind (on CPU: the self time of aten ops, the device being the host), the busy share of the
    step's wall time, and the host syncs (.item() and device synchronizations)."""
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not device:  # CPU: aten ops at the top of the stack, none counted twice
        device = [e for e in events if e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::")
                  and "dur" in e]
        device = outermost(device)
    by_kind, top = {}, {}
    for event in device:
        name, ms = event["name"], event["dur"] / 1000
        kind = "copies" if event.get("cat") in ("gpu_memcpy", "gpu_memset") else kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
        top[name] = top.get(name, 0.0) + ms
    busy_ms = busy_time(device)
    names = [e.get("name", "") for e in events]
    return dict(wall_ms=wall_s * 1000, busy_ms=busy_ms, idle_ms=max(0.0, wall_s * 1000 - busy_ms),
                by_kind=dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                top_kernels=sorted(top.items(), key=lambda kv: -kv[1])[:15],
                host_syncs=dict(item=names.count("aten::_local_scalar_dense"),
                                synchronize=sum(1 for n in names if "Synchronize" in n)))


def outermost(events):
    """Events not nested in another of the list (same thread): their durations add up without double counting."""
    kept, ends = [], {}
    for event in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        thread = (event.get("pid"), event.get("tid"))
        if event["ts"] >= ends.get(thread, float("-inf")):
            kept.append(event)
            ends[thread] = event["ts"] + event["dur"]
    return kept


def busy_time(events):
    """Milliseconds covered by at least one of the events (the union of their intervals)."""
    busy, end = 0.0, float("-inf")
    for event in sorted(events, key=lambda e: e["ts"]):
        start, stop = event["ts"], event["ts"] + event["dur"]
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1000


def wall_clock_breakdown(trainer, steps=2):
    """DeepSpeed's own timers (wall_clock_breakdown, on in this trainer's JSON), ms per optimizer step: fwd, bwd
    (bwd_inner: autograd; bwd_allreduce: gradient reduction) and step, summed over the accumulation, the median
    over `steps`. The engine logs and resets them at each boundary: read there."""
    engine, records = trainer.engine, []
    log = engine.timers.log

    def capture(names, *args, **kwargs):
        timers = engine.timers.get_timers()
        if "fwd" in names:
            records.append({name: timers[name].elapsed(reset=False) for name in names if name in timers})
        return log(names, *args, **kwargs)
    engine.timers.log = capture
    for _ in range(steps):
        trainer.step()
    return {name: statistics.median(r.get(name, 0.0) for r in records) for name in records[-1]} if records else {}


RESERVE_S = 15  # kept for the last row, the default again


def row_cost(lever, compile):
    """Seconds a row may take on a GPU at d12, from the rows of 2026-11-27 (an H200, after the acceptance run on the
    same machine, whose compiled code inductor's cache kept): 7-9 s a row, 8-11 s recompiling, 120 s with
    coordinate-descent tuning."""
    if not compile:
        return 15
    return 150 if lever.tunes else 25 if lever.recompiles else 15


# -- the report -----------------------------------------------------------------------------------------
LEVER_COLUMNS = [("lever", "{}"), ("micro_batch", "{}"), ("tokens_per_s", "{:,.0f}"), ("ratio", "{:.3f}"),
                 ("mfu", "{:.3f}"), *MEMORY_COLUMNS, ("first_step_s", "{:.1f}"), ("note", "{}")]


def print_profile(profile, breakdown):
    wall = profile["wall_ms"]
    print("\n## where one step's time goes (torch.profiler, the default settings)\n")
    print(f"wall {wall:.1f} ms; device busy {profile['busy_ms']:.1f} ms ({profile['busy_ms'] / wall:.0%}), idle "
          f"{profile['idle_ms']:.1f} ms; host syncs: {profile['host_syncs']['item']} .item(), "
          f"{profile['host_syncs']['synchronize']} synchronize calls\n")
    print("| kind | ms per step | share of wall |\n|---|---|---|")
    for kind, ms in profile["by_kind"].items():
        print(f"| {kind} | {ms:.1f} | {ms / wall:.1%} |")
    print(f"| idle (device waits on the host) | {profile['idle_ms']:.1f} | {profile['idle_ms'] / wall:.1%} |")
    print("\n| top kernels | ms |\n|---|---|")
    for name, ms in profile["top_kernels"]:
        print(f"| {name[:110]} | {ms:.1f} |")
    if breakdown:
        print("\nDeepSpeed wall_clock_breakdown, ms per optimizer step (a run of its own: its timers synchronize): "
              + ", ".join(f"{k} {v:.1f}" for k, v in breakdown.items()))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every row once on the tiny model, eager (tests)")
    parser.add_argument("--only", nargs="+", help="these levers alone (the default always runs)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: a row starts only while it can end in time (row_cost) with 15 s kept for "
                             "the default's second run")
    parser.add_argument("--json", help="write the results here (after each row)")
    parser.add_argument("--trace", help="keep the profiled step's Chrome trace here (.json.gz)")
    return parser.parse_args()


def results_header(size, dtype, compile):
    """The results' opening fields: the device, the versions, the size and setting every row shares."""
    results = dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__,
                   dtype=dtype, compiled=compile, **size, rows=[])
    try:
        import deepspeed
        results["deepspeed"] = deepspeed.__version__
    except ImportError:
        pass
    return results


def skip_note(lever, left, compile):
    """Why a lever is not measured here: it needs another device, or `left` seconds of --budget are not enough
    (None: measure it)."""
    if lever.needs and lever.needs != DEVICE:
        return f"skipped: needs {lever.needs}"
    if left < row_cost(lever, compile) + (0 if lever.name == "default (again)" else RESERVE_S):
        return f"skipped: {left:.0f} s of the budget left"
    return None


def print_report(profile, results):
    """After the rows: where the default step's time went, what each lever changes, the run's seconds."""
    print_profile(profile, results["wall_clock_breakdown"])
    print("\n| lever | what it changes |\n|---|---|")
    for row in results["rows"]:
        print(f"| {row['lever']} | {row['what']} |")
    print(f"\n{results['seconds']:.0f} s")


def main():
    args = parse_args()
    size = SIZES["smoke" if args.smoke else "gpu" if DEVICE == "cuda" else "cpu"]
    compile = DEVICE == "cuda" and not args.smoke  # as the trainer's default: compiled with CUDA
    dtype = "bf16" if bf16_usable() else "fp32"
    peak = peak_flops(DEVICE, dtype)[0] if DEVICE == "cuda" else None
    started = time.perf_counter()
    results = results_header(size, dtype, compile)

    def save():
        results["seconds"] = time.perf_counter() - started
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))

    def add(row, flops_per_token):
        default = results["rows"][0] if results["rows"] else row
        if row["tokens_per_s"]:
            row["ratio"] = row["tokens_per_s"] / default["tokens_per_s"]
            row["mfu"] = row["tokens_per_s"] * flops_per_token / peak if peak else None
        results["rows"].append(row)
        print_row(row, LEVER_COLUMNS)
        save()
    wanted = [lever for lever in levers(size) if not args.only or lever.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_shards(Path(tmp), vocab_size=size["vocab_size"])
        print(f"{results['device']}: {size['model']}, T={size['seq_len']}, {size['tokens']:,} tokens/step, {dtype}, "
              f"{'compiled' if compile else 'eager'}; torch {torch.__version__}")
        print_header("each lever against the default, one process", LEVER_COLUMNS)
        flops = {}

        def profile_and_flops(trainer):
            flops["per_token"] = trainer.model.flops_per_token(size["seq_len"])
            return step_profile(args.trace)(trainer)
        default = Lever("default", "today's defaults: ds_configs/zero1_bf16.json, --loss fused")
        first = measure(default, data, tmp, size, compile, profile=profile_and_flops)
        profile = first.pop("profile")
        add(first, flops["per_token"])
        breakdown = Lever("default+wall_clock_breakdown", "DeepSpeed's timers on (they synchronize)",
                          ds=set_in("wall_clock_breakdown", True))
        row = measure(breakdown, data, tmp, size, compile, profile=wall_clock_breakdown)
        results["wall_clock_breakdown"] = row.pop("profile", {})
        add(row, flops["per_token"])
        for lever in wanted + [Lever("default (again)", "the default once more: drift over the run")]:
            note = skip_note(lever, args.budget - (time.perf_counter() - started) if args.budget else float("inf"),
                             compile)
            add(dict(blank_row(LEVER_COLUMNS), lever=lever.name, what=lever.what, note=note) if note else
                measure(lever, data, tmp, size, compile), flops["per_token"])
        results["profile"] = profile
        save()
    print_report(profile, results)


if __name__ == "__main__":
    sys.exit(main())
