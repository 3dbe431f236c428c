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
want="$(cat pyproject.toml plugins/scipy_backend/pyproject.toml plugins/eigen_backend/pyproject.toml plugins/cupy_backend/pyproject.toml plugins/cudss_backend/pyproject.toml plugins/distributed/pyproject.toml plugins/cuda_kernels/pyproject.toml scripts/test.sh scripts/_venv.sh | "$PY" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]] || ! "$PY" -m pip show sparsetorch >/dev/null 2>&1; then
    echo "==> installing sparsetorch (editable) with the test extra"
    "$PY" -m pip install -e '.[test]'
    # Backend plugins (each its own distribution, found through its entry point).
    "$PY" -m pip install -e 'plugins/scipy_backend[amg]'
    # The Eigen plugin is compiled here (pybind11 + Eigen headers from PyPI, ~2-3 CPU-minutes).
    "$PY" -m pip install -e plugins/eigen_backend
    # The CuPy plugin installs without CuPy (its GPU tests skip; its declines are tested on CPU).
    "$PY" -m pip install -e plugins/cupy_backend
    # The cuDSS plugin installs without libcudss (its GPU tests skip; declines, costs and the
    # library lookup are tested on CPU).
    "$PY" -m pip install -e plugins/cudss_backend
    # The distributed plugin (torch.distributed; its tests spawn 2 and 4 gloo processes, ~1 min).
    "$PY" -m pip install -e plugins/distributed
    # Native CUDA kernels (NVRTC through cuda-bindings + nvidia-cuda-nvrtc, its dependencies). On a
    # machine without a GPU: the host compile test, declines and costs run; GPU tests skip.
    "$PY" -m pip install -e plugins/cuda_kernels
    echo "$want" > "$STAMP"
fi

# OpenBLAS threads on small shared VMs made SciPy's Krylov loops 10-45x slower (measured).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec "$PY" -m pytest "$@"
