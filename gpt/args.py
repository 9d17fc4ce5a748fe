"""Bad input to the console scripts (gpt-prepare, gpt-plan, gpt-eval, gpt-sample, gpt-export): one line per
problem on stderr, `error: <the flag or file>: <the problem>`, and exit status 1, malformed flags included;
checked before anything is loaded or written."""
import argparse
import errno
import json
import math
import os
import stat
from dataclasses import fields
from pathlib import Path

from gpt.console import exit_with
from gpt.settings import current_default


class Parser(argparse.ArgumentParser):
    """argparse, reporting a malformed command line as the commands report any bad input: one line (not the
    usage), exit status `error_status` (1; the trainer's 2), said by rank 0 only when a launcher started ranks."""

    def __init__(self, *args, error_status=1, **kwargs):
        super().__init__(*args, **kwargs)
        self.error_status = error_status

    def error(self, message):
        exit_with(message, self.error_status)


def add_setting_arguments(parser, settings_class, names=None, choices=None):
    """A flag per field of a settings dataclass (gpt/settings.py), or of the fields named: --<name> with the field's
    default, help and argparse options; a bool defaulting to False is a switch. choices: name -> allowed values."""
    for f in fields(settings_class):
        if names is not None and f.name not in names:
            continue
        options = dict(f.metadata["argparse"])
        if f.metadata["help"] is not None:
            options["help"] = f.metadata["help"]
        if f.name in (choices or {}):
            options["choices"] = choices[f.name]
        if f.default is False and "action" not in options:
            options["action"] = "store_true"
        elif not ({"action", "type"} & options.keys()) and f.default is not None and not isinstance(f.default, str):
            options["type"] = type(f.default)
        parser.add_argument(f"--{f.name}", default=current_default(f), **options)


def range_problems(args, ranges):
    """'--name value must be a finite number >= least' (or > least) for each flag out of range, NaN included, and
    '--name value must be at most most (why)' above an optional upper bound. ranges: (name, least, inclusive) or
    (name, least, inclusive, most, why); flags left unset (None) are skipped."""
    problems = []
    for name, least, inclusive, *upper in ranges:
        value = getattr(args, name)
        if value is None:
            continue
        if not (math.isfinite(value) and (value >= least if inclusive else value > least)):
            problems.append(f"--{name} {value} must be a finite number {'>=' if inclusive else '>'} {least}")
        elif upper and value > upper[0]:
            problems.append(f"--{name} {value} must be at most {upper[0]}" + (f" ({upper[1]})" if upper[1] else ""))
    return problems


SEED_LIMIT = 2**63  # numpy's and torch's generators take a seed in [0, 2**63): none negative, none wider


def seed_problem(flag, seed):
    """Why `seed` is no seed for torch and numpy, or None."""
    return None if 0 <= seed < SEED_LIMIT else f"{flag} {seed} must lie in [0, 2**63)"


def out_dir_problem(flag, out_dir):
    """Why `out_dir` cannot be made or written (empty, a file, or a file, a dangling symbolic link or an unwritable
    directory in its way), or None. Give it the flag's string: Path("") would be the working directory."""
    if not str(out_dir).strip():
        return f"{flag} is empty: name a directory"
    out_dir = Path(out_dir)
    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    dangling = next((p for p in (out_dir, *out_dir.absolute().parents) if p.is_symlink() and not p.exists()), None)
    if dangling is not None:  # mkdir would fail on it with a FileExistsError
        return f"{flag} {out_dir}" + ("" if dangling == out_dir else f": {dangling}") + \
            f" is a symbolic link to {os.readlink(dangling)}, which does not exist"
    if not existing.is_dir():
        return f"{flag} {out_dir}" + (" is a file" if existing == out_dir else f": {existing} is a file") + \
            ", not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {out_dir}: {existing} is not writable"
    return None


def out_file_problem(flag, path):
    """Why a file cannot be written at `path` (out_dir_problem's reasons for a path that does not exist yet; for
    one that does: a directory, a FIFO or another special file but a character device such as /dev/null, or an
    unwritable file), or None."""
    if not str(path).strip():
        return f"{flag} is empty: name a file"
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent, or in a path that cannot hold it: out_dir_problem says which part is in the way
        return out_dir_problem(flag, path)
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):  # a FIFO would block the writer until a reader comes
        return f"{flag} {path} is " + next((kind for test, kind in NOT_REGULAR if test(mode)), "a special file") + \
            ", not a regular file"
    if not os.access(path, os.W_OK):
        return f"{flag} {path} is not writable"
    return None


NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def regular_file_problem(path):
    """Why `path` is not a regular file to read (a dangling or looping symbolic link, a directory, a FIFO, ...),
    or None. Decided by stat alone: opening a FIFO would block until something writes to it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
        return f"{path}: file not found"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{path}: a symbolic link that loops ({e.strerror})"
        return f"{path}: unreadable ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return f"{path}: " + next((kind for test, kind in NOT_REGULAR if test(mode)), "a special file") + \
        ", not a regular file"


def directory_problem(path):
    """Why an existing `path` (or a symbolic link there) is not a directory to write into, or None: nothing
    there, or a directory. Decided by stat alone."""
    if os.path.isdir(path) or not os.path.lexists(path):
        return None
    if not os.path.exists(path):
        return regular_file_problem(path)  # a dangling or looping link: said as for a file
    mode = os.stat(path).st_mode
    return f"{path}: " + ("a file" if stat.S_ISREG(mode) else next(
        (kind for test, kind in NOT_REGULAR if test(mode)), "a special file")) + ", not a directory"


def json_line(line, where, error):
    """One line of a JSON Lines file (bytes) decoded, or `error` naming where it is and what is wrong."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
