"""Universal checkpoints (gpt/train/universal.py): 2-rank ZeRO-1/2 checkpoints (from the shared 2-rank launch) converted
with DeepSpeed's converter inside their step directory, reused, read by read_weights and the console scripts, and
loaded into a 1-rank engine with the optimizer state exactly the two ranks' shards gathered; bf16 across DeepSpeed's
two optimizers (BF16_Optimizer for bf16 ZeRO-1 with fp32 accumulation, DeepSpeedZeroOptimizer for ZeRO-2); and
what cannot be converted, said in one line with the checkpoint untouched."""
import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import (GPT2_VOCAB, TINY, join_single_rank_group, out_dir_of, succeeded, train, two_rank_run,
                      write_ds_config)
from gpt.train import checkpoint, engine as ds_engine, resume, universal
from gpt.commands.eval import main as evaluate_main
from gpt.commands.export import main as export_main
from gpt.commands.sample import main as sample_main
from gpt.console import BadInput
from gpt.model.model import GPT, GPTConfig
from gpt.train.engine import OptimizerSettings

STEPS = ["--max_steps", "3", "--total_batch_tokens", "512", "--save_every", "3"]  # one checkpoint: step_00000002
TAG = "step_00000002"
# fp32: GPT-2's vocabulary, for the console scripts' samples as GPT-2 text (the console scripts' test below)
RUNS = {f"universal_zero{stage}_fp32": two_rank_run("--data", "{small_vocab_dir}", *TINY, *GPT2_VOCAB, *STEPS,
                                                    ds_config=dict(stage=stage, precision="fp32"))
        for stage in (1, 2)} | {
       f"universal_zero{stage}_bf16": two_rank_run("--data", "{small_vocab_dir}", *TINY, *STEPS,
                                                   ds_config=dict(stage=stage))  # zero1_bf16.json's, stage changed
       for stage in (1, 2)}
uses_runs = pytest.mark.two_rank_runs(RUNS)


def saved_step(two_rank_runs, name, tmp_path):
    """A copy of the run's checkpoint (without a universal form other tests made beside it)."""
    _, proc = succeeded(two_rank_runs[name])
    copy = tmp_path / name / TAG
    shutil.copytree(out_dir_of(proc) / "checkpoints" / TAG, copy,
                    ignore=shutil.ignore_patterns(checkpoint.UNIVERSAL, checkpoint.UNIVERSAL_TEMPORARY))
    return copy


def contents(directory):
    """Every file under directory: name -> (size, mtime, sha256); a change to any shows."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns,
                                            hashlib.sha256(p.read_bytes()).digest())
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def shards(step_dir):
    """Each saving rank's ZeRO optimizer state dict, in rank order."""
    return [torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"]
            for f in sorted(step_dir.glob("*zero_pp_rank_*_optim_states.pt"))]


def gathered(rank_states, name, key):
    """The whole flat tensor of parameter `name`'s fp32 master weight ("fp32") or Adam moment (exp_avg,
    exp_avg_sq), gathered from the ranks' partitions: each rank's file says which slice of its flat partition holds
    which part of the parameter (param_slice_mappings), and a parameter's parts follow rank order."""
    pieces = []
    for state in rank_states:
        for group, mapping in enumerate(state["param_slice_mappings"]):
            if name in mapping:
                flat = (state["single_partition_of_fp32_groups"][group] if key == "fp32"
                        else state["base_optimizer_state"]["state"][group][key])
                pieces.append(flat.narrow(0, mapping[name].start, mapping[name].numel))
    return torch.cat(pieces), len(pieces)


def one_rank_engine(step_dir, tmp_path, stage, precision, **ds_config):
    """A 1-rank engine for the checkpoint's model, built as the trainer builds one (gpt.train.engine.initialize), with load_universal set."""
    join_single_rank_group()
    run = resume.read_run_config(step_dir)
    args = run["args"]
    config = json.loads(Path(write_ds_config(tmp_path / "load.json", stage=stage, precision=precision,
                                             **ds_config)).read_text())
    config["checkpoint"] = {"load_universal": True}
    model = GPT(GPTConfig(**run["model"]))
    optimizer = OptimizerSettings(lr=args["lr"], weight_decay=args["weight_decay"], warmup_steps=args["warmup_steps"],
                                  max_steps=args["max_steps"], min_lr_ratio=args["min_lr_ratio"])
    return ds_engine.initialize(model, config, args["micro_batch"], 1, optimizer), model


