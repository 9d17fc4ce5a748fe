"""Full and read-only disks (gpt/console.py), on small tmpfs mounts: one line, `latest` never on a partial step,
refused up front where the run could not save; a read-only HOME trains, and a read-only cache that a run needs
(torch's extensions for FusedAdam, our downloads) is named with the variable that moves it."""
import shutil
import subprocess
import sys

import pytest

from conftest import FUSED_ADAM, GPT2_VOCAB, REPO, TINY, plain_shell_env, train, write_ds_config
from gpt.console import BadInput
from gpt.data import hellaswag
from gpt.train import checkpoint, resume
from gpt.train.metrics import MetricsLogger, events_dir
from gpt.console import free_bytes, megabytes


@pytest.fixture
def mount(tmp_path):
    """mount(path, size, read_only=False): a tmpfs at path (made), unmounted at the end; skips where mounting
    is not permitted (not root, a container without CAP_SYS_ADMIN)."""
    mounted = []

    def make(path, size, read_only=False):
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                              text=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(path)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        return path
    try:
        yield make
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_checkpoints_directory_is_refused_before_training(mount, tmp_path, small_vocab_dir):
    out = tmp_path / "out"
    mount(out / "checkpoints", "1m", read_only=True)
    _, proc = train(out, small_vocab_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out}: {out / 'checkpoints'} is not writable\n")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]  # nothing written


def test_a_read_only_out_dir_is_refused_before_training(mount, tmp_path, small_vocab_dir):
    out = mount(tmp_path / "out", "1m", read_only=True)
    _, proc = train(out / "run", small_vocab_dir, *TINY, "--max_steps", "2", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out / 'run'}: {out} is not writable\n")


def test_tensorboards_events_removed_mid_run_end_it_in_one_line(tmp_path, small_vocab_dir, monkeypatch):
    """TensorBoard's writer reopens its events file by name (in bytes) for every write: with the directory removed
    it failed, its thread printed a traceback, and the trainer's handler crashed on the bytes name (TypeError)."""
    out, log, removed = tmp_path / "out", MetricsLogger.log, []

    def log_after_removing_the_events_at_step_2(self, step, metrics, console=None):
        if step == 2 and self.enabled and not removed:
            removed.extend(events_dir(out).glob("events.out.tfevents.*"))
            shutil.rmtree(events_dir(out))
        log(self, step, metrics, console)
    monkeypatch.setattr(MetricsLogger, "log", log_after_removing_the_events_at_step_2)
    _, proc = train(out, small_vocab_dir, *TINY, "--max_steps", "8", "--total_batch_tokens", "512", "--save_every",
                    "2", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        f"error: stopping: {removed[0]}: No such file or directory. Last good checkpoint: "
        f"{out / 'checkpoints' / 'step_00000001'}"]


@pytest.mark.slow
def test_a_save_onto_a_full_disk_says_so_and_keeps_latest_then_a_resume_is_refused(mount, tmp_path, small_vocab_dir):
    """The tiny fp32 model's checkpoint is ~52 MB: 80 MB holds one, not two. The second save fails mid-way:
    one line, exit 1, `latest` on the first; the partial step is never loaded. A --resume auto on the still-full
    disk is refused up front, before a run that could not save starts."""
    out = mount(tmp_path / "disk", "80m") / "out"
    args = [*TINY, *GPT2_VOCAB, "--max_steps", "4", "--total_batch_tokens", "512", "--save_every", "2"]
    _, proc = train(out, small_vocab_dir, *args, check=False)
    ckpt = out / "checkpoints"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        f"error: stopping: {ckpt / 'step_00000003'}: no space left on the device; that checkpoint is incomplete and "
        f"will not be loaded. Last good checkpoint: {ckpt / 'step_00000001'}"]
    assert (ckpt / "latest").read_text() == "step_00000001" and (ckpt / "step_00000003").is_dir()
    assert resume.find_checkpoint("auto", out) == ckpt / "step_00000001"

    needed = sum(checkpoint.file_sizes(ckpt / "step_00000001").values())
    free = free_bytes(ckpt)
    _, proc = train(out, small_vocab_dir, *args, "--resume", "auto", check=False)
    assert (proc.returncode, proc.stderr) == (2, f"error: --out_dir {out}: no space left on the device: "
                                                 f"{megabytes(free)} free, a checkpoint like step_00000001 needs "
                                                 f"{megabytes(needed)}\n")


def test_a_read_only_home_trains_and_fused_adam_there_is_one_line_and_exit_2(mount, tmp_path, small_vocab_dir,
                                                                          monkeypatch):
    """ds_configs/ train with torch's AdamW, which needs no build: a read-only HOME (torch's extensions directory
    under it, no writable cache) trains, in a process of its own. DeepSpeed's FusedAdam JIT-builds there and takes a
    lock file there to load a built one: a config that asks for it is refused before anything is written (the run
    failed in DeepSpeed's op build with `OSError: Read-only file system`); a check of the environment at start-up,
    made in this process."""
    home = mount(tmp_path / "home", "1m", read_only=True)
    env = {k: v for k, v in plain_shell_env().items() if k not in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)

    def run(out, *flags):
        return subprocess.run([sys.executable, "train_ds.py", *TINY, "--max_steps", "2", "--total_batch_tokens", "512",
                               "--data", str(small_vocab_dir), "--out_dir", str(out), *flags], cwd=REPO,
                              capture_output=True, text=True, timeout=300, env=env)
    proc = run(tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "over AdamW" in proc.stdout and list(home.iterdir()) == []
    fused_adam = write_ds_config(tmp_path / "fused_adam.json", "zero2_fp32.json", optimizer=FUSED_ADAM)
    out = tmp_path / "fused"
    monkeypatch.setenv("HOME", str(home))
    for name in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    _, proc = train(out, small_vocab_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512", "--ds_config",
                    fused_adam, check=False)
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr[-2000:]
    extensions = home / ".cache" / "torch_extensions"
    assert proc.stderr.splitlines()[-1] == (
        f"error: {extensions}: not writable ({home} is read-only or not yours), and DeepSpeed builds and loads its "
        f"FusedAdam there: set XDG_CACHE_HOME or TORCH_EXTENSIONS_DIR to a writable directory, or use torch's AdamW "
        f"(optimizer.params.torch_adam true, as ds_configs/ do)")


def test_a_read_only_download_cache_names_the_variable_that_moves_it(mount, tmp_path, monkeypatch):
    """--hellaswag val keeps its download under $XDG_CACHE_HOME/dsgpt (~/.cache/dsgpt): a read-only HOME failed
    there with `OSError: Read-only file system`."""
    cache = mount(tmp_path / "cache", "1m", read_only=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with pytest.raises(BadInput) as error:
        hellaswag.load("val")
    assert str(error.value) == (f"{cache / 'dsgpt'}: cannot keep HellaSwag's download there (Read-only file system); "
                                f"set XDG_CACHE_HOME to a writable directory, or pass a local hellaswag_val.jsonl")
