"""The gpt-eval and gpt-sample commands: evaluate and sample outside training, from one of our
checkpoints or a Hugging Face GPT-2 directory.

    gpt-eval --checkpoint runs/dsgpt/checkpoints --data data/fineweb10B --hellaswag hellaswag_val.jsonl --json
    gpt-eval --hf gpt2-dir --hellaswag val                      # OpenAI's GPT-2 124M: acc_norm 0.2955
    gpt-sample --checkpoint runs/dsgpt/checkpoints --prompt "Hello, I'm a language model," --num_samples 4
    python -m gpt.cli eval|sample ...                          # the same without installing
"""
import argparse
import json
import sys
import time

import torch

from gpt import hellaswag
from gpt.data import DataError, ValidationSet, find_shards
from gpt.evaluate import sample, validation_loss
from gpt.checkpoint import CheckpointError, read_weights
from gpt.hf import InteropError, config_from_hf, load_hf_weights, read_hf_config
from gpt.model import GPT
from gpt.tokenizer import gpt2_tokenizer


def load_model(args):
    """(GPT in eval mode, its config) from --checkpoint or --hf."""
    if args.checkpoint:
        state, config = read_weights(args.checkpoint)
    else:
        config = config_from_hf(read_hf_config(args.hf))
        state = load_hf_weights(args.hf, config)
    model = GPT(config)
    model.load_state_dict(state)
    return model.eval(), config


def add_model_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="one of our checkpoints (or its checkpoints/ directory: the newest)")
    source.add_argument("--hf", help="a Hugging Face GPT-2 directory (config.json + weights)")


def evaluate_main(argv=None):
    parser = argparse.ArgumentParser(description="Validation loss and HellaSwag for a checkpoint or HF model.")
    add_model_arguments(parser)
    parser.add_argument("--data", help="a shard directory: validation loss on its val split")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--val_tokens", type=int, default=10 * 2**20)
    parser.add_argument("--hellaswag", help="hellaswag_val.jsonl, llm.c's hellaswag_val.bin, or 'val' to download")
    parser.add_argument("--batch", type=int, default=8, help="sequences (val) / examples (HellaSwag) per forward")
    parser.add_argument("--limit", type=int, help="score only the first N HellaSwag examples")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        model, config = load_model(args)
        results = {}
        if args.data:
            val_set = ValidationSet(find_shards(args.data, "val"), min(args.seq_len, config.block_size),
                                    args.val_tokens // args.seq_len, args.batch)
            start = time.perf_counter()
            results["val_loss"] = validation_loss(model, val_set, torch.device("cpu"))
            results["val_tokens_per_s"] = len(val_set) * val_set.seq_len / (time.perf_counter() - start)
        if args.hellaswag:
            examples = hellaswag.load(args.hellaswag)[:args.limit]
            start = time.perf_counter()
            scores = hellaswag.evaluate(model, examples, torch.device("cpu"), config.block_size, args.batch, progress=True)
            results.update({f"hellaswag_{k}": v for k, v in scores.items()})
            results["hellaswag_examples_per_s"] = len(examples) / (time.perf_counter() - start)
    except (DataError, hellaswag.HellaSwagError, InteropError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    if not results:
        sys.exit("error: nothing to evaluate: give --data and/or --hellaswag")
    print(json.dumps(results) if args.json else "\n".join(f"{k:28s} {v:.4f}" if isinstance(v, float)
                                                         else f"{k:28s} {v}" for k, v in results.items()))


def sample_main(argv=None):
    parser = argparse.ArgumentParser(description="Sample text from a checkpoint or HF model.")
    add_model_arguments(parser)
    parser.add_argument("--prompt", default="\n")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num_samples", type=int, default=1)
    args = parser.parse_args(argv)
    if args.temperature <= 0 or args.top_k < 1:
        sys.exit("error: --temperature must be > 0 and --top_k >= 1")
    try:
        model, _ = load_model(args)
    except (InteropError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    tokenizer = gpt2_tokenizer()
    generator = torch.Generator().manual_seed(args.seed)  # one stream: the samples differ, the run repeats
    for i in range(args.num_samples):
        tokens = sample(model, tokenizer.encode_ordinary(args.prompt), args.max_new_tokens, generator,
                        torch.device("cpu"), args.temperature, args.top_k)
        print(f"--- sample {i}\n{tokenizer.decode(tokens)}")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in ("eval", "sample"):
        sys.exit("usage: python -m gpt.cli eval|sample [options]")
    (evaluate_main if command == "eval" else sample_main)(sys.argv[2:])
