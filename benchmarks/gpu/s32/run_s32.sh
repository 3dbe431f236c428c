#!/usr/bin/env bash
# Session 32's first device run (one call; no cuDSS): on the lent GPU
#  1. the preconditioners' CUDA tests (tests/test_preconditioners_s31.py; the polynomial preconditioner in CG's
#     CUDA-graph replay, written after session 31's last GPU run) and the core Krylov GPU cases;
#  2. issue 16's DELTA(4) rows (the default kernels, 8192^2, fp16 / bf16, 50 % / 10 %, cold and warm) with dense
#     cuBLAS GEMV in the same run;
#  3. issue 17's LLM layers (90 %, 2:4; batch 1 and 64; forward).
#   bash benchmarks/gpu/s32/run_s32.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/scipy_backend 2>&1 | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
TAG=${TAG:-s32}
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short \
    tests/test_preconditioners_s31.py tests/test_krylov.py ${EXTRA_TESTS:-} -k "${TEST_K:-cuda or CUDA or gpu}" \
    > "$OUT/pytest_gpu_${TAG}_precond.txt" 2>&1
  echo "tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_${TAG}_precond.txt" | head -20; tail -1 "$OUT/pytest_gpu_${TAG}_precond.txt"
fi
python3 -m sparsetorch_cuda.compile --sources delta --values float16,bfloat16 2>&1 | tail -1
for c in ${DELTA_MODES:-cold warm}; do
  timeout "${DELTA_TIMEOUT:-150}" python3 plugins/cuda_kernels/benchmarks/bench_s11_delta.py --out "$OUT" --no-csr \
    --variants "${DELTA_VARIANTS:-default}" --densities 0.5,0.1 --rounds 3 \
    --name "cuda_delta_${TAG}_$c.json" $([ $c = cold ] && echo --cold) 2>&1 | tail -12
done
if [ "${LLM:-1}" = 1 ]; then
  timeout "${LLM_TIMEOUT:-150}" python3 benchmarks/bench_llm_gpu.py --out "$OUT/llm_${TAG}.json" \
    --no-backward --no-compile --sparsities 90%,2:4 --batches 1,64 --repeats 15 2>&1 | tail -30
fi
