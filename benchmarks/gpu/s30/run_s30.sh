#!/usr/bin/env bash
# Session 30's device run, in the last of three back-to-back calls (the first two stash cuDSS's wheel chunks:
# ../shared/DEVICE.md "Carrying cuDSS"): cuDSS 0.8 installed from the stashed chunks, then on the GPU
#  1. this session's new test files (the everyday tensor API, lists, solve broadcasting, sparse @ sparse: their CUDA
#     cases), and session 29's;
#  2. the cudss plugin's tests (not run since session 29's spd-tag change moved which methods singular Laplacians
#     are offered) and the core's GPU cases of the solve / product paths this session touched;
#  3. sparse @ sparse on the GPU against torch's CSR @ CSR (cuSPARSE) and CuPy (benchmarks/bench_spgemm.py);
#  4. where the card is an H200 (MEASURE=1): issue 17's LLM layers and issue 16's DELTA(4) rows with the current
#     defaults (the goals are stated on the H200; sessions 28-29 got H100s only).
#   bash benchmarks/gpu/s30/run_s30.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/nvidia_cudss_cu13-0.8.0.10-py3-none-manylinux_2_17_x86_64.whl
if ls /root/stash/* >/dev/null 2>&1 && ls .whl/parts/*/* >/dev/null 2>&1; then
  cat /root/stash/* .whl/parts/*/* > $W && python3 -m pip install -q --no-index --no-deps --target /tmp/site $W 2>&1 | tail -2
  export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
else
  echo "no cuDSS chunks (the machine went cold between the calls?): the cudss GPU tests will skip"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cudss_backend \
  -e plugins/scipy_backend 2>&1 | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
run_tests() {  # name, timeout, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short "$@" > "$OUT/pytest_gpu_s30_$name.txt" 2>&1
  echo "$name: pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_s30_$name.txt" | head -20
  tail -1 "$OUT/pytest_gpu_s30_$name.txt"
}
run_tests new "${NEW_TIMEOUT:-300}" $(ls tests/test_*s30*.py tests/test_*s29*.py 2>/dev/null)
run_tests cudss "${CUDSS_TIMEOUT:-200}" plugins/cudss_backend/tests
run_tests core "${CORE_TIMEOUT:-150}" tests/test_trust_gpu.py tests/test_half.py tests/test_matmul_fallback.py \
  tests/test_matmul_execute_fallback.py tests/test_logdet.py -k "${CORE_K:-cuda or gpu or GPU or device}"
timeout "${SPGEMM_TIMEOUT:-120}" python3 benchmarks/bench_spgemm.py --device cuda --sizes 100,300 --repeats 5 \
  --out "$OUT/spgemm_gpu_s30.json" 2>&1 | tail -5
if [ "${MEASURE:-auto}" = 1 ] || { [ "${MEASURE:-auto}" = auto ] && [[ "$GPU" == *H200* ]]; }; then
  python3 -m sparsetorch_cuda.compile --sources delta,mma,spmm_pb --values float16,bfloat16 2>&1 | tail -1
  timeout "${LLM_TIMEOUT:-150}" python3 benchmarks/bench_llm_gpu.py --out "$OUT/llm_h200_s30.json" \
    --no-backward --no-compile --sparsities 90%,2:4 --batches 1,64 --repeats 15 2>&1 | tail -30
  for c in warm cold; do
    timeout "${DELTA_TIMEOUT:-100}" python3 plugins/cuda_kernels/benchmarks/bench_s11_delta.py --out "$OUT" \
      --variants default --densities 0.5,0.1 --name "cuda_delta_h200_s30_$c.json" $([ $c = cold ] && echo --cold) 2>&1 | tail -12
  done
fi
