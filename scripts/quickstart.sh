#!/usr/bin/env bash
# First command of the README on a fresh machine:
#   create .venv (if missing), install torch, install sparsetorch editable, run the demo.
# Idempotent; works from any directory.
#   PYTHON=python3.12 bash scripts/quickstart.sh      # pick the interpreter
#   TORCH_SPEC='torch==2.13.0' (default)              # pin/override the torch build
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

if [[ -e "$VENV" && ! -d "$VENV" ]]; then
    # A PEP 832 redirect file (tox writes one pointing into .tox/): not ours to keep.
    if grep -qs '^\.tox/' "$VENV"; then
        rm -f "$VENV"
    else
        echo "error: $VENV exists but is not a directory; move it away and re-run." >&2
        exit 1
    fi
fi

if [[ ! -x "$PY" ]]; then
    echo "==> creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi

# torch first and pinned: an unpinned `torch` could pull a multi-GB build.
if "$PY" -m pip show torch >/dev/null 2>&1; then
    echo "==> torch already installed: $("$PY" -m pip show torch | sed -n 's/^Version: //p')"
else
    echo "==> installing $TORCH_SPEC"
    "$PY" -m pip install "$TORCH_SPEC"
fi

echo "==> installing sparsetorch (editable) with the scipy extra"
"$PY" -m pip install -e '.[scipy]'
# Backend plugins get installed here as they land, e.g.:
#   "$PY" -m pip install -e plugins/scipy_backend

echo "==> sparsetorch demo"
"$VENV/bin/sparsetorch" demo
