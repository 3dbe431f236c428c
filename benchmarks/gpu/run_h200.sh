#!/usr/bin/env bash
# One call on the lent GPU machine: install the carried peer wheels, run the cupy plugin's tests,
# run the suite. Results go under $OUT (the device tool brings them back).
#   OUT=/tmp/out bash benchmarks/gpu/run_h200.sh                # everything
#   TESTS="plugins/cupy_backend/tests/test_cupy_gpu.py" SUITE_ARGS="--cases spmv" bash benchmarks/gpu/run_h200.sh
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT/results"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
fi
# the plugins are found through their entry points: install them (editable) from the carried tree
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cupy_backend -e plugins/cuda_kernels 2>&1 | tail -2
export PYTHONPATH="$PWD/core:$PWD/plugins/cupy_backend:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY' 2>&1 | tee "$OUT/probe.txt"
import importlib, inspect
for m in ("matplotlib", "cupy", "nvmath", "torch_sla"):
    try:
        mod = importlib.import_module(m); print(m, "OK", getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", type(e).__name__, e)
from cupy_backends.cuda.libs import cusparse as cs
print("createCsc bound:", hasattr(cs, "createCsc"))
import cupyx.scipy.sparse.linalg as cla
for f in ("cg", "gmres", "minres", "cgs", "lsmr", "eigsh"):
    print(f, inspect.signature(getattr(cla, f)))
PY
if [ "${TESTS:-all}" != "none" ]; then
  T=${TESTS:-plugins/cupy_backend/tests}
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -W ignore -rfEs --tb=short $T > "$OUT/pytest_full.txt" 2>&1
  echo "pytest exit $?"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_full.txt" | head -60
  tail -3 "$OUT/pytest_full.txt"
fi
if [ "${SUITE_ARGS:-}" != "none" ]; then
  timeout "${SUITE_TIMEOUT:-320}" python3 benchmarks/gpu/suite.py --out "$OUT/results" ${SUITE_ARGS:-} 2>&1 | tee "$OUT/suite_log.txt" | tail -80
fi
