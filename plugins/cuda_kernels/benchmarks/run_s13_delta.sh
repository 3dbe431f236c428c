#!/usr/bin/env bash
# Session 13: DELTA(4) half with unit bases from the plan ("tc8pkb") and L2 prefetches ("tc8pkbf", "tc8pkbf3"; the
# rotated gathers of the first call, "tc8pkr" / "tc8pr", were removed): their GPU tests (and the every-row-offset / CUDA-graph test of every tc variant), then bench_s11_delta.py
# against the default tc8pk and GEMV at 1 / 10 / 30 / 50 % (two rounds). Run as run_final.sh's EXTRA (after
# device_setup.sh) or alone. Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=plugins/cuda_kernels/benchmarks
python3 -m sparsetorch_cuda.compile --sources delta,fast --values float16,bfloat16 --indices int32,int64 2>&1 | tail -1
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${DTEST_TIMEOUT:-100} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
    -k "${DTEST_K:-tc8pkb or every_row_offset or many_rows}" -q -p no:cacheprovider --tb=short > $OUT/pytest_h200_${DTAG:-s13}_delta.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|^E  " $OUT/pytest_h200_${DTAG:-s13}_delta.txt | head -12; tail -1 $OUT/pytest_h200_${DTAG:-s13}_delta.txt
fi
timeout ${DBENCH_TIMEOUT:-150} python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_${DTAG:-s13}.json \
  ${DBENCH_ARGS:---variants default,tc8pk,tc8pkb,tc8pkbf3 --densities 0.1,0.5,0.3,0.01 --no-csr} 2>&1 \
  | tee $OUT/bench_s13_delta_log.txt | grep -v "^  " | cut -c1-150 | tail -40
if [ "${PROFILE:-0}" = 1 ]; then  # Nsight Compute of the default and tc8pkb (run_s11_delta.sh's metrics)
  TESTS=0 BENCH=0 PROFILE=1 PROFILE_ARGS="${PROFILE_ARGS:---variants tc8pk,tc8pkb --densities 0.1,0.5}" bash $B/run_s11_delta.sh 2>&1 | tail -60
  mv $OUT/ncu_s11d_delta.txt $OUT/ncu_${DTAG:-s13}_delta.txt
fi
