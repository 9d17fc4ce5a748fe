"""The launcher's variables read once and checked before anything is planned for them (gpt/console.py
launch_problem; a stale WORLD_SIZE in a plain shell: tests/integration/test_bad_input.py)."""
import pytest

from gpt.console import launch_problem, launched_rank, launched_world_size


@pytest.mark.parametrize("environ", [{}, {"RANK": "0", "WORLD_SIZE": "1"}, {"RANK": "3", "WORLD_SIZE": "8"},
                                     {"WORLD_SIZE": "1"}, {"LOCAL_RANK": "0"}])
def test_a_launchers_variables_or_none_are_one_launch(environ):
    assert launch_problem(environ) is None


@pytest.mark.parametrize("environ, problem", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not, and a launcher sets both: left in this shell, it would "
                          "plan the batch for 2 ranks while 1 trains. Unset WORLD_SIZE, or launch with deepspeed or "
                          "torchrun"),
    ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not, and a launcher sets both: unset RANK for a one-process run, "
                    "or launch with deepspeed or torchrun"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2' is not a rank of WORLD_SIZE=2 (0 to 1)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not a rank of WORLD_SIZE=2 (0 to 1)"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a number of ranks (a whole number, 1 or more)"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a number of ranks (a whole number, 1 or more)"),
])
def test_one_variable_without_the_other_or_a_value_out_of_range_is_one_line(environ, problem):
    assert launch_problem(environ) == problem


def test_a_value_that_is_no_rank_still_lets_the_error_be_said(monkeypatch):
    """exit_with reads the rank to decide who speaks: junk there must not raise before the line is said."""
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "y")
    assert (launched_rank(), launched_world_size()) == (0, 1)