def check_loaded_state(engine, model, step_dir):
    """The engine's fp32 master weights, exp_avg and exp_avg_sq are the saving ranks' shards gathered, exactly; its
    16-bit weights (or fp32 ones) those masters; Adam's step count, the lr scheduler, global and skipped steps the
    checkpoint's."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    rank_states = shards(step_dir)
    split = 0
    for name, param in model.named_parameters():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            expected, parts = gathered(rank_states, name, key)
            split = max(split, parts)
            loaded = safe_get_full_fp32_param(param) if key == "fp32" else safe_get_full_optimizer_state(param, key)
            assert loaded.dtype == torch.float32 and loaded.numel() == param.numel() == expected.numel(), (name, key)
            assert (loaded.flatten() - expected).abs().max().item() == 0.0, (name, key)
        assert torch.equal(param.data, safe_get_full_fp32_param(param).to(param.dtype)), name
    assert split == 2  # some parameter was split across the two ranks: the gathering was put to the test
    saved_adam_steps = {int(state["base_optimizer_state"]["state"][group]["step"]) for state in rank_states
                        for group in state["base_optimizer_state"]["state"]}
    assert {int(state["step"]) for state in engine.optimizer.optimizer.state.values()} == saved_adam_steps == {3}
    for group, saved_group in zip(engine.optimizer.param_groups, rank_states[0]["base_optimizer_state"]["param_groups"],
                                  strict=True):  # lr, betas, eps, weight decay...
        assert all(group[k] == v for k, v in saved_group.items() if k != "params"), saved_group
    saved = torch.load(step_dir / checkpoint.MODEL_STATES, map_location="cpu", weights_only=False)
    assert (engine.global_steps, engine.skipped_steps) == (saved["global_steps"], saved["skipped_steps"]) == (3, 0)
    assert engine.lr_scheduler.state_dict() == saved["lr_scheduler"] and engine.lr_scheduler.last_epoch == 3


def train_one_step(engine, model):
    """The loaded engine trains on: one step, a finite loss, the weights move."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    _, loss = engine(x, x)
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss) and any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@uses_runs
@pytest.mark.parametrize("stage", [1, 2])
def test_a_two_rank_zero_checkpoint_converts_once_and_loads_on_one_rank_exactly(two_rank_runs, tmp_path, stage,
                                                                              monkeypatch):
    step_dir = saved_step(two_rank_runs, f"universal_zero{stage}_fp32", tmp_path)
    before = contents(step_dir)
    assert universal.convert_problem(step_dir) is None
    path = universal.universal_dir(step_dir)  # no --inject_missing_state: save() recorded universal_checkpoint_info
    assert path == step_dir / "universal" and universal.is_universal(path)
    assert contents(step_dir) == {**before, **{f"universal/{k}": v for k, v in contents(path).items()}}  # only added
    assert checkpoint.file_sizes(step_dir) == json.loads((step_dir / "complete.json").read_text())["files"]
    assert checkpoint.damage(step_dir) is None

    from deepspeed.checkpoint import ds_to_universal
    monkeypatch.setattr(ds_to_universal, "main", lambda args: pytest.fail("converted a second time"))
    made = contents(path), os.stat(path).st_ino, os.stat(path).st_mtime_ns
    assert universal.universal_dir(step_dir) == path
    assert (contents(path), os.stat(path).st_ino, os.stat(path).st_mtime_ns) == made

    from_universal, config = universal.read_weights(path)
    from_step, step_config = universal.read_weights(step_dir)  # DeepSpeed's zero_to_fp32 reader
    assert config == step_config and from_universal.keys() == from_step.keys()
    assert all(torch.equal(from_universal[k], from_step[k]) for k in from_step)
    assert from_universal["lm_head.weight"] is from_universal["transformer.wte.weight"]

    engine, model = one_rank_engine(step_dir, tmp_path, stage, "fp32")
    client_state = universal.load(engine, step_dir)
    assert client_state["step"] == 2 and client_state["run_config"] == resume.read_run_config(step_dir)
    assert client_state["loader"]["batch"] == 3  # the data position as saved: any world size continues it
    check_loaded_state(engine, model, step_dir)
    assert all(torch.equal(v, from_step[k]) for k, v in model.state_dict().items())  # fp32: the weights are the masters
    train_one_step(engine, model)
    engine.destroy()


