#!/usr/bin/env bash
# One device call (session 9, batch-1 LLM layers, PDL and csr16_x12b): install, compile the mma module
# (NVRTC, float16 and bfloat16, in parallel, into the disk cache), bench_s9_llm.py (BENCH_ARGS), then the
# GPU tests (TESTS, PYTEST_K: default the batch-1 kernels' and PDL tests). Results under $OUT.
PREWARM=${PREWARM:-mma} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 source plugins/cuda_kernels/benchmarks/device_setup.sh
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-180} python3 plugins/cuda_kernels/benchmarks/bench_s9_llm.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s9_log.txt | cut -c1-2500
fi
if [ "${TEST:-1}" = 1 ]; then
  TESTS=${TESTS:-plugins/cuda_kernels/tests/test_cuda_mma.py}
  PYTEST_K=${PYTEST_K-csr16 or pdl or rot}
  KARGS=(); [ -n "${PYTEST_K}" ] && KARGS=(-k "$PYTEST_K")
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short "${KARGS[@]}" ${PYTEST_ARGS:-} 2>&1 \
    | tee $OUT/pytest_h200_s9.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-40}
fi
