"""Ctrl-C while a console tool loads (gpt/console.py, ctrl_c_in_imports_is_one_line): one line and exit status 130,
where gpt-sample, gpt-export, gpt-eval and gpt-plan printed a KeyboardInterrupt traceback (or, landing inside the
import machinery, `TypeError: expected a message argument`). Each tool runs as its console script does, the test's
Ctrl-C sent once the tool's import of torch has begun. (Ctrl-C while gpt-prepare writes shards:
tests/integration/test_prepare_runs.py.)"""
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, default_signals

# pip's console script for the tool, after a finder that says when torch's import begins and holds it there: the
# Ctrl-C lands inside that import whatever this machine's speed
SCRIPT = """import sys, time

class HoldTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("importing torch", flush=True)
            time.sleep(600)
        return None

sys.meta_path.insert(0, HoldTorch())
from gpt.commands.{module} import main
if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("tool, module, leaves", [
    ("gpt-sample", "sample", "nothing was written"), ("gpt-export", "export", "nothing was written"),
    ("gpt-eval", "eval", "nothing was written"), ("gpt-plan", "plan", "nothing was written"),
    # torch comes inside its main: what its main's Ctrl-C says
    ("gpt-prepare", "prepare", "the shards complete so far are kept; the same command again continues after them")])
def test_ctrl_c_while_a_tool_imports_torch_is_one_line_and_exit_130(tmp_path, tool, module, leaves):
    script = tmp_path / tool
    script.write_text(SCRIPT.format(module=module))
    args = ["shakespeare", "--out_dir", str(tmp_path / "out")] if module == "prepare" else ["--help"]
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=tmp_path, env={**os.environ,
                            "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_signals)
    try:
        assert proc.stdout.readline() == "importing torch\n"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, stderr) == (130, f"error: stopped by Ctrl-C (SIGINT): {leaves}\n")
    assert stdout == "" and not (tmp_path / "out").exists()
