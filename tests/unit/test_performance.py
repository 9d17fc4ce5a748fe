"""A step's clock on an asynchronous device (the --profile trace and the CPU allocator setting:
tests/integration/test_performance_runs.py)."""
from gpt.train import dist


def test_a_steps_clock_stops_after_the_device_finished_its_work(monkeypatch):
    """A GPU runs kernels asynchronously and the trainer's one host sync comes before its last backward and
    optimizer step: the clock is read only after the device synchronized, and the work queued before the step
    is finished before the clock starts (here the device is an event log)."""
    events = []

    class Accelerator:
        def synchronize(self):
            events.append("synchronize")
    monkeypatch.setattr(dist, "get_accelerator", Accelerator)
    monkeypatch.setattr(dist.time, "perf_counter", lambda: events.append("clock") or float(len(events)))
    result, seconds = dist.timed_on_device(lambda: events.append("step") or "loss")
    assert result == "loss" and events == ["synchronize", "clock", "step", "synchronize", "clock"]
    assert seconds == 5.0 - 2.0
