"""The training loader: disjoint ranks, deterministic shuffling, exact resume; the validation set."""
import numpy as np
import pytest

from gpt.data import DataError, ShuffledTokenLoader, ValidationSet, find_shards, write_shard

SEQ, MICRO = 8, 2


@pytest.fixture
def shards(tmp_path):
    """Three train shards whose tokens are their global positions, so a window names its own origin."""
    sizes = [8 * 12 + 1, 8 * 9 + 1, 8 * 16 + 1]  # 12, 9, 16 windows
    start = 0
    for index, size in enumerate(sizes, start=1):
        write_shard(tmp_path / f"x_train_{index:06d}.bin", np.arange(start, start + size) % 50000)
        start += size
    write_shard(tmp_path / "x_val_000000.bin", np.arange(10_000, 10_000 + 8 * 20 + 1))
    return find_shards(tmp_path, "train")


def loader(shards, rank=0, world_size=1, seed=0):
    return ShuffledTokenLoader(shards, MICRO, SEQ, rank=rank, world_size=world_size, seed=seed, prefetch=2)


def batches(l, n):
    out = [l.next_batch() for _ in range(n)]
    return [(x.tolist(), y.tolist()) for x, y in out]


def test_targets_are_the_next_tokens(shards):
    x, y = loader(shards).next_batch()
    assert x.shape == y.shape == (MICRO, SEQ) and (y[:, :-1] == x[:, 1:]).all() and (y[:, -1] == x[:, -1] + 1).all()


def test_two_ranks_never_share_a_window_and_together_cover_an_epoch(shards):
    per_epoch = [12 // 4, 9 // 4, 16 // 4]  # global batches of MICRO x 2 ranks windows per shard
    steps = sum(per_epoch)
    starts = {r: [row[0] for x, _ in batches(loader(shards, r, 2), steps) for row in x] for r in (0, 1)}
    assert not set(starts[0]) & set(starts[1])
    covered = set(starts[0]) | set(starts[1])
    assert len(covered) == steps * MICRO * 2
    # all windows but each shard's remainder (12 % 4, 9 % 4, 16 % 4 = 0 + 1 + 0) are read once
    assert len(covered) == 12 + 9 + 16 - 1


def test_same_seed_same_order_and_a_new_order_each_epoch(shards):
    steps = (12 + 9 + 16) // MICRO  # one epoch at world size 1 (9 windows -> 4 batches, one left out)
    assert batches(loader(shards, seed=1), steps) == batches(loader(shards, seed=1), steps)
    assert batches(loader(shards, seed=1), steps) != batches(loader(shards, seed=2), steps)
    l = loader(shards, seed=1)
    first, second = batches(l, steps), batches(l, steps)
    starts = lambda bs: [row[0] for x, _ in bs for row in x]
    assert starts(first) != starts(second)  # a new order in epoch 2 ...
    # ... over the same windows, except the one left-over window of the 9-window shard, which is redrawn
    assert len(set(starts(first)) & set(starts(second))) >= len(starts(first)) - 1


@pytest.mark.parametrize("stop_after", [1, 6, 18, 25])  # inside a shard, at a boundary, at / past an epoch end
def test_resume_continues_with_exactly_the_uninterrupted_batches(shards, stop_after):
    reference = batches(loader(shards, rank=1, world_size=2, seed=3), 40)
    interrupted = loader(shards, rank=1, world_size=2, seed=3)
    before = batches(interrupted, stop_after)
    state = interrupted.state_dict()
    interrupted.close()
    resumed = loader(shards, rank=1, world_size=2, seed=3)
    resumed.load_state_dict(state)
    assert before + batches(resumed, 40 - stop_after) == reference


def test_resuming_with_another_layout_is_refused(shards):
    state = loader(shards, world_size=2).state_dict()
    with pytest.raises(DataError, match="loader state was saved with world_size=2, this run has 1"):
        loader(shards).load_state_dict(state)


def test_validation_set_is_the_same_at_every_world_size(shards):
    val = find_shards(shards[0].parent, "val")
    single = [x for x, _ in ValidationSet(val, SEQ, 7, MICRO).batches()]
    split = [x for r in (0, 1) for x, _ in ValidationSet(val, SEQ, 7, MICRO, rank=r, world_size=2).batches()]
    rows = lambda xs: sorted(row[0] for x in xs for row in x.tolist())
    assert rows(single) == rows(split) == [10_000 + SEQ * w for w in range(7)]
