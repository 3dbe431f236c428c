#!/usr/bin/env bash
# One device call (session 8, DELTA): install, compile the delta / fast modules (NVRTC, into the
# disk cache), the DELTA GPU tests (tests/test_cuda_delta.py and test_cuda_gpu.py's DELTA tests),
# then bench_s8_delta.py. Results under $OUT. TESTS=0 / BENCH=0 skip a part; BENCH_ARGS passes options on.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, i) for s in ("delta", "fast", "spmv", "sddmm") for v in c.VAL_KINDS for i in c.IDX_KINDS]
t0 = time.time()
with cf.ProcessPoolExecutor(16) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s")
PY
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py plugins/cuda_kernels/tests/test_cuda_gpu.py \
    -q -p no:cacheprovider --tb=short -k "${PYTEST_K:-(chunk or delta or DELTA) and not host}" 2>&1 | tee $OUT/pytest_h200_s8_delta.txt \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s8_delta.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s8_delta_log.txt | cut -c1-200
fi
