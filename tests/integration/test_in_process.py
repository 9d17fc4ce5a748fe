"""The in-process harness (tests/integration/in_process.py) with whatever handlers pytest or anyone else attaches to
DeepSpeed's logger: DeepSpeed's console lines land in the run's stderr, every other handler keeps its target,
and all are as they were afterwards; what malloc kept of a run's freed memory is handed back when it ends."""
import io
import logging
import sys

import torch

from deepspeed.utils import logger as deepspeed_logger

from gpt.runtime.host import keep_freed_memory_in_heap
from in_process import run_main


class Capturing(logging.StreamHandler):
    """Like pytest's LogCaptureHandler: a StreamHandler subclass with a stream of its own."""


def test_a_run_sends_deepspeeds_console_lines_to_its_stderr_and_leaves_other_handlers_alone():
    others = [logging.NullHandler(), Capturing(io.StringIO())]  # a NullHandler has no stream at all
    before = {handler: getattr(handler, "stream", None) for handler in deepspeed_logger.handlers}
    for handler in others:
        deepspeed_logger.addHandler(handler)
    try:
        def main(argv):
            deepspeed_logger.warning("from DeepSpeed's logger")
            print("to stdout", argv)
            sys.exit(3)

        code, out, err = run_main(["--flag"], main=main)
    finally:
        for handler in others:
            deepspeed_logger.removeHandler(handler)
    assert (code, out) == (3, "to stdout ['--flag']\n")
    assert "from DeepSpeed's logger" in err
    assert "from DeepSpeed's logger" in others[1].stream.getvalue()  # still its own target, not err
    assert {handler: getattr(handler, "stream", None) for handler in deepspeed_logger.handlers} == before


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_what_a_run_kept_of_its_freed_memory_is_handed_back_when_it_ends():
    def main(argv):
        keep_freed_memory_in_heap()  # what setup_distributed does in a CPU run
        block = torch.ones(64 * 2**20)  # 256 MiB, kept in the heap once freed
        del block
        assert resident_bytes() - before > 200 * 2**20

    before = resident_bytes()
    assert run_main([], main=main)[0] == 0
    assert resident_bytes() - before < 16 * 2**20  # the run's free memory handed back


def test_a_compiled_run_compiles_for_its_own_shapes_as_in_a_process_of_its_own():
    """torch.compile's state outlives a run in this process: a later run then traced shapes for the earlier ones too and
    recompiled with a dynamic dimension that a run of its own never has (and no cache shares). Each run starts with
    none, as a new process does. (Dynamo alone, no kernels: the eager backend.)"""
    from torch._dynamo.testing import EagerAndRecordGraphs

    graphs = EagerAndRecordGraphs()

    @torch.compile(backend=graphs)
    def double(x):
        return x * 2

    def main(argv):
        double(torch.ones(int(argv[0])))

    for size in ("2", "3"):
        assert run_main([size], main=main)[0] == 0
    inputs = [[getattr(value, "shape", value) for value in (node.meta["example_value"] for node in graph.graph.nodes
                                                             if node.op == "placeholder")] for graph in graphs.graphs]
    assert inputs == [[torch.Size([2])], [torch.Size([3])]]  # static: no symbolic size as an input of its own
