"""Token shards and the loaders that read them.

Shard formats:
- llm.c `.bin`: a header of 256 little-endian int32 ([0] magic 20240520, [1] version 1, [2] token count),
  then that many uint16 tokens. File names {name}_{val|train}_{%06d}.bin, shard 0 = val.
- build-nanogpt `.npy`: a plain NumPy array of uint16 tokens (np.save), same naming.
Shards are memory-mapped: opening one reads nothing, so moving to the next shard costs no visible time.
A shard's identity is its size and a hash of a few sampled blocks (shard_fingerprint): checkpoints record it, so
that a resume into shards rewritten since is refused instead of silently training on other data."""
import hashlib
import json
import os
import queue
import re
import threading
from pathlib import Path

import numpy as np
import torch

from gpt.console import BadInput, atomic_write, regular_file_problem

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
SCAN_CHUNK = 1 << 24  # tokens per read when checking a shard's token range
FINGERPRINT_BLOCK = 1 << 20  # bytes per sampled block
FINGERPRINT_BLOCKS = 5  # the first, the last and three between: 5 MiB of a 100M-token (200 MB) shard



def shard_name(name, split, index):
    return f"{name}_{split}_{index:06d}.bin"


def write_shard(path, tokens):
    """Write tokens to an llm.c shard; a temp name is renamed only once the file is complete."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise BadInput(f"{path}: token ids must fit in uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    # A full disk, a directory where the shard goes: no partial file is left behind.
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_shard_header(path):
    """Check an llm.c shard's header against its size (cheap: reads 1 KiB); return its token count."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise BadInput(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte shard header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise BadInput(f"{path}: bad magic {header[0]} (expected {SHARD_MAGIC}); not an llm.c token shard")
    if header[1] != SHARD_VERSION:
        raise BadInput(f"{path}: unsupported shard version {header[1]} (expected {SHARD_VERSION})")
    ntok = int(header[2])
    if size != HEADER_BYTES + 2 * ntok:
        raise BadInput(f"{path}: header says {ntok} tokens ({HEADER_BYTES + 2 * ntok} bytes) "
                       f"but the file has {size} bytes")
    return ntok


def load_shard(path):
    """The shard's tokens as a read-only memory map (nothing is read until used)."""
    if str(path).endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r")
        except ValueError as e:
            raise BadInput(f"{path}: not a NumPy array file ({e})") from None
        if tokens.dtype != np.uint16 or tokens.ndim != 1:
            raise BadInput(f"{path}: expected a 1-D uint16 token array, found {tokens.ndim}-D {tokens.dtype}")
        return tokens
    ntok = read_shard_header(path)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(ntok,))


def check_token_range(path, vocab_size):
    """Every token id < vocab_size; reads the whole shard once, in chunks (~1 s per GB)."""
    tokens = load_shard(path)
    for start in range(0, len(tokens), SCAN_CHUNK):
        chunk = np.asarray(tokens[start:start + SCAN_CHUNK])
        if chunk.size and chunk.max() >= vocab_size:
            position = start + int(np.argmax(chunk >= vocab_size))
            raise BadInput(f"{path}: token {int(tokens[position])} at position {position} "
                           f"is >= the vocabulary size {vocab_size}")


SPLITS = ("train", "val")


def corpus_of(shard_name):
    """The corpus a shard belongs to: its name before the last _train_ or _val_ (x in x_train_000001.bin)."""
    return re.match(r"(.*)_(?:train|val)_", shard_name).group(1)


def unfinished_preparations(data_dir):
    """One warning per gpt-prepare progress file in data_dir that says its preparation did not complete: a run
    then trains on part of the corpus (which may be meant: a partial FineWeb). Unreadable files are left to
    gpt-prepare, which refuses them when it resumes."""
    warnings = []
    for path in sorted(Path(data_dir).glob("*_prepare.json")):
        try:
            progress = json.loads(path.read_bytes()) if not regular_file_problem(path) else None
        except (OSError, ValueError):
            continue
        if isinstance(progress, dict) and progress.get("complete") is False:
            shards = progress.get("shards")
            written = f" ({len(shards)} shard(s) written)" if isinstance(shards, list) else ""
            warnings.append(f"warning: {path}: its gpt-prepare did not complete{written}: training on part of the "
                            f"corpus; rerun the same gpt-prepare command to finish it")
    return warnings


