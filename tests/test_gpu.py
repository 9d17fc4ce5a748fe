"""The CUDA paths, on one GPU: d12-shaped steps in bf16 and fp16 (the loss scale moves on overflow), the
default torch.compile with validation and sampling, bit-exact resume under --deterministic, --micro_batch
auto, a resume through DeepSpeed's universal form, DeepSpeed's FusedAdam JIT build, and gpt-eval / gpt-sample on
the GPU. Skipped where there is no
CUDA (CI); `python -m pytest -m gpu tests` runs just these on a GPU machine."""
import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, train, train_losses, write_ds_config
from gpt.evaluate import sample
from gpt.model import GPT, PRESETS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# GPT-2 small (d12) at full sequence length, 4 micro-batches of 8: one optimizer step takes ~0.1 s on an H100
D12 = ["--model", "d12", "--seq_len", "1024", "--micro_batch", "8", "--total_batch_tokens", "32768",
       "--lr", "1e-3", "--warmup_steps", "2", "--val_every", "0", "--sample_every", "0", "--seed", "1234"]


@pytest.fixture(autouse=True)
def on_cuda(monkeypatch):
    """conftest pins DeepSpeed to its CPU accelerator; runs started from these tests use the GPU."""
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")


def steps(records):
    return [r for r in records if "loss" in r]


def test_d12_zero1_bf16_learns(tmp_path, shakespeare_dir):
    records, proc = train(tmp_path, shakespeare_dir, *D12, "--ds_config", "ds_configs/zero1_bf16.json",
                          "--no-compile", "--max_steps", "12")
    losses = train_losses(records)
    assert losses[0] > 10.5 and sum(losses[-3:]) / 3 < losses[0] - 2.0, losses
    assert "bf16, ZeRO 1, BF16_Optimizer over FusedAdam" in proc.stdout
    assert "CPU Virtual Memory" not in proc.stdout  # no DeepSpeed memory dumps


def test_d12_zero2_fp16_lowers_the_loss_scale_on_overflow_then_learns(tmp_path, shakespeare_dir):
    # 2**32 x a loss of ~11 overflows fp16 (max 65504) in the backward: each overflow skips the step and
    # halves the scale until the gradients fit
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 1000,
            "hysteresis": 1, "min_loss_scale": 1}
    config = write_ds_config(tmp_path / "fp16.json", base="zero2_fp16.json", fp16=fp16)
    records, proc = train(tmp_path / "run", shakespeare_dir, *D12, "--ds_config", config, "--no-compile",
                          "--max_steps", "36")
    records = steps(records)
    assert records[0]["skipped_steps"] == 1 and records[0]["loss_scale"] == 2.0**31
    skipped = records[-1]["skipped_steps"]
    assert 0 < skipped <= 24 and records[-1]["loss_scale"] == 2.0 ** (32 - skipped)
    trained = [r["loss"] for r in records[skipped:]]
    assert sum(trained[-3:]) / 3 < trained[0] - 1.0, trained
    assert "fp16, ZeRO 2, DeepSpeedZeroOptimizer over FusedAdam" in proc.stdout


def test_compile_is_the_default_and_keeps_validation_and_sampling_working(tmp_path, shakespeare_dir):
    args = [*D12, "--seq_len", "256", "--total_batch_tokens", "8192", "--max_steps", "3", "--val_every", "2",
            "--val_tokens", "8192", "--sample_every", "2", "--sample_tokens", "16"]
    compiled, proc = train(tmp_path / "compiled", shakespeare_dir, *args)
    assert "torch.compile on (the default with CUDA; --no-compile turns it off)" in proc.stdout
    assert "sample at step 2:" in proc.stdout
    eager, _ = train(tmp_path / "eager", shakespeare_dir, *args, "--no-compile")
    for key in ("loss", "val_loss"):  # bf16: the compiled kernels round differently
        assert [r[key] for r in compiled if key in r] == pytest.approx([r[key] for r in eager if key in r], rel=2e-2)


@pytest.mark.parametrize("config", ["zero1_bf16.json", "zero2_fp16.json"])
def test_deterministic_resume_is_bit_exact(tmp_path, shakespeare_dir, config):
    args = [*D12, "--ds_config", f"ds_configs/{config}", "--no-compile", "--deterministic", "--max_steps", "6",
            "--save_every", "3", "--val_every", "3", "--val_tokens", "16384"]
    whole, _ = train(tmp_path / "whole", shakespeare_dir, *args)
    resumed, proc = train(tmp_path / "resumed", shakespeare_dir, *args,
                          extra=["--resume", str(tmp_path / "whole" / "checkpoints" / "step_00000002")])
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout

    def exact(records):
        return [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss")) for r in records
                if r["step"] >= 3 and ("loss" in r or "val_loss" in r)]
    assert exact(resumed) == exact(whole)  # equality, not a tolerance


