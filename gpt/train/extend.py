"""Extending a wsd run in its own --out_dir. Resumed from the checkpoint it kept where its cooldown starts, with a
larger --max_steps, the run would overwrite its finished cooldown's checkpoints step by step, and drop its
metrics.jsonl records of those steps (gpt/train/metrics.py continue_from). So rank 0, under the run lock and before the
run writes anything else, moves them aside into OUT_DIR/cooldowns/to_step_N/ (N: the finished run's --max_steps):
checkpoints/ with every step directory after the resumed one (and `latest` when it names one of them), and a copy of
metrics.jsonl as it was. --resume auto never looks there (only OUT_DIR/checkpoints/step_*). Each directory moves with
one rename, atomic on one file system: a crash leaves some moved and some not, and the same command again moves the
rest. Whether a resume is such an extension, and what else refuses one: gpt/train/resume.py check_resume_target."""
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpt.console import BadInput, atomic_write, directory_problem, nearest_existing, say
from gpt.train.checkpoint import CHECKPOINTS, LATEST, RUN_CONFIG, TAG_PATTERN, checkpoint_dir, complete_tags, \
    kept_because
from gpt.train.metrics import METRICS
from gpt.train.out_dir import foreign_link_problem

COOLDOWNS = "cooldowns"


@dataclass(frozen=True)
class Cooldown:
    """A finished cooldown in out_dir: the step directories after `resumed` (its start), oldest first, saved by the
    run that had --max_steps `end`."""
    out_dir: Path
    resumed: Path
    tags: tuple
    end: int

    @property
    def archive(self):
        return Path(self.out_dir) / COOLDOWNS / f"to_step_{self.end}"


def max_steps_of(path):
    """The --max_steps of the run that saved the checkpoint at path, or None where its run_config.json is unreadable
    (or gone: rank 0 may be moving it while another rank looks)."""
    try:
        return json.loads((Path(path) / RUN_CONFIG).read_text())["args"]["max_steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finished_cooldown(resume_from, out_dir):
    """The Cooldown resume_from starts, when it is the checkpoint a wsd run kept at its cooldown's start and out_dir's
    checkpoints/ holds complete ones after it saved by that same run (with its --max_steps); None otherwise (later
    checkpoints of another run, an extension's: not this cooldown). Its tags: every step directory after
    resume_from, complete or not."""
    resumed, ckpt_dir = Path(resume_from), checkpoint_dir(out_dir)
    end = max_steps_of(resumed)
    later = [tag for tag in complete_tags(ckpt_dir) if tag > resumed.name]
    if not (kept_because(resumed) and end and later) or any(max_steps_of(ckpt_dir / tag) not in (None, end)
                                                            for tag in later):
        return None
    tags = sorted(p.name for p in ckpt_dir.iterdir() if TAG_PATTERN.match(p.name) and p.name > resumed.name)
    return Cooldown(Path(out_dir), resumed, tuple(tags), end)


def check_extension(cooldown, max_steps):
    """A resume from a cooldown's start into its own out_dir extends the run only with a larger --max_steps (the
    same one runs that cooldown again: into a new --out_dir), and only where its checkpoints can move aside in one
    rename each: to a directory on the same file system, holding none of the same name, not linked into another run
    (gpt/runtime/links.py). Raises BadInput."""
    resumed, archive, ckpt_dir = cooldown.resumed, cooldown.archive, checkpoint_dir(cooldown.out_dir)
    if max_steps <= cooldown.end:
        raise BadInput(f"--resume {resumed}: the checkpoint at the cooldown's start of the run in {cooldown.out_dir}, "
                       f"whose cooldown's checkpoints (up to {cooldown.tags[-1]}) this run would overwrite: extend it "
                       f"with a --max_steps larger than its {cooldown.end} (its cooldown is then moved to {archive}), "
                       f"or into a new --out_dir")
    problem = next(filter(None, map(directory_problem, (archive.parent, archive, archive / CHECKPOINTS))), None)
    # in both places (in this order: another rank may look while rank 0 moves them, each in one rename)
    taken = [tag for tag in cooldown.tags if os.path.lexists(archive / CHECKPOINTS / tag)
             and os.path.lexists(ckpt_dir / tag)]
    if problem or taken:
        raise BadInput(f"--resume {resumed}: where the run's cooldown moves aside, " + (
            problem or f"{archive / CHECKPOINTS} already holds {taken[0]}") + ": move it away, or extend the run "
            f"into a new --out_dir")
    linked = foreign_link_problem(cooldown.out_dir, archive, "where the run's cooldown would move aside")
    if linked:
        raise BadInput(linked)
    if os.stat(ckpt_dir).st_dev != os.stat(nearest_existing(archive)).st_dev:
        raise BadInput(f"--resume {resumed}: {ckpt_dir} lies on another file system than {archive.parent} (through "
                       f"a symbolic link), so the run's cooldown cannot move aside there: extend the run into a new "
                       f"--out_dir")


def move_aside(cooldown):
    """Rank 0, under the run lock: the copy of metrics.jsonl first, then
    `latest` and each step directory, one rename each; said in one line. Raises BadInput when the file system fails
    it: what moved stays moved, and the same command moves the rest."""
    archive, ckpt_dir, out_dir = cooldown.archive, checkpoint_dir(cooldown.out_dir), Path(cooldown.out_dir)
    try:
        (archive / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        if (out_dir / METRICS).is_file():  # untouched until the run starts: a move cut short copies it again
            with atomic_write(archive / METRICS) as tmp:
                shutil.copyfile(out_dir / METRICS, tmp)
        latest = ckpt_dir / LATEST
        if latest.is_file() and latest.read_text().strip() in cooldown.tags:
            os.rename(latest, archive / CHECKPOINTS / LATEST)
        for tag in cooldown.tags:
            os.rename(ckpt_dir / tag, archive / CHECKPOINTS / tag)
    except OSError as e:
        raise BadInput(f"--resume {cooldown.resumed}: moving the run's cooldown aside to {archive} failed ({e}); "
                       f"what moved stays there: run the same command again to move the rest") from None
    say(f"--resume {cooldown.resumed}: extending the run in {out_dir}: its cooldown to step {cooldown.end} "
        f"(checkpoints up to {cooldown.tags[-1]}) moved aside to {archive}, with a copy of {METRICS} as it was")
