"""Whether and how a checkpoint continues this run: which one (--resume auto, or a path), its run_config.json read
and checked as save() wrote it, the resume refused up front where the weights, the data position, the train shards
or the directory it writes to would not fit, and how it loads (resume_kind). preflight asks find_resume, then
plan_resume; gpt-eval and gpt-export find and read checkpoints here too."""
import json
import os
from pathlib import Path

from gpt.config.settings import COOLDOWN_SHAPES, LR_SCHEDULES
from gpt.console import BadInput, regular_file_problem, warn
from gpt.data.shards import data_changes, describe_changes
from gpt.train.checkpoint import (CHECKPOINTS, COMPLETE, FORMAT, MODEL_STATES, RUN_CONFIG, SHAPE_KEYS, TAG_PATTERN,
                                  checkpoint_dir, complete_tags, damage, is_universal, json_kind, kept_because,
                                  model_states, newest_intact, unverified)
from gpt.train.out_dir import check_fresh_out_dir


def find_resume(settings):
    """(the checkpoint --resume names, its run_config), (None, None) for a fresh start; --init_from checked
    against it. Raises BadInput."""
    if not settings.checkpoint.resume:
        return None, None
    resume_from = find_checkpoint(settings.checkpoint.resume, settings.run.out_dir)
    saved = read_run_config(resume_from) if resume_from else None
    if saved:
        check_init_from(resume_from, saved, settings.checkpoint.init_from)
    return resume_from, saved


def plan_resume(resume_from, saved, current, settings):
    """How resume_from (its run_config `saved`) loads into the run `current` describes (resume_kind), once every
    check that refuses it passed: the weights and the data position fit, the train shards are the same, the run
    would overwrite no later checkpoint, and steps are left. Raises BadInput."""
    check_compatible(resume_from, saved, current)
    check_same_data(resume_from, saved, current, settings.data.dir, settings.data.reset_data_position)
    check_resume_target(resume_from, settings.run.out_dir)
    check_steps_left(resume_from, settings.optimizer.max_steps)
    return resume_kind(saved, current)


def find_checkpoint(resume, out_dir):
    """The checkpoint directory to resume from, or None for a fresh start ('auto' with nothing saved).
    `resume` is 'auto' (the newest intact one under out_dir) or a path to a checkpoint or its parent; with
    out_dir None (the console scripts) it is always a path. Its bytes are checked against the checksums of its
    save (checkpoint.damage); one saved before checkpoints recorded them is said to be unverified."""
    found = _find_checkpoint(resume, out_dir)
    if found is not None and (found / COMPLETE).exists() and unverified(found):
        warn(f"{found}: saved before checkpoints recorded their files' checksums: its bytes are not verified")
    return found


def _find_checkpoint(resume, out_dir):
    if resume == "auto" and out_dir is not None:  # without a run's out_dir (gpt-export, gpt-eval) 'auto' is a path
        return newest_intact(checkpoint_dir(out_dir))
    path = Path(resume)
    if is_universal(path):  # STEP/universal, or one made with `python -m deepspeed.checkpoint.ds_to_universal`
        if out_dir is not None:
            step = path.parent if (path.parent / COMPLETE).exists() else None
            raise BadInput(f"{path}: a universal checkpoint: --resume takes "
                           + (f"the checkpoint it was made from, {step}" if step else
                              "one of this trainer's checkpoints (a step_NNNNNNNN directory)"))
        return path  # the console scripts read its weights (read_weights)
    if (path / COMPLETE).exists():
        problem = damage(path, contents=True)
        if problem:
            raise BadInput(f"{path}: damaged checkpoint ({problem}); give its parent directory to take "
                           f"the newest intact one")
        return path
    for parent in (path, path / CHECKPOINTS):
        found = newest_intact(parent)
        if found:
            return found
    if path.is_dir() and TAG_PATTERN.match(path.name):
        raise BadInput(f"{path}: incomplete checkpoint (no {COMPLETE}: the save was interrupted)")
    raise BadInput(f"{path}: {'no complete checkpoint found' if path.exists() else 'not found'}")


def check_resume_target(resume_from, out_dir):
    """Where the resumed run will write must hold nothing it would overwrite or mix with: resuming an
    older step of out_dir's own run would overwrite its later checkpoints step by step and prune the new
    ones in their favour (damaged later steps are set aside instead); resuming another directory's
    checkpoint into an out_dir holding a run of its own would do the same to that run."""
    ckpt_dir = checkpoint_dir(out_dir)
    if not ckpt_dir.is_dir() or Path(resume_from).parent.resolve() != ckpt_dir.resolve():
        return check_fresh_out_dir(out_dir)
    later = [t for t in complete_tags(ckpt_dir) if t > Path(resume_from).name
             and not damage(ckpt_dir / t, contents=True)]
    if later and kept_because(resume_from):  # a wsd run's cooldown start: extended elsewhere, its cooldown kept
        raise BadInput(f"--resume {resume_from}: the checkpoint at the cooldown's start of the run in {out_dir}, "
                       f"whose cooldown's checkpoints (up to {later[-1]}) this run would overwrite: extend it into a "
                       f"new --out_dir")
    if later:
        raise BadInput(f"--resume {resume_from}: {ckpt_dir} holds later checkpoints (up to {later[-1]}) "
                       f"that this run would overwrite: resume it into another --out_dir")


