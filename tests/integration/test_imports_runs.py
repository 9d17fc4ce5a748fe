"""Each gpt module imports on its own, with no other gpt module loaded before it (the import graph:
tests/unit/test_imports.py)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

GPT = REPO / "gpt"
MODULES = sorted(".".join(path.relative_to(GPT).with_suffix("").parts) for path in GPT.rglob("*.py")
                 if path.stem != "__init__")  # "console", "train.trainer", "commands.plan"


# One fresh interpreter imports torch and DeepSpeed, then forks a child per gpt module: each child starts with
# no gpt module loaded, as a fresh interpreter would, without paying torch's import (~3 s) again per module.
IMPORT_EACH = """
import os, sys
import torch, deepspeed
failed = []
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__("gpt." + module)
        except BaseException as e:
            print(f"gpt.{module}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(module)
print(" ".join(failed))
"""


@pytest.mark.slow
def test_each_module_imports_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH, *MODULES], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.split() == [], proc.stderr[-3000:]
