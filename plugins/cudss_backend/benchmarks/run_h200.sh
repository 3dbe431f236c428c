#!/usr/bin/env bash
# On the GPU machine (repo root as cwd): install the carried wheels, run the cudss plugin's tests,
# then the benchmark. Outputs go to ${OUT:-/tmp/out}. Wheels: .whl/peers/*.whl (nvmath-python,
# torch-sla) and a reassembled nvidia-cudss wheel named by $CUDSS_WHEEL (see ../shared/DEVICE.md).
#   STAGES="tests bench" BENCH_ARGS="--cases 2d-1000" bash plugins/cudss_backend/benchmarks/run_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/site
if [[ -n "${CUDSS_WHEEL:-}" && -f "$CUDSS_WHEEL" ]]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$CUDSS_WHEEL" 2>&1 | tail -2
fi
if [[ -d .whl/peers ]] && ! ls /tmp/site/torch_sla >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/peers/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=/tmp/site:core:plugins/cudss_backend
export LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export OPENBLAS_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
python3 -c "import sparsetorch_cudss._lib as L; l=L.load(); print('cuDSS', l.version, l.path)"
for stage in ${STAGES:-tests bench}; do
  case $stage in
    tests)
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -W ignore -rs ${TEST_ARGS:-plugins/cudss_backend/tests} \
        2>&1 | tee "$OUT/pytest_cudss.txt" | tail -40 ;;
    bench)
      timeout ${BENCH_TIMEOUT:-400} python3 plugins/cudss_backend/benchmarks/bench_cudss.py --out "$OUT/cudss_h200.json" ${BENCH_ARGS:-} \
        2>&1 | tee "$OUT/bench_cudss.txt" | tail -40 ;;
  esac
done
