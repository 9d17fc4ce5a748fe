"""launch/gpu_check.sh, the GPU acceptance run, where there is no GPU: one line and exit 1. Its steps' CPU twins
run elsewhere: gpt-plan --measure's search (test_probe.py), the bench sections (test_bench_runs.py),
gpt-eval's device choice (tests/unit/test_eval_device.py)."""
import subprocess

import pytest
import torch

from conftest import REPO


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it is the acceptance run itself")
def test_gpu_check_without_a_gpu_says_so_and_exits_1_and_its_report_dir_is_the_callers(tmp_path):
    """Started from another directory with a relative REPORT_DIR: the report goes where the caller stands."""
    proc = subprocess.run(["bash", str(REPO / "launch" / "gpu_check.sh"), "report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", (
        "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False); this is the GPU acceptance run\n"))
    assert (tmp_path / "report").is_dir() and not (REPO / "report").exists()
