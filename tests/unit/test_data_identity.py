"""Shard fingerprints: the loader's saved state carries them and refuses a position in changed shards; a large
shard is sampled in five blocks. (Resumes into changed shards: tests/integration/test_data_identity_runs.py.)"""
import numpy as np
import pytest

from gpt.console import BadInput
from gpt.data.shards import ShuffledTokenLoader, find_shards, shard_fingerprint, write_shard


def test_the_loader_refuses_a_saved_position_in_changed_shards(tmp_path):
    """The loader's own state carries the fingerprints too (the check after launch, for any user of the loader);
    a state saved before them is taken on the shard names."""
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "x_train_000001.bin", np.arange(3000) % 500)
    loader = ShuffledTokenLoader(find_shards(data, "train"), micro_batch=2, seq_len=16, prefetch=1)
    loader.next_batch()
    state = loader.state_dict()
    loader.close()
    write_shard(data / "x_train_000001.bin", np.arange(3000) % 499)
    loader = ShuffledTokenLoader(find_shards(data, "train"), micro_batch=2, seq_len=16, prefetch=1)
    try:
        with pytest.raises(BadInput) as error:
            loader.load_state_dict(state)
        assert str(error.value) == ("the shards changed since the loader state was saved (x_train_000001.bin holds "
                                    "other tokens in the same 7,024 bytes)")
        loader.load_state_dict({k: v for k, v in state.items() if k != "fingerprints"})
        assert (loader.epoch, loader.batch) == (0, 1)
    finally:
        loader.close()


def test_the_fingerprint_samples_five_blocks_of_a_large_shard(tmp_path):
    """Cheap for FineWeb's 200 MB shards: 5 MiB read. A change in a sampled block shows; the limit, stated: one
    confined to the bytes between the blocks does not."""
    path = tmp_path / "x_train_000001.bin"
    tokens = np.arange(5 * 2**20) % 50000  # 10 MiB of tokens: blocks at 0, ~2.25, ~4.5, ~6.75 and ~9 MiB
    write_shard(path, tokens)
    original = shard_fingerprint(path)
    for position, seen in ((2**20 + 10, False), (len(tokens) - 1, True), (0, True)):
        changed = tokens.copy()
        changed[position] += 1
        write_shard(path, changed)
        assert (shard_fingerprint(path) != original) == seen, position
