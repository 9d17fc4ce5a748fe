"""gpt-prepare: a corpus as llm.c-format token shards (gpt/data/prepare.py).

    python -m gpt.commands.prepare shakespeare --out_dir data/shakespeare
    python -m gpt.commands.prepare files 'corpus/*.jsonl' --text_field text --out_dir data/mine
    python -m gpt.commands.prepare hub HuggingFaceFW/fineweb-edu --hub_config sample-10BT --out_dir data/fineweb_edu
"""
import os
from pathlib import Path

from gpt.console import BadInput, Parser, download_cache, exit_if, exit_with, one_line_on_ctrl_c, os_error_line
from gpt.config.settings import path_arg, range_problems

MAX_SHARD_TOKENS = 2**31 - 1  # the llm.c header's token count is an int32
SHARD_HEADER_LIMIT = "llm.c's shard header holds the token count as an int32"
# Below this a shard is a file for every few tokens: --shard_tokens 1 wrote Shakespeare as 9,555 one-token files
MIN_SHARD_TOKENS = 1000


def max_workers():
    """More tokenizer processes than 4 per CPU only add memory (each holds a tokenizer) and start-up time; far more
    (a typo, --workers 1000000) would fork until the machine gives out."""
    return 4 * (os.cpu_count() or 1)


def check_args(args, name):
    """The numbers in range and the name a plain file-name prefix; one line per problem."""
    problems = range_problems(args, [("shard_tokens", 1, True, MAX_SHARD_TOKENS, SHARD_HEADER_LIMIT),
                                     ("val_tokens", 1, True, MAX_SHARD_TOKENS, SHARD_HEADER_LIMIT),
                                     ("workers", 1, True, max_workers(), f"4 per CPU of this machine's {max_workers() // 4}")])
    if isinstance(args.shard_tokens, int) and 1 <= args.shard_tokens < MIN_SHARD_TOKENS:
        problems.append(f"--shard_tokens {args.shard_tokens} must be at least {MIN_SHARD_TOKENS:,}: smaller shards are "
                        f"a file for every few tokens (the default is 100,000,000)")
    if Path(name).name != name or name.startswith("."):
        problems.append(f"--name {name!r} must be a plain file-name prefix")
    return problems


@one_line_on_ctrl_c("the shards complete so far are kept; the same command again continues after them")
def main(argv=None):
    from gpt.data.prepare import SOURCES, check_out_dir, prepare  # here: a Ctrl-C while torch imports is one line too

    parser = Parser(description="Turn a corpus into GPT-2 token shards (llm.c format).")
    sources = parser.add_subparsers(dest="source", required=True)
    shakespeare = sources.add_parser("shakespeare", help="the embedded default corpus")
    files = sources.add_parser("files", help="local .txt/.jsonl/.json/.parquet files or globs")
    files.add_argument("paths", nargs="+", type=path_arg)
    hub = sources.add_parser("hub", help="a Hugging Face dataset, streamed (or a local dataset directory)")
    hub.add_argument("dataset", type=path_arg, help="e.g. HuggingFaceFW/fineweb-edu, or a local dataset directory")
    hub.add_argument("--hub_config", default=None, help="e.g. sample-10BT")
    hub.add_argument("--split", default="train")
    for sub in (shakespeare, files, hub):
        sub.add_argument("--out_dir", required=True, type=path_arg, help="where the .bin shards go")
        sub.add_argument("--name", default=None, help="shard name prefix (default: the source's)")
        sub.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per train shard")
        sub.add_argument("--val_tokens", type=int, default=None,
                         help="validation tokens, whole documents from the start (default: --shard_tokens)")
        sub.add_argument("--workers", type=int, default=1, help="tokenizer processes")
        sub.add_argument("--cache_dir", default=str(download_cache()), type=path_arg,
                         help="where downloaded sources are kept")
    for sub in (files, hub):
        sub.add_argument("--text_field", default="text", help="the column holding the text (.jsonl/.parquet)")
    args = parser.parse_args(argv)
    default_names = {"shakespeare": "shakespeare", "files": "corpus",
                     "hub": Path(getattr(args, "dataset", "hub")).name.replace("-", "_").lower()}
    name = args.name or default_names[args.source]
    # what the shards are made of: a rerun with other inputs into the same directory is refused, not "done"
    inputs = {key: getattr(args, key) for key in ("paths", "dataset", "hub_config", "split", "text_field")
              if hasattr(args, key)}
    settings = {"source": args.source, "shard_tokens": args.shard_tokens, "val_tokens": args.val_tokens, **inputs}
    exit_if(check_args(args, name))
    try:
        check_out_dir(args.out_dir, name)
        corpus = SOURCES[args.source](args)
        counts = prepare(corpus, args.out_dir, name, args.shard_tokens, args.val_tokens or args.shard_tokens,
                         args.workers, settings)
    except BadInput as e:
        exit_with(e)
    except OSError as e:  # a full disk while writing, a directory where a shard goes
        exit_with(os_error_line(e, args.out_dir))
    print(f"{name}: {counts['train']:,} train and {counts['val']:,} val tokens in {args.out_dir}")


if __name__ == "__main__":
    main()
