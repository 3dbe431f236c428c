#!/usr/bin/env bash
# Session 29's device run (issue 17, batch 64): spmm_rs's GPU tests, bench_rs.py, then the tests of the kernels whose
# shared code changed this session (spmm_wd / spmm_sp: copy and mbarrier helpers moved to common.cuh; pb / mma / bm:
# tile_epilogue's cluster loads issued back to back).
#   bash benchmarks/gpu/s29/run_s29.sh   (repository root, on the lent GPU; results under $OUT)
# Knobs: TESTS=0 skips the tests; BENCH_ARGS (default: fp16, both shapes); TEST_TIMEOUT (per file, s).
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TAG=${TAG:-s29}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
python3 -m sparsetorch_cuda.compile --sources spmm_rs,spmm_pb,spmm_wd,spmm_sp,mma,spmm_bm --values float16,bfloat16 2>&1 | tail -1
echo "prewarm $(( $(date +%s) - t0 )) s"
run_tests() {  # name, timeout, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short "$@" > "$OUT/pytest_gpu_${TAG}_$name.txt" 2>&1
  echo "$name: pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_${TAG}_$name.txt" | head -20
  tail -1 "$OUT/pytest_gpu_${TAG}_$name.txt"
}
if [ "${TESTS:-1}" = 1 ]; then
  run_tests rs "${TEST_TIMEOUT:-150}" -x plugins/cuda_kernels/tests/test_cuda_spmm_rs.py
fi
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu/s29/bench_rs.py --out "$OUT" --name "spmm_rs_${TAG}.json" \
  ${BENCH_ARGS:---dtypes float16} 2>&1 | tail -30
if [ "${TESTS:-1}" = 1 ]; then
  run_tests wd_sp "${TEST_TIMEOUT2:-120}" plugins/cuda_kernels/tests/test_cuda_spmm_wd.py \
    plugins/cuda_kernels/tests/test_cuda_spmm_sp.py -k "${WDSP_K:-every or matches}"
  # tile_epilogue (common.cuh) now issues the cluster loads back to back: the kernels that use it
  run_tests epilogue "${TEST_TIMEOUT3:-200}" plugins/cuda_kernels/tests/test_cuda_spmm_pb.py \
    plugins/cuda_kernels/tests/test_cuda_mma.py plugins/cuda_kernels/tests/test_cuda_spmm_bm.py -k "${EPI_K:-every or matches}"
fi
