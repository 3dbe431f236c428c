#!/usr/bin/env bash
# One device call (session 10, DELTA(4) "tc" kernels): install; compile the modules the benchmark needs
# (delta, mma: half types, int32) first, the ones the tests need (delta, fast: every type) in the
# background meanwhile; the DELTA GPU tests, then bench_s10_delta.py. Results under $OUT.
# BENCH=0 / TESTS=0 skip a part; BENCH_ARGS passes options on.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources delta,mma --values float16,bfloat16 --indices int32 2>&1 | tail -2
python3 -m sparsetorch_cuda.compile --sources delta,fast --values all --indices all >$OUT/prewarm_tests.txt 2>&1 &
PRE=$!
if [ "${TESTS:-1}" = 1 ]; then
  wait $PRE
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
    -q -p no:cacheprovider --tb=short 2>&1 | tee $OUT/pytest_h200_s10_delta.txt \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 plugins/cuda_kernels/benchmarks/bench_s10_delta.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s10_delta_log.txt | grep -v "^  " | cut -c1-170
fi
wait $PRE