def saved_step(path):
    """The step after which a complete checkpoint was saved."""
    return json.loads((Path(path) / COMPLETE).read_text())["step"]


def check_steps_left(resume_from, max_steps):
    """A resume with nothing left to train would print 'resumed', train nothing and exit 0."""
    step = saved_step(resume_from)
    if max_steps <= step + 1:
        raise BadInput(f"--max_steps {max_steps}: nothing left to train: {resume_from} was saved after step "
                       f"{step}, and --max_steps {max_steps} ends after step {max_steps - 1}; raise --max_steps "
                       f"to train on")


# run_config.json's keys read by the trainer's resume and the console scripts, and what each must hold
RUN_CONFIG_ARGS = {"warmup_steps": (int,), "micro_batch": (int,), "seq_len": (int,), "seed": (int,),
                   "max_steps": (int,), "lr": (int, float), "min_lr_ratio": (int, float)}
# and those a checkpoint saved before they existed lacks (its run was cosine: gpt.train.trainer SCHEDULE_FLAGS)
RUN_CONFIG_NAMES = {"lr_schedule": LR_SCHEDULES, "cooldown_shape": COOLDOWN_SHAPES}


def run_config_problems(run):
    """What in a parsed run_config.json is not as save() writes it, by dotted key (the first problem)."""
    if not isinstance(run, dict):
        return f"{json_kind(run)}, not a JSON object"
    if not isinstance(run.get("model"), dict):
        return f"'model' must be an object of the model's shape, got {json.dumps(run.get('model'))}"
    for key in SHAPE_KEYS:
        value = run["model"].get(key)
        if type(value) is not int or value <= 0:
            return f"model.{key} must be a positive whole number, got {json.dumps(value)}"
    extra = sorted(set(run["model"]) - set(SHAPE_KEYS))
    if extra:
        return f"model.{extra[0]}: unknown key (the model's shape is {', '.join(SHAPE_KEYS)})"
    if "format" in run and (type(run["format"]) is not int or not 1 <= run["format"] <= FORMAT):
        return f"format must be a checkpoint format this trainer reads (1 to {FORMAT}), got {json.dumps(run['format'])}"
    if type(run.get("world_size")) is not int or run["world_size"] <= 0:
        return f"world_size must be a positive whole number, got {json.dumps(run.get('world_size'))}"
    if run.get("precision") not in ("fp32", "bf16", "fp16"):
        return f"precision must be \"fp32\", \"bf16\" or \"fp16\", got {json.dumps(run.get('precision'))}"
    if type(run.get("zero_stage")) is not int or not 0 <= run["zero_stage"] <= 3:
        return f"zero_stage must be 0, 1, 2 or 3, got {json.dumps(run.get('zero_stage'))}"
    if not isinstance(run.get("args"), dict):
        return f"'args' must be an object of the run's flags, got {json.dumps(run.get('args'))}"
    for key, types in RUN_CONFIG_ARGS.items():
        value = run["args"].get(key)
        if type(value) not in types:
            return f"args.{key} must be a number, got {json.dumps(value)}"
    for key, allowed in RUN_CONFIG_NAMES.items():
        if key in run["args"] and run["args"][key] not in allowed:
            return f"args.{key} must be one of {', '.join(allowed)}, got {json.dumps(run['args'][key])}"
    if type(run["args"].get("cooldown_frac", 0.5)) not in (int, float):
        return f"args.cooldown_frac must be a number, got {json.dumps(run['args']['cooldown_frac'])}"
    return None


def read_run_config(path):
    """A checkpoint's run_config.json, checked to be as save() wrote it: BadInput naming the file and
    the key otherwise (an edited or foreign file used to raise a TypeError wherever it was read). For a universal
    checkpoint (gpt/train/universal.py), the one of the step it was made in, or else the one its model-states file
    records."""
    if is_universal(path):
        return read_universal_run_config(path)
    file = Path(path) / RUN_CONFIG
    problem = regular_file_problem(file)
    if problem:
        raise BadInput(problem)
    try:
        run = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: unreadable {RUN_CONFIG} ({e})") from None
    problem = run_config_problems(run)
    if problem:
        raise BadInput(f"{file}: {problem}")
    return run


