"""Checkpoints through real runs: exact resume, SIGTERM, pruning, interrupted saves, world-size change,
incompatible resumes, the fp16 minimum-scale diagnostic."""
import json
import shutil
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import (REPO, TINY, default_signals, out_dir_of, saved_tensors, started_early, succeeded, train,
                      two_rank_run, write_ds_config)
from gpt.train import checkpoint, resume, universal
from gpt.train.stop import AT_ONCE_AFTER_S
from gpt.train.metrics import events_dir
from gpt.console import BadInput

# Resumed at step 5: Adam's 6th step, the first whose beta2^t (0.95) as a running float product, which DeepSpeed's
# CPU Adam keeps and no checkpoint holds, differs from pow(0.95, 6) (gpt/train/engine.py, replay_adam_step_count).
RESUMABLE = [*TINY, "--max_steps", "8", "--total_batch_tokens", "512", "--save_every", "5", "--keep_last", "5"]


def step_records(records):
    return [(r["step"], r["loss"], r.get("grad_norm")) for r in records if "loss" in r]


CPU_FLAGS = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
# Quarantined, not solved (2026-11-23): on a Xeon with AVX512-BF16 but no AMX this case differed from step 3
# on in the 6th digit in 1 of 3 full suites and 1 of 2 runs beside a busy loop (alone: 3 of 3 exact; two
# uninterrupted runs under load: identical). Still runs and reports; strict on every other CPU.
AVX512_BF16_WITHOUT_AMX = "avx512_bf16" in CPU_FLAGS and "amx_bf16" not in CPU_FLAGS


def resume_runs(stage, precision, ranks):
    """The uninterrupted run and its resume from step 2: (name, data fixture, flags) of each. '{runs}': the
    directory that holds both out_dirs."""
    whole, resumed = f"whole_{stage}_{precision}_{ranks}", f"resumed_{stage}_{precision}_{ranks}"
    return [(whole, "small_vocab_dir", RESUMABLE),
            (resumed, "small_vocab_dir", [*RESUMABLE, "--resume", f"{{runs}}/{whole}/checkpoints/step_00000004"])]


RESUMES_ON_TWO_RANKS = {name: two_rank_run("--data", f"{{{data}}}", *flags,
                                           ds_config=dict(stage=stage, precision=precision))
                        for stage, precision in ((1, "bf16"), (2, "fp32"))
                        for name, data, flags in resume_runs(stage, precision, 2)}


@pytest.mark.two_rank_runs(RESUMES_ON_TWO_RANKS)
@pytest.mark.parametrize("stage,precision,ranks", [
    (1, "bf16", 2),
    pytest.param(2, "bf16", 1, marks=pytest.mark.xfail(AVX512_BF16_WITHOUT_AMX, strict=False, reason=(
        "bf16 ZeRO-2 resume not bit-exact under load on AVX512-BF16 without AMX (see the comment)"))),
    (1, "fp32", 1), (2, "fp32", 2)])
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, request, stage, precision, ranks):
    (whole_name, data, flags), (resumed_name, _, resumed_flags) = resume_runs(stage, precision, ranks)
    if ranks == 2:  # both in the session's shared 2-rank launch
        runs = request.getfixturevalue("two_rank_runs")
        (whole, whole_proc), (resumed, proc) = succeeded(runs[whole_name]), succeeded(runs[resumed_name])
    else:
        config = write_ds_config(tmp_path / "ds.json", stage=stage, precision=precision)
        data = request.getfixturevalue(data)
        whole, whole_proc = train(tmp_path / whole_name, data, *flags, "--ds_config", config)
        resumed, proc = train(tmp_path / resumed_name, data, *(f.format(runs=tmp_path) for f in resumed_flags),
                              "--ds_config", config)
    assert "resumed from" in proc.stdout and "at step 5" in proc.stdout
    assert step_records(resumed) == step_records(whole)[5:]  # exact equality, not a tolerance
    # a loss's 7 digits miss a weight 1e-9 off: every tensor of the last checkpoint, bit for bit
    whole_state, resumed_state = (saved_tensors(out_dir_of(p) / "checkpoints" / "step_00000007")
                                  for p in (whole_proc, proc))
    assert whole_state.keys() == resumed_state.keys()
    assert [name for name in whole_state if not torch.equal(whole_state[name], resumed_state[name])] == []


