"""The gpt-eval and gpt-sample commands: evaluate and sample outside training, from one of our
checkpoints or a Hugging Face GPT-2 directory.

    gpt-eval --checkpoint runs/dsgpt/checkpoints --data data/fineweb10B --hellaswag hellaswag_val.jsonl --json
    gpt-eval --hf gpt2-dir --hellaswag val                      # OpenAI's GPT-2 124M: acc_norm 0.2955
    gpt-sample --checkpoint runs/dsgpt/checkpoints --prompt "Hello, I'm a language model," --num_samples 4
    python -m gpt.cli eval|sample ...                          # the same without installing

Both run on the GPU when torch sees one (--device auto, the default; --device cpu|cuda to choose), in bf16
autocast on GPUs with bf16 units and in fp32 elsewhere; gpt-eval reports the device and precision it used.

Bad input is one line on stderr and exit status 1, found before the weights are loaded: the flags first,
then the model's shape (read without its weights) against them.
"""
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from gpt import hellaswag
from gpt.args import Parser, exit_if, range_problems, seed_problem
from gpt.data import DataError, ValidationSet, check_token_range, find_shards
from gpt.evaluate import sample, validation_loss
from gpt.checkpoint import CheckpointError, find_checkpoint, read_run_config, read_weights
from gpt.hf import InteropError, config_from_hf, load_hf_weights, read_hf_config
from gpt.model import GPT, GPT2_VOCAB_SIZE, GPTConfig
from gpt.tokenizer import EOT_TOKEN, gpt2_tokenizer

DEFAULT_VAL_TOKENS = 10 * 2**20
DEVICES = ("auto", "cpu", "cuda")


def model_source(args):
    """(the model's GPTConfig, a function returning the model in eval mode) from --checkpoint or --hf: the
    shape is read without the weights, so that the input can be checked against it first."""
    if args.checkpoint:
        path = find_checkpoint(args.checkpoint, None)  # once: a damaged newer one is warned about once
        config = GPTConfig(**read_run_config(path)["model"])
        weights = lambda: read_weights(path)[0]  # noqa: E731
    else:
        config = config_from_hf(read_hf_config(args.hf))
        weights = lambda: load_hf_weights(args.hf, config)  # noqa: E731

    def load(device):
        state = weights()  # first: it refuses weights that do not fit the config before a model is built from it
        model = GPT(config)
        model.load_state_dict(state)
        return model.to(device).eval()
    return config, load


def add_model_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="one of our checkpoints (or its checkpoints/ directory: the newest)")
    source.add_argument("--hf", help="a Hugging Face GPT-2 directory (config.json + weights)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs: auto (the default) is cuda when torch sees a GPU, else cpu")


def model_problems(args):
    """The model's path and the device, checked before anything is loaded."""
    flag, path = ("--checkpoint", args.checkpoint) if args.checkpoint else ("--hf", args.hf)
    return [None if Path(path).exists() else f"{flag} {path}: not found",
            "--device cuda: torch sees no CUDA GPU here; use --device auto or cpu"
            if args.device == "cuda" and not torch.cuda.is_available() else None]


def choose_device(name):
    """The torch.device for --device: auto is cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def evaluation_precision(device):
    """(name, context to run the model in): bf16 autocast on a CUDA GPU with bf16 units, else fp32. The trainer's
    GPU runs are bf16, so a checkpoint is scored in the precision it trained in, at tensor-core speed. CPUs stay
    in fp32, their results exactly as before (many only emulate bf16, slowly); so do GPUs that only emulate it
    (V100)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16", torch.autocast("cuda", dtype=torch.bfloat16)
    return "fp32", contextlib.nullcontext()


# A typo guard: a batch of 10**12 used to build one batch of the whole val split (or of all of HellaSwag) and swap
# until killed; GPT-2's logits for 1024 sequences of 1024 tokens are already 200 GB in fp32.
MAX_EVAL_BATCH = 1024


def check_eval_args(args):
    problems = range_problems(args, [("batch", 1, True, MAX_EVAL_BATCH, "the logits alone outgrow memory"),
                                     ("limit", 1, True), ("seq_len", 1, True), ("val_tokens", 1, True)])
    if not (args.data or args.hellaswag):
        problems.append("nothing to evaluate: give --data and/or --hellaswag")
    for flag, needs in (("seq_len", "data"), ("val_tokens", "data"), ("limit", "hellaswag")):
        if getattr(args, flag) is not None and not getattr(args, needs):
            problems.append(f"--{flag} applies to --{needs}, which is not given")
    return problems + model_problems(args)


def check_against_model(args, config):
    """The flags against the model's shape: (problems, the validation seq_len)."""
    problems, seq_len = [], args.seq_len or config.block_size
    if seq_len > config.block_size:
        problems.append(f"--seq_len {seq_len} exceeds the model's block_size {config.block_size}")
    elif args.data and (args.val_tokens or DEFAULT_VAL_TOKENS) < seq_len:
        problems.append(f"--val_tokens {args.val_tokens or DEFAULT_VAL_TOKENS} is less than one sequence "
                        f"(--seq_len {seq_len})")
    if args.hellaswag and config.vocab_size < GPT2_VOCAB_SIZE:
        problems.append(f"--hellaswag needs GPT-2's vocabulary: the model's vocab_size is {config.vocab_size} "
                        f"< {GPT2_VOCAB_SIZE}")
    return problems, seq_len


