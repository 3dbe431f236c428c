#!/usr/bin/env bash
# One device call: install, GPU tests, benchmark + cost fit (bench_s4.py). Results under $OUT.
# The host NVRTC compile test is left to CI (it compiles every source for two architectures).
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/scipy_backend -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
if [ "${TEST:-1}" = 1 ]; then
  TESTS=${TESTS:-plugins/cuda_kernels/tests --ignore=plugins/cuda_kernels/tests/test_compile_host.py}
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short -x ${PYTEST_ARGS:-} 2>&1 \
    | tee $OUT/pytest_h200_cuda_kernels_s4.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -25
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 plugins/cuda_kernels/benchmarks/bench_s4.py --out $OUT --fit $OUT/cost_h200.json ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s4_log.txt | grep -v "^ *$" | cut -c1-190
fi
