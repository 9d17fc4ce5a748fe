"""The user-facing commands in the environment of a new shell: without the DS_ACCELERATOR=cpu that the suite pins
(tests/common.py), DeepSpeed detects the device itself and logs, and the trainer runs in a process of its own, not
in the suite's in-process harness. Each command works, and its stdout holds only its own lines: DeepSpeed's logs
and prints go to stderr. gpt-plan and gpt-eval: tests/integration/test_plan_runs.py, test_eval_device_runs.py."""
import re
import subprocess
import sys

import pytest

from common import SMALL_VOCAB
from conftest import REPO, plain_shell_env, read_metrics

# what DeepSpeed writes when it reaches stdout: its logger's lines and its ops' bare prints
DEEPSPEED_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[[A-Z]+\]|^DeepSpeed ")


def run(*argv):
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=plain_shell_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not [line for line in proc.stdout.splitlines() if DEEPSPEED_LINE.match(line)], proc.stdout
    return proc


@pytest.mark.slow
def test_train_then_sample_and_export_in_a_plain_shell(tmp_path, small_vocab_dir, trained_checkpoint):
    """train_ds.py with the default DeepSpeed config (zero1_bf16), in the tests' 512-id vocabulary (bf16 is emulated
    on a CPU without bf16 units: GPT-2's logits cost seconds a step there); gpt-sample and gpt-export on the session's
    trained checkpoint (GPT-2's vocabulary, which they need; a bf16 checkpoint's weights for them:
    test_universal.py). Over 15 s on a 2-core AVX2 EPYC: three processes, each importing torch and DeepSpeed."""
    out = tmp_path / "run"
    proc = run("train_ds.py", "--model", "tiny", "--seq_len", "64", "--micro_batch", "2", "--total_batch_tokens",
               "256", "--max_steps", "2", "--data", str(small_vocab_dir), "--out_dir", str(out), "--val_every", "1",
               "--val_tokens", "256", "--sample_every", "2", "--sample_tokens", "8", "--vocab_size", str(SMALL_VOCAB))
    assert "Setting accelerator to CPU" in proc.stderr  # DeepSpeed chose the device itself
    assert "1 rank(s) x micro_batch 2 x seq_len 64 x grad_accum 2 = 256 tokens/step" in proc.stdout
    assert "bf16, ZeRO 1, BF16_Optimizer over AdamW" in proc.stdout  # the default config's
    records = read_metrics(out)
    assert [r["step"] for r in records if "loss" in r] == [0, 1] and [r["step"] for r in records if "val_loss" in r] \
        == [0, 1]
    assert f"step     1 | saved {out}/checkpoints/step_00000001" in proc.stdout

    sampled = run("-m", "gpt.commands.sample", "--checkpoint", str(trained_checkpoint), "--max_new_tokens", "8",
                  "--num_samples", "2")
    assert sampled.stdout.startswith("--- sample 0\n") and "\n--- sample 1\n" in sampled.stdout

    exported = run("-m", "gpt.commands.export", str(trained_checkpoint), "--out_dir", str(tmp_path / "hf"))
    assert exported.stdout.startswith(f"exported {trained_checkpoint} -> {tmp_path / 'hf'} ")
    assert exported.stdout.count("\n") == 1
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= {p.name for p in (tmp_path / "hf").iterdir()}


@pytest.mark.slow
def test_the_trainer_leaves_its_process_group_when_the_run_ends(tmp_path, small_vocab_dir):
    """train_ds.py run as a script destroys its process group at a normal end (NCCL warns at every GPU run's exit
    of one left standing); checked in the script's process, after its __main__ block."""
    script = ("import runpy, sys, torch.distributed as dist; sys.argv = ['train_ds.py', *sys.argv[1:]]; "
              "runpy.run_path('train_ds.py', run_name='__main__'); print('group left standing:', dist.is_initialized())")
    proc = run("-c", script, "--model", "tiny", "--seq_len", "64", "--micro_batch", "2", "--total_batch_tokens", "128",
               "--max_steps", "1", "--data", str(small_vocab_dir), "--out_dir", str(tmp_path / "run"),
               "--val_every", "0", "--sample_every", "0")
    assert proc.stdout.splitlines()[-1] == "group left standing: False", proc.stdout[-2000:]


@pytest.mark.slow
def test_prepare_in_a_plain_shell(tmp_path):
    """gpt-prepare files: two documents, the first to validation, the second to a train shard."""
    docs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for doc, text in zip(docs, ("To be, or not to be: that is the question.", "All the world's a stage. " * 20)):
        doc.write_text(text)
    run("-m", "gpt.commands.prepare", "files", *map(str, docs), "--out_dir", str(tmp_path / "shards"),
        "--shard_tokens", "1000", "--val_tokens", "10")
    assert sorted(p.name.rsplit("_", 2)[1] for p in (tmp_path / "shards").glob("*.bin")) == ["train", "val"]


@pytest.mark.slow
def test_the_cpu_demo_config_choice_in_a_plain_shell():
    """gpt.commands.hardware, which launch/cpu_demo.sh reads with $(...): one line, a DeepSpeed JSON of ds_configs/."""
    (line,) = run("-m", "gpt.commands.hardware").stdout.splitlines()
    assert line in ("ds_configs/zero2_bf16.json", "ds_configs/zero2_fp32.json") and (REPO / line).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("command, usage, flag", [
    (["train_ds.py"], "usage: train_ds.py", "--micro_batch"),
    (["-m", "gpt.commands.eval"], "usage: ", "--checkpoint"),
    (["-m", "gpt.commands.sample"], "usage: ", "--max_new_tokens"),
    (["-m", "gpt.commands.export"], "usage: ", "--out_dir"),
    (["-m", "gpt.commands.plan"], "usage: ", "--ds_config"),
], ids=["train_ds.py", "gpt-eval", "gpt-sample", "gpt-export", "gpt-plan"])
def test_a_commands_help_in_a_plain_shell_is_its_own_alone(command, usage, flag):
    """--help answers before DeepSpeed is imported: the flags on stdout, nothing on stderr (DeepSpeed logs its
    accelerator choice at import)."""
    proc = run(*command, "--help")
    assert proc.stdout.startswith(usage) and flag in proc.stdout and proc.stderr == "", proc.stderr
