"""Full and read-only disks (gpt/console.py), on small tmpfs mounts: one line, `latest` never on a partial step,
refused up front where the run could not save; a read-only cache (torch's extensions, our downloads) named with the
variable that moves it."""
import subprocess
import sys

import pytest

from conftest import GPT2_VOCAB, REPO, TINY, plain_shell_env, train
from gpt.console import BadInput
from gpt.data import hellaswag
from gpt.train import checkpoint, resume
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


def test_a_read_only_torch_extensions_dir_is_one_line_and_exit_2_with_nothing_written(mount, tmp_path, small_vocab_dir):
    """DeepSpeed JIT-builds its ops there and takes a lock file there to load one already built: the run failed in
    DeepSpeed's op build with `OSError: Read-only file system`."""
    extensions = mount(tmp_path / "ro", "1m", read_only=True) / "torch_extensions"
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train_ds.py", *TINY, "--max_steps", "2", "--data", str(small_vocab_dir),
                           "--out_dir", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**plain_shell_env(), "TORCH_EXTENSIONS_DIR": str(extensions)})
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        f"error: {extensions}: not writable ({tmp_path / 'ro'} is read-only or not yours), and DeepSpeed builds and "
        f"loads its ops there: set TORCH_EXTENSIONS_DIR to a writable directory")


def test_a_read_only_download_cache_names_the_variable_that_moves_it(mount, tmp_path, monkeypatch):
    """--hellaswag val keeps its download under $XDG_CACHE_HOME/dsgpt (~/.cache/dsgpt): a read-only HOME failed
    there with `OSError: Read-only file system`."""
    cache = mount(tmp_path / "cache", "1m", read_only=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with pytest.raises(BadInput) as error:
        hellaswag.load("val")
    assert str(error.value) == (f"{cache / 'dsgpt'}: cannot keep HellaSwag's download there (Read-only file system); "
                                f"set XDG_CACHE_HOME to a writable directory, or pass a local hellaswag_val.jsonl")
