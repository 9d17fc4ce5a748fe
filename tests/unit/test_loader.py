"""The training loader: disjoint ranks, deterministic shuffling, exact resume; the validation set."""
import numpy as np
import pytest

from gpt.console import BadInput
from gpt.data.shards import ShuffledTokenLoader, ValidationSet, find_shards, write_shard

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


def global_batches(shards, n, world_size=1, micro_batch=MICRO, windows_per_batch=8, seed=3, state=None):
    """The next n global batches as one world size and micro-batch read them: every rank's micro-batches, in
    rank then micro-step order, joined; the loaders' state after them; the note of loading `state` first."""
    loaders = [ShuffledTokenLoader(shards, micro_batch, SEQ, rank=r, world_size=world_size, seed=seed,
                                   windows_per_batch=windows_per_batch, prefetch=2) for r in range(world_size)]
    notes = {l.load_state_dict(state) for l in loaders} if state else {None}
    micro_steps = windows_per_batch // (micro_batch * world_size)
    out = []
    for _ in range(n):
        rows = []
        for l in loaders:
            for _ in range(micro_steps):
                rows += l.next_batch()[0].tolist()
        out.append(rows)
    states = [l.state_dict() for l in loaders]
    for l in loaders:
        l.close()
    assert len(notes) == 1 and all(s == states[0] for s in states)  # every rank agrees
    return out, states[0], notes.pop()


@pytest.mark.parametrize("world_size,micro_batch", [(2, 2), (2, 1), (4, 2), (1, 4), (8, 1)])
def test_a_global_batch_is_the_same_on_every_world_size_and_micro_batch(shards, world_size, micro_batch):
    one_rank, _, _ = global_batches(shards, 10, 1, MICRO)  # 10 batches of 8 windows: over an epoch's end (4)
    assert global_batches(shards, 10, world_size, micro_batch)[0] == one_rank
    assert len({row[0] for rows in one_rank[:4] for row in rows}) == 4 * 8  # an epoch: no window twice


@pytest.mark.parametrize("stop_after", [1, 2, 4, 5])  # inside a shard, at a boundary, at / past an epoch end
@pytest.mark.parametrize("before,after", [((2, 2), (1, 4)), ((1, 2), (4, 1)), ((2, 1), (2, 4))])
def test_a_resume_on_another_world_size_or_micro_batch_continues_with_the_next_global_batch(shards, stop_after,
                                                                                         before, after):
    reference, _, _ = global_batches(shards, 9)
    first, state, _ = global_batches(shards, stop_after, *before)
    rest, _, note = global_batches(shards, 9 - stop_after, *after, state=state)
    assert first + rest == reference and note is None


def test_a_state_saved_before_global_batches_were_steps_keeps_its_order_on_the_same_layout(shards):
    """Checkpoints written before global batches were a step's windows: a global batch was one micro-step of
    micro_batch x world_size windows, rank r reading block r of it (the order this spells out by hand)."""
    world_size, seed = 2, 3
    def old_stream(rank, n):  # unit u of an epoch: windows (u * world_size + rank) * MICRO of its shard's order
        out = []
        for epoch in range(3):
            for s in np.random.default_rng([seed, epoch]).permutation(len(shards)):
                windows = [12, 9, 16][s]
                order = np.random.default_rng([seed, epoch, s]).permutation(windows)
                for u in range(windows // (MICRO * world_size)):
                    start = (u * world_size + rank) * MICRO
                    out.append([[0, 97, 170][s] + w * SEQ for w in order[start:start + MICRO]])  # first tokens
        return out[:n]
    old_state = {"epoch": 0, "batch": 5, "seed": seed, "world_size": world_size, "micro_batch": MICRO, "seq_len": SEQ,
                 "shards": [p.name for p in shards]}  # as such a checkpoint recorded it: 5 micro-steps done
    for rank in (0, 1):
        l = ShuffledTokenLoader(shards, MICRO, SEQ, rank=rank, world_size=world_size, seed=seed,
                                windows_per_batch=4 * MICRO * world_size, prefetch=2)
        note = l.load_state_dict(old_state)
        assert "the order of the checkpoint's run" in note
        assert [x[:, 0].tolist() for x, _ in (l.next_batch() for _ in range(6))] == old_stream(rank, 11)[5:]
        l.close()


def test_another_global_batch_size_continues_with_no_window_read_twice(shards):
    """--total_batch_tokens changed on resume: 8 windows a batch before, 4 after (and back)."""
    first, state, _ = global_batches(shards, 3)  # shards of 1, 1, 2 batches of 8: the third is half-way in one
    rest, _, note = global_batches(shards, 2, windows_per_batch=4, state=state)
    assert "global batches of 4 windows, 8 when saved" in note
    starts = [row[0] for rows in first + rest for row in rows]
    assert len(starts) == len(set(starts))  # no window twice in the epoch


def test_a_state_of_other_shards_or_seed_is_refused(shards):
    state = loader(shards, world_size=2).state_dict()
    with pytest.raises(BadInput, match="loader state was saved with seed=0, this run has 1"):
        loader(shards, seed=1).load_state_dict(state)


def test_validation_set_is_the_same_at_every_world_size(shards):
    val = find_shards(shards[0].parent, "val")
    single = [x for x, _ in ValidationSet(val, SEQ, 7, MICRO).batches()]
    split = [x for r in (0, 1) for x, _ in ValidationSet(val, SEQ, 7, MICRO, rank=r, world_size=2).batches()]
    rows = lambda xs: sorted(row[0] for x in xs for row in x.tolist())
    assert rows(single) == rows(split) == [10_000 + SEQ * w for w in range(7)]
    counts = [ValidationSet(val, SEQ, 7, MICRO, rank=r, world_size=2).batch_count() for r in (0, 1)]
    assert counts == [len([x for x, _ in ValidationSet(val, SEQ, 7, MICRO, rank=r, world_size=2).batches()])
                      for r in (0, 1)]  # the progress bar's total


def test_a_header_only_shard_changes_no_count(tmp_path):
    """An empty shard (a valid header, no tokens) beside a good one holds no window: it counted -1 and took a step
    off the epoch (2,922 steps/epoch said where the good shard alone holds 2,923)."""
    write_shard(tmp_path / "c_train_000001.bin", np.arange(8 * 16 + 1, dtype=np.uint16))
    alone = ShuffledTokenLoader(find_shards(tmp_path, "train"), micro_batch=2, seq_len=16, prefetch=1)
    write_shard(tmp_path / "c_train_000002.bin", np.zeros(0, dtype=np.uint16))
    beside = ShuffledTokenLoader(find_shards(tmp_path, "train"), micro_batch=2, seq_len=16, prefetch=1)
    assert alone.windows == [8] and beside.windows == [8, 0]
    assert sum(beside.batches_per_shard) == sum(alone.batches_per_shard) == 4
    alone.close(), beside.close()
