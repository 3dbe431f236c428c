#!/usr/bin/env bash
# First command of the README on a fresh machine:
#   create .venv (if missing), install torch, install sparsetorch editable, run the demo.
# Idempotent; works from any directory.
#   PYTHON=python3.12 bash scripts/quickstart.sh      # pick the interpreter
#   TORCH_SPEC='torch==2.13.0' (default)              # pin/override the torch build
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source "$ROOT/scripts/_venv.sh"

echo "==> installing sparsetorch (editable) and the SciPy + PyAMG backend plugin"
"$PY" -m pip install -e '.[scipy]' -e 'plugins/scipy_backend[amg]'
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

echo "==> sparsetorch demo"
"$VENV/bin/sparsetorch" demo
