"""Data identity across a resume: checkpoints record the train shards' sizes and sampled hashes, so a resume into
shards rewritten since the save is refused before launch (exit 2, nothing written) instead of continuing at a
position that now points into other tokens; --reset_data_position continues from the next epoch's start and says
what changed; checkpoints saved before fingerprints existed still resume, saying what goes unchecked."""
import json
import shutil

import numpy as np
import pytest

from conftest import TINY, reseal, train
from gpt.data.shards import find_shards, fingerprints, load_shard, write_shard

RUN = [*TINY, "--max_steps", "3", "--total_batch_tokens", "512"]
SHARD = "shakespeare_train_000001.bin"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, small_vocab_dir):
    """(data directory, out_dir) of a 3-step run that saved step_00000002."""
    root = tmp_path_factory.mktemp("identity")
    shutil.copytree(small_vocab_dir, root / "data")
    train(root / "out", root / "data", *RUN)
    return root / "data", root / "out"


def changed_copy(data, tmp_path, change):
    """A copy of the data directory with the train shard's tokens changed by change(tokens)."""
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    write_shard(copy / SHARD, change(np.asarray(load_shard(data / SHARD))))
    return copy


def snapshot(directory):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


@pytest.mark.parametrize("change, what", [
    (lambda tokens: np.roll(tokens, 1), "holds other tokens in the same {bytes:,} bytes"),
    (lambda tokens: tokens[:-1000], "has {fewer:,} bytes, {bytes:,} then")], ids=["same_length", "shorter"])
def test_a_resume_into_rewritten_shards_is_refused_before_launch(saved, tmp_path, change, what):
    data, out = saved
    changed = changed_copy(data, tmp_path, change)
    before = snapshot(out)
    _, proc = train(out, changed, *RUN, "--max_steps", "5", "--resume", "auto", check=False)
    size = (data / SHARD).stat().st_size
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        f"error: --data {changed}: the train shards changed since {out / 'checkpoints' / 'step_00000002'} was saved "
        f"({SHARD} {what.format(bytes=size, fewer=size - 2000)}): its data position would point into other data; "
        f"restore them, or resume with --reset_data_position (from the next epoch's start)"]
    assert snapshot(out) == before  # nothing written


def test_reset_data_position_continues_from_the_next_epoch_and_says_what_changed(saved, tmp_path):
    data, out = saved
    changed = changed_copy(data, tmp_path, lambda tokens: np.roll(tokens, 1))
    shutil.copytree(out, tmp_path / "out")
    records, proc = train(tmp_path / "out", changed, *RUN, "--max_steps", "5", "--resume", "auto",
                          "--reset_data_position")
    ckpt = tmp_path / "out" / "checkpoints"
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: --data {changed}: the train shards changed since {ckpt / 'step_00000002'} was saved ({SHARD} holds "
        f"other tokens in the same {(data / SHARD).stat().st_size:,} bytes); --reset_data_position: training continues "
        f"from the start of the next epoch"]
    assert (f"resumed from {ckpt / 'step_00000002'} at step 3: weights, optimizer, schedule, data from the start of "
            f"epoch 1 (--reset_data_position) and RNG") in proc.stdout
    assert [r["step"] for r in records if "loss" in r][-2:] == [3, 4]
    run_config = json.loads((ckpt / "step_00000004" / "run_config.json").read_text())
    assert run_config["data"] == fingerprints(find_shards(changed, "train"))  # the next resume checks the new shards


def test_the_same_shards_elsewhere_resume_at_the_saved_position(saved, tmp_path):
    """Fingerprints go by file name and content, not path: data moved to another disk resumes exactly."""
    data, out = saved
    shutil.copytree(data, tmp_path / "moved")
    shutil.copytree(out, tmp_path / "out")
    _, proc = train(tmp_path / "out", tmp_path / "moved", *RUN, "--max_steps", "4", "--resume", "auto")
    assert "at step 3: weights, optimizer, schedule, data position and RNG" in proc.stdout
    assert "warning:" not in proc.stderr


def test_a_checkpoint_without_fingerprints_resumes_and_says_what_is_not_checked(saved, tmp_path):
    """Checkpoints saved before fingerprints were recorded: run_config.json without 'data' (rewritten to its old
    size, as complete.json records it)."""
    data, out = saved
    shutil.copytree(out, tmp_path / "out")
    step = tmp_path / "out" / "checkpoints" / "step_00000002"
    text = (step / "run_config.json").read_text()
    run_config = json.loads(text)
    del run_config["data"]
    (step / "run_config.json").write_text(json.dumps(run_config, indent=1).ljust(len(text)))
    reseal(step, checksums=False)  # saved before checksums too
    _, proc = train(tmp_path / "out", data, *RUN, "--max_steps", "4", "--resume", "auto")
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {step}: saved before checkpoints recorded their files' checksums: its bytes are not verified",
        f"warning: {step}: saved before checkpoints recorded their shards' fingerprints: whether --data {data} holds "
        f"the same train shards is not checked"]
    assert "at step 3: weights, optimizer, schedule, data position and RNG" in proc.stdout
