"""Token shards (llm.c's .bin format) and the distributed loader that reads them.

Shard layout, as llm.c writes it: a header of 256 little-endian int32 ([0] magic 20240520, [1] version 1,
[2] token count), then that many uint16 tokens. File names: {name}_{val|train}_{%06d}.bin.
"""
import os
from pathlib import Path

import numpy as np
import torch

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class DataError(ValueError):
    """Bad or missing data, named with its file."""


def shard_name(name, split, index):
    return f"{name}_{split}_{index:06d}.bin"


def write_shard(path, tokens):
    """Write tokens to an llm.c shard; a temp name is renamed only once the file is complete."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise DataError(f"{path}: token ids must fit in uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    os.replace(tmp, path)


def read_shard_header(path):
    """Check a shard's header against its size (cheap: reads 1 KiB) and return its token count."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise DataError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte shard header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise DataError(f"{path}: bad magic {header[0]} (expected {SHARD_MAGIC}); not an llm.c token shard")
    if header[1] != SHARD_VERSION:
        raise DataError(f"{path}: unsupported shard version {header[1]} (expected {SHARD_VERSION})")
    ntok = int(header[2])
    if size != HEADER_BYTES + 2 * ntok:
        raise DataError(f"{path}: header says {ntok} tokens ({HEADER_BYTES + 2 * ntok} bytes) "
                        f"but the file has {size} bytes")
    return ntok


def load_shard(path):
    """The shard's tokens as a read-only memory map (nothing is read until used)."""
    ntok = read_shard_header(path)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(ntok,))


def find_shards(data_dir, split):
    """Sorted shard paths of one split in data_dir; a clear error when there are none."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: data directory not found (make one with: python -m gpt.prepare shakespeare --out_dir {data_dir})")
    paths = sorted(data_dir.glob(f"*_{split}_*.bin"))
    if not paths:
        raise DataError(f"{data_dir}: no '{split}' shards (*_{split}_*.bin)")
    return paths


class DistributedTokenLoader:
    """Contiguous (x, y) windows of micro_batch x seq_len tokens; rank r of W takes the r-th of every W
    consecutive windows, so ranks never overlap and together read the stream in order. After the last
    shard it starts over (a new epoch)."""

    def __init__(self, shard_paths, micro_batch, seq_len, rank=0, world_size=1):
        self.shards = list(shard_paths)
        self.micro_batch, self.seq_len = micro_batch, seq_len
        self.rank, self.world_size = rank, world_size
        self.window = micro_batch * seq_len
        for path in self.shards:
            ntok = read_shard_header(path)
            if ntok < self.window * world_size + 1:
                raise DataError(f"{path}: {ntok} tokens is fewer than one step needs "
                                f"({micro_batch} x {seq_len} x {world_size} ranks + 1)")
        self.reset()

    def reset(self):
        self.shard_index, self.position = 0, 0
        self.tokens = load_shard(self.shards[0])

    def next_batch(self):
        start = self.position + self.rank * self.window
        chunk = torch.from_numpy(self.tokens[start:start + self.window + 1].astype(np.int64))
        x = chunk[:-1].view(self.micro_batch, self.seq_len)
        y = chunk[1:].view(self.micro_batch, self.seq_len)
        self.position += self.window * self.world_size
        if self.position + self.window * self.world_size + 1 > len(self.tokens):
            self.shard_index = (self.shard_index + 1) % len(self.shards)
            self.tokens, self.position = load_shard(self.shards[self.shard_index]), 0
        return x, y
