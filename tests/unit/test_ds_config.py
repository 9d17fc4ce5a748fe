"""The DeepSpeed JSON's reader (gpt/config/ds_config.py): duplicate keys at any depth, bytes that are not UTF-8, the
precision DeepSpeed will really train in (its `bfloat16` alias), and every shipped ds_configs/*.json passing
the check. (Bad JSON through the trainer: tests/integration/test_bad_input.py; through gpt-plan:
test_bad_input_scripts.py there.)"""
import json
from types import SimpleNamespace

import pytest

from common import REPO
from gpt.train import resume
from gpt.config import ds_checks, ds_config as dsc
from gpt.memory import plan
from gpt.commands import plan as plan_command
from train_ds import parse
from gpt.console import BadInput
from gpt.train.start import guard_problem, run_config_of, validate

FP32 = json.loads((REPO / "ds_configs" / "zero2_fp32.json").read_text())


def write(tmp_path, content, name="ds.json"):
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def test_duplicate_keys_are_named_at_every_depth(tmp_path):
    path = write(tmp_path, '{"zero_optimization": {"stage": 1, "stage": 2}, "steps_per_print": 1, '
                           '"optimizer": {"params": {"betas": [{"a": 1, "a": 2}]}}, "steps_per_print": 2}')
    with pytest.raises(BadInput) as error:
        dsc.load(path)
    assert str(error.value).splitlines() == [
        f"{path}: duplicate key 'steps_per_print' (DeepSpeed would use the last one, silently)",
        f"{path}: duplicate key 'zero_optimization.stage' (DeepSpeed would use the last one, silently)",
        f"{path}: duplicate key 'optimizer.params.betas[0].a' (DeepSpeed would use the last one, silently)"]


def test_a_config_without_duplicates_loads_as_plain_dicts(tmp_path):
    config = dsc.load(write(tmp_path, json.dumps(FP32)))
    assert config == FP32 and type(config) is dict and type(config["zero_optimization"]) is dict


def test_bytes_that_are_not_utf8_are_one_line_with_their_offset(tmp_path):
    path = write(tmp_path, b'{"steps_per_print": 1, "x": "caf\xe9"}')
    with pytest.raises(BadInput, match=r"^.*ds\.json: not UTF-8 text \(byte 0xe9 at offset 32\)$"):
        dsc.load(path)


PRECISION_BLOCKS = [({}, "fp32"), ({"bf16": {"enabled": True}}, "bf16"), ({"bfloat16": {"enabled": True}}, "bf16"),
                    ({"bf16": None, "bfloat16": {"enabled": True}}, "bf16"), ({"fp16": {"enabled": True}}, "fp16"),
                    ({"bfloat16": {"enabled": False}}, "fp32"), ({"fp16": {"enabled": False}}, "fp32")]


@pytest.mark.parametrize("blocks, expected", PRECISION_BLOCKS)
def test_precision_is_what_deepspeeds_own_parser_reads(blocks, expected):
    """precision() reads the JSON as DeepSpeed 0.19 does, its alias `bfloat16` included."""
    parsed = dsc.deepspeed_config(blocks)
    deepspeed = "fp16" if parsed.float16_config.enabled else "bf16" if parsed.bfloat16_config.enabled else "fp32"
    assert dsc.precision(blocks) == deepspeed == expected


def test_the_bfloat16_alias_is_bf16_for_the_run_config_the_checkpoint_check_and_the_planner(tmp_path, capsys,
                                                                                           shakespeare_dir, monkeypatch):
    monkeypatch.setattr(plan, "step_bytes", lambda *args: 0)  # the activations' CPU measurement: seconds, not needed
    alias = {**FP32, "bfloat16": {"enabled": True}}
    path = write(tmp_path, json.dumps(alias))
    settings = parse(["--ds_config", str(path), "--model", "tiny", "--seq_len", "64", "--micro_batch", "4",
                      "--total_batch_tokens", "1024", "--data", str(shakespeare_dir)])
    settings, ds_config, model_config, _ = validate(settings, 1)
    run_config = run_config_of(settings, ds_config, model_config, 1)
    assert run_config["precision"] == "bf16"
    bf16_run = run_config_of(settings, {**FP32, "bf16": {"enabled": True}}, model_config, 1)
    resume.check_compatible(tmp_path, bf16_run, run_config)  # a bf16 checkpoint resumes under the alias
    plan_command.main(["--model", "tiny", "--seq_len", "64", "--ds_config", str(path), "--gpu", "h100-80gb", "--json"])
    assert json.loads(capsys.readouterr().out)["precision"] == "bf16"