def saved_param_groups(step_dir):
    """The optimizer's param groups a checkpoint holds (rank 0's ZeRO file): the settings its run stepped with."""
    (path,) = step_dir.glob("*zero_pp_rank_0_*optim_states.pt")
    return torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]["base_optimizer_state"][
        "param_groups"]


def saved_loss_scaler(step_dir):
    """fp16's loss scaler a checkpoint holds (rank 0's ZeRO file)."""
    (path,) = step_dir.glob("*zero_pp_rank_0_*optim_states.pt")
    return torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]["loss_scaler"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_resume_applies_the_optimizer_settings_it_is_given(tmp_path, small_vocab_dir, precision):
    """DeepSpeed loads the param groups, the gradient clipping and fp16's loss scaler as the checkpoint saved them:
    --weight_decay 0.0 on a run trained with 0.1 kept 0.1, and so did a changed JSON, without a word. The run's flags
    and JSON now apply from the resumed step on, each said in one line, a key removed from the JSON (eps) as its
    default; a resume that changes nothing says nothing (and stays bit-exact:
    test_resume_reproduces_the_uninterrupted_run_bit_for_bit)."""
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 2, "min_loss_scale": 1}
    before = write_ds_config(tmp_path / "before.json", "zero2_fp32.json", stage=2, precision="fp32", optimizer={
        "type": "AdamW", "params": {"betas": [0.9, 0.95], "eps": 1e-06, "torch_adam": True, "fused": True}},
        **({"fp16": fp16} if precision == "fp16" else {}))
    after = write_ds_config(tmp_path / "after.json", "zero2_fp32.json", gradient_clipping=0.5, optimizer={
        "type": "AdamW", "params": {"betas": [0.9, 0.99], "torch_adam": True, "fused": True}},
        **({"fp16": {**fp16, "hysteresis": 4, "loss_scale_window": 50, "consecutive_hysteresis": True,
                     "initial_scale_power": 6}} if precision == "fp16" else {}))
    flags = [*TINY, "--total_batch_tokens", "512", "--save_every", "2",
             *(["--cpu_fp16"] if precision == "fp16" else [])]
    train(tmp_path, small_vocab_dir, *flags, "--max_steps", "2", "--ds_config", before)
    records, proc = train(tmp_path, small_vocab_dir, *flags, "--max_steps", "4", "--ds_config", after, "--resume",
                          "auto", "--weight_decay", "0.05")
    notes = [line for line in proc.stdout.splitlines() if line.startswith("resume: ")]
    assert notes == ["resume: --weight_decay 0.05 applied (the checkpoint's run had 0.1)",
                     "resume: optimizer.params.betas [0.9, 0.99] applied (the checkpoint's run had [0.9, 0.95])",
                     "resume: optimizer.params.eps 1e-08 (its default) applied (the checkpoint's run had 1e-06)",
                     "resume: gradient_clipping 0.5 applied (the checkpoint's run had 1.0)"] + (
        ["resume: fp16.loss_scale_window 50 applied (the checkpoint's run had 1000)",
         "resume: fp16.hysteresis 4 applied (the checkpoint's run had 2)",
         "resume: fp16.consecutive_hysteresis true applied (the checkpoint's run had false)",
         "resume: fp16.initial_scale_power 6 applied (the checkpoint's run had 8): the loss scale restarts at 64 (it "
         "was 256)"] if precision == "fp16" else [])
    groups = saved_param_groups(tmp_path / "checkpoints" / "step_00000003")
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert all(list(g["betas"]) == [0.9, 0.99] and g["eps"] == 1e-08 for g in groups)
    if precision == "fp16":
        scaler = saved_loss_scaler(tmp_path / "checkpoints" / "step_00000003")
        assert (scaler.consecutive_hysteresis, scaler.delayed_shift, scaler.scale_window) == (True, 4, 50)
        assert [r["loss_scale"] for r in records if "loss" in r and r["step"] == 2] == [64.0]
    _, proc = train(tmp_path, small_vocab_dir, *flags, "--max_steps", "5", "--ds_config", after, "--resume", "auto",
                    "--weight_decay", "0.05")
    assert "resume: " not in proc.stdout  # nothing changed since


