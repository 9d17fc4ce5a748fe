"""What the unit and the integration tests share, each made on first use: the Shakespeare shards (prepared once per
session, in this process), ten HellaSwag examples (jsonl and llm.c .bin), the one-rank process group of in-process
DeepSpeed engines. tests/common.py, imported first, pins DeepSpeed to its CPU accelerator (also on a machine with a
GPU; tests/integration/test_gpu.py holds the CUDA tests).

tests/unit/ starts no process and needs nothing more (`python -m pytest -q tests/unit`: the inner loop); its tests
import from common.py. tests/integration/ trains, launches and runs the console tools: its conftest.py holds that
machinery (runs in this process, the shared 2-rank launch, the background lane, the trained checkpoint), and its
tests import from it as `conftest`, the name pytest imports every conftest.py under, so that file is the one they
get: keep it the only conftest.py below this one. Markers: slow (launches processes or trains for seconds),
two_rank_runs, background_runs, gpu."""
import json
import struct

import pytest

from common import join_single_rank_group


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory):
    from gpt.commands.prepare import main as prepare_main

    out = tmp_path_factory.mktemp("shakespeare")
    prepare_main(["shakespeare", "--out_dir", str(out)])  # in this process: the command line is test_prepare's
    return out


HELLASWAG_CONTEXTS = ["A man is sitting on a roof. he", "A woman walks into the kitchen and",
                      "The dog runs across the", "Two kids are playing chess while", "She opens the box and finds",
                      "The chef slices the onion, then", "A cyclist climbs the hill and",
                      "The teacher writes on the board and", "He tunes the guitar before", "The crowd cheers as the runner"]
HELLASWAG_ENDINGS = ["starts pulling up roofing on a roof.", "is holding a rubik's cube.", "eats a sandwich slowly.",
                     "jumps over the fence into the garden of the neighbours."]


@pytest.fixture(scope="session")
def hellaswag_files(tmp_path_factory):
    """Ten HellaSwag examples as official jsonl and as an llm.c eval .bin written from its spec."""
    from gpt.data.tokenizer import gpt2_tokenizer

    out = tmp_path_factory.mktemp("hellaswag")
    rows = [{"ind": i, "ctx": c, "endings": HELLASWAG_ENDINGS[i % 4:] + HELLASWAG_ENDINGS[:i % 4], "label": i % 4,
             "split": "val"} for i, c in enumerate(HELLASWAG_CONTEXTS)]
    (out / "hellaswag_val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = gpt2_tokenizer()
    stream = []
    for i, r in enumerate(rows):
        fields = [i, r["label"], 4]
        for tokens in [tokenizer.encode_ordinary(r["ctx"])] + [tokenizer.encode_ordinary(" " + e) for e in r["endings"]]:
            fields += [len(tokens), *tokens]
        stream += [65535, 2 * (len(fields) + 2), *fields]
    (out / "hellaswag_val.bin").write_bytes(struct.pack("<256i", 20240522, 1, len(rows), *[0] * 253)
                                            + struct.pack(f"<{len(stream)}H", *stream))
    return out


@pytest.fixture(scope="session")
def single_rank_group():
    join_single_rank_group()


def pytest_sessionfinish(session):
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
