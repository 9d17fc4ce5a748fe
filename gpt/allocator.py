"""The CUDA caching allocator's setting (PYTORCH_CUDA_ALLOC_CONF): the trainer's default of expandable
segments, gpt-plan --measure --allocator's choice, and reading which one a run has or will have. It decides
how much of the device the planned bytes can use; set it before CUDA's allocator starts."""
import os

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def use_expandable_segments(environ=os.environ):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the user set the variable: measured on an
    H100 with d12, the allocator then reserved ~1% above what it allocated instead of ~20%, and the
    largest micro-batch grew from 64 to 76. Call before CUDA's allocator starts. Returns the log line."""
    for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF"):  # the second: its name since PyTorch 2.9
        if name in environ:
            return f"{name}={environ[name]} (yours, kept)"
    environ[ALLOC_CONF] = EXPANDABLE_SEGMENTS
    return f"{ALLOC_CONF}={EXPANDABLE_SEGMENTS} (the trainer's default on CUDA: set the variable to choose otherwise)"


def set_allocator(expandable, environ=os.environ):
    """Choose the CUDA allocator's expandable segments on or off, whatever the environment said (gpt-plan
    --measure --allocator). Call before CUDA's allocator starts."""
    environ.pop("PYTORCH_ALLOC_CONF", None)
    environ[ALLOC_CONF] = f"expandable_segments:{expandable}"


def expandable_segments(environ=os.environ):
    """Whether the CUDA allocator runs (or will run) with expandable segments."""
    settings = ",".join(environ.get(name, "") for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF")).replace(" ", "")
    return "expandable_segments:true" in settings.lower()


def trainer_uses_expandable_segments(environ=os.environ):
    """Whether the trainer will run with expandable segments: its default, unless the variable is set."""
    return not {ALLOC_CONF, "PYTORCH_ALLOC_CONF"} & environ.keys() or expandable_segments(environ)
