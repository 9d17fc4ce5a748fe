"""What a user reads: whole lines on the console (say, and say0 for rank 0), and bad input. BadInput is the one
error type every check before launch raises (a config, a shard, a checkpoint, a flag: its message names the file
or flag and the problem, one line each); exit_with is the one way every command ends on it, and on a run that
cannot go on: `error: <line>` on stderr and a non-zero status. Imports nothing from the project, so that every
module may use it; ranks are read from the launcher's environment, before any process group exists."""
import os
import sys


class BadInput(ValueError):
    """Input that cannot be used, one problem per line: each names the flag or file and what is wrong with it."""


def launched_rank():
    """This process's rank as the launcher (deepspeed, torchrun) set it; 0 for a plain `python` run."""
    return int(os.environ.get("RANK", 0))


def launched_world_size():
    return int(os.environ.get("WORLD_SIZE", 1))


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


def exit_with(problem, status=1, every_rank=False, hard=False):
    """End the command: `error: <line>` on stderr for each line of `problem` (text, an exception or a list of lines),
    from rank 0 only, or from every rank, each line prefixed with it, when ranks fail apart; then exit with
    `status` on every rank. The console scripts exit 1 on bad input, the trainer 2 (1: a run that stopped).
    hard: exit without the interpreter's teardown (os._exit), whose C++ destructors of a process group can abort
    the process when a peer rank has already gone."""
    lines = [str(p) for p in problem if p] if isinstance(problem, list) else [str(problem)]
    text = "\n".join(lines)
    if every_rank and launched_world_size() > 1:
        text = f"[rank {launched_rank()}] {text}"
    if every_rank or launched_rank() == 0:
        say("error: " + text.replace("\n", "\nerror: "), sys.stderr)
    if hard:
        sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


def exit_if(problems, status=1):
    """exit_with(problems) if any of them is not None."""
    if any(problems):
        exit_with(list(problems), status)
