#!/usr/bin/env bash
# Session 12: DELTA(4) half, one block of 1024 threads per SM with units of 16 ("tc16pk") and L2 prefetches
# ("tc8pkf", "tc16pkf") against the default tc8pk and GEMV: the GPU tests of the new variants, then
# bench_s11_delta.py (two rounds, 10 / 30 / 50 %). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=plugins/cuda_kernels/benchmarks
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
python3 -m sparsetorch_cuda.compile --sources delta,fast,mma --values float16,bfloat16 --indices int32,int64 2>&1 | tail -1
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-100} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py -k "${TEST_K:-tc16pk or tc8pkf}" \
    -q -p no:cacheprovider --tb=short > $OUT/pytest_h200_s12d_delta.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s12d_delta.txt | head; tail -1 $OUT/pytest_h200_s12d_delta.txt
fi
timeout ${BENCH_TIMEOUT:-200} python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_s12d.json \
  ${BENCH_ARGS:---variants default,tc8pkf,tc16pk,tc16pkf --densities 0.1,0.3,0.5 --no-csr} 2>&1 \
  | tee $OUT/bench_s12d_delta_log.txt | grep -v "^  " | cut -c1-150 | tail -40
