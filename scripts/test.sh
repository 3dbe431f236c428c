#!/usr/bin/env bash
# Second command of the README: run the test suite in .venv.
#   bash scripts/test.sh                      # all of tests/
#   bash scripts/test.sh tests/test_cli.py -x # extra args go to pytest
# Creates .venv with torch and sparsetorch[test] if needed, re-uses it otherwise.
# Exit code is pytest's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMP="$VENV/.sparsetorch-test-installed"

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

if ! "$PY" -m pip show torch >/dev/null 2>&1; then
    echo "==> installing $TORCH_SPEC"
    "$PY" -m pip install "$TORCH_SPEC"
fi

# Re-install only when the packaging inputs changed (or the stamp is missing).
want="$(cat pyproject.toml scripts/test.sh | "$PY" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]] || ! "$PY" -m pip show sparsetorch >/dev/null 2>&1; then
    echo "==> installing sparsetorch (editable) with the test extra"
    "$PY" -m pip install -e '.[test]'
    # Backend plugins get installed here as they land, e.g.:
    #   "$PY" -m pip install -e plugins/scipy_backend
    echo "$want" > "$STAMP"
fi

exec "$PY" -m pytest "$@"
