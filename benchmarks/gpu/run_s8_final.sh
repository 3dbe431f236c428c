#!/usr/bin/env bash
# One device call (session 8, the lead's final run of the integrated tree): install the carried
# peer wheels (.whl/: nvmath-python, torch-sla) and the plugins, compile every kernel module in
# parallel (NVRTC, into the disk cache), run the GPU suite's cases that carry issue 16's goals
# side by side (spmv with the cuda rows and UST, cuda_kernels, cg_1m, cg_1g) after the cuda
# plugin's GPU tests and the core's GPU tests (TEST_FILES). Results under $OUT.
#   SUITE_CASES=..., SUITE_TIMEOUT=..., TEST_TIMEOUT=..., TESTS=0 / SUITE=0 skip a part.
set -u -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cupy_backend -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, i) for s in c.SOURCES for v in c.VAL_KINDS for i in c.IDX_KINDS]
t0 = time.time()
with cf.ProcessPoolExecutor(16) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s", flush=True)
PY
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short ${TEST_FILES:-plugins/cuda_kernels/tests \
    tests/test_nn_gpu_planned.py tests/test_memory_safety.py tests/test_ust_semantics.py tests/test_convert_direct.py} \
    > "$OUT/pytest_h200_s8_final.txt" 2>&1
  echo "pytest exit $?"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_h200_s8_final.txt" | head -40
  tail -3 "$OUT/pytest_h200_s8_final.txt"
fi
if [ "${SUITE:-1}" = 1 ]; then
  timeout "${SUITE_TIMEOUT:-330}" python3 benchmarks/gpu/suite.py --out "$OUT" --prefix gpu_suite_s8 \
    --cases "${SUITE_CASES:-spmv,cuda_kernels,cg_1m,cg_1g}" 2>&1 | tee "$OUT/gpu_suite_s8_log.txt" | cut -c1-180 | tail -150
fi