def test_a_resume_on_another_zero_stage_and_micro_batch_goes_through_the_universal_form(tmp_path, shakespeare_dir):
    """bf16 ZeRO 1 (BF16_Optimizer) saved, resumed as ZeRO 2 with half the micro-batch: converted to DeepSpeed's
    universal form and loaded into a CUDA engine, then the uninterrupted run's losses to bf16's rounding (the
    sums go in another order; tests/test_resume_anywhere.py measures the same on CPU)."""
    args = [*D12, "--no-compile", "--deterministic", "--max_steps", "6", "--save_every", "3"]
    whole, _ = train(tmp_path / "whole", shakespeare_dir, *args, "--ds_config", "ds_configs/zero1_bf16.json")
    step_2 = tmp_path / "whole" / "checkpoints" / "step_00000002"
    resumed, proc = train(tmp_path / "resumed", shakespeare_dir, *args, "--ds_config", "ds_configs/zero2_bf16.json",
                          "--micro_batch", "4", "--resume", str(step_2))
    assert f"converted {step_2} to DeepSpeed's universal form" in proc.stdout and "at step 3" in proc.stdout
    whole_losses = {r["step"]: r["loss"] for r in steps(whole)}
    difference = max(abs(r["loss"] / whole_losses[r["step"]] - 1) for r in steps(resumed))
    print(f"largest relative loss difference after the universal resume on the GPU: {difference:.3g}")
    assert [r["step"] for r in steps(resumed)] == [3, 4, 5] and difference < 1e-3


def test_micro_batch_auto_fills_the_gpu(tmp_path, shakespeare_dir):
    records, proc = train(tmp_path, shakespeare_dir, *D12, "--micro_batch", "auto", "--no-compile",
                          "--total_batch_tokens", "524288", "--max_steps", "2")
    chosen = re.search(r"1 rank\(s\) x micro_batch (\d+) x seq_len 1024 x grad_accum (\d+)", proc.stdout)
    assert chosen, proc.stdout[-3000:]
    micro, accum = map(int, chosen.groups())
    assert micro >= 8 and micro * accum * 1024 == 524288  # d12 in bf16 on a >= 32 GB GPU
    assert [r["step"] for r in steps(records)] == [0, 1]
    # the plan was checked by a real step (gpt/probe.py): the last probe that fitted is the chosen size
    probes = re.findall(r"probe at micro-batch (\d+): (fits|out of memory)", proc.stdout)
    assert probes and max(int(size) for size, verdict in probes if verdict == "fits") == micro, proc.stdout[-3000:]
    assert f"probed {micro}: micro_batch {micro} x grad_accum {accum}" in proc.stdout
    assert all(r["peak_reserved_gib"] < torch.cuda.get_device_properties(0).total_memory / 2**30 for r in steps(records))


def test_fused_adam_builds_with_an_arch_suffixed_torch_cuda_arch_list(tmp_path, shakespeare_dir, monkeypatch):
    major, minor = torch.cuda.get_device_capability()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}a")  # as NVIDIA's containers set it for Hopper
    records, proc = train(tmp_path, shakespeare_dir, *D12, "--no-compile", "--max_steps", "2")
    assert f"TORCH_CUDA_ARCH_LIST '{major}.{minor}a' -> '{major}.{minor}' for DeepSpeed's op builder" in proc.stdout
    assert "over FusedAdam" in proc.stdout
    assert [r["step"] for r in steps(records)] == [0, 1]


