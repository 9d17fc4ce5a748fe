"""A stored loss curve: the tiny model, fixed seed, CPU fp32, 20 steps, compared step by step, so that a
numerical change (model, data order, optimizer, schedule, a DeepSpeed or PyTorch upgrade) cannot land
silently. After an intended change, regenerate it and say why in the commit:

    python tests/integration/test_loss_curve.py --update
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script (--update): tests/ on the path, as pytest puts it, for common.py
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from conftest import GPT2_VOCAB, REPO, TINY, train, train_losses, write_ds_config  # noqa: E402

STORED = REPO / "tests" / "data" / "loss_curve_tiny_fp32.json"
ARGS = [*TINY, *GPT2_VOCAB, "--max_steps", "20", "--total_batch_tokens", "512", "--lr", "1e-3"]  # GPT-2 tokens
# Other CPUs round differently: running with AVX2 or SSE4.2 kernels instead of AVX-512 (ATEN_CPU_CAPABILITY,
# MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA) moved the 20 losses by at most 1.9e-7 relative; a real change
# moves them by far more (a 1% higher learning rate: 8.7e-4).
RELATIVE_TOLERANCE = 1e-5


def loss_curve(tmp_path, data_dir):
    config = write_ds_config(Path(tmp_path) / "zero1_fp32.json", precision="fp32")
    records, _ = train(Path(tmp_path) / "run", data_dir, *ARGS, "--ds_config", config)
    return train_losses(records)


@pytest.mark.slow
def test_loss_curve_matches_the_stored_one(tmp_path, shakespeare_dir):
    stored = json.loads(STORED.read_text())
    assert stored["args"] == ARGS, "the run's settings changed: regenerate with --update"
    losses = loss_curve(tmp_path, shakespeare_dir)
    assert len(losses) == len(stored["losses"]) == 20
    for step, (got, want) in enumerate(zip(losses, stored["losses"])):
        assert abs(got - want) <= RELATIVE_TOLERANCE * want, f"step {step}: loss {got} vs stored {want}"


def main():
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(__doc__)
    import deepspeed
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shakespeare"
        subprocess.run([sys.executable, "-m", "gpt.commands.prepare", "shakespeare", "--out_dir", str(data)], cwd=REPO, check=True)
        losses = loss_curve(tmp, data)
    STORED.parent.mkdir(exist_ok=True)
    STORED.write_text(json.dumps({"args": ARGS, "torch": torch.__version__, "deepspeed": deepspeed.__version__,
                                  "losses": losses}, indent=1) + "\n")
    print(f"wrote {STORED}: {losses}")


if __name__ == "__main__":
    main()