@uses_runs
@pytest.mark.parametrize("saved_stage,loaded_stage,optimizers", [
    (1, 2, ("BF16_Optimizer", "DeepSpeedZeroOptimizer")), (2, 1, ("DeepSpeedZeroOptimizer", "BF16_Optimizer"))])
def test_bf16_checkpoints_move_between_bf16_optimizer_and_zero_optimizer(two_rank_runs, tmp_path, saved_stage,
                                                                         loaded_stage, optimizers):
    """bf16 ZeRO-1 with fp32 accumulation runs DeepSpeed's BF16_Optimizer, ZeRO-2 its DeepSpeedZeroOptimizer (both
    write bf16_zero_pp_rank_* files): a universal checkpoint of either loads into the other, exactly."""
    name = f"universal_zero{saved_stage}_bf16"
    step_dir = saved_step(two_rank_runs, name, tmp_path)
    assert f"{optimizers[0]} over" in two_rank_runs[name][1].stdout  # the saving run's, as its log says
    universal.universal_dir(step_dir)
    engine, model = one_rank_engine(step_dir, tmp_path, loaded_stage, "bf16")
    assert type(engine.optimizer).__name__ == optimizers[1] and next(model.parameters()).dtype == torch.bfloat16
    assert universal.load(engine, step_dir)["step"] == 2
    check_loaded_state(engine, model, step_dir)
    train_one_step(engine, model)
    engine.destroy()


@uses_runs
def test_the_weights_of_a_bf16_optimizer_checkpoint_are_its_fp32_masters(two_rank_runs, tmp_path, monkeypatch, capsys):
    """zero1_bf16.json (BF16_Optimizer), which DeepSpeed's zero_to_fp32 refuses: read_weights (gpt-export, gpt-eval,
    gpt-sample) reads the fp32 master weights through the step's universal form, not the module's bf16 copy; where
    that form cannot be made, the bf16 weights with a warning."""
    step_dir = saved_step(two_rank_runs, "universal_zero1_bf16", tmp_path)
    module = torch.load(step_dir / checkpoint.MODEL_STATES, map_location="cpu", weights_only=False)["module"]
    masters, _ = universal.read_weights(step_dir)
    assert (step_dir / "universal").is_dir()  # made, and kept for a resume
    expected = checkpoint.read_fp32_weights(step_dir / "universal")  # its lm_head.weight: the module's bf16 copy
    assert all(torch.equal(masters[k], expected[k]) for k in expected if k != "lm_head.weight")
    assert masters["lm_head.weight"] is masters["transformer.wte.weight"]  # tied, as in the model
    assert any(not torch.equal(masters[k], module[k].float()) for k in module)  # not the bf16 copy
    assert all(torch.equal(masters[k].bfloat16(), module[k]) for k in module)  # whose rounding it is

    shutil.rmtree(step_dir / "universal")
    capsys.readouterr()  # zero_to_fp32's and the converter's progress
    monkeypatch.setattr(universal, "convert_problem", lambda step: f"{step}: not writable, and its universal form is "
                                                                 f"made inside it")
    fallback, _ = universal.read_weights(step_dir)
    assert all(torch.equal(fallback[k], module[k].float()) for k in module)
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"warning: {step_dir}: cannot convert it to a universal checkpoint: not writable, and its universal form is "
        f"made inside it; reading the module's bf16 weights instead of the fp32 master weights")