def test_a_resume_switches_fp16_between_a_static_and_a_dynamic_loss_scale(tmp_path, small_vocab_dir):
    """DeepSpeed loads the checkpoint's loss scaler, static or dynamic, over the one the JSON asks for: a static 128
    after a dynamic run kept the dynamic scale (the loss_scale column read 256). Now this run's scaler, said; a key
    removed from the block afterwards is its default, said the same way."""
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "min_loss_scale": 1}
    flags = [*TINY, "--total_batch_tokens", "512", "--save_every", "1", "--cpu_fp16"]
    runs = [(2, {**fp16}), (3, {**fp16, "loss_scale": 128}), (4, {**fp16, "loss_scale_window": 100}), (5, fp16)]
    outputs = []
    for max_steps, block in runs:
        config = write_ds_config(tmp_path / f"{max_steps}.json", "zero2_fp32.json", fp16=block)
        records, proc = train(tmp_path, small_vocab_dir, *flags, "--max_steps", str(max_steps), "--ds_config", config,
                              *(["--resume", "auto"] if max_steps > 2 else []))
        outputs.append(([line for line in proc.stdout.splitlines() if line.startswith("resume: ")],
                        [r["loss_scale"] for r in records if "loss" in r][-1],
                        saved_loss_scaler(tmp_path / "checkpoints" / f"step_{max_steps - 1:08d}")))
    assert outputs[1][:2] == (["resume: fp16.loss_scale 128 applied (the checkpoint's run had 0: a dynamic scale, "
                               "256 when saved)"], 128.0)
    assert (outputs[1][2].dynamic, outputs[1][2].cur_scale) == (False, 128)
    assert outputs[2][:2] == (["resume: fp16.loss_scale 0 (a dynamic scale from 256) applied (the checkpoint's run "
                               "had 128)"], 256.0)
    assert (outputs[2][2].dynamic, outputs[2][2].cur_scale, outputs[2][2].scale_window) == (True, 256, 100)
    # a key removed from the JSON: its default, said
    assert outputs[3][0] == ["resume: fp16.loss_scale_window 1000 (its default) applied (the checkpoint's run had 100)"]
    assert outputs[3][2].scale_window == 1000


def test_a_resume_turns_amsgrad_on_and_drops_clipping_for_compute_grad_norm_false(tmp_path, small_vocab_dir):
    """amsgrad false -> true on a checkpoint without max_exp_avg_sq raised KeyError at the first resumed step;
    compute_grad_norm false (with gradient_clipping 0) on a checkpoint clipped at 1.0 raised DeepSpeed's ValueError
    from its load. Both now apply, said."""
    params = {"betas": [0.9, 0.95], "eps": 1e-08, "torch_adam": True, "fused": True}
    before = write_ds_config(tmp_path / "before.json", "zero2_fp32.json", gradient_clipping=1.0,
                             optimizer={"type": "AdamW", "params": params})
    after = write_ds_config(tmp_path / "after.json", "zero2_fp32.json", gradient_clipping=0,
                            optimizer={"type": "AdamW", "params": {**params, "amsgrad": True}},
                            zero_optimization={"stage": 2, "compute_grad_norm": False})
    flags = [*TINY, "--total_batch_tokens", "512", "--save_every", "2"]
    train(tmp_path, small_vocab_dir, *flags, "--max_steps", "2", "--ds_config", before)
    records, proc = train(tmp_path, small_vocab_dir, *flags, "--max_steps", "4", "--ds_config", after, "--resume",
                          "auto")
    assert [line for line in proc.stdout.splitlines() if line.startswith("resume: ")] == [
        "resume: optimizer.params.amsgrad true applied (the checkpoint's run had false)",
        "resume: optimizer.params.amsgrad: the checkpoint holds no maximum of exp_avg_sq (its run ran without "
        "AMSGrad): AMSGrad's maximum starts from the resumed step",
        "resume: gradient_clipping 0 applied (the checkpoint's run had 1.0)"]
    assert [r["step"] for r in records if "loss" in r] == [0, 1, 2, 3]  # trained on, no KeyError
    (path,) = (tmp_path / "checkpoints" / "step_00000003").glob("*zero_pp_rank_0_*optim_states.pt")
    saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    assert saved["clip_grad"] == 0 and all("max_exp_avg_sq" in state for state in
                                           saved["base_optimizer_state"]["state"].values())


STOPPED = [*TINY, "--max_steps", "500", "--total_batch_tokens", "512", "--save_every", "0"]


