"""The memory planner: model states equal DeepSpeed's estimator and the ZeRO paper; the plan holds what GPUs
fitted; the search behaves; bad input is a clear error. (The bytes a real 2-rank engine holds and activations
measured at unseen sizes: tests/integration/test_plan_runs.py.)"""
import json

import pytest
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from common import REPO
from gpt.memory.footprint import measure_step_bytes
from gpt.model.model import PRESETS, GPTConfig
from gpt.memory.plan import (CONTEXT_RESERVE, GPUS, GiB, MODEL_STATE_PARTS, auto_record, element_bytes,
                             loss_chunk_element_bytes, make_plan, model_state_bytes)
from gpt.console import BadInput
from gpt.config.ds_config import load as load_ds_config


@pytest.mark.parametrize("world_size", [1, 8, 64])
def test_zero2_model_states_equal_deepspeeds_estimator(world_size):
    psi = 124_475_904
    parts = model_state_bytes(psi, "fp16", 2, world_size)
    planned = sum(v for k, v in parts.items() if k != "buckets")
    _, deepspeed_gpu_bytes = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=world_size, cpu_offload=False)
    assert int(planned) == deepspeed_gpu_bytes  # 2 psi + 18 psi / N


def zero_paper_model_states(n_params, stage, world_size):
    """The ZeRO paper's accounting (Rajbhandari et al. 2020, fig. 1): mixed-precision Adam, K = 12."""
    psi, n = n_params, world_size
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]


def test_zero_paper_example_7_5b_on_64_gpus():
    gigabytes = [round(zero_paper_model_states(7.5e9, stage, 64) / 1e9, 1) for stage in (0, 1, 2)]
    assert gigabytes == [120.0, 31.4, 16.6]


def test_the_fused_loss_never_holds_the_whole_logits():
    """A step of 8 chunks: the fused loss's peak is below the classic one by more than the fp32 logits."""
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=4096)
    classic, fused = (measure_step_bytes(config, 16, 64, "bf16", False, loss, chunk_rows=128)
                      for loss in ("classic", "fused"))
    assert classic - fused > 16 * 64 * 4096 * 4, (classic, fused)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("loss", ["classic", "fused"])
