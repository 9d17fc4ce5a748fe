"""What the unit and the integration tests share, imported first (tests/conftest.py): DeepSpeed pinned to its CPU
accelerator before anything imports it, OpenMP threads that sleep while they wait, the repository's root, the small
vocabulary, and the one-rank process group of in-process DeepSpeed engines. Unit tests import from here; integration
tests from tests/integration/conftest.py, which imports this."""
import os
from pathlib import Path

os.environ["DS_ACCELERATOR"] = "cpu"  # before DeepSpeed is imported; runs started from the tests inherit it
# Before torch loads OpenMP: with the shared launch or the background lane beside the tests, 2 cores run more threads
# than they have, and OpenMP threads that spin while waiting took ~20% more CPU time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# What the tests' runs would otherwise inherit from whoever started pytest and then behave otherwise: a launcher's
# rank variables (pytest started inside a job), a thread count, glibc's malloc setting of bench/train.py's baseline.
for _variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "NODE_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "OMP_NUM_THREADS", "DSGPT_MALLOC_CACHE"):
    os.environ.pop(_variable, None)


def _children_start_with_default_signals():
    """A signal ignored in pytest (nohup ignores SIGHUP, a shell's `&` SIGINT) stays ignored in every process it
    starts, and a test that sends it then finds a run that never stopped. A handler that does nothing keeps pytest
    as immune, and exec resets a handled signal to its default: the tests' runs start as from a new shell."""
    import signal

    for number in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        if signal.getsignal(number) is signal.SIG_IGN:
            signal.signal(number, lambda *_: None)


_children_start_with_default_signals()

REPO = Path(__file__).resolve().parents[1]
# The tests' tiny runs (conftest.TINY, on small_vocab_dir): the tiny model's 50304-wide logits matmul is 97% of
# its FLOPs, and the logits and the loss were ~75% of a tiny step's time on CPU; CPUs without bf16 units emulate
# half-precision matmuls ~90x slower than fp32. With 512 ids it shrinks 100x.
SMALL_VOCAB = 512


def load_script(relative_path):
    """A script of bench/ or launch/ (folders of scripts, not packages) as a module, for its functions."""
    import importlib.util

    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def join_single_rank_group():
    """A one-rank gloo process group inside the test process, for in-process DeepSpeed engines and training
    runs: one for the whole session, since DeepSpeed caches the group it first saw (a second one is 'not
    registered'). Joined on first use."""
    import deepspeed
    import torch.distributed as dist

    from gpt.runtime.ranks import free_port

    os.environ["LOCAL_RANK"] = "0"  # DeepSpeed's engine reads it (a run in this process puts its environment back)
    if dist.is_initialized():
        return
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    deepspeed.init_distributed(dist_backend="gloo")
    for key, value in saved.items():  # only for joining: runs started later must not inherit RANK and the port
        if key != "LOCAL_RANK":
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
