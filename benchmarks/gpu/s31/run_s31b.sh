#!/usr/bin/env bash
# Session 31's second device run: the torch backend's new preconditioners (ic0 / ilu0 / ssor / polynomial) on CUDA
# (their GPU tests, the core Krylov GPU cases of tests/test_krylov.py) and bench_preconditioners.py on the GPU.
#   bash benchmarks/gpu/s31/run_s31b.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/scipy_backend 2>&1 | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short \
  tests/test_preconditioners_s31.py tests/test_krylov.py ${EXTRA_TESTS:-} -k "${TEST_K:-cuda or CUDA or gpu}" \
  > "$OUT/pytest_gpu_s31b.txt" 2>&1
echo "tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_s31b.txt" | head -20; tail -1 "$OUT/pytest_gpu_s31b.txt"
timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/bench_preconditioners.py --device cuda --sizes "${SIZES:-300,1000}" \
  --reps 3 --out "$OUT/preconditioners_gpu_s31.json" 2>&1 | tail -20