def check_init_from(path, saved, init_from):
    """--init_from with a resume: the checkpoint's weights would replace --init_from's without a word. Allowed
    only when the checkpoint's run itself started from that directory (a relaunch with the same command)."""
    if not init_from:
        return
    started_from = saved["args"].get("init_from")
    same = started_from is not None and (str(started_from) == str(init_from) or (
        os.path.exists(started_from) and os.path.exists(init_from) and os.path.samefile(started_from, init_from)))
    if not same:
        raise BadInput(f"--init_from {init_from}: --resume continues {path}, whose weights would replace "
                       f"--init_from's (its run did not start from {init_from}): drop --init_from to continue "
                       f"that run, or --resume (and use a fresh --out_dir) to start from {init_from}")


def format_of(run):
    """A run_config's checkpoint format: FORMAT, or 1 for checkpoints saved before it was recorded."""
    return run.get("format", 1)


def resume_kind(saved, current):
    """How a checkpoint loads into this run (both run_configs):
    'exact'      the same world size and ZeRO stage: everything, each rank's RNG too;
    'universal'  another world size or ZeRO stage (1 <-> 2): ZeRO's optimizer partitions fit only the layout that
                 saved them, so the checkpoint is converted to DeepSpeed's universal form, which loads on any;
    'whole'      ZeRO 0 on another world size: its optimizer state is whole in the checkpoint and loads as it is;
    'weights'    another world size, saved before checkpoints recorded what a conversion needs: the weights only.
    The last three restore no RNG state (one per rank) and keep the data position (gpt/data/shards.py)."""
    if (saved["world_size"], saved["zero_stage"]) == (current["world_size"], current["zero_stage"]):
        return "exact"
    if format_of(saved) < FORMAT:
        return "weights"
    return "whole" if saved["zero_stage"] == 0 else "universal"


def check_compatible(path, saved, current):
    """Refuse a resume whose weights or data position would not fit this run, naming every mismatch."""
    problems = [f"{key} {saved['model'].get(key)} in the checkpoint, {current['model'][key]} now"
                for key in SHAPE_KEYS if saved["model"].get(key) != current["model"][key]]
    if saved.get("precision") != current.get("precision"):
        problems.append(f"precision {saved.get('precision')} in the checkpoint, {current.get('precision')} now")
    stages = {saved.get("zero_stage"), current.get("zero_stage")}
    if len(stages) > 1 and not (stages == {1, 2} and format_of(saved) >= FORMAT):
        problems.append(f"zero_stage {saved.get('zero_stage')} in the checkpoint, {current.get('zero_stage')} now" + (
            " (ZeRO 1 <-> 2 converts only checkpoints saved since they record what a conversion needs)"
            if stages == {1, 2} else " (only ZeRO 1 <-> 2 converts)"))
    if not current["args"].get("reset_data_position"):
        order = [f"--{key} {saved['args'].get(key)} in the checkpoint, {current['args'][key]} now"
                 for key in ("seq_len", "seed") if saved["args"].get(key) != current["args"][key]]
        if order:
            problems.append("; ".join(order) + " (the data position depends on them: --reset_data_position starts the "
                            "next epoch in the new order)")
    if problems:
        raise BadInput(f"{path}: cannot resume: " + "; ".join(problems))


def check_same_data(path, saved, current, data_dir, reset_position):
    """A resume continues at the saved data position, which means the same tokens only in the same train shards:
    refuse one whose shards changed since the save (run_config.json records their fingerprints), or with
    reset_position (--reset_data_position, the position restarts anyway) say what changed. Checkpoints saved
    before fingerprints were recorded: said, not checked."""
    if "data" not in saved:
        warn(f"{path}: saved before checkpoints recorded their shards' fingerprints: whether --data {data_dir} holds "
             f"the same train shards is not checked")
        return
    changes = data_changes(saved["data"], current["data"])
    if changes and reset_position:
        warn(f"--data {data_dir}: the train shards changed since {path} was saved ({describe_changes(changes)}); "
             f"--reset_data_position: training continues from the start of the next epoch")
    elif changes:
        raise BadInput(f"--data {data_dir}: the train shards changed since {path} was saved "
                       f"({describe_changes(changes)}): its data position would point into other data; "
                       f"restore them, or resume with --reset_data_position (from the next epoch's start)")


def read_universal_run_config(path):
    """The run_config of a universal checkpoint: run_config.json of the directory holding it (our layout:
    step_N/universal), or else the one save() records in its mp_rank_00_model_states.pt (a copy moved away)."""
    path = Path(path)
    if os.path.lexists(path.parent / RUN_CONFIG):
        return read_run_config(path.parent)
    run = model_states(path).get("run_config")
    if run is None:
        raise BadInput(f"{path}: a universal checkpoint whose model shape is unknown: no {RUN_CONFIG} beside "
                       f"it in {path.parent}, and its {MODEL_STATES} records none (saved before checkpoints "
                       f"did): copy the {RUN_CONFIG} of the checkpoint it was made from into {path.parent}")
    problem = run_config_problems(run)
    if problem:
        raise BadInput(f"{path / MODEL_STATES}: its run_config: {problem}")
    return run
