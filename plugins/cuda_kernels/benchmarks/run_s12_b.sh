#!/usr/bin/env bash
# Session 12, second call: the csr16 one-column tests (csr16_warp's masked product: session 12's fix) and
# diag_s12_cluster.py (launch cost with clusters / large shared memory; spmm_cc's rounds). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
PREWARM=${PREWARM:-mma,spmm_cc} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 \
  source plugins/cuda_kernels/benchmarks/device_setup.sh
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short \
  plugins/cuda_kernels/tests/test_cuda_mma.py -k "${PYTEST_K:-csr16_one_column or csr16_rows_next}" \
  > $OUT/pytest_h200_s12b.txt 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s12b.txt | head; tail -2 $OUT/pytest_h200_s12b.txt
timeout ${DIAG_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/diag_s12_cluster.py --out $OUT 2>&1 | grep -v Warn | tail -80
