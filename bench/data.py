"""Data-path benchmark: every figure is a ratio against a baseline measured in the same run.

    python bench/data.py            # ~1-2 minutes on 2 cores

1. prepare tokens/s (the whole pipeline: read, tokenize, write shards) vs tiktoken's own
   encode_ordinary_batch on the same text, per worker, and the scaling from 1 to 2 workers;
2. loader tokens/s vs the tokens/s a tiny model's training step consumes;
3. batch fetch time at shard boundaries vs inside a shard (p50/p99), with a consumer that computes;
4. peak RSS while preparing 1x, 4x and 16x the corpus (separate processes): flat = bounded by buffers,
   not by the corpus (datasets reads .jsonl in chunks of up to 10 MB, so 1x, at 5.5 MB, sits below that).
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gpt.data.shards import ShuffledTokenLoader, find_shards, write_shard
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS
from gpt.data.prepare import Corpus, prepare, shakespeare_documents
from gpt.data.tokenizer import gpt2_tokenizer


def best_of(repeats, fn):
    """Lowest wall time of `repeats` calls: the least disturbed by a noisy machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_prepare(documents, work):
    tokens = sum(len(t) + 1 for t in gpt2_tokenizer().encode_ordinary_batch(documents))
    tiktoken_s = best_of(2, lambda: gpt2_tokenizer().encode_ordinary_batch(documents, num_threads=1))
    prepare_s = {w: best_of(2, lambda w=w: prepare(Corpus(iter(documents)), tempfile.mkdtemp(dir=work), "b",
                                                    10_000_000, 100_000, w, {"w": w})) for w in (1, 2)}
    return {"tokens": tokens, "tiktoken_1thread_tok_s": tokens / tiktoken_s,
            "prepare_1worker_tok_s": tokens / prepare_s[1], "prepare_2workers_tok_s": tokens / prepare_s[2],
            "prepare_vs_tiktoken_per_worker": tiktoken_s / prepare_s[1],
            "scaling_1_to_2_workers": prepare_s[1] / prepare_s[2]}


def make_shards(directory, shards, tokens_per_shard):
    rng = np.random.default_rng(0)
    for i in range(shards):
        write_shard(Path(directory) / f"b_train_{i + 1:06d}.bin", rng.integers(0, GPT2_VOCAB_SIZE, tokens_per_shard))
    return find_shards(directory, "train")


def bench_loader(work, micro_batch=8, seq_len=1024):
    paths = make_shards(Path(tempfile.mkdtemp(dir=work)), 4, 4_000_000)
    loader = ShuffledTokenLoader(paths, micro_batch, seq_len, seed=0)
    loader.next_batch()
    batches = 300
    loader_s = best_of(1, lambda: [loader.next_batch() for _ in range(batches)]) / batches
    loader.close()
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, GPT2_VOCAB_SIZE, (micro_batch, PRESETS["tiny"].block_size))

    def train_step():
        _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()
    model_s = best_of(3, train_step) * seq_len / PRESETS["tiny"].block_size  # per micro_batch x seq_len tokens
    tokens = micro_batch * seq_len
    return {"loader_tok_s": tokens / loader_s, "tiny_model_train_tok_s": tokens / model_s,
            "loader_vs_consumption": model_s / loader_s}


def bench_boundaries(work, micro_batch=8, seq_len=1024, compute_s=0.005):
    """Small shards (a few batches each) so that many fetches cross a boundary; between fetches the
    consumer 'computes' for compute_s, as training would."""
    batches_per_shard = 5
    paths = make_shards(Path(tempfile.mkdtemp(dir=work)), 40, batches_per_shard * micro_batch * seq_len + 1)
    loader = ShuffledTokenLoader(paths, micro_batch, seq_len, seed=0)
    loader.next_batch()
    boundary, inside = [], []
    for i in range(1, 40 * batches_per_shard * 2):
        time.sleep(compute_s)
        start = time.perf_counter()
        loader.next_batch()
        (boundary if i % batches_per_shard == 0 else inside).append(time.perf_counter() - start)
    loader.close()
    ms = lambda values, q: float(np.percentile(values, q) * 1e3)
    return {"boundary_p50_ms": ms(boundary, 50), "boundary_p99_ms": ms(boundary, 99),
            "inside_p50_ms": ms(inside, 50), "inside_p99_ms": ms(inside, 99), "boundary_fetches": len(boundary)}


# VmHWM, not ru_maxrss: a forked child's ru_maxrss starts from the parent's, and survives exec.
RSS_CHILD = """
import sys
from gpt.commands.prepare import main
main(sys.argv[1:])
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


def bench_rss(documents, work):
    """The real CLI path (`files` source: datasets streaming a .jsonl) on 1x and 4x the corpus."""
    rss = {}
    for copies in (1, 4, 16):
        corpus = Path(work) / f"corpus_{copies}x.jsonl"
        with open(corpus, "w") as f:
            for _ in range(copies):
                f.writelines(json.dumps({"text": d}) + "\n" for d in documents)
        args = ["files", str(corpus), "--out_dir", tempfile.mkdtemp(dir=work), "--shard_tokens", "1000000"]
        out = subprocess.run([sys.executable, "-c", RSS_CHILD, *args], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1])
        rss[copies] = int(out.stdout.split()[-1]) / 1024  # KiB -> MiB
    return {"peak_rss_1x_mib": rss[1], "peak_rss_4x_mib": rss[4], "peak_rss_16x_mib": rss[16],
            "rss_4x_vs_1x": rss[4] / rss[1], "rss_16x_vs_4x": rss[16] / rss[4]}


def main():
    torch.set_num_threads(2)
    splits = shakespeare_documents()
    documents = splits["val"] + splits["train"]
    # Split the 39 works into ~1000-line documents: FineWeb-sized documents, and enough of them to fill
    # several tasks per worker.
    documents = ["\n".join(lines[i:i + 200]) for doc in documents
                 for lines in [doc.splitlines()] for i in range(0, len(lines), 200)]
    with tempfile.TemporaryDirectory() as work:
        results = {"prepare": bench_prepare(documents, work), "loader": bench_loader(work),
                   "boundaries": bench_boundaries(work), "rss": bench_rss(documents, work)}
    for section, figures in results.items():
        print(f"{section}:")
        for name, value in figures.items():
            print(f"  {name:34s} {value:>14,.3f}" if isinstance(value, float) else f"  {name:34s} {value:>14,}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
