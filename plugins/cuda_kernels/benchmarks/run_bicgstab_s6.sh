#!/usr/bin/env bash
# One device call (session 6, issue 16 item 6, BiCGStab): install, the fused CG's and BiCGStab's GPU
# tests, bench_bicgstab_s6.py (BENCH_ARGS). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/scipy_backend -e plugins/cupy_backend -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest ${TESTS:-plugins/cuda_kernels/tests/test_cuda_bicgstab.py plugins/cuda_kernels/tests/test_cuda_cg.py} \
    -q -p no:cacheprovider --tb=short 2>&1 | tee $OUT/pytest_h200_cuda_bicgstab_s6.txt | grep -v "^$" | tail -${TEST_TAIL:-60}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 plugins/cuda_kernels/benchmarks/bench_bicgstab_s6.py --out $OUT/cuda_bicgstab_h200_s6.json \
    ${BENCH_ARGS:-} 2>&1 | tee $OUT/cuda_bicgstab_h200_s6_log.txt | cut -c1-400
fi
