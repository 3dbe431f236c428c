#!/usr/bin/env bash
# Session 15: the dense backward route (sparsetorch_cuda.plan.DENSE_ROUTE: values-gradient and adjoint product) and SparseLinear's compiled
# forward through sparsetorch::spmm: their GPU tests, train_step_profile.py (where a training step's GPU time
# goes, both routes), then bench_llm_gpu.py with its compiled and TorchUST columns. Results in $OUT/train.tar.gz.
#   PREWARM=all PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32,int64 source plugins/cuda_kernels/benchmarks/device_setup.sh
#   bash benchmarks/gpu/s15/run_train.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT0=${OUT:-/tmp/out}; OUT=/tmp/train; mkdir -p $OUT $OUT0
trap 'tar czf $OUT0/train.tar.gz -C $OUT .' EXIT
timeout ${TTEST_TIMEOUT:-120} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_gpu.py -k "sddmm or spmm_matches_dense" -q -p no:cacheprovider \
  --tb=short > $OUT/pytest_h200_s15_sddmm.txt 2>&1
echo "sddmm pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s15_sddmm.txt | head; tail -1 $OUT/pytest_h200_s15_sddmm.txt
timeout ${PROF_TIMEOUT:-150} python3 benchmarks/gpu/s15/train_step_profile.py --out $OUT 2>&1 | tail -40
timeout ${LLM_TIMEOUT:-300} python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s15_train.json \
  ${LLM_ARGS:---sparsities 90%,2:4 --batches 1,64 --repeats 15} 2>&1 | cut -c1-330 | tail -18
