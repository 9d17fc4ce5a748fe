"""loss: which kernel --loss fused should mean, each fused kernel and the classic loss at a fixed
micro-batch and at --micro_batch auto's choice, against the classic loss's best; a verdict line."""
import traceback
from pathlib import Path

from harness import (DEVICE, MEMORY_COLUMNS, auto_micro_batch, blank_row, ds_config_file, print_row, trainer_settings,
                     trainer_throughput)
from gpt.model.loss import KERNELS, loss_problem

COLUMNS = [("model", "{}"), ("dtype", "{}"), ("loss", "{}"), ("compiled", "{}"), ("micro_batch", "{}"),
           ("grad_accum", "{}"), ("picked_by", "{}"), ("tokens_per_s", "{:.0f}"), *MEMORY_COLUMNS,
           ("ratio_to_classic_best", "{:.3f}"), ("note", "{}")]


KERNELS_MEASURED = ("classic", *(k for k in KERNELS if k != "classic"))  # classic first: the target


def measure(data, tmp, dtype, model, seq_len, sequences, micro_batch, sweep_from, compile, repeats):
    """The choice of the kernel behind --loss fused: the classic loss and each fused kernel at micro-batch
    `micro_batch` ("fixed") and at --micro_batch auto's choice for that loss ("auto"); the classic loss also at
    micro-batches doubling from `sweep_from` up to its first out-of-memory ("sweep"), its best tokens/s the
    target. Every row `sequences` x seq_len tokens per step (accumulating), compiled as `compile` says. Returns
    (rows, the verdict)."""
    config, rows = ds_config_file(tmp, dtype), []

    def settings(kernel, size):
        return trainer_settings(data, Path(tmp) / f"loss_{kernel}_{size}", config, model, seq_len, size,
                                sequences // size, compile=compile, loss=kernel)
    for kernel in KERNELS_MEASURED:
        base = dict(blank_row(COLUMNS), model=model, dtype=dtype, loss=kernel, compiled=compile)
        problem = loss_problem(kernel, DEVICE, dtype)
        if problem:
            rows.append(dict(base, note=f"skipped: {problem}"))
            print_row(rows[-1], COLUMNS)
            continue
        try:
            auto = auto_micro_batch(settings(kernel, sequences).replace(micro_batch="auto",
                                                                        out_dir=str(Path(tmp) / f"loss_{kernel}_auto")))
            picks = sizes_to_measure(kernel, micro_batch, auto, sweep_from if kernel == "classic" else None, sequences)
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
                print_row(row, COLUMNS)
        except Exception as error:  # noqa: BLE001 -- a fused kernel that fails here is an answer (liger has open bugs)
            if kernel == "classic":
                raise
            traceback.print_exc()
            rows.append(dict(base, note=f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"))
            print_row(rows[-1], COLUMNS)
    verdict = loss_verdict(rows, micro_batch, dtype)
    print(f"\n{verdict['line']}", flush=True)
    return rows, verdict


def sizes_to_measure(kernel, micro_batch, auto, sweep_from, sequences):
    """{micro-batch: why it is measured}: the fixed one, auto's choice, and from sweep_from (None: no sweep) the sizes
    doubling up to `sequences`."""
    picks = {micro_batch: ["fixed"]}
    picks.setdefault(auto, []).append("auto")
    size = sweep_from
    while size is not None and size <= sequences:
        picks.setdefault(size, []).insert(0, "sweep")
        size *= 2
    return picks


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