def test_a_fp16_step_holds_what_a_bf16_step_holds_to_the_byte(loss, checkpointing):
    """The half dtypes differ in range, not in size: the same tensors live at every moment of a step. So the
    measurements at an unseen size (tests/integration/test_plan_runs.py) check bf16, and fp16 through this."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=512)
    bf16, fp16 = (measure_step_bytes(config, 8, 32, precision, checkpointing, loss) for precision in ("bf16", "fp16"))
    assert bf16 == fp16 and bf16 > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_a_chunk_of_the_fused_loss_holds_its_fp32_logits_once(precision):
    """At a chunk's peak: its logits in fp32 and their gradient in the compute dtype, nothing more (bf16 makes the
    gradient in the forward pass; a second fp32 copy there peaked 1.65 GiB above the plan on an H100)."""
    assert loss_chunk_element_bytes(precision) <= 4 + element_bytes(precision) + 0.01


SHARED_H100 = json.loads((REPO / "tests" / "data" / "h100_memory_2026-11-22.json").read_text())


@pytest.mark.parametrize("run", SHARED_H100["runs"], ids=lambda run: f"{run['ds_config']}-{run['alloc_conf'][:18]}")
def test_the_plan_matches_what_an_h100_fitted(run):
    """Planned with the run's allocator setting and memory: never above the first size that ran out of
    memory, no more than 10% below the last that fitted. The capped runs limited PyTorch's allocator alone,
    so nothing is reserved outside it; the uncapped one had the whole device, CUDA context included."""
    cap = run["cap_gib"]
    allocator = "expandable_segments" if "expandable_segments:True" in run["alloc_conf"] else "default"
    plan = make_plan(PRESETS[run["model"]], 1024, load_ds_config(REPO / run["ds_config"]), 1,
                     cap * GiB if cap else GPUS["h100-80gb"], 524288, "classic", allocator,
                     0 if cap else CONTEXT_RESERVE, compiled=False)
    last_fit = max(row["micro"] for row in run["rows"] if row["ok"])
    first_oom = min(row["micro"] for row in run["rows"] if not row["ok"])
    assert 0.9 * last_fit <= plan["max_micro_batch"] < first_oom, (plan["max_micro_batch"], last_fit, first_oom)


MEASURED = sorted((REPO / "tests" / "data").glob("gpu_measure_*.json"))  # gpt-plan --measure --json reports


@pytest.mark.parametrize("report", MEASURED, ids=lambda path: path.stem)
def test_the_plan_holds_every_row_measured_on_a_gpu(report):
    """Every row gpt-plan --measure measured (tests/data/gpu_measure_*.json, written on a GPU by
    launch/gpu_check.sh), planned again now: at most the raw maximum and at least 90% of what fitted; a row whose
    search stopped at the token budget only says the plan may reach it."""
    report = json.loads(report.read_text())
    config = GPTConfig(**report["model_config"], block_size=max(1024, report["seq_len"]))
    device_bytes = (report["allocator_cap_bytes"] + report["outside_allocator_bytes"] if report["allocator_cap_bytes"]
                    else report["total_memory_bytes"])
    for row in report["rows"]:
        measured = row["measured_max_micro_batch"]
        try:
            planned = make_plan(config, report["seq_len"], load_ds_config(REPO / row["ds_config"]), 1, device_bytes,
                                report["total_batch_tokens"], row["loss"], row["allocator"],
                                compiled=report.get("compiled", False))["max_micro_batch"]
        except BadInput:
            planned = 0
        if row["capped_at_budget"]:
            continue  # the GPU fits the whole budget: any plan up to it is safe
        # compiled reports try only the sizes dividing the budget (and the plan, between two of them): the raw maximum
        # lies from the largest size that fitted to below the first that failed
        highest = (row.get("first_out_of_memory") or measured + 1) - 1
        fitted = row.get("largest_fitting") or measured
        assert measured and 0.9 * fitted <= planned <= highest, (row["ds_config"], row["loss"], planned, measured)


def plan_for(config_name, gpu_gib, model=GPTConfig(), world_size=8):
    return make_plan(model, 1024, load_ds_config(REPO / "ds_configs" / config_name), world_size, gpu_gib * GiB, 524288)


def test_more_memory_never_gives_a_smaller_micro_batch():
    batches = [plan_for("zero2_fp16.json", gib)["max_micro_batch"] for gib in range(12, 90, 6)]
    assert batches == sorted(batches) and batches[-1] > batches[0]


@pytest.mark.parametrize("base", ["zero1_bf16", "zero2_fp16"])
def test_activation_checkpointing_allows_a_larger_micro_batch(base):
    assert plan_for(f"{base}_ckpt.json", 32)["max_micro_batch"] > plan_for(f"{base}.json", 32)["max_micro_batch"]


def test_plan_fits_and_reaches_the_token_budget():
    plan = plan_for("zero1_bf16.json", 80)
    assert plan["total_bytes"] <= plan["gpu_bytes"]
    assert plan["micro_batch"] * 1024 * 8 * plan["grad_accum"] == 524288
    assert set(MODEL_STATE_PARTS) - {"fp32_gradients"} <= set(plan["bytes"])


def gpt_plan(capsys, *args):
    """gpt-plan in this process, where the activation fits are cached across tests: (exit code, stdout,
    stderr as the console would show them)."""
    from gpt.commands.plan import main
    code, message = 0, ""
    try:
        main(list(args))
    except SystemExit as exit:  # sys.exit("error: ...") prints its message and exits 1
        code, message = (1, exit.code + "\n") if isinstance(exit.code, str) else (exit.code, "")
    out = capsys.readouterr()
    return code, out.out, out.err + message


def test_cli_json_and_errors(capsys):
    code, out, _ = gpt_plan(capsys, "--model", "d12", "--seq_len", "1024", "--ds_config", "ds_configs/zero1_bf16.json",
                            "--gpu", "a800-80gb", "--world_size", "8", "--json")
    plan = json.loads(out)
    assert {"max_micro_batch", "total_bytes", "gpu_bytes", "bytes"} <= set(plan) and plan["gpu_bytes"] == GPUS["a800-80gb"]
    assert plan["loss"] == "fused" and plan["allocator"] == "expandable_segments"  # the trainer's defaults
    code, _, err = gpt_plan(capsys, "--gpu", "tpu-v9")
    assert code == 1 and "invalid choice: 'tpu-v9'" in err
    code, _, err = gpt_plan(capsys, "--model", "d48", "--ds_config", "ds_configs/zero1_fp16.json", "--gpu", "v100-32gb",
                            "--world_size", "1")
    assert code == 1 and err.startswith("error: even micro-batch 1 needs 3")
    assert "use ZeRO-2, activation checkpointing, more GPUs or a GPU with more memory" in err
    code, _, err = gpt_plan(capsys, "--model", "d48", "--ds_config", "ds_configs/zero1_fp16.json", "--gpu", "v100-16gb",
                            "--world_size", "1")  # the model states alone: no batch or checkpointing helps
    assert code == 1 and err == ("error: the model states alone (1.56e+09 parameters: weights, gradients, optimizer "
                                 "states) need 30.1 GiB per GPU, more than its 15.3 GiB: choose a smaller model, or "
                                 "more GPUs with ZeRO 1 or 2\n")
    code, _, err = gpt_plan(capsys, "--model", "d12")
    assert code == 1 and err.startswith("error: give --gpu (one of a100-40gb")
    with pytest.raises(BadInput):
        plan_for("zero1_bf16.json", 0.5)


def test_gpt_plan_plans_the_compiled_step_unless_told_no_compile(capsys):
    """As the trainer runs on CUDA: compiled by default, where Inductor fuses the classic loss's logits (more
    sequences fit than eager); --no-compile plans the eager step. The text names the mode."""
    plans = {}
    for flags in ((), ("--no-compile",)):
        code, out, _ = gpt_plan(capsys, "--gpu", "h100-80gb", "--world_size", "1", "--loss", "classic", *flags, "--json")
        plans[flags] = json.loads(out)
    compiled, eager = plans[()], plans[("--no-compile",)]
    assert compiled["compiled"] is True and eager["compiled"] is False
    assert compiled["max_micro_batch"] > eager["max_micro_batch"]
    _, out, _ = gpt_plan(capsys, "--gpu", "h100-80gb", "--world_size", "1", "--no-compile")
    assert "fused loss, eager, expandable_segments allocator" in out


def test_several_configs_and_losses_plan_each(capsys):
    code, out, _ = gpt_plan(capsys, "--gpu", "v100-32gb", "--ds_config", "ds_configs/zero2_fp16.json",
                            "ds_configs/zero2_fp16_ckpt.json", "--loss", "fused", "classic", "--json")
    plans = json.loads(out)
    assert code == 0 and [(p["checkpointing"], p["loss"]) for p in plans] == [
        (False, "fused"), (False, "classic"), (True, "fused"), (True, "classic")]
    assert plans[0]["max_micro_batch"] > plans[1]["max_micro_batch"]  # the fused loss fits more
    code, out, _ = gpt_plan(capsys, "--gpu", "v100-32gb", "--ds_config", "ds_configs/zero2_fp16.json",
                            "ds_configs/zero2_fp16_ckpt.json")
    assert out.count("max micro-batch") == 2 and "v100-32gb, ds_configs/zero2_fp16_ckpt.json: 124M" in out


def test_what_auto_chose_a_size_for_is_recorded_whole_and_any_change_makes_another_record():
    """A checkpoint's record of what --micro_batch auto's choice depended on (gpt.train.start.kept_micro_batch keeps
    the saved size only for an equal one): it survives run_config.json's round trip, and each input changes it."""
    ds_config = load_ds_config(REPO / "ds_configs/zero1_bf16.json")
    inputs = dict(config=PRESETS["tiny"], seq_len=64, ds_config=ds_config, world_size=1, device_type="cpu",
                  loss="fused", compiled=False, deterministic=False)
    record = auto_record(**inputs)
    assert json.loads(json.dumps(record)) == record == auto_record(**inputs)
    assert record["device"] == "cpu" and record["memory_bytes"] > 0
    changes = dict(config=PRESETS["d4"], seq_len=128, world_size=2, loss="classic", compiled=True, deterministic=True,
                   ds_config={**ds_config, "zero_optimization": {**ds_config["zero_optimization"],
                                                                 "reduce_bucket_size": 1}})
    assert [name for name, value in changes.items() if auto_record(**{**inputs, name: value}) == record] == []
