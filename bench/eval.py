"""HellaSwag evaluation throughput (examples/s) for a model size on this machine, on synthetic examples
shaped like the real validation set (context ~45 tokens, endings ~22 tokens; the real file cannot be
downloaded here), batched as in training, in fp32 and bf16, on the GPU when there is one (as gpt-eval).

    python bench/eval.py --model d12 --examples 64
    python bench/eval.py --model d12 --examples 512 --batch 16 --device cuda    # launch/gpu_check.sh
"""
import argparse
import time

import numpy as np
import torch

from gpt.train.hf import DEVICES, choose_device
from gpt.data.hellaswag import Example, evaluate
from gpt.model.model import GPT, GPT2_VOCAB_SIZE, PRESETS


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
    parser.add_argument("--device", choices=DEVICES, default="auto")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = choose_device(args.device)
    examples = synthetic_examples(args.examples)
    for dtype in (torch.float32, torch.bfloat16):
        model = GPT(PRESETS[args.model]).to(device, dtype).eval()
        evaluate(model, examples[:args.batch], device, model.config.block_size, args.batch)  # warm up
        start = time.perf_counter()
        evaluate(model, examples, device, model.config.block_size, args.batch)  # its scores end in .item(): synced
        seconds = time.perf_counter() - start
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
        print(f"{args.model} {str(dtype).split('.')[-1]:9s} {args.examples / seconds:8.2f} examples/s "
              f"({args.examples} examples, batch {args.batch}, {where}): the full 10,042 in "
              f"{10042 / (args.examples / seconds) / 60:.1f} min")


if __name__ == "__main__":
    main()
