import struct

import numpy as np
import pytest

from gpt.data import DataError, DistributedTokenLoader, find_shards, load_shard, write_shard
from gpt.prepare import SHAKESPEARE_VAL_PLAYS, shakespeare_documents
from gpt.tokenizer import EOT_TOKEN, gpt2_tokenizer


def write_llmc_shard_independently(path, tokens):
    """A shard written straight from llm.c's spec, sharing no code with gpt.data."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def test_reads_shards_written_from_the_llmc_spec(tmp_path):
    tokens = [0, 1, 50256, 65535, 12345]
    write_llmc_shard_independently(tmp_path / "x_train_000001.bin", tokens)
    assert load_shard(tmp_path / "x_train_000001.bin").tolist() == tokens


def test_written_shard_has_the_llmc_layout(tmp_path):
    tokens = np.array([7, 8, 9, 50256], dtype=np.uint16)
    write_shard(tmp_path / "s.bin", tokens)
    raw = (tmp_path / "s.bin").read_bytes()
    assert len(raw) == 1024 + 2 * 4
    assert struct.unpack("<3i", raw[:12]) == (20240520, 1, 4)
    assert struct.unpack("<4H", raw[1024:]) == (7, 8, 9, 50256)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("corrupt,message", [
    (lambda raw: struct.pack("<i", 1234) + raw[4:], "bad magic 1234 (expected 20240520); not an llm.c token shard"),
    (lambda raw: raw[:4] + struct.pack("<i", 7) + raw[8:], "unsupported shard version 7 (expected 1)"),
    (lambda raw: raw[:-2], "header says 5 tokens (1034 bytes) but the file has 1032 bytes"),
    (lambda raw: raw[:100], "100 bytes is shorter than the 1024-byte shard header"),
])
def test_bad_shards_are_named_with_their_problem(tmp_path, corrupt, message):
    path = tmp_path / "bad_train_000001.bin"
    write_shard(path, np.arange(5))
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(DataError) as error:
        load_shard(path)
    assert str(error.value) == f"{path}: {message}"


def test_missing_data_and_missing_split_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="data directory not found"):
        find_shards(tmp_path / "nope", "train")
    write_shard(tmp_path / "x_train_000001.bin", np.arange(10))
    with pytest.raises(DataError, match=r"no 'val' shards \(\*_val_\*.bin\)"):
        find_shards(tmp_path, "val")


def test_ranks_read_disjoint_windows_that_together_cover_the_stream(tmp_path):
    tokens = np.arange(1000) % 60000
    write_shard(tmp_path / "x_train_000001.bin", tokens)
    write_shard(tmp_path / "x_train_000002.bin", tokens + 1000)
    shards = find_shards(tmp_path, "train")
    loaders = [DistributedTokenLoader(shards, micro_batch=2, seq_len=8, rank=r, world_size=2) for r in range(2)]
    seen = []
    for _ in range(5):
        for loader in loaders:
            x, y = loader.next_batch()
            assert np.array_equal(y.flatten()[:-1].numpy(), x.flatten()[1:].numpy())  # targets = next token
            seen.append(x.flatten().tolist())
    flat = [t for window in seen for t in window]
    assert len(flat) == len(set(flat))  # no token position read twice
    assert flat == list(range(len(flat)))  # and none skipped: rank 0, rank 1, rank 0, ... in order


def test_loader_moves_to_the_next_shard_and_wraps_around(tmp_path):
    write_shard(tmp_path / "x_train_000001.bin", np.arange(40))
    write_shard(tmp_path / "x_train_000002.bin", np.arange(100, 140))
    loader = DistributedTokenLoader(find_shards(tmp_path, "train"), micro_batch=1, seq_len=16)
    firsts = [loader.next_batch()[0][0, 0].item() for _ in range(5)]
    assert firsts == [0, 16, 100, 116, 0]


def test_a_shard_too_small_for_one_step_is_rejected(tmp_path):
    path = tmp_path / "x_train_000001.bin"
    write_shard(path, np.arange(20))
    with pytest.raises(DataError, match="20 tokens is fewer than one step needs"):
        DistributedTokenLoader([path], micro_batch=2, seq_len=8, world_size=2)


def test_tokenizer_is_gpt2_bpe():
    tokenizer = gpt2_tokenizer()
    assert tokenizer.encode_ordinary("Hello world") == [15496, 995]
    assert tokenizer.n_vocab == 50257 and tokenizer.eot_token == EOT_TOKEN
    text = "To be, or not to be: that is the question.\n"
    assert tokenizer.decode(tokenizer.encode_ordinary(text)) == text


def test_prepared_shakespeare_round_trips_and_holds_out_whole_plays(shakespeare_dir):
    documents = shakespeare_documents()  # the archive the fixture downloaded
    tokenizer = gpt2_tokenizer()
    for split in ("train", "val"):
        (shard,) = find_shards(shakespeare_dir, split)
        tokens = load_shard(shard).tolist()
        eot = tokenizer.decode([EOT_TOKEN])
        assert tokenizer.decode(tokens) == "".join(eot + doc for doc in documents[split])
    assert len(documents["val"]) == len(SHAKESPEARE_VAL_PLAYS)
    assert not set(documents["val"]) & set(documents["train"])
    assert any(doc.startswith("MACBETH") for doc in documents["val"])
