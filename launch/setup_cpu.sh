#!/usr/bin/env bash
# Install dsgpt on a machine without a GPU (laptop, CI): PyTorch 2.13.0 (CI's machines hold its CPU build
# locally; elsewhere choose the CPU wheel in PyTorch's install selector), then the package and its test extras
# at the versions the suite last passed with: launch/constraints-cpu.txt, a pip constraints file (the lock).
# setup.cfg keeps the ranges users install from; the lock is what is tested, so a new release of any tool
# cannot turn CI red overnight. GPU machines: README, "Install on GPUs" (and launch/constraints-gpu.txt).
#   bash launch/setup_cpu.sh            the lock (CI, the demo)
#   bash launch/setup_cpu.sh --latest   the newest releases setup.cfg allows instead (torch stays 2.13.0, the
#                                       CPU build), then the packages that differ from the lock; then run the
#                                       suite: a drift found before users find it (docs/testing.md)
#   bash launch/setup_cpu.sh --freeze   this environment's versions become the lock: in a fresh venv, after
#                                       --latest and a green suite
set -euo pipefail
cd "$(dirname "$0")/.."
lock=launch/constraints-cpu.txt

# "name==version" per installed package but the project; torch's local label (+cpu) dropped, so the lock
# also takes the same release from another index.
installed() { python -m pip freeze --exclude-editable | sed 's/^\(torch==[^+]*\)+.*/\1/'; }

case "${1:-}" in
  "")
    python -m pip install --quiet --constraint "$lock" torch==2.13.0 -e ".[test]" ;;
  --latest)
    python -m pip install --quiet --upgrade --upgrade-strategy eager torch==2.13.0 -e ".[test]"
    echo "packages that differ from $lock (lock -> installed):"
    installed | python -c '
import re, sys

def pins(lines):  # {canonical name: version} of "name==version" lines
    pairs = (line.strip().partition("==") for line in lines if not line.startswith("#"))
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, _, version in pairs if version}

lock, now = pins(open(sys.argv[1])), pins(sys.stdin)
changed = [(name, lock.get(name, "-"), now.get(name, "-")) for name in sorted(lock.keys() | now.keys())
           if lock.get(name) != now.get(name)]
print("\n".join(f"  {name} {old} -> {new}" for name, old, new in changed) or "  none")' "$lock" ;;
  --freeze)
    { echo "# The versions the suite last passed with (python -m pytest -q tests), written by"
      echo "# 'bash launch/setup_cpu.sh --freeze' on $(date +%F) in a fresh venv, Python $(python -c 'import platform; print(platform.python_version())')."
      installed; } > "$lock.new"
    mv "$lock.new" "$lock"
    echo "wrote $lock ($(grep -vc '^#' "$lock") packages)" ;;
  *)
    echo "usage: bash launch/setup_cpu.sh [--latest | --freeze]" >&2; exit 2 ;;
esac
