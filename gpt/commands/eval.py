"""gpt-eval: validation loss and HellaSwag outside training, for one of our checkpoints or a Hugging Face
GPT-2 directory.

    gpt-eval --checkpoint runs/dsgpt/checkpoints --data data/fineweb10B --hellaswag hellaswag_val.jsonl --json
    gpt-eval --hf gpt2-dir --hellaswag val                      # OpenAI's GPT-2 124M: acc_norm 0.2955
    python -m gpt.commands.eval ...                                  # the same without installing

It runs on the GPU when torch sees one (--device auto, the default; --device cpu|cuda to choose), in bf16
autocast on GPUs with bf16 units and in fp32 elsewhere, and reports the device and precision it used.

Bad input is one line on stderr and exit status 1, found before the weights are loaded: the flags first,
then the model's shape (read without its weights) against them.
"""
import json
import time

from gpt.data import hellaswag
from gpt.console import BadInput, Parser, exit_if, exit_with, one_line_on_ctrl_c
from gpt.config.settings import path_arg, range_problems

from gpt.train.hf import add_model_arguments, choose_device, evaluation_precision, model_problems, model_source
from gpt.data.shards import ValidationSet, check_token_range, find_shards
from gpt.train.evaluate import validation_loss

from gpt.model.model import GPT2_VOCAB_SIZE

DEFAULT_VAL_TOKENS = 10 * 2**20

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
    seq_len = args.seq_len or config.block_size
    problems = config.problems(seq_len)
    if not problems and args.data and (args.val_tokens or DEFAULT_VAL_TOKENS) < seq_len:
        problems.append(f"--val_tokens {args.val_tokens or DEFAULT_VAL_TOKENS} is less than one sequence "
                        f"(--seq_len {seq_len})")
    if args.hellaswag and config.vocab_size < GPT2_VOCAB_SIZE:
        problems.append(f"--hellaswag needs GPT-2's vocabulary: the model's vocab_size is {config.vocab_size} "
                        f"< {GPT2_VOCAB_SIZE}")
    return problems, seq_len


@one_line_on_ctrl_c("nothing was written")
def main(argv=None):
    parser = Parser(description="Validation loss and HellaSwag for a checkpoint or HF model.")
    add_model_arguments(parser)
    parser.add_argument("--data", type=path_arg, help="a shard directory: validation loss on its val split")
    parser.add_argument("--seq_len", type=int, help="tokens per validation sequence (default: the model's block_size)")
    parser.add_argument("--val_tokens", type=int, help=f"validation tokens (default: {DEFAULT_VAL_TOKENS})")
    parser.add_argument("--hellaswag", type=path_arg,
                        help="hellaswag_val.jsonl, llm.c's hellaswag_val.bin, or 'val' to download")
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
                check_token_range(path, config.real_vocab_size)
        if args.hellaswag:
            examples = hellaswag.load(args.hellaswag)[:args.limit]
        device = choose_device(args.device)
        precision, autocast = evaluation_precision(device)
        model, results = load_model(device), {"device": device.type, "precision": precision}
        with autocast:
            if val_set:
                start = time.perf_counter()
                results["val_loss"] = validation_loss(model, val_set, device, progress=True)  # .item(): synchronized
                results["val_tokens"] = len(val_set) * val_set.seq_len  # --val_tokens beyond the val split: all of it
                results["val_tokens_per_s"] = len(val_set) * val_set.seq_len / (time.perf_counter() - start)
            if examples:
                start = time.perf_counter()
                scores = hellaswag.evaluate(model, examples, device, config.block_size, args.batch, progress=True)
                results.update({f"hellaswag_{k}": v for k, v in scores.items()})
                results["hellaswag_examples_per_s"] = len(examples) / (time.perf_counter() - start)
    except BadInput as e:
        exit_with(e)
    print(json.dumps(results) if args.json else "\n".join(f"{k:28s} {v:.4f}" if isinstance(v, float)
                                                         else f"{k:28s} {v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