def find_shards(data_dir, split):
    """Sorted shard paths (.bin or .npy) of one split in data_dir; a clear error when there are none."""
    if not str(data_dir).strip():
        raise BadInput("--data is empty: name a shard directory")
    data_dir = Path(data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise BadInput(f"{data_dir}: a file, not a directory of shards")
    if not data_dir.is_dir():
        raise BadInput(f"{data_dir}: data directory not found "
                       f"(make one with: python -m gpt.commands.prepare shakespeare --out_dir {data_dir})")
    paths = sorted(p for p in data_dir.glob(f"*_{split}_*") if p.suffix in (".bin", ".npy"))
    corpora = sorted({corpus_of(p.name) for s in SPLITS for p in data_dir.glob(f"*_{s}_*")
                      if p.suffix in (".bin", ".npy")})
    if len(corpora) > 1:  # gpt-prepare refuses to write a second corpus beside one; this is a directory mixed by hand
        raise BadInput(f"{data_dir}: shards of {len(corpora)} corpora (" + ", ".join(f"{c}_*" for c in corpora) +
                       "): a run would train on all of them; keep one corpus per directory")
    if not paths:
        raise BadInput(f"{data_dir}: no '{split}' shards (*_{split}_*.bin or .npy)")
    for path in paths:  # a FIFO would block the first read forever, a directory or a dangling link raise there
        problem = regular_file_problem(path)
        if problem:
            raise BadInput(problem.replace(", not a regular file", " named like a shard, not a shard file"))
        if not path.stat().st_size:
            raise BadInput(f"{path}: an empty file (0 bytes), not a token shard")
    return paths


def shard_fingerprint(path):
    """{'bytes', 'sampled_sha256'}: the size, and a hash of FINGERPRINT_BLOCKS blocks spread evenly from the
    first byte to the last (the whole file when it is smaller). Cheap, and sure to change when a shard is
    rewritten from other text or tokenized anew; an edit that only touches bytes between the blocks goes unseen."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FINGERPRINT_BLOCK * FINGERPRINT_BLOCKS:
            digest.update(f.read())
        else:
            for k in range(FINGERPRINT_BLOCKS):
                f.seek(k * (size - FINGERPRINT_BLOCK) // (FINGERPRINT_BLOCKS - 1))
                digest.update(f.read(FINGERPRINT_BLOCK))
    return {"bytes": size, "sampled_sha256": digest.hexdigest()}


def fingerprints(paths):
    """{shard file name: shard_fingerprint} of shards in one directory."""
    return {Path(p).name: shard_fingerprint(p) for p in paths}


def data_changes(saved, current):
    """How the shards differ from when `saved` (fingerprints()) was taken: one phrase per shard, in name order."""
    changes = []
    for name in sorted(saved.keys() | current.keys()):
        then, now = saved.get(name), current.get(name)
        if now is None:
            changes.append(f"{name} is gone")
        elif then is None:
            changes.append(f"{name} is new")
        elif then["bytes"] != now["bytes"]:
            changes.append(f"{name} has {now['bytes']:,} bytes, {then['bytes']:,} then")
        elif then["sampled_sha256"] != now["sampled_sha256"]:
            changes.append(f"{name} holds other tokens in the same {now['bytes']:,} bytes")
    return changes


def describe_changes(changes, most=3):
    return "; ".join(changes[:most]) + (f"; and {len(changes) - most} more" if len(changes) > most else "")


def check_shards(data_dir, vocab_size):
    """Everything about the data that can fail, checked before training: both splits exist, every header
    agrees with its file, every token fits the vocabulary."""
    for split in ("train", "val"):
        for path in find_shards(data_dir, split):
            check_token_range(path, vocab_size)


def check_lengths(data_dir, seq_len, global_batch, validating):
    """The shards hold enough tokens for the run: one global batch of windows in some train shard (the
    loader never crosses shards) and, when validating, one sequence in the val split."""
    problems, window = [], seq_len + 1
    lengths = {p: len(load_shard(p)) for p in find_shards(data_dir, "train")}
    longest = max(lengths, key=lengths.get)
    if windows_in(lengths[longest], seq_len) < global_batch:
        problems.append(f"{data_dir}: no train shard holds one global batch of {global_batch} sequences of {window} "
                        f"tokens (the longest, {longest.name}, has {lengths[longest]:,}): lower --micro_batch or "
                        f"--seq_len, or prepare more text")
    if validating:
        val = find_shards(data_dir, "val")
        if all(windows_in(len(load_shard(p)), seq_len) == 0 for p in val):
            problems.append(f"{val[0]}: the val split is shorter than one sequence of {window} tokens; "
                            f"lower --seq_len or turn validation off with --val_every 0")
    if problems:
        raise BadInput("\n".join(problems))


def windows_in(tokens, seq_len):
    """How many sequences of seq_len tokens (+1 target) a shard of `tokens` tokens holds: none in an empty one (a
    header-only shard counted -1 and took a step off the epoch)."""
    return max(tokens - 1, 0) // seq_len


def _windows_to_batch(tokens, windows, seq_len):
    """(x, y) int64 tensors for sequences starting at windows * seq_len; y is x shifted by one token."""
    index = windows[:, None] * seq_len + np.arange(seq_len + 1)
    chunk = torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


class ShuffledTokenLoader:
    """Training batches. Each shard is cut into windows of seq_len (+1 target) tokens; every epoch draws a new
    shard order and a new window order within each shard from (seed, epoch). A global batch is one optimizer
    step's windows_per_batch windows, the next ones in that order; windows that cannot fill a whole global batch
    at a shard's end are left out of that epoch. So global batch k of epoch e is a pure function of (seed, e, k,
    windows_per_batch, seq_len) and the shards, whatever the world size and micro-batch.

    Ranks and micro-steps only split a global batch: rank r's micro-step j reads its (r * G + j)-th block of
    micro_batch windows, G = windows_per_batch / (micro_batch x world_size) micro-steps per rank, so ranks never
    overlap. The position (epoch, batch) is the whole state: a resume on any world size or micro-batch continues
    with exactly the next global batch. A background thread builds the next `prefetch` micro-batches."""

    def __init__(self, shard_paths, micro_batch, seq_len, rank=0, world_size=1, seed=0, windows_per_batch=None,
                 prefetch=4, pin_memory=False):
        self.shards = [Path(p) for p in shard_paths]
        self.micro_batch, self.seq_len = micro_batch, seq_len
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.prefetch, self.pin_memory = prefetch, pin_memory
        self.windows = [windows_in(len(load_shard(p)), seq_len) for p in self.shards]
        self.fingerprints = fingerprints(self.shards)
        self.epoch, self.batch, self.micro_step = 0, 0, 0
        self._thread = None
        self._set_batch_size(windows_per_batch or micro_batch * world_size)
        self._start()

    def _set_batch_size(self, windows_per_batch):
        per_micro_step = self.micro_batch * self.world_size
        if windows_per_batch % per_micro_step:
            raise BadInput(f"a global batch of {windows_per_batch} windows does not split into micro-batches of "
                           f"{self.micro_batch} on {self.world_size} rank(s)")
        self.windows_per_batch, self.micro_steps = windows_per_batch, windows_per_batch // per_micro_step
        self.batches_per_shard = [w // windows_per_batch for w in self.windows]
        if sum(self.batches_per_shard) == 0:
            raise BadInput(f"{self.shards[0].parent}: no shard holds one global batch ({windows_per_batch} "
                           f"sequences of {self.seq_len} tokens + 1)")

    # -- the pure schedule -------------------------------------------------------------------------
    def _rng(self, *keys):
        return np.random.default_rng([self.seed, *keys])

    def shard_order(self, epoch):
        return self._rng(epoch).permutation(len(self.shards))

    def _epoch_plan(self, epoch):
        """[(shard index, batches)] in this epoch's order, skipping shards too small for one batch."""
        return [(int(s), self.batches_per_shard[s]) for s in self.shard_order(epoch) if self.batches_per_shard[s]]

    def _batches(self, epoch, batch):
        """Yield (epoch, batch, micro-step, x, y) from the start of global batch (epoch, batch) on, forever."""
        while True:
            done = 0
            for shard, count in self._epoch_plan(epoch):
                if batch >= done + count:
                    done += count
                    continue
                tokens = load_shard(self.shards[shard])
                order = self._rng(epoch, shard).permutation(self.windows[shard])
                for k in range(batch - done, count):
                    for j in range(self.micro_steps):
                        start = k * self.windows_per_batch + (self.rank * self.micro_steps + j) * self.micro_batch
                        x, y = _windows_to_batch(tokens, order[start:start + self.micro_batch], self.seq_len)
                        if self.pin_memory:
                            x, y = x.pin_memory(), y.pin_memory()
                        yield epoch, done + k, j, x, y
                done += count
                batch = done
            epoch, batch = epoch + 1, 0

    def translated_position(self, epoch, batch, saved_size):
        """Where a stream of global batches of saved_size windows, stopped before its batch (epoch, batch),
        continues in global batches of this loader's size: in the shard it stopped in, at the first batch that
        starts at or after the windows read there (else at the next shard), so that no window is read twice in
        the epoch and fewer than one global batch's windows are passed over in that shard."""
        saved_counts = [w // saved_size for w in self.windows]
        done_saved = done_here = 0
        for shard in self.shard_order(epoch):
            if batch < done_saved + saved_counts[shard]:
                read = (batch - done_saved) * saved_size
                return epoch, done_here + min(-(-read // self.windows_per_batch), self.batches_per_shard[shard])
            done_saved += saved_counts[shard]
            done_here += self.batches_per_shard[shard]
        return epoch + 1, 0

    # -- the prefetching consumer ------------------------------------------------------------------
    def _start(self):
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(self.epoch, self.batch, self._queue, self._stop),
                                        daemon=True, name="token-prefetch")
        self._thread.start()

    def _produce(self, epoch, batch, out, stop):
        try:
            for item in self._batches(epoch, batch):
                while not stop.is_set():
                    try:
                        out.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except Exception as e:  # surfaced to the consumer by next_batch
            out.put(e)

    def _halt(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def next_batch(self):
        """This rank's next micro-batch (x, y)."""
        item = self._queue.get()
        if isinstance(item, Exception):
            raise item
        epoch, batch, micro_step, x, y = item
        last = micro_step == self.micro_steps - 1
        self.epoch, self.batch, self.micro_step = epoch, batch + last, 0 if last else micro_step + 1
        return x, y

    def state_dict(self):
        """The position of the next global batch, plus what it is only valid with: the global batch's size, the
        shards' identities. Taken between global batches (the trainer saves between optimizer steps)."""
        if self.micro_step:
            raise RuntimeError(f"the loader's position is inside a global batch (micro-step {self.micro_step} of "
                               f"{self.micro_steps}): save between optimizer steps")
        return {"epoch": self.epoch, "batch": self.batch, "windows_per_batch": self.windows_per_batch,
                "seed": self.seed, "seq_len": self.seq_len, "shards": [p.name for p in self.shards],
                "fingerprints": self.fingerprints}

    def load_state_dict(self, state):
        """Continue at a saved position, on any world size and micro-batch. Returns None, or one line saying how
        the position was carried over:
        - a state saved before global batches were a step's windows (no 'windows_per_batch': its global batch
          was one micro-step, micro_batch x world_size windows) on the same world size and micro-batch keeps that
          order, exactly as the run that saved it would have gone on;
        - a global batch of another size (--total_batch_tokens changed; such an old state on another layout)
          continues at translated_position: no window twice.
        States saved before fingerprints were recorded are taken on the names."""
        mine = self.state_dict()
        for key in ("seed", "seq_len", "shards"):
            if state[key] != mine[key]:
                raise BadInput(f"loader state was saved with {key}={state[key]!r}, this run has {mine[key]!r}")
        changes = data_changes(state.get("fingerprints", mine["fingerprints"]), mine["fingerprints"])
        if changes:
            raise BadInput(f"the shards changed since the loader state was saved ({describe_changes(changes)})")
        self._halt()
        saved_size, note = state.get("windows_per_batch"), None
        if saved_size is None:
            saved_size = state["micro_batch"] * state["world_size"]
            if (state["micro_batch"], state["world_size"]) == (self.micro_batch, self.world_size):
                self._set_batch_size(saved_size)
                note = (f"data in the order of the checkpoint's run (saved before global batches were a step's "
                        f"windows: one micro-step of {saved_size} windows each)")
        self.epoch, self.batch, self.micro_step = state["epoch"], state["batch"], 0
        if saved_size != self.windows_per_batch:
            self.epoch, self.batch = self.translated_position(state["epoch"], state["batch"], saved_size)
            note = (f"data in global batches of {self.windows_per_batch} windows, {saved_size} when saved: from "
                    f"batch {self.batch} of epoch {self.epoch}, no window read twice")
        self._start()
        return note

    def close(self):
        self._halt()


class ValidationSet:
    """The first `num_sequences` windows of seq_len tokens of the val shards, in order: the same tokens
    on every run and every world size. Rank r scores windows r, r + W, r + 2W, ..."""

    def __init__(self, shard_paths, seq_len, num_sequences, micro_batch, rank=0, world_size=1):
        self.seq_len, self.micro_batch = seq_len, micro_batch
        self.windows = []  # (shard path, window index)
        for path in shard_paths:
            available = windows_in(len(load_shard(path)), seq_len)
            self.windows += [(path, w) for w in range(min(available, num_sequences - len(self.windows)))]
        if not self.windows:
            raise BadInput(f"{shard_paths[0]}: the val split is shorter than one sequence of {seq_len} tokens")
        self.mine = self.windows[rank::world_size]

    def __len__(self):
        return len(self.windows)

    def batch_count(self):
        """How many batches this rank's batches() yields."""
        return -(-len(self.mine) // self.micro_batch)

    def batches(self):
        for start in range(0, len(self.mine), self.micro_batch):
            group = self.mine[start:start + self.micro_batch]
            tokens = load_shard(group[0][0])
            if any(path != group[0][0] for path, _ in group):  # a batch spanning two shards: rare, slow path
                xs, ys = zip(*(_windows_to_batch(load_shard(p), np.array([w]), self.seq_len) for p, w in group))
                yield torch.cat(xs), torch.cat(ys)
            else:
                yield _windows_to_batch(tokens, np.array([w for _, w in group]), self.seq_len)