def signalled(out, data, environ, *flags, at=(), preexec_fn=default_signals):
    """`python train_ds.py` of STOPPED's steps into out, sent each signal of `at` ((line prefix, signal), in order) as
    it prints that line: (exit status, output, the complete checkpoints' tags after it)."""
    proc = subprocess.Popen([sys.executable, "train_ds.py", *STOPPED, "--data", str(data), "--out_dir", str(out),
                             *flags], cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=preexec_fn)
    pending, lines = list(at), []
    try:
        for line in proc.stdout:
            lines.append(line)
            if pending and line.startswith(pending[0][0]):
                proc.send_signal(pending.pop(0)[1])
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    return code, "".join(lines), checkpoint.complete_tags(out / "checkpoints")


def step_of(tag):
    return int(tag.split("_")[1])


def stop_drills(data, environ, out):
    """Three launches of one tiny run into out, each resuming the one before (a launch costs seconds of imports):
    started as nohup starts it (SIGHUP ignored), a SIGHUP at step 3, then a SIGTERM at step 6; resumed with SIGHUP at
    its default, a SIGHUP at its first step; resumed with a long first step, a SIGINT in it and again
    (in_training_stops). {name: what signalled returns} and out."""
    nohup = signalled(out, data, environ, at=[("step     3/", signal.SIGHUP), ("step     6/", signal.SIGTERM)],
                      preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    resumes_at = step_of(nohup[2][-1]) + 1 if nohup[2] else 0  # 0: a fresh start, the SIGTERM saved nothing
    hangup = signalled(out, data, environ, "--resume", "auto", at=[(f"step {resumes_at:5d}/", signal.SIGHUP)])
    in_training = in_training_stops(out, data, environ) if hangup[2] else None  # None: no checkpoint to resume
    return dict(out=out, nohup=nohup, hangup=hangup, in_training=in_training)


def in_training_stops(out, data, environ):
    """A resumed run's first step made long (1M tokens of the tiny model: seconds to a minute on a 2-core EPYC; a CPU
    step can take minutes): the first SIGINT goes 1 s after the resume's line (the step begins microseconds after
    it), the second after the first's answer, at least AT_ONCE_AFTER_S after it arrived: the step is many times what
    the drill waits, and a slower machine widens that. (exit status, stdout, stderr lines, tags)."""
    cmd = [sys.executable, "train_ds.py", *STOPPED, "--total_batch_tokens", str(2**20), "--resume", "auto",
           "--data", str(data), "--out_dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr, stdout = [], []
    answered = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            stderr.append(line)
            if line.startswith("SIGINT"):
                answered.set()
    reader = threading.Thread(target=read_stderr)
    reader.start()
    try:
        for line in proc.stdout:
            stdout.append(line)
            if line.startswith("resumed from"):  # the step begins
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        answered.wait(timeout=120)
        time.sleep(AT_ONCE_AFTER_S + 0.2)  # at least this long after the first arrived
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        stdout += proc.stdout.readlines()
    finally:
        proc.kill()
        reader.join()
    return code, "".join(stdout), stderr, checkpoint.complete_tags(out / "checkpoints")


# beside the module's in-process runs from its first test on: the launches mostly wait
stopped_runs_started, stopped_runs = started_early(stop_drills, "small_vocab_dir", name="stopped_runs")


@pytest.mark.slow
def test_a_run_started_under_nohup_trains_on_through_sighup(stopped_runs):
    """nohup's promise: SIGHUP ignored from the start stays ignored, the run trains on (to stop_drills' SIGTERM 3 steps
    later). The first reader of stop_drills: it waits for what of its three launches the tests before it left."""
    code, output, _ = stopped_runs["nohup"]
    assert code == 0 and "stopped by SIGHUP" not in output and "step     6/500" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_finishes_the_step_saves_and_exits_0_then_auto_resume_continues(stopped_runs, signum):
    """SIGHUP (a closed terminal) too: its default ended the run silently, without a save. Each stops one launch of
    stop_drills, and the next launch resumes it."""
    nohup, hangup, in_training = stopped_runs["nohup"], stopped_runs["hangup"], stopped_runs["in_training"]
    if signum == signal.SIGTERM:  # the signal's launch, the checkpoints before it, the step it came at, the resume
        (code, output, tags), before, signalled_at, resumed = nohup, [], 6, hangup[1]
    else:
        (code, output, tags), before, resumed = hangup, nohup[2], in_training and in_training[1] or ""
        signalled_at = step_of(before[-1]) + 1
    assert code == 0 and f"stopped by {signum.name}: checkpoint saved, exiting" in output, output[-3000:]
    (tag,) = set(tags) - set(before)  # this launch's one save: the stop's
    # stopped where the signal met it, long before its 500 steps: how many steps a loaded machine takes between the
    # line and the signal's arrival is not the point (a bound of 10 failed under a load of 13 on 2 cores)
    assert signalled_at <= step_of(tag) < 499
    checkpoints = stopped_runs["out"] / "checkpoints"
    assert f"resumed from {checkpoints / tag} at step {step_of(tag) + 1}" in resumed, resumed[-3000:]


@pytest.mark.slow
def test_in_training_a_stop_is_said_at_once_and_the_same_signal_again_stops_without_saving(stopped_runs):
    """A resumed run's long first step (stop_drills): a SIGINT there is answered on stderr at once; the same again, at
    least AT_ONCE_AFTER_S later, ends the run before the step does, exit 1, without a checkpoint of that step: the one
    before stands. The steps before it are tiny ones: the drill costs a start-up, not minutes of steps. (Validation,
    HellaSwag and samples are cut short by a stop instead: test_stops_runs.py's
    test_sigterm_to_the_deepspeed_command_saves_and_stops_every_rank. tests/unit/test_stops.py: a second signal sooner
    is the same request; a run with no checkpoint says so.)"""
    code, stdout, stderr, tags = stopped_runs["in_training"]
    before = stopped_runs["hangup"][2]
    assert code == 1, "".join(stderr)[-3000:]
    # the first answer came before the step ended (said at once), and the step never ended: no save, no record
    assert f"step {step_of(before[-1]) + 1:5d}" not in stdout, stdout[-3000:]
    said = [line for line in stderr if line.startswith(("SIGINT", "error"))]
    assert said == [
        f"SIGINT: finishing this step, then saving and exiting (SIGINT again, {AT_ONCE_AFTER_S:.0f} s or more from "
        f"now, stops at once without saving)\n",
        "error: stopped at once by a second SIGINT, without saving: the last complete checkpoint stands (--resume "
        "auto continues from it)\n"]
    assert tags == before
    assert [json.loads(line)["step"] for line in (stopped_runs["out"] / "metrics.jsonl").read_text().splitlines()] == \
        list(range(step_of(before[-1]) + 1))


def test_a_stage_written_2_point_0_trains_saves_and_resumes_as_stage_2(tmp_path, small_vocab_dir):
    """What the JSON checks accept, a resume accepts: "stage": 2.0 (as a generated JSON may write it) is stage 2 in
    run_config.json, and --resume auto continues the run (it refused its own checkpoint before)."""
    config = write_ds_config(tmp_path / "stage_2.0.json", base="zero2_fp32.json", stage=2.0)
    flags = [*TINY, "--ds_config", config, "--total_batch_tokens", "512", "--save_every", "1"]
    train(tmp_path / "run", small_vocab_dir, *flags, "--max_steps", "2")
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step_00000001" / "run_config.json").read_text())
    assert type(saved["zero_stage"]) is int and saved["zero_stage"] == 2
    records, proc = train(tmp_path / "run", small_vocab_dir, *flags, "--max_steps", "3", "--resume", "auto")
    assert "at step 2" in proc.stdout and [r["step"] for r in records if "loss" in r] == [0, 1, 2]


def test_a_resume_drops_the_records_of_the_steps_it_takes_again_and_a_cut_last_line(tmp_path, small_vocab_dir):
    """A run killed after its last checkpoint had logged the steps after it, the last line cut mid-write: the resume
    keeps one record per step and a file whose every line parses (it appended a second record of each step before,
    the first glued onto the cut line), and says what it dropped; TensorBoard shows each step once."""
    flags = [*TINY, "--total_batch_tokens", "512", "--save_every", "2"]
    train(tmp_path, small_vocab_dir, *flags, "--max_steps", "5")
    ckpt = tmp_path / "checkpoints"
    for tag in ("step_00000004", "latest"):  # as if killed after step 4's record, before its save
        shutil.rmtree(ckpt / tag) if (ckpt / tag).is_dir() else (ckpt / tag).unlink()
    with open(tmp_path / "metrics.jsonl", "a") as metrics:
        metrics.write('{"step": 5, "loss": 6.1')  # the kill's cut line
    records, proc = train(tmp_path, small_vocab_dir, *flags, "--max_steps", "6", "--resume", "auto")
    assert "at step 4" in proc.stdout
    assert [r["step"] for r in records if "loss" in r] == [0, 1, 2, 3, 4, 5]
    assert (f"warning: {tmp_path / 'metrics.jsonl'}: 1 record(s) of steps 4 on dropped: this launch trains them "
            f"again; line(s) 6 dropped: not a whole record (cut by a kill)") in proc.stderr
    # TensorBoard's own reader: each step once, in order (the first launch's step 4 is purged by the resumed one's)
    scalars = EventAccumulator(str(events_dir(tmp_path))).Reload().Scalars("loss/train")
    assert [scalar.step for scalar in scalars] == [0, 1, 2, 3, 4, 5]
    assert [scalar.value for scalar in scalars] == pytest.approx([r["loss"] for r in records if "loss" in r])


def test_a_checkpoint_whose_bytes_changed_is_passed_over_and_an_old_one_is_said_to_be_unverified(tmp_path,
                                                                                                small_vocab_dir):
    """Bytes overwritten in the middle of the newest checkpoint's optimizer file, its size kept (a failing disk, a bad
    copy): it loaded without a word before, and the loss went NaN. Named, it is refused; --resume auto takes the one
    before and sets it aside. That one's complete.json as older saves wrote it (no checksums): loaded, said unverified."""
    args = [*TINY, "--total_batch_tokens", "512", "--save_every", "2"]
    train(tmp_path, small_vocab_dir, *args, "--max_steps", "4")
    ckpt = tmp_path / "checkpoints"
    (optim,) = (ckpt / "step_00000003").glob("*optim_states.pt")
    with open(optim, "r+b") as file:
        file.seek(optim.stat().st_size // 2)
        file.write(bytes(64))
    with pytest.raises(BadInput, match=f"step_00000003: damaged checkpoint \\({optim.name} does not hold the bytes it "
                                       f"was saved with \\(the CRC-32 of its bytes from 0 on: "):
        resume.find_checkpoint(str(ckpt / "step_00000003"), tmp_path)
    crcs = (checkpoint.checksums(optim.parent, [optim.name])[optim.name][0],  # the file is one piece: < CHUNK_BYTES
            json.loads((ckpt / "step_00000003" / "complete.json").read_text())["crc32"][optim.name][0])
    marker = ckpt / "step_00000001" / "complete.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "crc32"}))
    records, proc = train(tmp_path, small_vocab_dir, *args, "--max_steps", "5", "--resume", "auto")
    assert f"resumed from {ckpt / 'step_00000001'} at step 2" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings[:2] == [
        f"warning: {ckpt / 'step_00000003'}: damaged checkpoint ({optim.name} does not hold the bytes it was saved "
        f"with (the CRC-32 of its bytes from 0 on: {crcs[0]:08x}, {crcs[1]:08x} at save)); falling back to the one "
        f"before it",
        f"warning: {ckpt / 'step_00000001'}: saved before checkpoints recorded their files' checksums: its bytes are "
        f"not verified"], proc.stderr[-3000:]
    assert f"warning: {ckpt / 'step_00000003'}: damaged checkpoint set aside as step_00000003.damaged" in warnings
    assert [r["step"] for r in records if "loss" in r] == [0, 1, 2, 3, 4]


def test_auto_resume_with_nothing_saved_is_a_fresh_start(tmp_path, small_vocab_dir):
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "2", "--total_batch_tokens", "512",
                          "--resume", "auto")
    assert "no checkpoint in" in proc.stdout and "fresh start" in proc.stdout
    assert [r["step"] for r in records if "loss" in r] == [0, 1]


def test_keep_last_and_keep_every(tmp_path, small_vocab_dir):
    train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "7", "--total_batch_tokens", "512", "--save_every", "1",
          "--keep_last", "2", "--keep_every", "3")
    assert checkpoint.complete_tags(tmp_path / "checkpoints") == [
        "step_00000000", "step_00000003", "step_00000005", "step_00000006"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000006"


def test_an_interrupted_save_leaves_the_previous_checkpoint_loadable(tmp_path, small_vocab_dir):
    train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "4", "--total_batch_tokens", "512", "--save_every", "2")
    ckpt = tmp_path / "checkpoints"
    # A crash between DeepSpeed's writes and the completion marker: the newest checkpoint has no marker,
    # and `latest` was never moved to it (here it is, to show a bad pointer is not trusted either).
    (ckpt / "step_00000003" / "complete.json").unlink()
    (ckpt / "latest").write_text("step_00000003")
    assert resume.find_checkpoint("auto", tmp_path) == ckpt / "step_00000001"
    with pytest.raises(BadInput, match="incomplete checkpoint"):
        resume.find_checkpoint(str(ckpt / "step_00000003"), tmp_path)
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "4", "--total_batch_tokens", "512",
                          "--save_every", "2", "--resume", "auto")
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_passed_over_with_one_line_and_set_aside(tmp_path, small_vocab_dir, capsys):
    """A file removed from inside a complete step (DeepSpeed: AssertionError) and a truncated one: --resume
    auto, gpt-export and gpt-sample take the step before, saying so once; an explicit damaged path and an
    older step of the same out_dir (whose later steps a resume would overwrite) are refused. The resumed run
    sets the damaged step aside, repeats the uninterrupted run's losses and says which RNG it lacked."""
    args = [*TINY, "--max_steps", "6", "--total_batch_tokens", "512", "--save_every", "2", "--keep_last", "5"]
    whole, _ = train(tmp_path, small_vocab_dir, *args)
    ckpt = tmp_path / "checkpoints"
    assert checkpoint.complete_tags(ckpt) == ["step_00000001", "step_00000003", "step_00000005"]
    (optim,) = (ckpt / "step_00000005").glob("*optim_states.pt")
    optim.unlink()
    assert resume.find_checkpoint("auto", tmp_path) == ckpt / "step_00000003"
    assert capsys.readouterr().err == (f"warning: {ckpt / 'step_00000005'}: damaged checkpoint ({optim.name} is "
                                       f"missing); falling back to the one before it\n")
    assert universal.read_weights(ckpt)[0].keys() == universal.read_weights(ckpt / "step_00000001")[0].keys()
    assert "step_00000005: damaged" in capsys.readouterr().err  # gpt-export and gpt-sample read through here
    with pytest.raises(BadInput, match=f"step_00000005: damaged checkpoint \\({optim.name} is "
                                                         f"missing\\); give its parent directory"):
        resume.find_checkpoint(str(ckpt / "step_00000005"), tmp_path)
    with pytest.raises(BadInput, match="holds later checkpoints \\(up to step_00000003\\) that "
                                                         "this run would overwrite: resume it into another --out_dir"):
        resume.check_resume_target(ckpt / "step_00000001", tmp_path, 6)
    model = ckpt / "step_00000001" / "mp_rank_00_model_states.pt"
    written = model.stat().st_size
    os.truncate(model, written // 2)
    assert checkpoint.damage(ckpt / "step_00000001") == (
        f"mp_rank_00_model_states.pt has {written // 2} bytes, {written} were written")

    (ckpt / "step_00000003" / "rng_rank00000.pt").unlink()  # not damage: said, and the run goes on
    resumed, proc = train(tmp_path, small_vocab_dir, *args, "--resume", "auto")
    assert f"resumed from {ckpt / 'step_00000003'} at step 4: weights, optimizer, schedule, data position and " \
           f"not the RNG of every rank" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {ckpt / 'step_00000005'}: damaged checkpoint ({optim.name} is missing); falling back to the one "
        f"before it",
        f"warning: {ckpt / 'step_00000001'}: damaged checkpoint set aside as step_00000001.damaged",
        f"warning: {ckpt / 'step_00000005'}: damaged checkpoint set aside as step_00000005.damaged",
        f"warning: [rank 0] {ckpt / 'step_00000003'}: rng_rank00000.pt is missing: this rank's random state was "
        f"not restored, so the run will not repeat an uninterrupted one exactly",
        f"warning: {tmp_path / 'metrics.jsonl'}: 2 record(s) of steps 4 on dropped: this launch trains them again"
    ], proc.stderr[-3000:]
    assert step_records(resumed) == step_records(whole)  # metrics.jsonl: the first run's 0-3, then these
    assert checkpoint.complete_tags(ckpt) == ["step_00000003", "step_00000005"]
    assert checkpoint.damage(ckpt / "step_00000005") is None and (ckpt / "step_00000005.damaged" / model.name).exists()


