#!/usr/bin/env bash
# One device call (session 8, batch-1 LLM layers): install, compile the mma module (NVRTC, float16 and
# bfloat16, in parallel, into the disk cache), bench_s8_llm.py (BENCH_ARGS), optionally
# benchmarks/bench_llm_gpu.py (LLM=1, LLM_ARGS; a second run with LLM2_ARGS), optionally ncu (NCU=1, NCU_ARGS), the GPU tests
# (TESTS, PYTEST_K). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, os, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, "int32") for s in (os.environ.get("PREWARM") or "mma").split(",") for v in ("float16", "bfloat16")]
t0 = time.time()
with cf.ProcessPoolExecutor(8) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s")
PY
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
