#!/usr/bin/env bash
# One device call (session 8, batch-1 LLM layers): install, compile the mma module (NVRTC, float16 and
# bfloat16, in parallel, into the disk cache), bench_s8_llm.py (BENCH_ARGS), optionally
# benchmarks/bench_llm_gpu.py (LLM=1, LLM_ARGS; a second run with LLM2_ARGS), optionally ncu (NCU=1, NCU_ARGS), the GPU tests
# (TESTS, PYTEST_K). Results under $OUT.
PREWARM=${PREWARM:-mma} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 source plugins/cuda_kernels/benchmarks/device_setup.sh
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/bench_s8_llm.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s8_log.txt | cut -c1-1500
fi
if [ "${LLM:-0}" = 1 ]; then
  timeout ${LLM_TIMEOUT:-200} python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s8.json ${LLM_ARGS:-} 2>&1 \
    | tee $OUT/llm_log_s8.txt | cut -c1-300
fi
if [ -n "${LLM2_ARGS:-}" ]; then
  timeout ${LLM2_TIMEOUT:-60} python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s8_b.json ${LLM2_ARGS} 2>&1 \
    | tee $OUT/llm_log_s8_b.txt | cut -c1-300
fi
if [ "${NCU:-0}" = 1 ]; then
  if command -v ncu >/dev/null; then
    timeout ${NCU_TIMEOUT:-90} ncu --cache-control none ${NCU_ARGS:-} > $OUT/ncu_s8.txt 2>&1
    tail -c 300 $OUT/ncu_s8.txt
  else
    echo "no ncu on this machine"
  fi
fi
if [ "${TEST:-1}" = 1 ]; then
  TESTS=${TESTS:-plugins/cuda_kernels/tests/test_cuda_mma.py}
  KARGS=(); [ -n "${PYTEST_K:-}" ] && KARGS=(-k "$PYTEST_K")
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short "${KARGS[@]}" ${PYTEST_ARGS:-} 2>&1 \
    | tee $OUT/pytest_h200_s8.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-30}
fi
