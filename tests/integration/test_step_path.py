"""docs/architecture.md's "One step, file by file": the files a reader opens to follow a training step from train_ds.py
to the optimizer's update are the project's files on the call stack at each moment of a real run's first step."""
import sys
from dataclasses import replace
from pathlib import Path

import deepspeed
from deepspeed.runtime.engine import DeepSpeedEngine

import gpt
import train_ds
from conftest import TINY, train
from gpt.config.settings import Settings
from gpt.data.shards import ShuffledTokenLoader
from gpt.model import loss as losses
from gpt.runtime import ranks

ROOT = Path(gpt.__file__).resolve().parents[1]  # the checkout the tests import: gpt/ and train_ds.py
FLOOR = "gpt/runtime/"  # under every layer, read by its names (rank(), mean_over_ranks, ...), as gpt/console.py is
# The path, in the order a reader meets it: the command line, the settings, the trainer, the run's start, the engine
# (the model wrapped, DeepSpeed), the model, its loss, the data. At most 8: change it with the docs.
STEP_FILES = ["train_ds.py", "gpt/config/settings.py", "gpt/train/trainer.py", "gpt/train/start.py",
              "gpt/train/engine.py", "gpt/model/model.py", "gpt/model/loss.py", "gpt/data/shards.py"]


def project_files_on_the_stack(own_file=None):
    """The project's files (train_ds.py, gpt/) with a frame on this thread's stack now, and own_file: the file of
    the function about to be called."""
    files, frame = {own_file} - {None}, sys._getframe(1)
    while frame is not None:
        files.add(frame.f_code.co_filename)
        frame = frame.f_back
    paths = {Path(f).resolve() for f in files}
    return {path.relative_to(ROOT).as_posix() for path in paths
            if path == ROOT / "train_ds.py" or path.is_relative_to(ROOT / "gpt")}


def test_a_training_step_is_read_in_the_eight_files_the_docs_name(tmp_path, small_vocab_dir, monkeypatch):
    moments = {}  # moment -> the project's files on the stack when it first came

    def watched(moment, function, own_file=None):
        def call(*args, **kwargs):
            moments.setdefault(moment, project_files_on_the_stack(own_file))
            return function(*args, **kwargs)
        return call

    def watched_kernel(*args):
        kernel = kernel_for(*args)
        return replace(kernel, function=watched("the loss computed", kernel.function,
                                                sys.modules[kernel.function.__module__].__file__))

    kernel_for = losses.kernel_for
    monkeypatch.setattr(losses, "kernel_for", watched_kernel)
    monkeypatch.setattr(Settings, "from_flags", classmethod(watched("the flags read", Settings.from_flags.__func__,
                                                                    sys.modules[Settings.__module__].__file__)))
    monkeypatch.setattr(ranks, "setup_distributed", watched("the process group joined", ranks.setup_distributed))
    monkeypatch.setattr(deepspeed, "initialize", watched("the engine built", deepspeed.initialize))
    shards_file = sys.modules[ShuffledTokenLoader.__module__].__file__
    monkeypatch.setattr(ShuffledTokenLoader, "next_batch", watched("a batch drawn", ShuffledTokenLoader.next_batch,
                                                                   shards_file))
    monkeypatch.setattr(DeepSpeedEngine, "step", watched("the optimizer stepped", DeepSpeedEngine.step))

    train(tmp_path, small_vocab_dir, *TINY, "--warmup_steps", "1", "--max_steps", "1", "--total_batch_tokens", "256")
    assert sorted(moments) == sorted(["the flags read", "the process group joined", "the engine built", "a batch drawn",
                                      "the loss computed", "the optimizer stepped"])
    files = set().union(*moments.values())
    assert {f for f in files if not f.startswith(FLOOR)} == set(STEP_FILES), moments
    assert len(STEP_FILES) <= 8 and Path(train_ds.__file__).resolve() == ROOT / "train_ds.py"
