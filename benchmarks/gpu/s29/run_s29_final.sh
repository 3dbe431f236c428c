#!/usr/bin/env bash
# Session 29's last device run: the GPU-touching tests of this session's changes (the core's products under autocast,
# SparseLinear under torch.func / forward AD, the spd tag's per-component test, float32 acceptance of the solve route,
# slogdet of singular matrices, the standalone pb / rs call path), on the lent GPU.
#   bash benchmarks/gpu/s29/run_s29_final.sh   (repository root; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/scipy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources spmm_rs,spmm_pb,mma --values float16,bfloat16 2>&1 | tail -1
run_tests() {  # name, timeout, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short "$@" > "$OUT/pytest_gpu_s29_$name.txt" 2>&1
  echo "$name: pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_s29_$name.txt" | head -20
  tail -1 "$OUT/pytest_gpu_s29_$name.txt"
}
new=$(ls tests/test_*s29*.py 2>/dev/null)
run_tests new "${NEW_TIMEOUT:-150}" $new
run_tests core "${CORE_TIMEOUT:-240}" tests/test_nn_gpu_planned.py tests/test_trust_gpu.py tests/test_half.py \
  tests/test_spectral.py tests/test_logdet.py tests/test_matmul_fallback.py tests/test_matmul_execute_fallback.py \
  -k "${CORE_K:-cuda or gpu or GPU or device}"
run_tests standalone "${SA_TIMEOUT:-120}" plugins/cuda_kernels/tests/test_cuda_spmm_rs.py \
  plugins/cuda_kernels/tests/test_cuda_spmm_pb.py -k "every or set_values or misaligned or declines"