def test_an_incompatible_checkpoint_is_refused_up_front(tmp_path, small_vocab_dir):
    train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "2", "--save_every", "1", "--keep_last", "1",
          "--total_batch_tokens", "512")
    zero0 = write_ds_config(tmp_path / "zero0.json", stage=0, precision="fp32")
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "512",
                          "--n_layer", "3", "--ds_config", zero0, "--resume", "auto", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'checkpoints' / 'step_00000001'}: cannot resume: n_layer 2 in the checkpoint, 3 now; "
        f"zero_stage 2 in the checkpoint, 0 now (only ZeRO 1 <-> 2 converts)")
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "512",
                          "--seq_len", "32", "--seed", "7", "--resume", "auto", check=False)
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (2, (
        f"error: {tmp_path / 'checkpoints' / 'step_00000001'}: cannot resume: --seq_len 64 in the checkpoint, 32 now; "
        f"--seed 1234 in the checkpoint, 7 now (the data position depends on them: --reset_data_position starts the "
        f"next epoch in the new order)"))
    records, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "512",
                          "--micro_batch", "auto", "--resume", "auto")  # a relaunched --micro_batch auto recipe
    assert "--micro_batch auto on CPU" in proc.stdout and "resumed from" in proc.stdout and "at step 2" in proc.stdout


