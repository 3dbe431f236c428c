#!/usr/bin/env bash
# Session 31's device run (one call; no cuDSS): on the lent GPU
#  1. the DELTA GPU tests of the default kernels (the hinted-load variants "tc8pkbrh" / "tc8pkbfrh" of commit b2ab2b1, measured
#     and removed: plugins/cuda_kernels/NOTES.md, session 31);
#  2. issue 16's DELTA(4) rows, warm and cold, fp16 and bf16, 50 % and 10 % (the defaults; DELTA_VARIANTS= for others),
#     with dense cuBLAS GEMV in the same run;
#  3. issue 17's LLM layers (90 %, 2:4; batch 1 and 64; forward) with the current defaults.
#   bash benchmarks/gpu/s31/run_s31.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/scipy_backend 2>&1 | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
TAG=${TAG:-s31}
python3 -m sparsetorch_cuda.compile --sources delta --values float16,bfloat16 2>&1 | tail -1
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short plugins/cuda_kernels/tests/test_cuda_delta.py \
    -k "tc8pkbr or tc8pkbfr or None" > "$OUT/pytest_gpu_${TAG}_delta.txt" 2>&1
  echo "delta tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_${TAG}_delta.txt" | head -20; tail -1 "$OUT/pytest_gpu_${TAG}_delta.txt"
fi
for c in ${DELTA_MODES:-cold warm}; do
  timeout "${DELTA_TIMEOUT:-150}" python3 plugins/cuda_kernels/benchmarks/bench_s11_delta.py --out "$OUT" --no-csr \
    --variants "${DELTA_VARIANTS:-default,tc8pkbr,tc8pkbfr}" --densities 0.5,0.1 --rounds 3 \
    --name "cuda_delta_${TAG}_$c.json" $([ $c = cold ] && echo --cold) 2>&1 | tail -16
done
if [ "${LLM:-1}" = 1 ]; then
  timeout "${LLM_TIMEOUT:-150}" python3 benchmarks/bench_llm_gpu.py --out "$OUT/llm_${TAG}.json" \
    --no-backward --no-compile --sparsities 90%,2:4 --batches 1,64 --repeats 15 2>&1 | tail -30
fi
