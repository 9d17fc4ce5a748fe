#!/usr/bin/env bash
# Install dsgpt on a machine without a GPU (laptop, CI): PyTorch 2.13.0 (CI's machines hold its CPU build
# locally; elsewhere choose the CPU wheel in PyTorch's install selector), then the package and test extras.
# GPU machines: install PyTorch's CUDA build first, then `pip install -e .` (README, "Install on GPUs").
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[test]"
