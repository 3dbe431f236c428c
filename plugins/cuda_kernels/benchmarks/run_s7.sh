#!/usr/bin/env bash
# One device call (session 7): install, compile the kernel modules in parallel (NVRTC, into the
# disk cache), bench_s7.py (BENCH_ARGS), optionally ncu (NCU=1, NCU_ARGS) and
# benchmarks/bench_llm_gpu.py (LLM=1, LLM_ARGS), the GPU tests (TESTS). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, os, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, i) for s in (os.environ.get("PREWARM") or "mma,fast,structured").split(",")
        for v in ("float16", "bfloat16") for i in ("int32", "int64")]
t0 = time.time()
with cf.ProcessPoolExecutor(16) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s")
PY
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s7.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s7_log.txt | cut -c1-400
fi
if [ "${NCU:-0}" = 1 ]; then
  if command -v ncu >/dev/null; then
    timeout ${NCU_TIMEOUT:-120} ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      python3 plugins/cuda_kernels/benchmarks/bench_s7.py --out $OUT --profile ${NCU_ARGS:-} > $OUT/ncu_s7.txt 2>&1
    tail -c 200 $OUT/ncu_s7.txt
  else
    echo "no ncu on this machine"
  fi
fi
if [ "${LLM:-0}" = 1 ]; then
  timeout ${LLM_TIMEOUT:-200} python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s7.json ${LLM_ARGS:-} 2>&1 \
    | tee $OUT/llm_log_s7.txt | cut -c1-300
fi
if [ "${TEST:-1}" = 1 ]; then
  TESTS=${TESTS:-plugins/cuda_kernels/tests/test_cuda_mma.py}
  KARGS=(); [ -n "${PYTEST_K:-}" ] && KARGS=(-k "$PYTEST_K")
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest $TESTS -q -p no:cacheprovider --tb=short "${KARGS[@]}" ${PYTEST_ARGS:-} 2>&1 \
    | tee $OUT/pytest_h200_s7.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-30}
fi
