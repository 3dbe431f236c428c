#!/usr/bin/env bash
# Session 28's device check, in the second of two back-to-back calls (the first stashes cuDSS's first wheel chunk:
# ../shared/DEVICE.md "Carrying cuDSS"): cuDSS 0.8 installed from the stashed chunks, then on the GPU
#  1. the cudss plugin's tests (complex symmetric / Hermitian LDL^T added this session: session 27 let the plugin
#     offer ldlt for any symmetry tag on complex values, never GPU-run);
#  2. the core's GPU-touching files changed this session: the matmul fallbacks (Matmul.execute, one-shot remembered
#     launches, the backward's sddmm), the solve route's new equilibration (test_trust_gpu), eigsh's wrong-end check and
#     slogdet's equilibrated LU (test_spectral / test_logdet cuda cases), compile from threads.
#   bash benchmarks/gpu/s28/run_s28.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/nvidia_cudss_cu13-0.8.0.10-py3-none-manylinux_2_17_x86_64.whl
if ls /root/stash/* >/dev/null 2>&1 && ls .whl/parts/01/* >/dev/null 2>&1; then
  cat /root/stash/* .whl/parts/01/* > $W && python3 -m pip install -q --no-index --no-deps --target /tmp/site $W 2>&1 | tail -2
  export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
else
  echo "no cuDSS chunks (the machine went cold between the calls?): the cudss GPU tests will skip"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cudss_backend \
  -e plugins/scipy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources krylov,spmv,fast --values float32,float64 2>&1 | tail -1
run_tests() {  # name, timeout, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short "$@" > "$OUT/pytest_gpu_s28_$name.txt" 2>&1
  echo "$name: pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_s28_$name.txt" | head -20
  tail -1 "$OUT/pytest_gpu_s28_$name.txt"
}
run_tests cudss "${CUDSS_TIMEOUT:-200}" plugins/cudss_backend/tests
run_tests core "${CORE_TIMEOUT:-240}" tests/test_matmul_execute_fallback.py tests/test_matmul_fallback.py \
  tests/test_trust_gpu.py tests/test_compile_threads.py tests/test_scaling_s28.py tests/test_logdet.py \
  tests/test_spectral.py tests/test_eigsh_wrong_end.py -k "${CORE_K:-cuda or gpu or GPU or device or fallback or scaled or wrong}"
