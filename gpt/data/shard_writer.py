"""Writing a corpus's token stream as shards (gpt-prepare, gpt/data/prepare.py): shard-sized buffers, a document
crossing a train shard's boundary continued in the next one, and a progress record (NAME_prepare.json) after every
shard, from which an interrupted preparation resumes without redoing shards."""
import json
from pathlib import Path

import numpy as np

from gpt.console import JSON_TYPES, BadInput, atomic_write, regular_file_problem
from gpt.data.shards import shard_name, write_shard


# What a progress file holds: key -> (the types its value may have, how the problem reads)
PROGRESS_KEYS = {"settings": (dict, "an object"), "shards": (list, "a list"), "documents": (int, "a whole number"),
                 "carry": (int, "a whole number"), "complete": (bool, "true or false")}


def read_progress(path):
    """A progress file as ShardWriter wrote it, or a BadInput saying how it is damaged (cut short by a full disk,
    edited by hand): the shards beside it cannot be trusted to continue from."""
    def damaged(problem):
        return BadInput(f"{path}: damaged progress file ({problem}): prepare into another --out_dir, or delete the "
                        f"shards beside it and this file")
    if regular_file_problem(path):
        raise BadInput(regular_file_problem(path))
    data = Path(path).read_bytes()
    try:
        progress = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise damaged(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}") from None
    except json.JSONDecodeError as e:
        raise damaged(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(progress, dict):
        raise damaged(f"{JSON_TYPES.get(type(progress))}, not an object")
    for key, (types, kind) in PROGRESS_KEYS.items():
        if key not in progress:
            raise damaged(f"no '{key}'")
        value = progress[key]
        if not isinstance(value, types) or (types is int and (isinstance(value, bool) or value < 0)):
            raise damaged(f"'{key}' is {json.dumps(value)[:40]}, not {kind}")
    if not all(isinstance(name, str) and Path(name).name == name for name in progress["shards"]):
        raise damaged("'shards' must list file names")
    return progress


def saved_progress(path, settings):
    """The progress file at path, if there is one, of a preparation with these settings; a BadInput if it is damaged
    or the settings differ."""
    if not path.exists():
        return None
    saved = read_progress(path)
    if saved["settings"] != settings:
        raise BadInput(f"{path}: {path.parent} was prepared with other settings {saved['settings']}; use another "
                       f"--out_dir or delete it")
    return saved


def unaccounted_shards(progress_path, name, shards):
    """Which of `shards` (file names of this name's shards) the progress file does not list: gpt-prepare did not write
    them. Except the next shard an unfinished preparation writes: it may have been written by one killed before it
    recorded it, and is written again."""
    progress = read_progress(progress_path)
    accounted = set(progress["shards"])
    if not progress["complete"]:
        index = len(progress["shards"])
        accounted.add(shard_name(name, "val" if index == 0 else "train", index))
    return [shard for shard in shards if shard not in accounted]


class ShardWriter:
    """Fills shard-sized buffers from a stream of documents and records, after every completed shard,
    how far into the document stream it got, so that an interrupted run resumes without redoing shards."""

    def __init__(self, out_dir, name, shard_tokens, settings):
        self.out_dir, self.name, self.shard_tokens = Path(out_dir), name, shard_tokens
        self.progress_path = self.out_dir / f"{name}_prepare.json"
        self.progress = saved_progress(self.progress_path, settings) or {
            "settings": settings, "shards": [], "documents": 0, "carry": 0, "complete": False}
        self.buffer = np.empty(shard_tokens, dtype=np.uint16)
        self.fill = 0
        self.documents = self.progress["documents"]  # documents wholly in written shards or the buffer
        self.carry = self.progress["carry"]  # tokens of the current document already written

    @property
    def in_val(self):
        return not self.progress["shards"]  # shard 0 is the validation split

    def add(self, tokens, lengths):
        """Append documents; a document crossing a train shard's boundary continues in the next shard.
        The val shard grows to hold whole documents."""
        position = 0
        for length in lengths:
            document = tokens[position:position + length]
            position += length
            while len(document):
                if self.in_val and self.fill + len(document) > len(self.buffer):
                    self.buffer = np.concatenate([self.buffer[:self.fill], document])
                    self.fill += len(document)
                    take = len(document)
                else:
                    take = min(len(document), len(self.buffer) - self.fill)
                    self.buffer[self.fill:self.fill + take] = document[:take]
                    self.fill += take
                document = document[take:]
                self.carry = 0 if not len(document) else self.carry + take
                self.documents += not len(document)
                if self.fill == len(self.buffer) and not self.in_val:
                    self.flush()

    def flush(self):
        """Write what the buffer holds as the next shard."""
        if not self.fill:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)  # only now: a refused or failed run leaves nothing behind
        index = len(self.progress["shards"])
        path = self.out_dir / shard_name(self.name, "val" if index == 0 else "train", index)
        write_shard(path, self.buffer[:self.fill])
        self.progress["shards"].append(path.name)
        self.progress.update(documents=self.documents, carry=self.carry)
        self._save()
        self.buffer, self.fill = np.empty(self.shard_tokens, dtype=np.uint16), 0

    def finish(self):
        self.flush()
        self.progress["complete"] = True
        self._save()

    def _save(self):
        with atomic_write(self.progress_path) as tmp:
            tmp.write_text(json.dumps(self.progress, indent=1))
