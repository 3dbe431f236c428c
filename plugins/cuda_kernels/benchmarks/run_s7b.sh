#!/usr/bin/env bash
# One device call (session 7b): install, compile the kernel modules in parallel (NVRTC, into the
# disk cache), the GPU tests this session touched, bench_s7b.py (Matmul.execute host time, stencil
# SpMV variants) and benchmarks/bench_convert_gpu.py (conversions against CuPy). Results under $OUT.
#   TESTS=0 / BENCH=0 / CONVERT=0 skip a part; BENCH_ARGS, CONVERT_ARGS, PYTEST_K pass options on.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, i) for s in ("fast", "spmv", "structured", "sddmm") for v in c.VAL_KINDS for i in c.IDX_KINDS]
t0 = time.time()
with cf.ProcessPoolExecutor(16) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s")
PY
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_gpu.py -q -p no:cacheprovider --tb=short \
    -k "${PYTEST_K:-direct or ctypes or replay or dia_variants or (matches_dense and (DIA or CSR or COO))}" 2>&1 | tee $OUT/pytest_h200_s7b.txt \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
  timeout 90 python3 -m pytest tests/test_convert_direct.py tests/test_tensor_convert.py -q -p no:cacheprovider --tb=short \
    -k "cuda" 2>&1 | tee $OUT/pytest_h200_s7b_convert.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/bench_s7b.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s7b_log.txt | cut -c1-200
fi
if [ "${CONVERT:-1}" = 1 ]; then
  timeout ${CONVERT_TIMEOUT:-100} python3 benchmarks/bench_convert_gpu.py --reps 21 --out $OUT/convert_cuda_s7b.json \
    ${CONVERT_ARGS:---only-peers --profile} 2>&1 | tee $OUT/convert_s7b_log.txt | cut -c1-220
fi
