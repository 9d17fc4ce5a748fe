"""Files a command writes are its own: none is written through a symbolic link. A user's notes.txt linked as a run's
run.lock was overwritten by the lock's record, and a run copied as a tree of links (`cp -rs`) and resumed appended its
records to the original run's metrics.jsonl.

Two kinds of write, two answers. A file written in place (a lock file, metrics.jsonl, opened to append) is never a
link: link_problem refuses one up front in one line, and open_no_follow refuses one made since (O_NOFOLLOW). A file
written whole (console.atomic_write: a temporary, then a rename) replaces a link at its path, never follows it.
Directories may be links (an --out_dir on another disk); gpt/train/out_dir.py refuses one into another run."""
import errno
import os

from gpt.console import BadInput


def link_problem(path, what):
    """Why `path`, written in place (`what`: its role), cannot be: it is a symbolic link; or None."""
    if not os.path.islink(path):
        return None
    return (f"{path}: a symbolic link to {os.readlink(path)} ({what}): it is written in place, never through a link, "
            f"which would overwrite the file the link leads to: remove the link, or use another --out_dir")


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def open_no_follow(path, mode, what, **kwargs):
    """open(path, mode), refusing a symbolic link at path (BadInput: link_problem's line), however recently made."""
    try:
        return open(path, mode, opener=_no_follow, **kwargs)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise BadInput(link_problem(path, what)) from None
        raise
