"""What a run adapts to the machine and the run: TORCH_CUDA_ARCH_LIST for DeepSpeed's op builder, the defaults
for --compile and the warmup, deterministic mode's CUDA switches. (The CPU precision by bf16 units, runs and
py-cpuinfo: tests/integration/test_hardware_runs.py.)"""
import importlib

import pytest

from gpt.config import hardware
from gpt.commands.train import parse
from gpt.config.preflight import resolve_defaults
from gpt.config.settings import GPT3_WARMUP_STEPS


@pytest.mark.parametrize("value,expected", [
    ("9.0a", "9.0"),  # NVIDIA's PyTorch containers on Hopper
    ("10.0a", "10.0"),
    ("8.6+PTX", "8.6+PTX"),
    ("9.0a+PTX", "9.0+PTX"),
    ("8.0;9.0a", "8.0;9.0"),
    ("7.0 8.0 9.0a", "7.0;8.0;9.0"),
    ("12.0f", "12.0"),
])
def test_arch_suffixes_are_dropped_so_deepspeeds_op_builder_parses_the_list(value, expected, monkeypatch):
    assert hardware.normalize_cuda_arch_list(value) == expected
    builder = importlib.import_module("deepspeed.ops.op_builder.fused_adam").FusedAdamBuilder()  # the CUDA one
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", value)
    if value != expected:
        with pytest.raises(ValueError, match="invalid literal for int"):  # what crashed deepspeed.initialize
            builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", expected)
    flags = builder.compute_capability_args()
    assert flags and all(flag.startswith("-gencode=arch=compute_") for flag in flags)


def test_fix_cuda_arch_list_rewrites_keeps_or_unsets_with_one_line():
    environ = {"TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert hardware.fix_cuda_arch_list(environ) == "TORCH_CUDA_ARCH_LIST '9.0a' -> '9.0' for DeepSpeed's op builder"
    assert environ == {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert hardware.fix_cuda_arch_list(environ) is None and environ == {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert hardware.fix_cuda_arch_list({}) is None
    environ = {"TORCH_CUDA_ARCH_LIST": "Hopper"}
    assert hardware.fix_cuda_arch_list(environ) == (
        "TORCH_CUDA_ARCH_LIST='Hopper' is not a list of compute capabilities DeepSpeed can build for: "
        "unset, DeepSpeed builds for the GPUs it finds")
    assert environ == {}


@pytest.mark.parametrize("argv,device,expected", [
    ((), "cuda", True), ((), "cpu", False),
    (("--no-compile",), "cuda", False), (("--compile",), "cpu", True),
])
def test_compile_is_on_by_default_with_cuda_only(argv, device, expected):
    decided, notes = resolve_defaults(parse(list(argv)), device)
    assert decided["compile"] is expected
    assert notes == (["torch.compile on (the default with CUDA; --no-compile turns it off)"] if not argv and expected
                     else [])


def test_a_run_shorter_than_the_default_warmup_warms_up_for_a_tenth_of_it():
    decided, notes = resolve_defaults(parse(["--max_steps", "80"]), "cpu")
    assert notes == [
        f"--warmup_steps 8: --max_steps 80 is below the default warmup of {GPT3_WARMUP_STEPS}, "
        f"so the warmup is a tenth of the run"]
    assert decided["warmup_steps"] == 8
    decided, notes = resolve_defaults(parse(["--max_steps", "20000"]), "cpu")
    assert notes == [] and decided["warmup_steps"] == GPT3_WARMUP_STEPS
    decided, notes = resolve_defaults(parse(["--max_steps", "80", "--warmup_steps", "30"]), "cpu")
    assert notes == [] and decided["warmup_steps"] == 30  # an explicit value is kept


def test_make_deterministic_sets_the_cuda_switches(monkeypatch):
    import torch

    environ = {}
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    try:
        hardware.make_deterministic("cuda", environ)
        assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cudnn.benchmark is False
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cuda.enable_cudnn_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
