#!/usr/bin/env bash
# One device call (session 8, DELTA): install, compile the delta / fast modules (NVRTC, into the
# disk cache), the DELTA GPU tests (tests/test_cuda_delta.py and test_cuda_gpu.py's DELTA tests),
# then bench_s8_delta.py. Results under $OUT. TESTS=0 / BENCH=0 skip a part; BENCH_ARGS passes options on.
PREWARM=${PREWARM:-delta,fast,spmv,sddmm} source plugins/cuda_kernels/benchmarks/device_setup.sh
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py plugins/cuda_kernels/tests/test_cuda_gpu.py \
    -q -p no:cacheprovider --tb=short -k "${PYTEST_K:-(chunk or delta or DELTA) and not host}" 2>&1 | tee $OUT/pytest_h200_s8_delta.txt \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s8_delta.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s8_delta_log.txt | cut -c1-200
fi