@pytest.mark.slow
def test_fp16_dynamic_loss_scale_comes_back(tmp_path, small_vocab_dir, monkeypatch):
    """fp16 under ZeRO: the loss scaler (scale, iteration counters, last overflow) is restored with the optimizer's
    global state, and the skipped steps with the engine's. A 1-rank checkpoint (the conversion takes any world size)
    whose scale grew twice and fell once."""
    from deepspeed.accelerator import get_accelerator

    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2, "hysteresis": 1,
            "min_loss_scale": 1}
    config = write_ds_config(tmp_path / "fp16.json", precision="fp32", fp16=fp16)
    train(tmp_path, small_vocab_dir, *TINY, "--max_steps", "5", "--total_batch_tokens", "256",
          "--ds_config", config, "--cpu_fp16")
    step_dir = tmp_path / "checkpoints" / "step_00000004"
    universal.universal_dir(step_dir)
    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: True, raising=False)  # as --cpu_fp16 does
    engine, model = one_rank_engine(step_dir, tmp_path, 1, "fp32", fp16={**fp16, "initial_scale_power": 10})
    assert type(engine.optimizer).__name__ == "DeepSpeedZeroOptimizer" and engine.optimizer.cur_scale == 1024
    universal.load(engine, step_dir)
    (rank_state,) = shards(step_dir)
    saved = torch.load(step_dir / checkpoint.MODEL_STATES, map_location="cpu", weights_only=False)
    assert vars(engine.optimizer.loss_scaler) == vars(rank_state["loss_scaler"])
    assert engine.optimizer.cur_scale == rank_state["loss_scaler"].cur_scale != 1024
    assert rank_state["loss_scaler"].cur_iter == 5 and engine.optimizer.dynamic_loss_scale
    assert (engine.global_steps, engine.skipped_steps) == (saved["global_steps"], saved["skipped_steps"])
    engine.destroy()