def test_grad_accum_dtype_spellings_deepspeed_takes_mean_the_same():
    assert [dsc.dtype_name(name) for name in ("fp32", "float32", "float", "torch.float32", "bfloat16", "half")] == [
        "fp32", "fp32", "fp32", "fp32", "bf16", "fp16"]
    assert plan.model_state_bytes(1000, "bf16", 1, 2, {"data_types": {"grad_accum_dtype": "float32"}}) == \
        plan.model_state_bytes(1000, "bf16", 1, 2, {"data_types": {"grad_accum_dtype": "fp32"}})


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "ds_configs").glob("*.json")))
def test_every_shipped_config_passes_the_check(name):
    path = REPO / "ds_configs" / name
    assert ds_checks.load_checked(path) == json.loads(path.read_text())


def test_problems_in_several_deepspeed_sections_are_all_named():
    """DeepSpeed's parser stops at its first error; each section is parsed apart, so each one is named."""
    config = {**FP32, "zero_optimization": {**FP32["zero_optimization"], "reduce_bucket_size": 0},
              "tensorboard": {"enabled": True, "output_pth": "tb"}}
    assert ds_checks.problems(config, "P") == [
        "P: zero_optimization.reduce_bucket_size: Input should be greater than 0 (got 0)",
        "P: unknown key 'tensorboard.output_pth' (did you mean 'output_path'?)"]


def test_a_shipped_config_is_found_from_any_directory_and_a_missing_one_is_still_one_line(tmp_path, monkeypatch):
    """The trainer's and gpt-plan's default, ds_configs/zero1_bf16.json, started outside the repository: the shipped
    file (a clone, an editable install). A name that is shipped nowhere is still not found, named as given."""
    monkeypatch.chdir(tmp_path)
    assert dsc.load("ds_configs/zero1_bf16.json") == json.loads((REPO / "ds_configs" / "zero1_bf16.json").read_text())
    with pytest.raises(BadInput, match=r"^ds_configs/nope\.json: DeepSpeed config not found$"):
        dsc.load("ds_configs/nope.json")


@pytest.mark.parametrize("name, change", [(path.name, {}) for path in sorted((REPO / "ds_configs").glob("*.json"))] + [
    *(("zero2_fp32.json", {"zero_optimization": {**FP32["zero_optimization"], "stage": stage}})
      for stage in (2.0, "2"))])
def test_what_the_checks_accept_round_trips_through_run_config_json(tmp_path, shakespeare_dir, name, change):
    """Every shipped JSON, and forms the checks accept as DeepSpeed does ("stage": 2.0, "2"): the run_config a
    checkpoint records, read back as a resume reads it, is what it was and resumes as itself (the stage-2.0 run through train, save and resume:
    tests/integration/test_checkpoint_runs.py)."""
    path = write(tmp_path, json.dumps({**json.loads((REPO / "ds_configs" / name).read_text()), **change}))
    settings = parse(["--ds_config", str(path), "--model", "tiny", "--seq_len", "64", "--micro_batch", "4",
                      "--total_batch_tokens", "1024", "--warmup_steps", "2", "--data", str(shakespeare_dir),
                      *(["--cpu_fp16"] if "fp16" in name else [])])  # fp16 on the CPU accelerator: for tests
    settings, ds_config, model_config, _ = validate(settings, 1)
    run_config = run_config_of(settings, ds_config, model_config, 1)
    written = tmp_path / "run_config.json"
    written.write_text(json.dumps(run_config, indent=1))
    read = resume.read_run_config(tmp_path)
    assert read == run_config and resume.resume_kind(read, run_config) == "exact"
    resume.check_compatible(tmp_path, read, run_config)


# What DeepSpeed's pydantic models (fp16, bf16, zero_optimization) read as JSON's true and false: pydantic's lax bool
SPELLINGS = {True: (True, "true", "True", 1, 1.0, "1", "yes", "on", "y", "t"),
             False: (False, "false", "FALSE", 0, 0.0, "0", "no", "off", "n", "f")}


