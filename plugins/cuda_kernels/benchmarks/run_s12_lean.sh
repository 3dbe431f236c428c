#!/usr/bin/env bash
# Session 12, last call (240 s of device time left): install, compile the modules the half-precision products
# need, the non-finite fix-up's GPU tests and the core's planned-layer GPU tests, then run_s12_fix.sh (the
# diagnostic and the timing with / without the fix-up). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
python3 -m sparsetorch_cuda.compile --sources mma,spmm_bm,spmm_sp,spmm_cc --values float16,bfloat16 --indices int32 2>&1 | tail -1
timeout ${TEST_TIMEOUT:-75} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short -x \
  plugins/cuda_kernels/tests/test_cuda_mma.py -k "${PYTEST_K:-nonfinite}" ${MORE_TESTS:-tests/test_nn_gpu_planned.py} \
  > $OUT/pytest_h200_s12x.txt 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|^E  " $OUT/pytest_h200_s12x.txt | head -12; tail -1 $OUT/pytest_h200_s12x.txt
BENCH_KS=${BENCH_KS:-16,64} BENCH_SHAPES=${BENCH_SHAPES:-4096x4096} DIAG_TIMEOUT=30 BENCH_TIMEOUT=40 bash plugins/cuda_kernels/benchmarks/run_s12_fix.sh
