#!/usr/bin/env bash
# Session 16, device call A: the conversion kernel (csr_rows) and the staged DELTA(4) kernel (tc8s):
# their GPU tests, then kernel times (csr_rows against torch / CuPy; tc8s against tc8pkbr, warm and cold).
# Usage (on the device, repository root): TAG=s16a bash benchmarks/gpu/s16/run_a.sh
set -o pipefail
TAG=${TAG:-s16a}
export PREWARM=delta,spmv PREWARM_VALUES=float16,bfloat16,float32 PREWARM_INDICES=all
source plugins/cuda_kernels/benchmarks/device_setup.sh
B=plugins/cuda_kernels/benchmarks
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -x -p no:cacheprovider plugins/cuda_kernels/tests/test_cuda_delta.py \
  plugins/cuda_kernels/tests/test_cuda_convert.py ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -15 | tee $OUT/pytest_h200_${TAG}.txt
timeout 120 python3 benchmarks/gpu/s16/csr_rows_kernel.py --out $OUT/csr_rows_h200_${TAG}.json 2>&1 | grep -v Warn | tail -20
for mode in cold warm; do
  timeout ${BENCH_TIMEOUT:-150} python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_${TAG}_${mode}.json \
    --variants ${VARIANTS:-default,tc8pkbr,tc8s,tc8sr} --densities ${DENSITIES:-0.1,0.3,0.5} --no-csr \
    $([ $mode = cold ] && echo --cold) 2>&1 | grep -v Warn | tail -20
done
