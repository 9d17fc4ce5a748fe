"""DeepSpeed's own export tool on our checkpoints (docs/evaluation.md): the zero_to_fp32.py that DeepSpeed saves beside
them writes our fp32 master weights, which gpt-export writes in transformers' layout bit for bit; with
--safe_serialization it fails on the tied embedding and output weights and writes nothing. Each test runs the script
as a user would, in a process of its own (~3 s)."""
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from gpt.train.hf import export, to_hf
from gpt.model.model import PRESETS

pytestmark = pytest.mark.slow  # launches processes


def zero_to_fp32(checkpoints, out_dir, *flags):
    script = checkpoints / "zero_to_fp32.py"  # DeepSpeed's copy of deepspeed/utils/zero_to_fp32.py
    return subprocess.run([sys.executable, str(script), str(checkpoints), str(out_dir), *flags], capture_output=True,
                          text=True, timeout=300)


def test_zero_to_fp32_writes_the_exported_weights_bit_for_bit(trained_checkpoint, tmp_path):
    proc = zero_to_fp32(trained_checkpoint, tmp_path / "fp32")
    assert proc.returncode == 0, proc.stderr
    state = torch.load(tmp_path / "fp32" / "pytorch_model.bin", map_location="cpu", weights_only=True)
    tiny = PRESETS["tiny"]
    # our names and layout: the padded vocabulary, the output weight tied to the embedding
    assert state["transformer.wte.weight"].shape == (tiny.vocab_size, tiny.n_embd)
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    export(trained_checkpoint, tmp_path / "hf")
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    converted = to_hf(state)  # what gpt-export does to our state dict: Conv1D layout, padding and lm_head dropped
    assert converted.keys() == exported.keys()
    for name, tensor in exported.items():
        assert converted[name].dtype == tensor.dtype == torch.float32 and torch.equal(converted[name], tensor), name


def test_safe_serialization_fails_on_the_tied_weights(trained_checkpoint, tmp_path):
    proc = zero_to_fp32(trained_checkpoint, tmp_path / "fp32", "--safe_serialization")
    assert proc.returncode == 1
    assert "Some tensors share memory" in proc.stderr, proc.stderr
    assert "'lm_head.weight'" in proc.stderr and "'transformer.wte.weight'" in proc.stderr
    assert not any((tmp_path / "fp32").iterdir())
