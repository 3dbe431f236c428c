#!/usr/bin/env bash
# Session 18, first kernel call: the DELTA(4) half "bm" kernels (kernels/delta.cu: the pattern as a bitmap per row,
# _delta.row_bitmap) against the default tc8pkbr / tc8pkbfr and cuBLAS GEMV: their GPU tests, then
# bench_s11_delta.py cold and warm at 50 / 30 / 10 % (8192^2, fp16 and bf16). Results tarred into $OUT/bm.tar.gz.
#   PREWARM=delta PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32,int64 source plugins/cuda_kernels/benchmarks/device_setup.sh
#   bash benchmarks/gpu/s18/run_bm.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT0=${OUT:-/tmp/out}; OUT=/tmp/bm; mkdir -p $OUT $OUT0
B=plugins/cuda_kernels/benchmarks
TAG=${TAG:-s18a}
timeout ${DTEST_TIMEOUT:-240} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
  -k "${TESTK:-bm or row_bitmap}" -q -p no:cacheprovider --tb=short -x > $OUT/pytest_h200_${TAG}_delta_bm.txt 2>&1
echo "delta pytest exit $?"; grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_h200_${TAG}_delta_bm.txt | head -20; tail -1 $OUT/pytest_h200_${TAG}_delta_bm.txt
for mode in ${MODES:-cold warm}; do
  timeout ${BTIMEOUT:-220} python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_${TAG}_$mode.json $([ $mode = cold ] && echo --cold) \
    --variants ${VARIANTS:-default,bm4,bm8,bm16,bm8f,bm16f} --densities ${DENS:-0.5,0.3,0.1} --no-csr --rounds ${ROUNDS:-2} 2>&1 \
    | grep -v "^  " | cut -c1-110 | grep -E "DELTA|GEMV|dense|rror" | sed 's/DELTA(4) //'
done
tar czf $OUT0/bm.tar.gz -C $OUT .