@pytest.mark.parametrize("config", ["zero1_bf16.json", "zero2_fp16.json"])
def test_d12_the_fused_loss_equals_the_classic_one_and_needs_less_memory(tmp_path, shakespeare_dir, config):
    """Fused (liger in bf16 where installed, else chunked) vs --loss classic: the same losses to bf16/fp16
    rounding over 4 steps, a lower peak in the step log, and expandable segments set by the trainer."""
    runs = {}
    for loss in ("classic", "fused"):
        records, proc = train(tmp_path / loss, shakespeare_dir, *D12, "--ds_config", f"ds_configs/{config}",
                              "--no-compile", "--max_steps", "4", "--loss", loss)
        runs[loss] = steps(records)
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the trainer's default" in proc.stdout
    for classic, fused in zip(runs["classic"], runs["fused"]):
        assert fused["loss"] == pytest.approx(classic["loss"], rel=2e-2)
    peak = {loss: max(r["peak_alloc_gib"] for r in rows) for loss, rows in runs.items()}
    assert peak["fused"] < peak["classic"] - 8 * 0.5, peak  # 8 sequences x >= 0.5 GiB of logits each
    assert all(r["peak_reserved_gib"] >= r["peak_alloc_gib"] for r in runs["fused"])


def test_gpt_plan_measure_finds_the_largest_micro_batch_under_a_capped_allocator():
    """gpt-plan --measure as a user runs it: d4, T=512, zero2_fp16 on 4 GiB (the allocator capped at 4 GiB less
    what the process holds outside it), fused and classic loss. The answer is the largest size that fitted, the
    next size did not, the peaks stay under the cap, and the fused loss fits more sequences; stdout is JSON."""
    proc = subprocess.run([sys.executable, "-m", "gpt.plan", "--measure", "--model", "d4", "--seq_len", "512",
                           "--ds_config", "ds_configs/zero2_fp16.json", "--loss", "fused", "classic", "--gpu_mem", "4",
                           "--total_batch_tokens", str(512 * 512), "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["allocator_cap_bytes"] + report["outside_allocator_bytes"] == 4 * 2**30
    assert report["device"] == torch.cuda.get_device_name() and report["world_size"] == 1
    for row in report["rows"]:
        measured = row["measured_max_micro_batch"]
        assert measured == max(t["micro_batch"] for t in row["tries"] if t["fits"]) and not row["capped_at_budget"]
        assert any(t["micro_batch"] == measured + 1 and not t["fits"] for t in row["tries"]), row["tries"]
        assert row["peak_reserved_gib"] * 2**30 <= report["allocator_cap_bytes"]
        assert row["planned_max_micro_batch"] <= measured  # the plan is safe (tests/test_plan.py holds it to 90%)
    fused, classic = report["rows"]
    assert fused["measured_max_micro_batch"] > classic["measured_max_micro_batch"]


def gpt_cli(*args):
    """`python -m gpt.cli ...` as a user runs it: the completed process."""
    return subprocess.run([sys.executable, "-m", "gpt.cli", *args], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=600)


def test_gpt_eval_on_cuda_equals_the_cpu_to_bf16_rounding(trained_checkpoint, shakespeare_dir, hellaswag_files):
    args = ["eval", "--checkpoint", str(trained_checkpoint), "--data", str(shakespeare_dir), "--seq_len", "64",
            "--val_tokens", "8192", "--hellaswag", str(hellaswag_files / "hellaswag_val.jsonl"), "--json"]
    runs = {device: json.loads(gpt_cli(*args, "--device", device).stdout.strip().splitlines()[-1])
            for device in ("cpu", "cuda", "auto")}
    precision = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
    assert [(r["device"], r["precision"]) for r in runs.values()] == [("cpu", "fp32"), ("cuda", precision),
                                                                       ("cuda", precision)]  # auto: the GPU
    for run in ("cuda", "auto"):
        assert runs[run]["val_loss"] == pytest.approx(runs["cpu"]["val_loss"], rel=1e-2)  # bf16 matmuls round
        assert runs[run]["hellaswag_examples"] == 10 and 0 <= runs[run]["hellaswag_acc_norm"] <= 1


def test_gpt_sample_on_cuda(trained_checkpoint):
    proc = gpt_cli("sample", "--checkpoint", str(trained_checkpoint), "--device", "cuda", "--prompt", "To be",
                   "--max_new_tokens", "8", "--num_samples", "2")
    assert "sampling on cuda in " in proc.stderr
    samples = proc.stdout.split("--- sample 0\n", 1)[1]  # past DeepSpeed's timestamped import warning
    assert samples.startswith("To be") and samples.count("--- sample 1\nTo be") == 1


def test_sampling_on_cuda_draws_from_a_cpu_or_a_cuda_generator():
    model = GPT(PRESETS["tiny"]).cuda()
    for generator in (torch.Generator(), torch.Generator(device="cuda")):
        tokens = sample(model, [50256], 8, generator.manual_seed(0), torch.device("cuda"))
        assert len(tokens) == 9 and max(tokens) < 50257
