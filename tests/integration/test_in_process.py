"""The in-process harness (tests/integration/in_process.py) with whatever handlers pytest or anyone else attaches to
DeepSpeed's logger: DeepSpeed's console lines land in the run's stderr, every other handler keeps its target,
and all are as they were afterwards."""
import io
import logging
import sys

from deepspeed.utils import logger as deepspeed_logger

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
