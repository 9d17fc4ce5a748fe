"""The performance features that tests can check without timing anything: the --profile trace, the CPU
allocator setting and the exit without a collection of garbage (bench/train.py measures what they are worth; a step's clock: tests/unit/test_performance.py)."""
import json
import subprocess
import sys

import pytest

from conftest import REPO, TINY, out_dir_of, succeeded, two_rank_run


@pytest.mark.two_rank_runs({"profile": two_rank_run("--data", "{small_vocab_dir}", *TINY, "--max_steps", "4",
                                                     "--total_batch_tokens", "1024", "--profile", "2")})
def test_profile_writes_a_trace_per_rank_for_tensorboard(two_rank_runs):
    _, proc = succeeded(two_rank_runs["profile"])
    out_dir = out_dir_of(proc)
    for rank in (0, 1):
        (trace,) = (out_dir / "profile").glob(f"rank{rank}.*.pt.trace.json")
        events = json.loads(trace.read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        # step 0 skipped, step 1 warm-up, steps 2 and 3 recorded
        assert sorted(n for n in names if str(n).startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
        assert {"aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu"} <= names


RESIDENT_AFTER_FREE = """
import torch
from gpt.runtime.host import keep_freed_memory_in_heap
if {keep}:
    keep_freed_memory_in_heap()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
before = rss()
block = torch.ones(64 * 2**20)  # 256 MiB: glibc would mmap it
del block
print(rss() - before)
"""


@pytest.mark.slow
def test_cpu_allocator_keeps_freed_blocks_for_the_next_step():
    def resident_after_free(keep):
        code = RESIDENT_AFTER_FREE.format(keep=keep)
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True).stdout
        return int(out.split()[-1])  # the last line (DeepSpeed may print to stdout first)
    assert resident_after_free(keep=True) > 200 * 2**20  # kept: the next step reuses it without page faults
    assert resident_after_free(keep=False) < 16 * 2**20  # glibc's default: unmapped, faulted in again next time


def test_a_commands_process_skips_the_collection_of_garbage_at_exit():
    """Importing gpt.commands (every command and train_ds.py do) freezes the objects at exit, so that the
    interpreter's teardown does not walk them (~1.5 s of CPU in every process: gpt.runtime.host)."""
    code = "import atexit, gc, gpt.commands; atexit._run_exitfuncs(); print(gc.get_freeze_count() > 0)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True).stdout
    assert out.splitlines()[-1] == "True"
