"""gpt-sample: text sampled from one of our checkpoints or a Hugging Face GPT-2 directory.

    gpt-sample --checkpoint runs/dsgpt/checkpoints --prompt "Hello, I'm a language model," --num_samples 4
    python -m gpt.commands.sample ...                               # the same without installing

It runs on the GPU when torch sees one (--device auto, the default; --device cpu|cuda to choose), in bf16
autocast on GPUs with bf16 units and in fp32 elsewhere; stdout holds only the samples.

Bad input is one line on stderr and exit status 1, found before the weights are loaded: the flags first,
then the model's shape (read without its weights) against them.
"""
import os
import sys

import torch

from gpt.console import BadInput, Parser, exit_if, exit_with, one_line_on_ctrl_c
from gpt.config.settings import range_problems, seed_problem

from gpt.train.hf import add_model_arguments, choose_device, evaluation_precision, model_problems, model_source
from gpt.train.evaluate import sample

from gpt.model.model import GPT2_VOCAB_SIZE
from gpt.data.tokenizer import EOT_TOKEN, gpt2_tokenizer

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


@one_line_on_ctrl_c("nothing was written")
def main(argv=None):
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
    except BadInput as e:
        exit_with(e)
    print(f"sampling on {device.type} in {precision}", file=sys.stderr)  # stdout holds only the samples
    tokenizer = gpt2_tokenizer()
    prompt = tokenizer.encode_ordinary(args.prompt) or [EOT_TOKEN]  # "" (nothing to continue): a new document
    generator = torch.Generator().manual_seed(args.seed)  # one stream: the samples differ, the run repeats
    with autocast:
        for i in range(args.num_samples):
            tokens = sample(model, prompt, args.max_new_tokens, generator, device, args.temperature, args.top_k)
            print(f"--- sample {i}\n{tokenizer.decode(tokens[1:] if args.prompt == '' else tokens)}")


if __name__ == "__main__":
    main()
