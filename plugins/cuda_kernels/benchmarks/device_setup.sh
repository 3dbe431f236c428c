#!/usr/bin/env bash
# Sourced by the device scripts (run_s8_*.sh, benchmarks/gpu/run_final.sh) at the start of a call on
# the lent GPU: install the tree's packages (editable, no dependencies: the image's torch runs), print the
# GPU, and compile the kernel modules the call needs into the disk cache in parallel
# (python -m sparsetorch_cuda.compile; PREWARM: comma-separated sources or "all", PREWARM_VALUES,
# PREWARM_INDICES likewise).
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources "${PREWARM:-all}" --values "${PREWARM_VALUES:-all}" --indices "${PREWARM_INDICES:-all}"
