#!/usr/bin/env bash
# One device call (session 5): install, GPU tests (TESTS), bench_s5.py (BENCH_ARGS), optionally
# benchmarks/bench_llm_gpu.py (LLM=1). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/scipy_backend -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${TEST:-1}" = 1 ]; then
  TESTS=${TESTS:-plugins/cuda_kernels/tests --ignore=plugins/cuda_kernels/tests/test_compile_host.py}
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short ${PYTEST_ARGS:-} 2>&1 \
    | tee $OUT/pytest_h200_cuda_kernels_s5.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-30}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 plugins/cuda_kernels/benchmarks/bench_s5.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s5_log.txt | cut -c1-220
fi
if [ "${LLM:-0}" = 1 ]; then
  timeout ${LLM_TIMEOUT:-240} python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s5.json ${LLM_ARGS:-} 2>&1 \
    | tee $OUT/llm_log.txt | cut -c1-260
fi
