#!/usr/bin/env bash
# Session 14 -> 15: the first device call for the DELTA row-pointer variants (tc8pkbr / tc8pkbfr, written and
# host-compiled in session 14, not GPU-run): their GPU tests, the skeleton probe, then bench_s11_delta warm and
# cold against the defaults; then (BM=1, default) spmm_bm's GPU tests (its new benchmarking flags) and
# benchmarks/gpu/s14/bm_probe.py (where spmm_bm's batch-64 time goes). Results under $OUT (tarred into
# $OUT/delta_rp.tar.gz). PREWARM=delta,spmm_bm for both parts.
#   PREWARM=delta PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32,int64 source plugins/cuda_kernels/benchmarks/device_setup.sh
#   bash benchmarks/gpu/s14/run_delta_rp.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT0=${OUT:-/tmp/out}; OUT=/tmp/delta_rp; mkdir -p $OUT $OUT0
B=plugins/cuda_kernels/benchmarks
timeout ${DTEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
  -k "tc8pkbr or tc8pkbfr or rows_past or every_row_offset or many_rows" -q -p no:cacheprovider --tb=short \
  > $OUT/pytest_h200_delta_rp.txt 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_delta_rp.txt | head; tail -1 $OUT/pytest_h200_delta_rp.txt
timeout 60 python3 benchmarks/gpu/s14/skeleton_probe.py --out $OUT 2>&1 | tail -18
for mode in warm cold; do
  timeout 200 python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_rp_$mode.json $([ $mode = cold ] && echo --cold) \
    --variants default,tc8pkb,tc8pkbr,tc8pkbf,tc8pkbfr --densities 0.1,0.5,0.3 --no-csr 2>&1 | grep -v "^  " | cut -c1-110 | tail -30
done
if [ "${BM:-1}" = 1 ]; then
  timeout ${BMTEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_spmm_bm.py -q -p no:cacheprovider \
    --tb=short > $OUT/pytest_h200_bm_flags.txt 2>&1
  echo "bm pytest exit $?"; tail -1 $OUT/pytest_h200_bm_flags.txt
  timeout 150 python3 benchmarks/gpu/s14/bm_probe.py --out $OUT 2>&1 | tail -60
fi
tar czf $OUT0/delta_rp.tar.gz -C $OUT .
