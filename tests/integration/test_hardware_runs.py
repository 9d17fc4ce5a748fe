"""What a run adapts to the machine, checked by processes and runs: DeepSpeed's CPU op flags with py-cpuinfo's
answer, the CPU precision by bf16 units, a short trial run's warmup, deterministic runs, a quiet start. (The rest:
tests/unit/test_hardware.py.)"""
import os
import subprocess
import sys

import pytest

from conftest import NO_BF16_UNITS, REPO, TINY, assert_exit_0, background_run, launcher_argv, train, train_losses
from gpt.config import hardware
from gpt.runtime import host


@pytest.mark.skipif(host.cpu_info_from_proc() is None, reason="py-cpuinfo answers itself off x86-64 Linux")
def test_deepspeed_builds_its_cpu_ops_with_the_flags_py_cpuinfo_would_give(monkeypatch):
    """gpt.runtime.accelerator (conftest imports it) answers py-cpuinfo's get_cpu_info from /proc/cpuinfo (gpt/runtime/host.py): DeepSpeed's
    op builder must pick the same -march and SIMD width as with py-cpuinfo's own answer, or it would rebuild its ops with other flags."""
    import cpuinfo
    from deepspeed.ops.op_builder.cpu import FusedAdamBuilder
    builder, fast = FusedAdamBuilder(), host.cpu_info_from_proc()
    assert cpuinfo.get_cpu_info() == fast  # what DeepSpeed gets in a gpt process

    def decisions():  # DeepSpeedCPUAdam also reads the vendor (a warning for fp16 on AMD)
        return builder.cpu_arch(), builder.simd_width(), cpuinfo.get_cpu_info()["vendor_id_raw"]
    answered_fast = decisions()
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.cpuinfo.get_cpu_info)  # py-cpuinfo's own, a process
    assert decisions() == answered_fast
    assert answered_fast[1] in ("-D__AVX512__", "-D__AVX256__")


def cpu_config_choice(env):
    proc = subprocess.run([sys.executable, "-m", "gpt.commands.hardware"], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip(), proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_cpu_without_bf16_units_gets_the_fp32_config():
    config, reason = cpu_config_choice(NO_BF16_UNITS)
    assert config == "ds_configs/zero2_fp32.json"
    assert "no bf16 units, bf16 would be emulated" in reason


@pytest.mark.slow
def test_the_cpu_choice_in_a_new_process_is_this_processs():
    """One bf16 decision per machine: a new process (the demo's) answers as this one, and says why."""
    config, reason = cpu_config_choice({})
    fast, why = hardware.cpu_bf16_units()
    assert config == ("ds_configs/zero2_bf16.json" if fast else "ds_configs/zero2_fp32.json")
    assert reason == f"{why}: {'bf16 units present' if fast else 'no bf16 units, bf16 would be emulated'}"


@pytest.mark.background_runs({"bf16_without_bf16_units": background_run(
    *launcher_argv("deepspeed", 2, "{port}"), "train_ds.py", "--data", "{small_vocab_dir}", "--out_dir", "{out}", *TINY,
    "--ds_config", "ds_configs/zero1_bf16.json", "--max_steps", "2", "--total_batch_tokens", "512",
    env=NO_BF16_UNITS)})
def test_a_bf16_run_without_bf16_units_warns_once_with_the_config_to_use(background_runs):
    proc = background_runs["bf16_without_bf16_units"]
    assert_exit_0(proc)
    warnings = [line for line in proc.stderr.splitlines() if "no bf16 units" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert warnings[0].startswith("warning: this CPU has no bf16 units: ONEDNN_MAX_CPU_ISA=AVX2 leaves oneDNN no bf16 "
                                  "instructions; bf16 matmuls are emulated")
    assert warnings[0].endswith("use ds_configs/zero2_fp32.json")


def test_a_short_trial_run_just_works_and_an_explicit_warmup_beyond_it_is_an_error(tmp_path, small_vocab_dir):
    no_warmup = [a for a in TINY if a not in ("--warmup_steps", "2")]
    records, proc = train(tmp_path / "short", small_vocab_dir, *no_warmup, "--max_steps", "8",
                          "--total_batch_tokens", "256")
    assert "--warmup_steps 0: --max_steps 8 is below the default warmup" in proc.stdout
    assert [r["step"] for r in records if "loss" in r] == list(range(8))
    _, proc = train(tmp_path / "long", small_vocab_dir, *no_warmup, "--max_steps", "8", "--warmup_steps", "9",
                    check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: --warmup_steps 9 must lie in [0, --max_steps 8]"


@pytest.mark.slow
def test_deterministic_mode_runs_validation_and_sampling_and_changes_nothing_on_cpu(tmp_path, small_vocab_dir):
    args = [*TINY, "--max_steps", "3", "--total_batch_tokens", "512", "--val_every", "2", "--val_tokens", "512",
            "--sample_every", "2", "--sample_tokens", "8"]
    plain, _ = train(tmp_path / "plain", small_vocab_dir, *args)
    deterministic, proc = train(tmp_path / "deterministic", small_vocab_dir, *args, "--deterministic")
    assert train_losses(deterministic) == train_losses(plain)  # CPU kernels are deterministic already
    assert [r["val_loss"] for r in deterministic if "val_loss" in r] == [r["val_loss"] for r in plain if "val_loss" in r]
    assert "sample at step 2:" in proc.stdout


def test_the_slow_machine_stand_in_caps_onednn_ignores_sigint_and_leaves_no_neighbour(tmp_path):
    """launch/slow_machine.sh: the command sees oneDNN capped below bf16 (so the one bf16 decision says no
    units), SIGINT ignored as a background job has it, DSGPT_SLOW_MACHINE=1; its busy neighbours end with it, and
    its exit status is the command's."""
    import psutil

    def spinning():  # neighbours of any stand-in: this suite may itself run inside one
        return {p.pid for p in psutil.process_iter(["cmdline"]) if "while True: pass" in (p.info["cmdline"] or [])}
    before = spinning()
    probe = ("import os, signal; from gpt.config.hardware import cpu_bf16_units; "
             "print(os.environ['ONEDNN_MAX_CPU_ISA'], os.environ['DSGPT_SLOW_MACHINE'], "
             "signal.getsignal(signal.SIGINT) == signal.SIG_IGN, cpu_bf16_units()[0]); raise SystemExit(3)")
    proc = subprocess.run(["bash", "launch/slow_machine.sh", "--busy", "2", sys.executable, "-c", probe], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.split() == ["AVX512_CORE", "1", "True", "False"]
    assert proc.stderr.splitlines()[0].startswith("slow machine: 2 busy neighbours on ")
    assert spinning() <= before


@pytest.mark.parametrize("args,line", [
    (["--busy", "x", "true"], "slow_machine.sh: --busy x must be a whole number of processes"),
    ([], "slow_machine.sh: no command given (usage: slow_machine.sh [--busy N] [--isa ISA] COMMAND...)")])
def test_the_slow_machine_stand_in_refuses_bad_input_in_one_line(args, line):
    proc = subprocess.run(["bash", "launch/slow_machine.sh", *args], cwd=REPO, capture_output=True, text=True)
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (2, line, "")
