"""train_ds.py's main() (or a test script's) inside a running process, as `python train_ds.py ARGV` would run
it: conftest's train() runs one-rank runs in the test process this way, and two_rank_runs.py runs many
2-rank runs in one launch. A launch costs seconds before its first step (importing torch and DeepSpeed,
loading its ops, torch._dynamo's import when the optimizer is built); a tiny run in a warm process, a fraction."""
import contextlib
import gc
import io
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

import torch

import train_ds  # first: gpt.runtime.accelerator imports DeepSpeed so that its logger writes to stderr
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import logger as deepspeed_logger

from gpt.runtime.host import unmap_freed_memory

REPO = Path(__file__).resolve().parents[2]


def run_main(argv, main=train_ds.main):
    """(exit status, stdout, stderr) of main(argv), train_ds.py's by default: SystemExit's code, or 1 and the
    traceback on stderr for an uncaught exception; stderr holds DeepSpeed's logger too. The process group is the one this
    process has joined (a run joins one if there is none). What a run changes in the process is put back:
    the environment, the working directory (the repository during the run, as the tests launch it), signal
    handlers, torch's thread count and deterministic mode, the CPU accelerator's fp16 switch (--cpu_fp16).
    malloc keeps freed memory for the run's next step, as in a run's own process (gpt.runtime.host: 3.9 -> 2.45 s for a
    tiny 6-step run, the kernel's page faults 2.1 -> 0.1 s), and hands it back when the run ends (held, this process's RSS
    would stay at the largest run's peak). The heap keeps the holes, unmapped: a later block may be served from one and
    stay resident once freed, so a test that measures RSS maps its memory itself (tests/unit/test_memory.py)."""
    accelerator = get_accelerator()
    environ, cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    fp16_switch = vars(accelerator).get("is_fp16_supported")
    # DeepSpeed's console handler holds the stderr of the moment it was built: point it at err for the run. Only
    # plain StreamHandlers, what loggers are built with for a console: subclasses keep their own targets (pytest
    # >= 9.2 attaches its capturing handlers, and a NullHandler with no stream, to DeepSpeed's logger too).
    log_streams = {handler: handler.stream for handler in deepspeed_logger.handlers
                   if type(handler) is logging.StreamHandler}
    out, err = io.StringIO(), io.StringIO()
    code = 0
    if "torch._dynamo" in sys.modules:
        # A fresh process has compiled nothing: without this a compiled run traced shapes for the earlier runs' too
        # (another micro-batch, sampling's lengths), recompiled with dynamic dimensions no run of its own has, and
        # compiled them again; static, its graphs are those of any run of the same shapes (inductor's caches).
        torch._dynamo.reset()
    try:
        os.chdir(REPO)
        for handler in log_streams:
            handler.setStream(err)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as e:  # as the interpreter exits: an int is the status, a message is printed, status 1
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    code = 1
            except Exception:  # as an uncaught exception ends a process: status 1, the traceback on stderr
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if fp16_switch is None:
            vars(accelerator).pop("is_fp16_supported", None)
        else:
            accelerator.is_fp16_supported = fp16_switch
        for handler, stream in log_streams.items():
            handler.setStream(stream)
        gc.collect()  # the run's engine and its buffers, before the next run (and then malloc's free memory)
        # What survives a run lives as long as the session: frozen, no later collection walks it again. A full
        # collection walked ~700k objects, 0.3 s, in every run's end and every probe's engine release: 33 s in
        # four files' 254, 0.4 s with this.
        gc.freeze()
        unmap_freed_memory()
    return code, out.getvalue(), err.getvalue()
