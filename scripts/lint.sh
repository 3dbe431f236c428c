#!/usr/bin/env bash
# Lint and type-check (what CI runs before the tests): ruff over the whole tree, mypy (strict) over
# the plugin contract. Rules and the files mypy checks: pyproject.toml ([tool.ruff], [tool.mypy]).
#   bash scripts/lint.sh          # check
#   bash scripts/lint.sh --fix    # let ruff fix what it can, then check
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source "$ROOT/scripts/_venv.sh"
if ! "$PY" -m ruff --version >/dev/null 2>&1 || ! "$PY" -m mypy --version >/dev/null 2>&1; then
    echo "==> installing ruff and mypy"
    "$PY" -m pip install -q 'ruff>=0.6' 'mypy>=1.10'
fi
echo "==> ruff $("$PY" -m ruff --version)"
"$PY" -m ruff check ${1:+"$1"} core plugins tests benchmarks examples
echo "==> $("$PY" -m mypy --version)"
"$PY" -m mypy