def test_a_directory_without_checkpoints_is_a_clear_error(tmp_path, small_vocab_dir):
    """(A path that does not exist: 'not found', in tests/integration/test_bad_input.py's table.)"""
    (tmp_path / "empty").mkdir()
    _, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "2", "--resume", str(tmp_path / "empty"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"error: {tmp_path / 'empty'}: no complete checkpoint found"


def test_fp16_loss_scale_at_minimum_ends_with_remedies(tmp_path, small_vocab_dir):
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "hysteresis": 1, "min_loss_scale": 2.0**32}
    config = write_ds_config(tmp_path / "fp16.json", precision="fp32", fp16=fp16)
    _, proc = train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "3", "--total_batch_tokens", "512",
                    "--ds_config", config, "--cpu_fp16", check=False)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("error: fp16 loss scale fell to its minimum")
    assert "bf16" in message and "hysteresis" in message and "initial_scale_power" in message


@pytest.mark.slow
def test_resume_with_another_max_steps(tmp_path, small_vocab_dir):
    """At or below the checkpoint's step: nothing left to train, refused before launch. Above it: the schedule
    of the new --max_steps from the resumed step on (said in one line), not the saved lr for one step and then
    a jump."""
    from gpt.train.schedule import Schedule
    args = [*TINY, "--total_batch_tokens", "512", "--save_every", "2"]
    train(tmp_path, small_vocab_dir, *args, "--max_steps", "4")
    last = tmp_path / "checkpoints" / "step_00000003"
    for max_steps in (4, 3):
        _, proc = train(tmp_path, small_vocab_dir, *args, "--max_steps", str(max_steps), "--resume", "auto", check=False)
        assert (proc.returncode, proc.stderr) == (2, f"error: --max_steps {max_steps}: nothing left to train: {last} was "
                                                     f"saved after step 3, and --max_steps {max_steps} ends after step "
                                                     f"{max_steps - 1}; raise --max_steps to train on\n")
    records, proc = train(tmp_path, small_vocab_dir, *args, "--max_steps", "8", "--resume", "auto")
    now, was = Schedule(6e-4, 2, 8, 0.1), Schedule(6e-4, 2, 4, 0.1)  # the defaults and TINY's
    assert (f"--max_steps 8 (the checkpoint's run had 4): the lr schedule follows the new flags from here on (cosine: "
            f"warmup 2 steps, cosine decay to peak x 0.1 at step 8); lr at step 4 is {now.lr_at(4):.4g} (was "
            f"{was.lr_at(4):.4g}): a longer cosine raises a decayed lr again (to extend a run without that, train it "
            f"with --lr_schedule wsd and resume from its checkpoint at the cooldown's start)") in proc.stdout.splitlines()
    assert [(r["step"], r["lr"]) for r in records if "loss" in r][4:] == [
        (step, pytest.approx(now.lr_at(step), rel=1e-12)) for step in range(4, 8)]
    # a larger batch per step is allowed (the data order depends on the micro-batch, not the accumulation): said
    _, proc = train(tmp_path, small_vocab_dir, *args, "--max_steps", "9", "--resume", "auto", "--total_batch_tokens",
                    "1024")
    assert "--total_batch_tokens 1,024 (the checkpoint's run had 512): grad_accum 4 from here on" in proc.stdout
