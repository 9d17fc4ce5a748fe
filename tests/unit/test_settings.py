"""Each setting is defined once, in gpt/config/settings.py: the command line is generated from the fields, with their
defaults, help and ranges."""
import dataclasses

import pytest

from gpt.commands.train import build_parser, parse
from gpt.model.model import PADDED_VOCAB_SIZE, PRESETS
from gpt.config.preflight import number_problems
from gpt.config.settings import Settings, ranges


def test_every_setting_is_a_flag_with_the_fields_default(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    flags = {action.dest for action in build_parser()._actions} - {"help"}
    assert flags == {f.name for f in dataclasses.fields(Settings)}
    assert parse([]) == Settings()


def test_the_launchers_local_rank_is_the_default(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert parse([]).local_rank == 3


def test_the_settings_vocabulary_is_the_models_padded_one():
    assert Settings().vocab_size == PADDED_VOCAB_SIZE  # gpt/config/settings.py may not import gpt.model.model


def test_the_parser_takes_its_choices_and_switches_from_the_fields():
    settings = parse(["--model", "tiny", "--no-compile", "--deterministic", "--micro_batch", "auto"])
    assert (settings.model, settings.compile, settings.deterministic, settings.micro_batch) == ("tiny", False, True,
                                                                                                "auto")
    assert sorted(build_parser()._option_string_actions["--model"].choices) == sorted(PRESETS)


@pytest.mark.parametrize("bounds", ranges(), ids=lambda bounds: bounds[0])
def test_each_fields_range_is_checked(bounds):
    """Just outside each field's range is one problem naming the flag, and so is twice its upper bound."""
    name, least, inclusive, *upper = bounds
    outside = least - 1 if inclusive else least
    assert [p for p in number_problems(dataclasses.replace(Settings(), **{name: outside}))
            if p.startswith(f"--{name} ")] == [f"--{name} {outside} must be a finite number "
                                               f"{'>=' if inclusive else '>'} {least}"]
    if upper:
        above = upper[0] * 2
        assert f"--{name} {above} must be at most {upper[0]} ({upper[1]})" in number_problems(
            dataclasses.replace(Settings(), **{name: above}))
