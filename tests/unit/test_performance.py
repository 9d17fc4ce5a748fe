"""A step's clock on an asynchronous device (the --profile trace and the CPU allocator setting:
tests/integration/test_performance_runs.py), and a rank's start-up."""
import torch

from gpt.runtime import accelerator, ranks


def test_a_steps_clock_stops_after_the_device_finished_its_work(monkeypatch):
    """A GPU runs kernels asynchronously and the trainer's one host sync comes before its last backward and
    optimizer step: the clock is read only after the device synchronized, and the work queued before the step
    is finished before the clock starts (here the device is an event log)."""
    events = []

    class Accelerator:
        def synchronize(self):
            events.append("synchronize")
    monkeypatch.setattr(ranks, "get_accelerator", Accelerator)
    monkeypatch.setattr(ranks.time, "perf_counter", lambda: events.append("clock") or float(len(events)))
    result, seconds = ranks.timed_on_device(lambda: events.append("step") or "loss")
    assert result == "loss" and events == ["synchronize", "clock", "step", "synchronize", "clock"]
    assert seconds == 5.0 - 2.0


def test_a_zero_engines_start_up_compiles_nothing_of_deepspeeds_muon():
    """DeepSpeed imports its Muon optimizer while it builds a ZeRO engine; the module's @torch.compile decorators
    would import Inductor (~1.3 CPU-s of each rank's start on a 2-core EPYC). gpt.runtime.accelerator imported it first
    with torch.compile a no-op: the function is DeepSpeed's own, and torch.compile is torch's again."""
    from deepspeed.runtime.zero.muon import original_muon

    assert original_muon.zeropower_via_newtonschulz5.__code__.co_filename == original_muon.__file__
    assert torch.compile.__module__ == "torch" and accelerator.torch.compile is torch.compile
