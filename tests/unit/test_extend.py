"""A wsd run extended in its own --out_dir, on checkpoint directories as save() lays them out (the files' contents
stand-ins): its finished cooldown moved aside whole, a move cut short finished by the same command, --resume auto then
finding the cooldown's start, and every other resume into the run refused as before (the runs themselves:
tests/integration/test_schedule_runs.py)."""
import errno
import json
import os
from pathlib import Path

import pytest

from gpt.console import BadInput
from gpt.train import extend, resume
from gpt.train.checkpoint import CHECKPOINTS, COMPLETE, LATEST, RUN_CONFIG, checkpoint_dir, tag_for

KEPT = "the cooldown's start"


def saved(out_dir, step, max_steps, kept=None):
    """A complete checkpoint after `step` of a run with --max_steps max_steps."""
    path = checkpoint_dir(out_dir) / tag_for(step)
    path.mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(os.urandom(256))
    (path / RUN_CONFIG).write_text(json.dumps({"args": {"max_steps": max_steps}}))
    (path / COMPLETE).write_text(json.dumps({"step": step} | ({"kept": kept} if kept else {})))
    return path


@pytest.fixture
def run(tmp_path):
    """An 8-step wsd run whose cooldown starts after step 3: step_3 (kept), step_5 and step_7, `latest` naming
    step_7, metrics.jsonl; and an interrupted save's step_00000006 (no complete.json)."""
    start = saved(tmp_path, 3, 8, kept=KEPT)
    saved(tmp_path, 5, 8)
    saved(tmp_path, 7, 8)
    (checkpoint_dir(tmp_path) / tag_for(6)).mkdir()
    (checkpoint_dir(tmp_path) / LATEST).write_text(tag_for(7))
    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": {9 - s / 8}}}\n' for s in range(8)))
    return tmp_path, start


def files_under(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def test_an_extension_in_place_moves_the_finished_cooldown_aside_whole_and_auto_then_finds_its_start(run, capsys):
    out_dir, start = run
    cooldown_files = {f"{CHECKPOINTS}/{name}": data for name, data in files_under(checkpoint_dir(out_dir)).items()
                      if not name.startswith(start.name)}
    metrics = (out_dir / "metrics.jsonl").read_bytes()
    cooldown = resume.check_resume_target(start, out_dir, 12)
    assert (cooldown.tags, cooldown.archive) == ((tag_for(5), tag_for(6), tag_for(7)), out_dir / "cooldowns/to_step_8")
    extend.move_aside(cooldown)
    assert capsys.readouterr().out == (f"--resume {start}: extending the run in {out_dir}: its cooldown to step 8 "
                                       f"(checkpoints up to step_00000007) moved aside to "
                                       f"{out_dir / 'cooldowns/to_step_8'}, with a copy of metrics.jsonl as it was\n")
    assert files_under(cooldown.archive) == cooldown_files | {"metrics.jsonl": metrics}
    assert sorted(p.name for p in checkpoint_dir(out_dir).iterdir()) == [start.name]
    assert resume.find_checkpoint("auto", out_dir) == start  # not an archived one
    assert resume.check_resume_target(start, out_dir, 12) is None  # nothing later: a plain resume now


def test_a_move_cut_short_leaves_what_moved_moved_and_the_same_command_moves_the_rest(run, monkeypatch):
    out_dir, start = run
    before = files_under(out_dir)
    renames = []

    def rename_twice(source, target):
        if len(renames) == 2:
            raise OSError(errno.EIO, "Input/output error")
        renames.append(Path(source).name)
        os.replace(source, target)

    monkeypatch.setattr(extend.os, "rename", rename_twice)
    with pytest.raises(BadInput) as refused:
        extend.move_aside(resume.check_resume_target(start, out_dir, 12))
    archive = out_dir / "cooldowns/to_step_8"
    assert str(refused.value) == (f"--resume {start}: moving the run's cooldown aside to {archive} failed ([Errno 5] "
                                  f"Input/output error); what moved stays there: run the same command again to move "
                                  f"the rest")
    assert renames == [LATEST, tag_for(5)]
    monkeypatch.undo()
    cooldown = resume.check_resume_target(start, out_dir, 12)
    assert cooldown.tags == (tag_for(6), tag_for(7))
    extend.move_aside(cooldown)
    moved = {name.removeprefix("cooldowns/to_step_8/"): data for name, data in files_under(out_dir).items()}
    assert moved == before  # every file where it was, or in the archive, byte for byte


def test_the_same_cooldown_again_into_the_runs_own_out_dir_is_refused(run):
    out_dir, start = run
    with pytest.raises(BadInput) as refused:
        resume.check_resume_target(start, out_dir, 8)
    assert str(refused.value) == (f"--resume {start}: the checkpoint at the cooldown's start of the run in {out_dir}, "
                                  f"whose cooldown's checkpoints (up to step_00000007) this run would overwrite: "
                                  f"extend it with a --max_steps larger than its 8 (its cooldown is then moved to "
                                  f"{out_dir / 'cooldowns/to_step_8'}), or into a new --out_dir")


@pytest.mark.parametrize("blocked", ["a file", "a step"])
def test_an_extension_whose_cooldown_cannot_move_aside_is_refused_before_launch(run, blocked):
    out_dir, start = run
    archive = out_dir / "cooldowns/to_step_8"
    if blocked == "a file":
        (out_dir / "cooldowns").write_text("notes")
        problem = f"{out_dir / 'cooldowns'}: a file, not a directory"
    else:
        (archive / "checkpoints" / tag_for(7)).mkdir(parents=True)
        problem = f"{archive / 'checkpoints'} already holds step_00000007"
    with pytest.raises(BadInput) as refused:
        resume.check_resume_target(start, out_dir, 12)
    assert str(refused.value) == (f"--resume {start}: where the run's cooldown moves aside, {problem}: move it away, "
                                  f"or extend the run into a new --out_dir")


@pytest.mark.parametrize("later", ["of an extension", "not from a cooldown's start"])
def test_every_other_resume_into_a_run_with_later_checkpoints_is_refused_as_before(run, later):
    """Later checkpoints saved by another --max_steps (an extension's, say, resumed again from the first cooldown's
    start) are not that cooldown; a checkpoint not kept at a cooldown's start extends nothing."""
    out_dir, start = run
    if later == "of an extension":
        saved(out_dir, 9, 12)
    else:
        start = checkpoint_dir(out_dir) / tag_for(5)
    with pytest.raises(BadInput) as refused:
        resume.check_resume_target(start, out_dir, 12)
    assert str(refused.value) == (f"--resume {start}: {checkpoint_dir(out_dir)} holds later checkpoints (up to "
                                  f"{tag_for(9 if later == 'of an extension' else 7)}) that this run would overwrite: "
                                  f"resume it into another --out_dir")


def test_an_extension_whose_cooldown_would_move_into_another_run_through_a_link_is_refused(run, tmp_path_factory):
    out_dir, start = run
    other = tmp_path_factory.mktemp("other")
    (other / "metrics.jsonl").write_text('{"step": 0, "loss": 9.0}\n')
    (out_dir / "cooldowns").symlink_to(other)
    archive = out_dir / "cooldowns/to_step_8"
    with pytest.raises(BadInput) as refused:
        resume.check_resume_target(start, out_dir, 12)
    assert str(refused.value) == (f"{archive} leads through a symbolic link to {other / 'to_step_8'}, among the files "
                                  f"of the run in {other} (where the run's cooldown would move aside): this run would "
                                  f"write into that run's; remove the link, or use another --out_dir")