@uses_runs
def test_what_cannot_be_converted_is_one_line_and_the_checkpoint_stays_untouched(two_rank_runs, tmp_path,
                                                                                 monkeypatch):
    step_dir = saved_step(two_rank_runs, "universal_zero1_fp32", tmp_path)
    left = lambda: sorted(p.name for p in step_dir.iterdir() if p.name.startswith("universal"))  # noqa: E731

    # a garbled optimizer file: DeepSpeed's converter fails midway
    optim = step_dir / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.truncate(optim, optim.stat().st_size // 2)
    before = contents(step_dir)
    with pytest.raises(BadInput) as error:
        universal.universal_dir(step_dir)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{step_dir}: could not convert it to a universal checkpoint (")
    assert message.endswith("); the checkpoint is untouched")
    assert left() == [] and contents(step_dir) == before
    step_dir = saved_step(two_rank_runs, "universal_zero1_fp32", tmp_path / "whole")

    # the disk fills up midway: said so, the half-made universal form removed
    from deepspeed.checkpoint import ds_to_universal
    original = ds_to_universal._save_checkpoint
    written = []

    def fill_up(path, state):
        if len(written) == 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        written.append(path)
        original(path, state)
    with monkeypatch.context() as patch:
        patch.setattr(ds_to_universal, "_save_checkpoint", fill_up)
        before = contents(step_dir)
        with pytest.raises(BadInput) as error:
            universal.universal_dir(step_dir)
    assert str(error.value) == (f"{step_dir}: could not convert it to a universal checkpoint (no space left on the "
                                f"device); the checkpoint is untouched")
    assert written and left() == [] and contents(step_dir) == before

    # found up front, before anything is written: no room, no write access
    with monkeypatch.context() as patch:
        patch.setattr(universal, "free_bytes", lambda path: 10**6)
        problem = universal.convert_problem(step_dir)
        assert problem.startswith(f"{step_dir}: no space left on the device for its universal form: 1.0 MB free, "
                                  f"the conversion needs ")
        with pytest.raises(BadInput, match="cannot convert it to a universal checkpoint: no space"):
            universal.universal_dir(step_dir)
    with monkeypatch.context() as patch:
        patch.setattr(os, "access", lambda path, mode: Path(path) != step_dir)
        assert universal.convert_problem(step_dir) == (f"{step_dir}: not writable, and its universal form is made "
                                                       f"inside it")
    assert left() == []

    # saved before checkpoints recorded universal_checkpoint_info
    model_states = step_dir / checkpoint.MODEL_STATES
    state = torch.load(model_states, map_location="cpu", weights_only=False)
    del state["universal_checkpoint_info"]
    torch.save(state, model_states)
    assert universal.convert_problem(step_dir) == (
        f"{step_dir}: saved before checkpoints recorded universal_checkpoint_info, which DeepSpeed's converter "
        f"requires (`python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state` can convert it by hand)")
    with pytest.raises(BadInput, match="cannot convert it to a universal checkpoint: saved before"):
        universal.universal_dir(step_dir)
    assert left() == []

    # ZeRO stage 0: no optimizer partitions to convert
    for optim in step_dir.glob("*_optim_states.pt"):
        optim.unlink()
    assert universal.convert_problem(step_dir) == (
        f"{step_dir}: a ZeRO stage 0 checkpoint (no zero_pp_rank_*_optim_states.pt): its optimizer state is whole "
        f"in mp_rank_00_model_states.pt, with nothing to convert")


@uses_runs
def test_the_console_scripts_read_a_universal_checkpoint_as_they_read_its_step(two_rank_runs, tmp_path,
                                                                              small_vocab_dir, capsys):
    """gpt-export, gpt-eval and gpt-sample on step_N/universal give what they give on step_N; also a copy of the
    universal form away from its step (the model's shape then from its model-states file). The trainer's --resume
    takes the step, not its universal form."""
    step_dir = saved_step(two_rank_runs, "universal_zero2_fp32", tmp_path)
    path = universal.universal_dir(step_dir)
    moved = tmp_path / "moved"
    shutil.copytree(path, moved)
    capsys.readouterr()

    exports = {}
    for name, source in (("step", step_dir), ("universal", path), ("moved", moved)):
        export_main([str(source), "--out_dir", str(tmp_path / f"hf_{name}")])
        exports[name] = [(tmp_path / f"hf_{name}" / file).read_bytes() for file in ("config.json", "model.safetensors")]
    assert exports["universal"] == exports["step"] == exports["moved"]

    def script_output(main, source, *argv):
        main(["--checkpoint", str(source), "--device", "cpu", *argv])
        return capsys.readouterr().out

    evaluations = {name: {k: v for k, v in json.loads(script_output(
        evaluate_main, source, "--data", str(small_vocab_dir), "--seq_len", "64", "--val_tokens", "1024", "--batch",
        "4", "--json").splitlines()[-1]).items() if not k.endswith("_per_s")} for name, source in (
        ("step", step_dir), ("universal", path))}
    assert evaluations["universal"] == evaluations["step"] and "val_loss" in evaluations["step"]
    samples = {name: script_output(sample_main, source, "--max_new_tokens", "8", "--num_samples", "2")
               for name, source in (("step", step_dir), ("universal", path), ("moved", moved))}
    assert samples["universal"] == samples["step"] == samples["moved"] and samples["step"].count("--- sample") == 2

    state = torch.load(moved / checkpoint.MODEL_STATES, map_location="cpu", weights_only=False)
    del state["run_config"]  # as in a checkpoint saved before it was recorded
    torch.save(state, moved / checkpoint.MODEL_STATES)
    with pytest.raises(SystemExit) as exit_info:
        sample_main(["--checkpoint", str(moved)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {moved}: a universal checkpoint whose model shape is unknown: no run_config.json beside it in "
        f"{tmp_path}, and its mp_rank_00_model_states.pt records none (saved before checkpoints did): copy the "
        f"run_config.json of the checkpoint it was made from into {tmp_path}")
    with pytest.raises(BadInput) as error:
        resume.find_checkpoint(str(path), tmp_path / "run")
    assert str(error.value) == (f"{path}: a universal checkpoint: --resume takes the checkpoint it was made from, "
                                f"{step_dir}")
