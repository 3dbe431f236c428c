#!/usr/bin/env bash
# Session 32's second device run: the CUDA cases of this session's core changes (svds' Gram route and shift below 0,
# Solver re-planning when values lose symmetry, the sweep fixes) and the core's GPU trust files.
#   bash benchmarks/gpu/s32/run_s32b.sh   (repository root, on the lent GPU; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/scipy_backend 2>&1 | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
TAG=${TAG:-s32b}
timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short \
  tests/test_svds_s32.py tests/test_sweep_s32.py tests/test_svds_s30.py tests/test_trust_gpu.py ${EXTRA_TESTS:-} \
  > "$OUT/pytest_gpu_${TAG}.txt" 2>&1
echo "tests: exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_${TAG}.txt" | head -20; tail -1 "$OUT/pytest_gpu_${TAG}.txt"
