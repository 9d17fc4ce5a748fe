"""bench/levers.py's accounting of where a step's time goes, on hand-made profiler events (its runs: the CPU twin in
tests/integration/test_bench_runs.py, a GPU's in launch/gpu_check.sh's part speed)."""
import sys

import pytest

from common import REPO, load_script


@pytest.fixture
def levers(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # its harness is bench/harness.py, imported as a script's sibling
    monkeypatch.delitem(sys.modules, "harness", raising=False)
    return load_script("bench/levers.py")


def kernel(name, ts, dur, cat="kernel"):
    return dict(cat=cat, name=name, ts=ts, dur=dur, pid=0, tid=7)


def test_device_time_is_summed_by_kind_and_idle_is_the_wall_left_uncovered(levers):
    """Kernels of H200 names land in their kind; overlapping kernels (two streams) are busy once; the idle time is
    the step's wall time that no kernel covers; .item() and synchronizations are counted on the host side."""
    events = [
        kernel("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN", 0, 4000),
        kernel("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", 3000, 2000),  # overlaps 1 ms
        kernel("triton_red_fused__to_copy_exp_fill_lift_fresh_logsumexp_slice_sub_unsqueeze_0", 6000, 1000),
        kernel("triton_poi_fused_gelu_view_2", 7000, 500),
        kernel("multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", 8000, 100),
        kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 8100, 400),
        kernel("Memcpy HtoD (Pageable -> Device)", 8500, 500, cat="gpu_memcpy"),
        dict(cat="cpu_op", name="aten::_local_scalar_dense", ts=0, dur=1, pid=0, tid=1),
        dict(cat="cuda_runtime", name="cudaStreamSynchronize", ts=0, dur=1, pid=0, tid=1),
    ]
    profile = levers.summarize(events, wall_s=0.010)
    assert profile["by_kind"] == {"matmul": 4.0, "attention": 2.0, "loss": 1.0, "copies": 0.5,
                                  "other compiled": 0.5, "eager elementwise": 0.4, "optimizer": 0.1}
    assert profile["busy_ms"] == pytest.approx(7.5)  # 0-5, 6-7.5 and 8-9 ms
    assert profile["idle_ms"] == pytest.approx(2.5)
    assert profile["host_syncs"] == {"item": 1, "synchronize": 1}
    assert profile["top_kernels"][0] == ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN", 4.0)


def test_on_cpu_only_the_outermost_aten_ops_count(levers):
    """Without device kernels the host's aten ops are the work: a nested op (aten::mm inside aten::matmul) is not
    counted twice, and ops on other threads are kept."""
    events = [dict(cat="cpu_op", name="aten::matmul", ts=0, dur=3000, pid=0, tid=1),
              dict(cat="cpu_op", name="aten::mm", ts=100, dur=2800, pid=0, tid=1),
              dict(cat="cpu_op", name="aten::logsumexp", ts=3000, dur=1000, pid=0, tid=1),
              dict(cat="cpu_op", name="aten::add_", ts=500, dur=500, pid=0, tid=2)]
    profile = levers.summarize(events, wall_s=0.005)
    assert profile["by_kind"] == {"matmul": 3.0, "loss": 1.0, "eager elementwise": 0.5}
    assert profile["busy_ms"] == pytest.approx(4.0)


def test_levers_are_named_once_and_the_budget_keeps_time_for_the_default_again(levers):
    size = levers.SIZES["gpu"]
    names = [lever.name for lever in levers.levers(size)]
    assert len(names) == len(set(names)) and "default" not in names
    tuning = [lever for lever in levers.levers(size) if lever.tunes]
    assert names[-len(tuning):] == [lever.name for lever in tuning]  # the minutes-long compiles come last
    assert levers.row_cost(tuning[0], compile=True) > levers.row_cost(levers.levers(size)[0], compile=True)