def evaluate_main(argv=None):
    parser = Parser(description="Validation loss and HellaSwag for a checkpoint or HF model.")
    add_model_arguments(parser)
    parser.add_argument("--data", help="a shard directory: validation loss on its val split")
    parser.add_argument("--seq_len", type=int, help="tokens per validation sequence (default: the model's block_size)")
    parser.add_argument("--val_tokens", type=int, help=f"validation tokens (default: {DEFAULT_VAL_TOKENS})")
    parser.add_argument("--hellaswag", help="hellaswag_val.jsonl, llm.c's hellaswag_val.bin, or 'val' to download")
    parser.add_argument("--batch", type=int, default=8, help="sequences (val) / examples (HellaSwag) per forward")
    parser.add_argument("--limit", type=int, help="score only the first N HellaSwag examples")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    exit_if(check_eval_args(args))
    try:
        config, load_model = model_source(args)
        problems, seq_len = check_against_model(args, config)
        exit_if(problems)
        val_set = examples = None
        if args.data:
            val_set = ValidationSet(find_shards(args.data, "val"), seq_len,
                                    (args.val_tokens or DEFAULT_VAL_TOKENS) // seq_len, args.batch)
            for path in dict.fromkeys(path for path, _ in val_set.windows):
                check_token_range(path, config.vocab_size)
        if args.hellaswag:
            examples = hellaswag.load(args.hellaswag)[:args.limit]
        device = choose_device(args.device)
        precision, autocast = evaluation_precision(device)
        model, results = load_model(device), {"device": device.type, "precision": precision}
        with autocast:
            if val_set:
                start = time.perf_counter()
                results["val_loss"] = validation_loss(model, val_set, device)  # ends in .item(): synchronized
                results["val_tokens"] = len(val_set) * val_set.seq_len  # --val_tokens beyond the val split: all of it
                results["val_tokens_per_s"] = len(val_set) * val_set.seq_len / (time.perf_counter() - start)
            if examples:
                start = time.perf_counter()
                scores = hellaswag.evaluate(model, examples, device, config.block_size, args.batch, progress=True)
                results.update({f"hellaswag_{k}": v for k, v in scores.items()})
                results["hellaswag_examples_per_s"] = len(examples) / (time.perf_counter() - start)
    except (DataError, hellaswag.HellaSwagError, InteropError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(results) if args.json else "\n".join(f"{k:28s} {v:.4f}" if isinstance(v, float)
                                                         else f"{k:28s} {v}" for k, v in results.items()))


# Upper bounds that stop a typo (--num_samples 1000000000000) from printing for days; no real use comes near them.
MAX_NEW_TOKENS = 2**16
MAX_SAMPLES = 10_000


def prompt_problem(prompt):
    """Why the prompt is not text (bytes that are not UTF-8 reach Python as lone surrogates), or None."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        data = os.fsencode(prompt)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"--prompt: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        return "--prompt: not UTF-8 text"
    return None


def sample_main(argv=None):
    parser = Parser(description="Sample text from a checkpoint or HF model.")
    add_model_arguments(parser)
    parser.add_argument("--prompt", default="\n",
                        help='the text to continue (default: a newline); "" starts from <|endoftext|>, as GPT-2\'s '
                             'unconditional samples do')
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=50,
                        help=f"sample among the k likeliest tokens; k >= {GPT2_VOCAB_SIZE} (the vocabulary): all of them")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num_samples", type=int, default=1)
    args = parser.parse_args(argv)
    exit_if(range_problems(args, [("max_new_tokens", 1, True, MAX_NEW_TOKENS, "64 x GPT-2's context"),
                                  ("temperature", 0, False), ("top_k", 1, True),
                                  ("num_samples", 1, True, MAX_SAMPLES, "more is a job for a script")])
            + [seed_problem("--seed", args.seed), prompt_problem(args.prompt)] + model_problems(args))
    try:
        config, load_model = model_source(args)
        exit_if([f"the model's vocab_size {config.vocab_size} is smaller than GPT-2's {GPT2_VOCAB_SIZE}: its "
                 f"samples cannot be written as GPT-2 text"] if config.vocab_size < GPT2_VOCAB_SIZE else [])
        device = choose_device(args.device)
        precision, autocast = evaluation_precision(device)
        model = load_model(device)
    except (InteropError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    print(f"sampling on {device.type} in {precision}", file=sys.stderr)  # stdout holds only the samples
    tokenizer = gpt2_tokenizer()
    prompt = tokenizer.encode_ordinary(args.prompt) or [EOT_TOKEN]  # "" (nothing to continue): a new document
    generator = torch.Generator().manual_seed(args.seed)  # one stream: the samples differ, the run repeats
    with autocast:
        for i in range(args.num_samples):
            tokens = sample(model, prompt, args.max_new_tokens, generator, device, args.temperature, args.top_k)
            print(f"--- sample {i}\n{tokenizer.decode(tokens[1:] if args.prompt == '' else tokens)}")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in ("eval", "sample"):
        sys.exit("usage: python -m gpt.cli eval|sample [options]")
    (evaluate_main if command == "eval" else sample_main)(sys.argv[2:])
