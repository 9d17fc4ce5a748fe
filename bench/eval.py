"""HellaSwag evaluation throughput (examples/s) for a model size on this machine, on synthetic examples
shaped like the real validation set (context ~45 tokens, endings ~22 tokens; the real file cannot be
downloaded here), batched as in training, in fp32 and bf16.

    python bench/eval.py --model d12 --examples 64
"""
import argparse
import time

import numpy as np
import torch

from gpt.hellaswag import Example, evaluate
from gpt.model import GPT, GPT2_VOCAB_SIZE, PRESETS


def synthetic_examples(count, seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda n: tuple(int(t) for t in rng.integers(0, GPT2_VOCAB_SIZE, n))
    return [Example(draw(rng.integers(30, 60)), tuple(draw(rng.integers(12, 32)) for _ in range(4)), int(rng.integers(4)))
            for _ in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="d12")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    examples = synthetic_examples(args.examples)
    for dtype in (torch.float32, torch.bfloat16):
        model = GPT(PRESETS[args.model]).to(dtype).eval()
        evaluate(model, examples[:args.batch], torch.device("cpu"), model.config.block_size, args.batch)  # warm up
        start = time.perf_counter()
        evaluate(model, examples, torch.device("cpu"), model.config.block_size, args.batch)
        seconds = time.perf_counter() - start
        print(f"{args.model} {str(dtype).split('.')[-1]:9s} {args.examples / seconds:8.2f} examples/s "
              f"({args.examples} examples, batch {args.batch}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
