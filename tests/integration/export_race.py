"""gpt-export as the first of two exporters into one --out_dir: it takes the --out_dir's lock, then waits, before it
writes a file, until the path given as its last argument exists; the test starts the second exporter meanwhile. Run
by tests/integration/test_link_runs.py."""
import sys
import time
from pathlib import Path

from gpt.commands import export

if __name__ == "__main__":
    go, write = Path(sys.argv.pop()), export.export

    def on_go(*args):
        while not go.exists():
            time.sleep(0.05)
        return write(*args)

    export.export = on_go
    export.main()
