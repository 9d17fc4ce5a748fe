"""Each setting is defined once, in gpt/config/settings.py: the command line is generated from the fields, with their
defaults, help and ranges."""
import dataclasses

import pytest

from train_ds import build_parser, parse
from gpt.model.model import PADDED_VOCAB_SIZE, PRESETS
from gpt.train.start import number_problems
from gpt.config.settings import Settings, ranges


def test_every_setting_is_a_flag_with_the_fields_default(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    flags = {action.dest for action in build_parser()._actions} - {"help"}
    assert flags == set(Settings().flags())
    assert parse([]) == Settings()


def test_the_command_line_is_flat_and_the_settings_are_in_sections():
    """Each flag lands in its section (--model and --data as model.preset and data.dir), and what a checkpoint
    records is the flat command line again, in the order of --help."""
    settings = parse(["--model", "tiny", "--data", "shards", "--lr", "0.001", "--val_every", "0", "--seed", "7"])
    assert (settings.model.preset, settings.data.dir, settings.optimizer.lr, settings.evaluation.val_every,
            settings.run.seed) == ("tiny", "shards", 0.001, 0, 7)
    recorded = settings.recorded()
    assert list(recorded) == [a.dest for a in build_parser()._actions if a.dest not in ("help", "local_rank")]
    assert Settings.from_flags(**recorded, local_rank=settings.run.local_rank) == settings
    assert settings.replace(lr=0.002).optimizer == dataclasses.replace(settings.optimizer, lr=0.002)


def test_the_launchers_local_rank_is_the_default(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert parse([]).run.local_rank == 3


def test_the_settings_vocabulary_is_the_models_padded_one():
    assert Settings().model.vocab_size == PADDED_VOCAB_SIZE  # gpt/config/settings.py may not import gpt.model.model


def test_the_parser_takes_its_choices_and_switches_from_the_fields():
    settings = parse(["--model", "tiny", "--no-compile", "--deterministic", "--micro_batch", "auto"])
    assert (settings.model.preset, settings.model.compile, settings.run.deterministic,
            settings.data.micro_batch) == ("tiny", False, True, "auto")
    assert sorted(build_parser()._option_string_actions["--model"].choices) == sorted(PRESETS)


@pytest.mark.parametrize("bounds", ranges(), ids=lambda bounds: bounds[0])
def test_each_fields_range_is_checked(bounds):
    """Just outside each field's range is one problem naming the flag, and so is twice its upper bound."""
    name, least, inclusive, *upper = bounds
    outside = least - 1 if inclusive else least
    assert [p for p in number_problems(Settings().replace(**{name: outside}))
            if p.startswith(f"--{name} ")] == [f"--{name} {outside} must be a finite number "
                                               f"{'>=' if inclusive else '>'} {least}"]
    if upper:
        above = upper[0] * 2
        assert f"--{name} {above} must be at most {upper[0]} ({upper[1]})" in number_problems(
            Settings().replace(**{name: above}))


def test_each_section_checks_its_own_fields_and_reports_them_all():
    """A field's checks stand next to it (its range, or its own check where a range does not say it); a section
    reports every problem of its fields at once, and the settings every section's."""
    from gpt.config.settings import ModelSection, OptimizerSection
    optimizer = OptimizerSection(lr=float("nan"), min_lr_ratio=2.0, max_bad_steps=0)
    assert optimizer.problems() == ["--lr nan must be a finite number > 0", "--min_lr_ratio 2.0 must lie in [0, 1]",
                                    "--max_bad_steps 0 must be a finite number >= 1"]
    assert ModelSection(n_head=0).problems() == ["--n_head must be positive (got 0)"]
    settings = parse(["--n_layer", "-1", "--micro_batch", "0", "--seed", "-2", "--lr", "0"])
    assert settings.problems() == ["--n_layer must be positive (got -1)",
                                   "--micro_batch must be positive or 'auto' (got 0)",
                                   "--lr 0.0 must be a finite number > 0", "--seed -2 must lie in [0, 2**63)"]
    assert Settings().problems() == [] and parse(["--micro_batch", "auto"]).problems() == []


def test_what_the_flags_leave_open_is_resolved_in_one_step():
    """compile by device, the warmup as the resumed checkpoint's run had it (its default depends on --max_steps),
    and --micro_batch auto as a checkpoint from before data positions (format 1) was saved, on its world size only;
    a newer checkpoint leaves auto to the planner."""
    from gpt.train.start import resolve_defaults
    old = {"world_size": 2, "args": {"warmup_steps": 7, "micro_batch": 4}}  # format 1: no "format" recorded
    decided, notes = resolve_defaults(parse(["--micro_batch", "auto", "--max_steps", "80"]), "cpu", old, 2)
    assert decided == {"compile": False, "warmup_steps": 7, "micro_batch": 4, "eval_every": 250}
    assert notes == ["--micro_batch auto: 4, as the checkpoint was saved with (it is older than data positions "
                     "that any micro-batch continues)"]
    assert resolve_defaults(parse(["--micro_batch", "auto"]), "cpu", old, 1)[0]["micro_batch"] == "auto"
    assert resolve_defaults(parse(["--micro_batch", "auto"]), "cpu", {**old, "format": 2}, 2)[0]["micro_batch"] == "auto"
    assert resolve_defaults(parse(["--warmup_steps", "3"]), "cpu", old, 2)[0]["warmup_steps"] == 3
