#!/usr/bin/env bash
# Second command of the README: run the test suite in .venv.
#   bash scripts/test.sh                      # all of tests/
#   bash scripts/test.sh tests/test_cli.py -x # extra args go to pytest
# Creates .venv with torch and sparsetorch[test] if needed, re-uses it otherwise.
# Exit code is pytest's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source "$ROOT/scripts/_venv.sh"
STAMP="$VENV/.sparsetorch-test-installed"

# Re-install only when the packaging inputs changed (or the stamp is missing).
want="$(cat pyproject.toml scripts/test.sh scripts/_venv.sh | "$PY" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]] || ! "$PY" -m pip show sparsetorch >/dev/null 2>&1; then
    echo "==> installing sparsetorch (editable) with the test extra"
    "$PY" -m pip install -e '.[test]'
    # Backend plugins get installed here as they land, e.g.:
    #   "$PY" -m pip install -e plugins/scipy_backend
    echo "$want" > "$STAMP"
fi

exec "$PY" -m pytest "$@"
