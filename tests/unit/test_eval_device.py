"""gpt-eval and gpt-sample --device: auto is cuda when torch sees a GPU, else cpu; a CUDA GPU with bf16 units
evaluates in bf16 autocast, the CPU in fp32. (On a checkpoint and in a plain shell:
tests/integration/test_eval_device_runs.py.)"""
import contextlib
import warnings

import pytest
import torch

from gpt.train import hf

CPU = torch.device("cpu")


@pytest.mark.parametrize("name, cuda_available, expected", [
    ("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cuda", True, "cuda")])
def test_device_choice(monkeypatch, name, cuda_available, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    assert hf.choose_device(name) == torch.device(expected)


@pytest.mark.parametrize("device, bf16_units, expected", [
    ("cpu", True, "fp32"), ("cuda", True, "bf16"), ("cuda", False, "fp32")])  # False: a V100, bf16 emulated
def test_precision_choice(monkeypatch, device, bf16_units, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: bf16_units or including_emulation)
    with warnings.catch_warnings():  # building a CUDA autocast without CUDA warns (and disables it)
        warnings.simplefilter("ignore")
        precision, context = hf.evaluation_precision(torch.device(device))
    assert precision == expected
    if expected == "bf16":
        assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
    else:
        assert isinstance(context, contextlib.nullcontext)
