#!/usr/bin/env bash
# One device call: install, GPU tests, benchmark (+ cost fit). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import cuda.bindings, torch; print('cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__)"
TESTS=${TESTS:-plugins/cuda_kernels/tests}
timeout ${TEST_TIMEOUT:-300} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest_h200_cuda_kernels.txt | tail -40
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_cuda_kernels.py --out $OUT --fit $OUT/cost_h200.json ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench_log.txt | tail -120
fi
