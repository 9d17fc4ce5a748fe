"""The commands README.md and docs/ show still run as written: every script they run exists, and every flag they
give train_ds.py (under python, deepspeed or torchrun) or a console tool is one that command takes, every
ds_configs/ file they name is there. (Running them is the suite's and the demo's job; this catches a renamed flag
or file in the docs.)"""
import contextlib
import importlib
import io
import re
import shlex

import pytest

from common import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOOLS = {f"gpt-{name}": name for name in ("prepare", "plan", "eval", "sample", "export")}
SEPARATORS = {"&&", "||", ";", "|", "do", "done", "then", "fi"}


def shell_commands(markdown):
    """The simple commands of a page's bash blocks, as token lists (comments dropped, continuations joined)."""
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = []
            for token in shlex.split(line, comments=True):
                ends = token in SEPARATORS or token.endswith(";")
                if not ends or token.rstrip(";"):
                    command.append(token.rstrip(";"))
                if ends and command:
                    yield command
                    command = []
            if command:
                yield command


def help_text(tool, subcommand):
    """A console tool's --help (of its subcommand, where it has them)."""
    main = importlib.import_module(f"gpt.commands.{tool}").main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*subcommand, "--help"])
    return out.getvalue()


def flags_of(argv):
    return {token.split("=")[0] for token in argv if token.startswith("--")}


def what_it_runs(command):
    """(the program: 'train_ds' or a tool's module name, its subcommand, its arguments) or None for other programs."""
    for i, token in enumerate(command):
        if token.endswith("train_ds.py"):
            return "train_ds", [], command[i + 1:]
        if token in TOOLS:
            return TOOLS[token], [], command[i + 1:]
        if token == "-m" and command[i + 1].startswith("gpt.commands."):
            return command[i + 1].split(".")[-1], [], command[i + 2:]
    return None


def problems_in(markdown):
    """One line per command of the page that names a missing script or config, or a flag its program does not take."""
    from train_ds import build_parser

    train_flags = {option for action in build_parser()._actions for option in action.option_strings}
    problems = []
    for command in shell_commands(markdown):
        if command[:1] == ["bash"] and command[1].startswith("launch/") and not (REPO / command[1]).exists():
            problems.append(f"{command[1]}: no such script")
        problems += [f"{value}: no such file" for value in command
                     if value.startswith("ds_configs/") and value.endswith(".json") and not (REPO / value).exists()]
        runs = what_it_runs(command)
        if runs is None:
            continue
        program, _, argv = runs
        if program == "train_ds":
            known = train_flags
        else:
            subcommand = argv[:1] if program == "prepare" and argv and not argv[0].startswith("-") else []
            known = set(re.findall(r"(--[\w-]+)", help_text(program, subcommand)))
        unknown = sorted(flags_of(argv) - known - {"--help"})
        if unknown:
            problems.append(f"{' '.join(command)[:100]}: {program} takes no {', '.join(unknown)}")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_the_commands_a_page_shows_take_the_flags_and_files_it_gives_them(page):
    assert problems_in(page.read_text()) == []


def test_a_renamed_flag_or_file_would_be_found():
    page = ("```bash\ndeepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero9.json \\\n    --no_such_flag 1\n"
            "gpt-sample --checkpoint c --prompt hi --top_p 0.9  # a comment\nbash launch/nope.sh\n```")
    assert problems_in(page) == [
        "ds_configs/zero9.json: no such file",
        "deepspeed --num_gpus 8 train_ds.py --ds_config ds_configs/zero9.json --no_such_flag 1: train_ds takes no "
        "--no_such_flag",
        "gpt-sample --checkpoint c --prompt hi --top_p 0.9: sample takes no --top_p",
        "launch/nope.sh: no such script"]


# The word issue or session and a number: this project's tracker, which no reader of the repo has. A third party's
# issue is named with its project and a '#' ("DeepSpeed issue #8439"), which this does not match.
TRACKER_WORDS = re.compile(r"\b(issues?|sessions?) (\d+)\b", re.I)


def tracker_references(text):
    return [match.group(0) for match in TRACKER_WORDS.finditer(text)]


def test_code_tests_and_docs_cite_no_tracker_numbers():
    files = [REPO / "README.md", REPO / "train_ds.py", *(REPO / "docs").glob("*.md"),
             *(path for folder in ("gpt", "bench", "launch", "tests", "ds_configs", "docs/gpu_reports")
               for path in (REPO / folder).rglob("*") if path.suffix in {".py", ".sh", ".json", ".md", ".sbatch"})]
    found = {str(path.relative_to(REPO)): tracker_references(path.read_text()) for path in files}
    assert {path: words for path, words in found.items() if words} == {}


def test_a_tracker_number_would_be_found():
    cited = "kept to 12 modules (Issue {}; 29 before)\nsince session {}".format(40, 7)  # not cited here itself
    assert tracker_references(cited) == ["Issue {}".format(40), "session {}".format(7)]
    assert tracker_references("DeepSpeed issue #8439, PR #7776; 2 sessions of 180 minutes each") == []


def test_readme_is_one_page_of_at_most_200_lines():
    """The depth goes to docs/: README is what a new user reads first, whole."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_the_testing_guide_is_at_most_250_lines():
    """docs/testing.md says what the suite is and checks, not its history: read whole before changing a test."""
    assert len((REPO / "docs" / "testing.md").read_text().splitlines()) <= 250
