"""python -m gpt.standalone_cli eval|sample ...: the gpt-eval and gpt-sample console scripts without installing."""
import sys

from gpt.standalone import evaluate_main, sample_main

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in ("eval", "sample"):
        sys.exit("usage: python -m gpt.standalone_cli eval|sample [options]")
    (evaluate_main if command == "eval" else sample_main)(sys.argv[2:])
