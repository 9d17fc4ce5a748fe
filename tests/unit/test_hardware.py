"""What a run adapts to the machine and the run: the one bf16 decision on CPU (from the flags the CPU declares,
measured only where none can be read), TORCH_CUDA_ARCH_LIST for DeepSpeed's op builder, the defaults for --compile
and the warmup, deterministic mode's CUDA switches. (The CPU precision in new processes, runs and py-cpuinfo:
tests/integration/test_hardware_runs.py.)"""
import importlib

import pytest

from gpt.config import hardware
from train_ds import parse
from gpt.train.start import resolve_defaults
from gpt.config.settings import GPT3_WARMUP_STEPS


CASCADE_LAKE = {"sse2", "avx2", "avx512f", "avx512bw", "avx512_vnni"}  # AVX-512 without bf16 units
SAPPHIRE_RAPIDS = CASCADE_LAKE | {"avx512_bf16", "amx_tile", "amx_bf16"}
EPYC_AVX2 = {"sse2", "avx2"}
GRAVITON3 = {"fp", "asimd", "bf16", "sve", "svebf16"}


@pytest.fixture
def bf16_decision(monkeypatch):
    """cpu_bf16_units on a simulated CPU: decide(flags, slowdown) -> (fast, why), the answer cached afresh each call."""
    def decide(flags, slowdown, onednn_cap=None):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
        monkeypatch.setattr(hardware, "cpu_bf16_slowdown", lambda: slowdown)
        if onednn_cap:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_cap)
        else:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
            monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        hardware.cpu_bf16_units.cache_clear()
        return hardware.cpu_bf16_units()
    yield decide
    hardware.cpu_bf16_units.cache_clear()


# a measured ratio either side of the old threshold (4.0) and of the dead band: the declared flags decide alone
@pytest.mark.parametrize("slowdown", [0.3, 1.2, 2.86, 4.48, 90.0])
@pytest.mark.parametrize("flags,fast", [(CASCADE_LAKE, False), (EPYC_AVX2, False), (SAPPHIRE_RAPIDS, True),
                                        (GRAVITON3, True), (CASCADE_LAKE | {"avx512_bf16"}, True)])
def test_the_declared_flags_decide_bf16_whatever_a_measurement_says(bf16_decision, flags, fast, slowdown):
    decided, why = bf16_decision(flags, slowdown)
    assert decided is fast
    assert why.startswith("the CPU declares")
    assert "measured" not in why


def test_onednn_capped_below_bf16_means_no_bf16_units_even_on_amx(bf16_decision):
    assert bf16_decision(SAPPHIRE_RAPIDS, 0.3, onednn_cap="AVX2") == (
        False, "ONEDNN_MAX_CPU_ISA=AVX2 leaves oneDNN no bf16 instructions")
    assert bf16_decision(SAPPHIRE_RAPIDS, 0.3, onednn_cap="AVX512_CORE_AMX")[0] is True  # a cap above bf16: no effect


@pytest.mark.parametrize("flags", [None, EPYC_AVX2 | {"avx_ne_convert"}])  # nothing readable; bf16 conversions alone
@pytest.mark.parametrize("slowdown,fast", [(0.3, True), (1.0, True), (1.5, True), (1.6, False), (2.86, False),
                                           (4.48, False), (90.0, False)])
def test_where_nothing_is_declared_a_measurement_decides_with_the_band_on_the_fp32_side(bf16_decision, flags,
                                                                                          slowdown, fast):
    decided, why = bf16_decision(flags, slowdown)
    assert decided is fast
    assert f"a bf16 matmul took {slowdown:.2f}x the time of fp32 here (measured; bf16 at most 1.5x)" in why


def test_the_flags_are_read_from_proc_cpuinfo_where_torch_has_no_query(tmp_path, monkeypatch):
    monkeypatch.delattr(hardware.torch.cpu, "get_capabilities", raising=False)
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 svebf16\n")
    assert {"avx2", "avx512_bf16"} <= hardware.cpu_flags(str(x86))
    assert "svebf16" in hardware.cpu_flags(str(arm))
    nothing = tmp_path / "nothing"
    nothing.write_text("processor\t: 0\nmodel name\t: something\n")
    assert hardware.cpu_flags(str(nothing)) is None and hardware.cpu_flags(str(tmp_path / "absent")) is None


def test_the_trainer_warning_names_why_and_the_config_to_use(bf16_decision):
    bf16_decision(CASCADE_LAKE, 2.86)
    assert hardware.cpu_bf16_warning() == (
        "warning: this CPU has no bf16 units: the CPU declares no amx_bf16, avx512_bf16 or Arm bf16 flag; bf16 "
        "matmuls are emulated, several to ~100x slower than fp32, so this run will be many times slower than in fp32; "
        "use ds_configs/zero2_fp32.json")
    assert hardware.cpu_ds_config() == "ds_configs/zero2_fp32.json"
    bf16_decision(SAPPHIRE_RAPIDS, 90.0)
    assert hardware.cpu_bf16_warning() is None and hardware.cpu_ds_config() == "ds_configs/zero2_bf16.json"


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


