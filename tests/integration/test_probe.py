"""--micro_batch auto's probe (gpt/memory/probe.py) and gpt-plan --measure's search (gpt/memory/measure.py): real DeepSpeed
engines on CPU, with the GPU allocator's out-of-memory simulated in the loss, since a CPU process swaps or is
killed instead of raising it."""
import gc
import json
import math
import weakref

import pytest
import torch

from gpt.train import engine as ds_engine
from gpt.model import loss as losses
from gpt.model.loss import chunked_cross_entropy
from gpt.model.model import GPT, GPTConfig
from gpt.train.engine import OptimizerSettings
from gpt.memory import measure
from gpt.memory.measure import format_report, measure_row, report_header
from gpt.memory.probe import dividing_sizes, doubling, probe_micro_batch, search_largest
from conftest import FP32_CONFIG, REPO, TINY, out_dir_of, succeeded, train, train_losses, two_rank_run

SEQ_LEN, VOCAB = 16, 128
CONFIG = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=SEQ_LEN, vocab_size=VOCAB)


def engine_factory(limit, models, error=torch.OutOfMemoryError, steps=None):
    """new_engine for the probe: a real fp32 engine whose loss raises `error` above `limit` sequences; each
    forward's micro-batch is appended to `steps` if given."""
    ds_config = json.loads((REPO / FP32_CONFIG).read_text())

    def limited_loss(hidden, weight, targets, vocab):
        if steps is not None:
            steps.append(hidden.shape[0] // SEQ_LEN)
        if hidden.shape[0] > limit * SEQ_LEN:
            raise error("simulated")
        return torch.nn.functional.cross_entropy(hidden @ weight.t(), targets)

    def new_engine(micro_batch):
        model = GPT(CONFIG)
        model.loss_fn = limited_loss
        models.append(weakref.ref(model))
        return ds_engine.initialize(model, ds_config, micro_batch, 1, OptimizerSettings(1e-3, 0.1, 0, 10, 0.1))
    return new_engine


def test_dividing_sizes_are_the_micro_batches_that_split_the_token_budget():
    assert dividing_sizes(2048, 32, 2, 32) == [1, 2, 4, 8, 16, 32]
    assert dividing_sizes(6 * 64, 32, 1, 11) == [1, 2, 3, 4, 6]


@pytest.mark.parametrize("limit, expected, probed", [(40, 32, [32]), (16, 16, [32, 16]),
                                                     (5, 4, [32, 16, 4, 8]), (1, 1, [32, 16, 4, 1, 2]),
                                                     (0, None, [32, 16, 4, 1])])
def test_the_probe_steps_down_from_the_plan_to_the_largest_size_that_fits(single_rank_group, limit, expected,
                                                                        probed):
    models, log = [], []
    candidates = dividing_sizes(32 * SEQ_LEN, SEQ_LEN, 1, 32)
    chosen = probe_micro_batch(engine_factory(limit, models), candidates, SEQ_LEN, VOCAB, torch.device("cpu"),
                               log=log.append)
    assert chosen == expected
    assert [int(line.split("micro-batch ")[1].split(":")[0]) for line in log] == probed
    assert [("fits" in line) for line in log] == [size <= limit for size in probed]
    assert "peak_rss_gib" in log[0]
    gc.collect()
    assert all(model() is None for model in models), "a probe's model outlived its engine"


def test_a_probe_takes_two_steps_on_one_engine(single_rank_group):
    """The first step creates Adam's moments; only the second step's forward and backward run beside them."""
    models, steps = [], []
    assert probe_micro_batch(engine_factory(8, models, steps=steps), [1, 2, 4], SEQ_LEN, VOCAB, torch.device("cpu"),
                             log=lambda line: None) == 4
    assert steps == [4, 4] and len(models) == 1


@pytest.mark.parametrize("gallop", [True, False])
@pytest.mark.parametrize("last", [0, 1, 7, 40, 511])
def test_the_search_finds_the_largest_fitting_index_from_any_start(last, gallop):
    """Every limit and every starting guess: the answer exact, no index tried twice or out of range, and at most
    2 log2(last + 2) tries galloping; in strides of one, at most the distance from the start and two more."""
    for limit in range(-1, last + 1):
        for start in range(0, last + 1, max(1, last // 13)):
            tried = []

            def fits(index):
                assert 0 <= index <= last and index not in tried
                tried.append(index)
                return index <= limit
            assert search_largest(fits, start, last, gallop) == limit
            most = 2 * math.ceil(math.log2(last + 2)) if gallop else abs(limit - start) + 2
            assert len(tried) <= most, (limit, start, tried)


def test_the_sizes_dividing_a_power_of_two_budget_double_and_the_search_steps_through_them_one_by_one():
    """524,288 tokens of 1024: 1, 2, 4, ..., 512, where a stride of two indices is 4x the size; 480 sequences'
    divisors (..., 24, 30, 32, ...) are dense, searched galloping."""
    assert doubling(dividing_sizes(524288, 1024, 1, 512)) and doubling([]) and doubling([7])
    assert not doubling(dividing_sizes(480 * 1024, 1024, 1, 480))


@pytest.mark.parametrize("limit, planned, compiled, tried, measured, out_of_memory, raw", [
    (13, 4, False, [4, 5, 7, 11, 19, 15, 13, 14], 13, 14, "13"),  # the plan under the answer: up in strides, bisect
    (40, 32, False, [32], 32, None, ">= 32"),  # the whole token budget on one GPU fits: the search stops there
    (0, 4, False, [4, 3, 1], None, 1, "-"),  # not even one sequence
    (13, 4, True, [4, 8, 16], 8, 16, "8-15"),  # compiled: only the sizes dividing the budget (1, 2, 4, 8, 16, 32), one by one
    (13, 20, True, [16, 8], 8, 16, "8-15"),  # compiled, the plan above the answer: from the largest dividing under it
    (13, 12, True, [8, 16, 12], 8, 16, "12-15"),  # compiled, the plan between two dividing sizes: tried too; it fits
    (10, 12, True, [8, 16, 12], 8, 12, "8-11")])  # ... and here it does not: the planner was optimistic
def test_measure_searches_above_and_below_the_plan(single_rank_group, limit, planned, compiled, tried, measured,
                                                   out_of_memory, raw):
    """gpt-plan --measure's search with the simulated out-of-memory: 32 sequences of budget (--total_batch_tokens
    = 32 x seq_len), each size two steps on a fresh engine, every engine freed, the report's table. Eager it
    tries every size (the raw maximum exact); compiled, a compile per size, only the sizes a run can use, and the
    plan itself where it lies between the answer and the first size out of memory."""
    models, log = [], []
    plan = {"max_micro_batch": planned}
    row = measure_row(engine_factory(limit, models), plan, 32 * SEQ_LEN, SEQ_LEN, VOCAB, torch.device("cpu"),
                      log=log.append, dividing_only=compiled)
    assert [t["micro_batch"] for t in row["tries"]] == tried and len(log) == len(tried)
    assert [t["fits"] for t in row["tries"]] == [size <= limit for size in tried]
    assert row["measured_max_micro_batch"] == measured and row["capped_at_budget"] == (measured == 32)
    assert row["first_out_of_memory"] == out_of_memory
    assert row["measured_micro_batch"] == {13: 8, 8: 8, 32: 32, None: None}[measured]  # the largest dividing 32
    assert row["planned_over_measured"] == (planned / measured if measured else None)
    assert row["peak_alloc_gib"] is None and row["search_s"] > 0  # peaks are the GPU allocator's; on CPU the RSS
    gc.collect()
    assert all(model() is None for model in models), "a measured model outlived its engine"
    report = report_header("CPU", 2 * 2**30, 0, None, "tiny", CONFIG, SEQ_LEN, 32 * SEQ_LEN, compiled=compiled)
    report["rows"].append({"ds_config": FP32_CONFIG, "loss": "fused", "allocator": "default", **row})
    table = format_report(report).splitlines()
    steps = "2 compiled steps per try, sizes dividing the budget" if compiled else "2 eager steps per try"
    assert table[0].startswith(f"tiny, seq_len {SEQ_LEN}, 1 rank, {steps}, on CPU (2.00 GiB); ")
    measured_cell = {32: ">= 32 (budget)", None: "-"}.get(measured, str(measured))
    ratio = f"{planned / measured:.2f}" if measured else "-"
    assert table[-1].startswith(f"| zero2_fp32.json | fused | default | {planned} | {measured_cell} | "
                                f"{out_of_memory or '-'} | {raw} | {ratio} | - | - | {len(tried)} | ")


def test_measure_all_takes_the_configs_whose_precision_the_gpu_has(monkeypatch):
    """--all on a V100 (compute capability 7.0, no bf16 units): the fp16 and fp32 configs; on an H100 (9.0) all."""
    monkeypatch.chdir(REPO)
    every = sorted(str(path) for path in (REPO / "ds_configs").glob("*.json"))
    for capability, expected in (((7, 0), [c for c in every if "bf16" not in c]), ((9, 0), every)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: capability)
        assert [str(REPO / c) for c in measure.configs_for_gpu()] == expected
    assert len(every) == 13 and sum("fp16" in c or "fp32" in c for c in every) == 7  # 4 of the 13 Muon's


def test_an_error_other_than_out_of_memory_is_not_taken_for_one(single_rank_group):
    with pytest.raises(ValueError, match="simulated"):
        probe_micro_batch(engine_factory(2, [], error=ValueError), [1, 2, 4], SEQ_LEN, VOCAB, torch.device("cpu"),
                          log=lambda line: None)


@pytest.mark.two_rank_runs({"probe": two_rank_run(
    *TINY, "--micro_batch", "auto", "--seq_len", "32", "--total_batch_tokens", "2048", "--max_steps", "2",
    "--data", "{small_vocab_dir}", script="tests/integration/probe_ranks.py")})
def test_two_ranks_probe_through_the_trainer_and_agree_on_the_smaller_limit(two_rank_runs):
    """Rank 1 runs out above 6 sequences, rank 0 above 12: both take 4 (of 1, 2, 4, ... 32), the trainer's
    grad_accum and run follow, and the initial weights are those of a run without a probe."""
    _, out = succeeded(two_rank_runs["probe"])
    ranks = [json.loads((out_dir_of(out) / f"probe_rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["planned"] == 32 and rank["micro_batch"] == 4 and rank["engine_micro_batch"] == 4
        assert rank["grad_accum"] == 2048 // (4 * 32 * 2) and rank["same_init"]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert "--micro_batch auto: planned 32" in out.stdout and "probed 4: micro_batch 4 x grad_accum 8" in out.stdout


def out_of_memory_over(monkeypatch, sequences):
    """The fused loss of runs at seq_len 64 raises a GPU's out-of-memory above this many sequences, simulated."""
    def limited(hidden, weight, targets, real_vocab_size):
        if hidden.shape[0] > sequences * 64:
            raise torch.OutOfMemoryError(f"simulated: over {sequences} sequences")
        return chunked_cross_entropy(hidden, weight, targets, real_vocab_size)

    monkeypatch.setattr(losses, "kernel_for", lambda *args: losses.Kernel(
        f"chunked, out of memory over {sequences} sequences", "", limited))


def test_auto_falls_back_to_a_smaller_size_when_the_first_compiled_step_runs_out_of_memory(tmp_path, small_vocab_dir,
                                                                                          monkeypatch):
    """--micro_batch auto whose size then runs out of memory in the run's first step (compiled; out-of-memory
    simulated in the loss): the run is built again at the next smaller size that divides the token budget, one line
    each time, and trains as a run started at that size does. Compiled runs (the point: the first compiled step);
    the size it falls back to is the tiny runs' micro-batch, whose graphs other compiled tests share (inductor's
    caches): only the first step's forward at 8 sequences is compiled for this test."""
    out_of_memory_over(monkeypatch, 4)
    args = [*TINY, "--max_steps", "3", "--total_batch_tokens", "512", "--compile"]
    auto, proc = train(tmp_path / "auto", small_vocab_dir, *args, "--micro_batch", "auto")
    fallbacks = [line for line in proc.stdout.splitlines() if "falling back" in line]
    assert fallbacks == ["--micro_batch auto: micro-batch 8 ran out of memory in the run's first step; falling back to 4"]
    assert "1 rank(s) x micro_batch 4 x seq_len 64 x grad_accum 2" in proc.stdout
    fixed, _ = train(tmp_path / "fixed", small_vocab_dir, *args, "--micro_batch", "4")
    assert train_losses(auto) == pytest.approx(train_losses(fixed), rel=1e-6) and len(train_losses(auto)) == 3


def test_a_resume_under_auto_keeps_the_size_its_run_chose_and_a_changed_run_chooses_again(tmp_path, small_vocab_dir,
                                                                                         monkeypatch):
    """--micro_batch auto on a resume: the size the checkpoint's run chose (here by its first step's fallback, which
    the plan cannot know) is kept for the same run on the same device, in one line, with no fallback again, and the
    run goes on bit for bit as the uninterrupted one; a run changed in what the choice depends on chooses again."""
    out_of_memory_over(monkeypatch, 16)
    args = [*TINY, "--max_steps", "4", "--total_batch_tokens", "2048", "--micro_batch", "auto"]
    whole, proc = train(tmp_path / "whole", small_vocab_dir, *args, "--save_every", "2")
    assert "falling back to 16" in proc.stdout
    step_1 = str(tmp_path / "whole" / "checkpoints" / "step_00000001")
    resumed, proc = train(tmp_path / "resumed", small_vocab_dir, *args, "--resume", step_1)
    assert ("--micro_batch auto: kept micro_batch 16 x grad_accum 2, which the checkpoint's run chose for this same "
            "run on cpu") in proc.stdout.splitlines()
    assert "falling back" not in proc.stdout
    assert train_losses(resumed) == train_losses(whole)[2:]  # exact equality, not a tolerance
    _, proc = train(tmp_path / "changed", small_vocab_dir, *args, "--deterministic", "--resume", step_1)
    assert "kept micro_batch" not in proc.stdout
    assert "micro-batch 32 ran out of memory in the run's first step; falling back to 16" in proc.stdout


AUTO_RUN = [*TINY, "--max_steps", "4", "--total_batch_tokens", "2048", "--micro_batch", "auto", "--save_every", "2",
            "--data", "{small_vocab_dir}"]


@pytest.mark.two_rank_runs({"auto_whole": two_rank_run(*AUTO_RUN), "auto_resumed": two_rank_run(
    *AUTO_RUN, "--resume", "{runs}/auto_whole/checkpoints/step_00000001")})
def test_two_ranks_resume_under_auto_at_the_size_their_run_chose(two_rank_runs):
    """Both ranks agree to keep the checkpoint's size (one collective), and the run goes on bit for bit."""
    (whole, _), (resumed, proc) = succeeded(two_rank_runs["auto_whole"]), succeeded(two_rank_runs["auto_resumed"])
    assert ("--micro_batch auto: kept micro_batch 16 x grad_accum 1, which the checkpoint's run chose for this same "
            "run on cpu") in proc.stdout.splitlines()
    assert train_losses(resumed) == train_losses(whole)[2:] and len(train_losses(resumed)) == 2


def test_auto_exits_with_one_line_when_even_the_smallest_size_runs_out_of_memory(tmp_path, small_vocab_dir,
                                                                                 monkeypatch):
    def never_fits(hidden, weight, targets, real_vocab_size):
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(losses, "kernel_for", lambda *args: losses.Kernel("always out of memory", "", never_fits))
    args = [*TINY, "--max_steps", "2", "--total_batch_tokens", "128", "--micro_batch", "auto"]
    _, proc = train(tmp_path, small_vocab_dir, *args, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        "error: --micro_batch auto: even micro-batch 1 ran out of memory in the run's first step; use ZeRO-2, "
        "activation checkpointing (ds_configs/*_ckpt.json), a shorter --seq_len or more GPUs")
