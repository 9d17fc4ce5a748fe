"""gpt-export with two gates, for a race of two exporters into one --out_dir: `export_race.py START GO ARGS...` imports
everything, waits until the path START exists, runs gpt-export ARGS, and once it holds the --out_dir's lock waits, before
it writes a file, until the path GO exists. Run by tests/integration/test_link_runs.py."""
import sys
import time
from pathlib import Path

from gpt.commands import export


def wait_for(path):
    while not path.exists():
        time.sleep(0.05)


if __name__ == "__main__":
    start, go, write = Path(sys.argv[1]), Path(sys.argv[2]), export.export

    def on_go(*args):
        wait_for(go)
        return write(*args)

    export.export = on_go
    wait_for(start)
    export.main(sys.argv[3:])