@pytest.mark.parametrize("rates, seconds, sizes", [
    ({256: 50, 512: 100, 1024: 105, 2048: 300}, 0.01, [256, 512, 1024]),  # 1024 gained under 10%: 2048 not tried
    ({256: 50, 512: 100, 1024: 200, 2048: 300}, 0.01, [256, 512, 1024, 2048]),  # each doubling gained: up to the cap
    ({256: 50, 512: 100, 1024: 200, 2048: 300}, 0.2, [256]),  # 8x 0.2 s would pass the 1 s budget (emulated bf16)
])
def test_the_matmul_peak_doubles_the_size_while_it_gains_and_fits_the_budget(monkeypatch, rates, seconds, sizes):
    asked = []

    def fake_matmul_flops(size, dtype, generator, repeats):
        asked.append(size)
        return rates[size], seconds
    monkeypatch.setattr(hardware, "matmul_flops", fake_matmul_flops)
    peak = hardware.measure_cpu_peak_flops.__wrapped__(hardware.torch.float32)
    assert asked == sizes and peak == max(rates[size] for size in sizes)



@pytest.mark.parametrize("flags, has_units, dtype, expected", [
    (SAPPHIRE_RAPIDS, True, "bf16", ("amx_bf16", 1024)), (SAPPHIRE_RAPIDS, True, "fp32", ("avx512f", 64)),
    (SAPPHIRE_RAPIDS, True, "fp16", ("avx512f", 64)),  # no AMX-FP16, no AVX512-FP16: fp32's units
    (CASCADE_LAKE, False, "bf16", ("avx512f", 64)),  # bf16 emulated: the fp32 units do the matmuls
    (SAPPHIRE_RAPIDS, False, "bf16", ("avx512f", 64)),  # oneDNN capped below bf16 (ONEDNN_MAX_CPU_ISA)
    (EPYC_AVX2, False, "bf16", ("fma", 32)), (GRAVITON3, True, "bf16", ("bf16", 128)),
    (GRAVITON3, True, "fp32", ("asimd", 32)), ({"sse2"}, False, "fp32", ("sse2", 8)), ({"lm"}, False, "fp32", None)])
def test_the_flops_per_cycle_are_those_of_the_units_that_do_the_matmuls(monkeypatch, flags, has_units, dtype,
                                                                        expected):
    monkeypatch.setattr(hardware, "cpu_bf16_units", lambda: (has_units, "given"))
    assert hardware.cpu_flops_per_cycle(dtype, flags) == expected


def test_the_cpu_peak_is_what_the_cpu_declares_never_a_timing(monkeypatch, bf16_decision):
    """A measured peak read MFU 0.47 and 0.29 at one speed beside a busy neighbour, and above 1 for bf16 emulated in
    fp32: the peak is cores x clock x FLOPs per cycle, the same in every run on the machine."""
    def timed(*args):
        raise AssertionError("the peak was timed")
    monkeypatch.setattr(hardware, "matmul_flops", timed)
    monkeypatch.setattr(hardware, "cpu_clock_hz", lambda: 2.5e9)
    bf16_decision(CASCADE_LAKE, slowdown=90.0)
    assert hardware.cpu_peak_flops("bf16", 4) == (
        4 * 2.5e9 * 64, "cpu peak (bf16): 4 core(s) x 2.50 GHz x 64 FLOP/cycle (avx512f)")
    monkeypatch.setattr(hardware, "cpu_clock_hz", lambda: None)
    assert hardware.cpu_peak_flops("fp32", 4) == (None, "nothing (this CPU declares no clock)")


def test_the_clock_is_cpufreqs_highest_else_the_model_names_else_the_reported_one(tmp_path):
    cpufreq, cpuinfo = tmp_path / "cpuinfo_max_freq", tmp_path / "cpuinfo"
    cpufreq.write_text("3700000\n")
    cpuinfo.write_text("model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\ncpu MHz\t\t: 1000.0\n"
                       "cpu MHz\t\t: 3100.5\n")
    clock = hardware.cpu_clock_hz.__wrapped__
    assert clock(str(cpuinfo), str(cpufreq)) == 3.7e9
    assert clock(str(cpuinfo), str(tmp_path / "absent")) == 2.4e9
    cpuinfo.write_text("model name\t: AMD EPYC\ncpu MHz\t\t: 1000.0\ncpu MHz\t\t: 2596.154\n")
    assert clock(str(cpuinfo), str(tmp_path / "absent")) == pytest.approx(2.596154e9)
    assert clock(str(tmp_path / "absent"), str(tmp_path / "absent")) is None
