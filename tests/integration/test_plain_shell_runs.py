"""The user-facing commands in the environment of a new shell: without the DS_ACCELERATOR=cpu that the suite pins
(tests/common.py), DeepSpeed detects the device itself and logs, and the trainer runs in processes of its own (a
2-rank launch), not in the suite's in-process harness. Each command works, and its stdout holds only its own lines:
DeepSpeed's logs and prints go to stderr. gpt-plan and gpt-eval: tests/integration/test_plan_runs.py,
test_eval_device_runs.py."""
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from common import SMALL_VOCAB
from conftest import REPO, free_port, plain_shell_env, read_metrics
from gpt.commands.sample import main as sample_main

# what DeepSpeed writes when it reaches stdout: its logger's lines and its ops' bare prints
DEEPSPEED_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[[A-Z]+\]|^DeepSpeed ")


def run(*argv):
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=plain_shell_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not [line for line in proc.stdout.splitlines() if DEEPSPEED_LINE.match(line)], proc.stdout
    return proc


# A rank of the launch below: its stdout to a file of its own (the launcher's pipe carries the launcher's logs too),
# then train_ds.py as the launcher runs it, as __main__, then whether the rank's process group is still up
AS_MAIN_THEN_THE_GROUP = """import os, sys
os.dup2(os.open(f"{stdout}.rank{{os.environ['RANK']}}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
import runpy, torch.distributed as dist
sys.argv[0] = "train_ds.py"
runpy.run_path("train_ds.py", run_name="__main__")
print("group left standing:", dist.is_initialized())
"""


@pytest.fixture(scope="module")
def plain_shell_launch(tmp_path_factory, small_vocab_dir):
    """One cold `deepspeed --num_gpus 2` launch of train_ds.py in a new shell: an empty TORCH_EXTENSIONS_DIR; the
    default DeepSpeed config (zero1_bf16) in the tests' 512-id vocabulary (bf16 is emulated on a CPU without bf16
    units: GPT-2's logits cost seconds a step there), with validation, a sample and a save. Each rank runs train_ds.py
    as __main__ and then says whether its process group is still up (AS_MAIN_THEN_THE_GROUP). One launch for the
    tests below: it costs 4 processes that import torch and DeepSpeed. Returns the completed launch, its out_dir,
    extensions directory and port, and each rank's stdout."""
    tmp = tmp_path_factory.mktemp("plain_shell_launch")
    extensions, out, port = tmp / "torch_extensions", tmp / "run", free_port()
    extensions.mkdir()
    (tmp / "as_main.py").write_text(AS_MAIN_THEN_THE_GROUP.format(stdout=tmp / "stdout"))
    proc = subprocess.run(["deepspeed", "--num_gpus", "2", "--master_port", str(port), str(tmp / "as_main.py"),
                           "--model", "tiny", "--seq_len", "64", "--micro_batch", "2", "--total_batch_tokens", "256",
                           "--max_steps", "2", "--data", str(small_vocab_dir), "--out_dir", str(out), "--val_every",
                           "1", "--val_tokens", "256", "--sample_every", "2", "--sample_tokens", "8", "--vocab_size",
                           str(SMALL_VOCAB)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**plain_shell_env(), "TORCH_EXTENSIONS_DIR": str(extensions)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return SimpleNamespace(proc=proc, out=out, extensions=extensions, port=port,
                           stdouts=[(tmp / f"stdout.rank{rank}").read_text() for rank in (0, 1)])


@pytest.mark.slow
def test_a_two_rank_launch_in_a_plain_shell_trains_with_the_default_config(plain_shell_launch):
    """Over 9 s (the launch, which this test sets up: ~15 s on the 2-core AVX512-BF16 EPYC, ~24 s on the AVX2 one):
    4 processes that each import torch and DeepSpeed, the cost of any launch; the checks below share it."""
    launch = plain_shell_launch
    assert "Setting accelerator to CPU" in launch.proc.stderr  # DeepSpeed chose the device itself, in each rank
    stdout = launch.stdouts[0]
    assert "2 rank(s) x micro_batch 2 x seq_len 64 x grad_accum 1 = 256 tokens/step" in stdout
    assert "bf16, ZeRO 1, BF16_Optimizer over AdamW" in stdout  # the default config's
    records = read_metrics(launch.out)
    assert [r["step"] for r in records if "loss" in r] == [0, 1] and [r["step"] for r in records if "val_loss" in r] \
        == [0, 1]
    assert f"step     1 | saved {launch.out}/checkpoints/step_00000001" in stdout
    assert not [line for rank in launch.stdouts for line in rank.splitlines() if DEEPSPEED_LINE.match(line)], \
        launch.stdouts


@pytest.mark.slow
def test_a_cold_two_rank_start_in_a_new_shell_builds_no_op(plain_shell_launch):
    """An empty extensions directory stays empty: no FusedAdam, no shared-memory allreduce (DeepSpeed builds that
    one for its inference path alone: gpt/runtime/accelerator.py), and so no /dev/shm buffer either."""
    assert list(plain_shell_launch.extensions.iterdir()) == []
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{plain_shell_launch.port}_*"))


@pytest.mark.slow
def test_the_trainer_leaves_its_process_group_when_the_run_ends(plain_shell_launch):
    """train_ds.py run as a script destroys its process group at a normal end (NCCL warns at every GPU run's exit
    of one left standing); checked in each rank's process, after its __main__ block."""
    assert [out.splitlines()[-1] for out in plain_shell_launch.stdouts] == ["group left standing: False"] * 2, \
        plain_shell_launch.stdouts


@pytest.mark.slow
def test_one_process_without_a_launcher_trains_in_a_plain_shell(tmp_path, small_vocab_dir):
    """`python train_ds.py` (README's one-process form): one rank, DeepSpeed's own choice of device, one step."""
    proc = run("train_ds.py", "--model", "tiny", "--seq_len", "64", "--micro_batch", "2", "--total_batch_tokens", "128",
               "--max_steps", "1", "--data", str(small_vocab_dir), "--out_dir", str(tmp_path / "run"), "--val_every",
               "0", "--sample_every", "0", "--vocab_size", str(SMALL_VOCAB))
    assert "Setting accelerator to CPU" in proc.stderr
    assert "1 rank(s) x micro_batch 2 x seq_len 64 x grad_accum 1 = 128 tokens/step" in proc.stdout
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [0]


@pytest.mark.slow
def test_sample_and_export_in_a_plain_shell(tmp_path, trained_checkpoint, capsys):
    """gpt-sample and gpt-export on the session's trained checkpoint (GPT-2's vocabulary, which they need; a bf16
    checkpoint's weights for them: test_universal.py). A fresh gpt-sample process samples the text that gpt-sample
    samples in this process, whatever this process did before: its seed decides."""
    argv = ["--checkpoint", str(trained_checkpoint), "--prompt", "To be", "--max_new_tokens", "8", "--num_samples",
            "2", "--seed", "7"]
    sampled = run("-m", "gpt.commands.sample", *argv)
    assert sampled.stdout.startswith("--- sample 0\nTo be") and sampled.stdout.count("\n--- sample 1\nTo be") == 1
    sample_main(argv)
    assert capsys.readouterr().out == sampled.stdout

    exported = run("-m", "gpt.commands.export", str(trained_checkpoint), "--out_dir", str(tmp_path / "hf"))
    assert exported.stdout.startswith(f"exported {trained_checkpoint} -> {tmp_path / 'hf'} ")
    assert exported.stdout.count("\n") == 1
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= {p.name for p in (tmp_path / "hf").iterdir()}


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
