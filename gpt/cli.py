"""`python -m gpt.cli eval|sample ...`: gpt-eval and gpt-sample without installing them. The commands live in
gpt/commands/ (eval.py, sample.py); this module holds nothing else, so that the command line above keeps working."""
import sys

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in ("eval", "sample"):
        sys.exit("usage: python -m gpt.cli eval|sample [options]")
    if command == "eval":
        from gpt.commands.eval import main
    else:
        from gpt.commands.sample import main
    main(sys.argv[2:])
