"""gpt-export: a dsgpt checkpoint as a Hugging Face GPT-2 directory (gpt/train/hf.py's export).

    gpt-export runs/dsgpt/checkpoints/step_00019072 --out_dir gpt2-dsgpt     # or: python -m gpt.commands.export ...

An --out_dir that already holds a model's files is refused unless --overwrite is given. One gpt-export per --out_dir at
a time: it holds OUT_DIR/export.lock while it writes (gpt/runtime/lock_file.py); a second is refused, naming the
first. Two at once, of different steps, both wrote: one said "exported" over the other's weights.
"""
import os
from pathlib import Path

from gpt.config.settings import path_arg
from gpt.console import Parser, exit_if, exit_with, one_line_on_ctrl_c, out_dir_problem, regular_file_problem
from gpt.runtime import lock_file
from gpt.train.hf import MODEL_FILES, export

EXPORT_LOCK = "export.lock"


def check_args(args):
    """The checkpoint exists; --out_dir can be written and holds neither checkpoints nor (without --overwrite)
    another model's files."""
    from gpt.train.checkpoint import COMPLETE, complete_tags  # after parsing: it imports DeepSpeed (gpt.train.hf)

    out = Path(args.out_dir)
    if not Path(args.checkpoint).exists():
        return [f"{args.checkpoint}: checkpoint not found"]
    problem = out_dir_problem("--out_dir", args.out_dir)
    if problem or not out.is_dir():
        return [problem]
    if (out / COMPLETE).exists() or complete_tags(out):
        return [f"--out_dir {out} holds dsgpt checkpoints: export into a directory of its own"]
    in_the_way = [regular_file_problem(out / name) for name in MODEL_FILES if os.path.lexists(out / name)]
    if any(in_the_way):  # --overwrite could not replace them
        return [f"{next(p for p in in_the_way if p)}: --overwrite could not replace it"]
    held = [name for name in MODEL_FILES if (out / name).exists()]
    if held and not args.overwrite:
        return [f"--out_dir {out} already holds {', '.join(held)}: give --overwrite to replace them, or another --out_dir"]
    return []


@one_line_on_ctrl_c("its files are renamed into place only once all are complete: none was half-written")
def main(argv=None):
    parser = Parser(description="Export a dsgpt checkpoint as a Hugging Face GPT-2 directory.")
    parser.add_argument("checkpoint", type=path_arg,
                        help="a checkpoint directory (or its checkpoints/ parent: the newest)")
    parser.add_argument("--out_dir", required=True, type=path_arg)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model and tokenizer files --out_dir already holds")
    args = parser.parse_args(argv)
    exit_if(check_args(args))
    try:
        with lock_file.holding(args.out_dir, EXPORT_LOCK, "gpt-export"):
            exit_if(check_args(args))  # again, now that no other export writes there
            out = export(args.checkpoint, args.out_dir)
            print(f"exported {args.checkpoint} -> {out} (load with transformers.GPT2LMHeadModel.from_pretrained, or "
                  f"transformers.pipeline('text-generation', model='{out}'))")  # said while the files are its own
    except (ValueError, OSError) as e:  # BadInput; a full disk
        exit_with(e)


if __name__ == "__main__":
    main()