@pytest.mark.parametrize("meaning, spelling", [(m, s) for m, spellings in SPELLINGS.items() for s in spellings])
def test_deepspeed_reads_these_spellings_as_true_and_false(meaning, spelling):
    assert dsc.fp16_config({"fp16": {"enabled": spelling}}).enabled is meaning
    zero = {"zero_optimization": {"stage": 2, "compute_grad_norm": spelling}}
    assert dsc.zero_config(zero).compute_grad_norm is meaning


# Booleans the checks read, each in a JSON where true and false get different answers (one of them a refusal)
BOOLEANS = {"fp16.fp16_master_weights_and_grads": {"fp16": {"enabled": True}},
            "bf16.bf16_master_weights_and_grads": {"bf16": {"enabled": True}},
            "bfloat16.bf16_master_weights_and_grads": {"bfloat16": {"enabled": True}},
            "zero_optimization.compute_grad_norm": {"zero_optimization": dict(FP32["zero_optimization"])},  # clipping 1
            "fp16.enabled": {"bf16": {"enabled": True}}, "bf16.enabled": {"fp16": {"enabled": True}}}


def with_value(config, dotted, value):
    section, key = dotted.split(".")
    return {**FP32, **config, section: {**config.get(section, {}), key: value}}


@pytest.mark.parametrize("dotted", BOOLEANS)
@pytest.mark.parametrize("meaning, spelling", [(m, s) for m, spellings in SPELLINGS.items() for s in spellings[1:4]])
def test_every_spelling_deepspeed_reads_as_true_or_false_gets_the_answer_that_value_gets(dotted, meaning, spelling):
    """"true", 1, "false", 0, ... are read as DeepSpeed reads them: 1 in the master-weights keys was accepted and
    failed in deepspeed.initialize, "true" an AssertionError from the check itself, 0 in compute_grad_norm passed."""
    answers = {value: ds_checks.problems(with_value(BOOLEANS[dotted], dotted, value), "P") for value in (True, False)}
    assert len(answers[True] + answers[False]) == 1  # one of true and false is refused, in one line
    assert ds_checks.problems(with_value(BOOLEANS[dotted], dotted, spelling), "P") == answers[meaning]


@pytest.mark.parametrize("spelling", [False, 0, "false", "off"])
def test_the_grad_norm_guard_is_refused_for_every_spelling_of_compute_grad_norm_false(spelling):
    settings = SimpleNamespace(optimizer=SimpleNamespace(skip_grad_z=3.0), run=SimpleNamespace(ds_config="P"))
    config = {**FP32, "gradient_clipping": 0, "zero_optimization": {"stage": 2, "compute_grad_norm": spelling}}
    assert ds_checks.problems(config, "P") == []
    assert guard_problem(settings, config) == (
        "--skip_grad_z 3: P sets zero_optimization.compute_grad_norm false, so DeepSpeed measures no gradient norm for "
        "it to act on: drop one of them")
    assert guard_problem(settings, {**config, "zero_optimization": {"stage": 2, "compute_grad_norm": "on"}}) is None


def test_an_error_deepspeed_raises_inside_a_check_is_one_line_naming_the_file_and_the_key(monkeypatch):
    """A block DeepSpeed's parser refuses where a check reads it (its asserts fire in DeepSpeedConfig's cross-block
    checks, which the per-key parse can miss) is one line, never a traceback: here an assert of its fp16 model."""
    from deepspeed.runtime import precision_config

    def refuses(ds_config):
        raise AssertionError("fp16 refused\nits traceback")
    monkeypatch.setattr(precision_config, "get_float16_config", refuses)
    assert ds_checks.problems(FP32, "P") == ["P: fp16: fp16 refused"]


def test_deepspeeds_own_assert_on_a_spelling_of_true_is_one_line_naming_the_key():
    """fp16_master_weights_and_grads "yes" with ZeRO 0: DeepSpeedConfig's assert, said in one line."""
    assert ds_checks.problems({**FP32, "fp16": {"enabled": True, "fp16_master_weights_and_grads": "yes"},
                               "zero_optimization": {"stage": 0}}, "P") == [
        "P: fp16: Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3."]
