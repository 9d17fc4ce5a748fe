"""--profile STEPS: a torch profiler trace of a few training steps, for TensorBoard's profiler view.

Each rank writes {out_dir}/profile/rank{N}.*.pt.trace.json (Chrome trace format): open it with
`tensorboard --logdir {out_dir}/profile` (needs the torch-tb-profiler plugin) or drag it into
https://ui.perfetto.dev.
"""
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WAIT_STEPS = 1  # the first step pays one-off costs (allocator warm-up, compilation): not representative


class NoProfiler:
    def step(self):
        pass

    def stop(self):
        pass


def step_profiler(steps, out_dir, device_type, rank):
    """A started profiler that records `steps` steps after one skipped and one warm-up step; call
    .step() after every training step and .stop() at the end. steps 0: a profiler that does nothing."""
    if not steps:
        return NoProfiler()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    profiler = profile(activities=activities, schedule=schedule(wait=WAIT_STEPS, warmup=1, active=steps, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(str(Path(out_dir) / "profile"), worker_name=f"rank{rank}"),
                       record_shapes=True, profile_memory=True, with_stack=False)
    profiler.start()
    return profiler


def profiled_steps_needed(steps):
    """Training steps a --profile STEPS run needs for a complete trace."""
    return WAIT_STEPS + 1 + steps if steps else 0

