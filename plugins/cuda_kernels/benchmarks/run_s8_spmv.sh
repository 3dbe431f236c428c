#!/usr/bin/env bash
# One device call (session 8, stencil SpMV): install, compile the kernel modules in parallel (NVRTC,
# into the disk cache), the GPU tests this work touched, bench_s8_spmv.py. Results under $OUT.
#   TESTS=0 / BENCH=0 skip a part; BENCH_ARGS, PYTEST_K pass options on.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 - <<'PY'
import concurrent.futures as cf, time
from sparsetorch_cuda import compile as c
from sparsetorch_cuda.launch import arch_of
arch = arch_of(0)
jobs = [(s, v, i) for s in ("fast", "spmv", "sddmm") for v in c.VAL_KINDS for i in c.IDX_KINDS]
t0 = time.time()
with cf.ProcessPoolExecutor(16) as ex:
    list(ex.map(c.cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
print(f"compiled {len(jobs)} modules in {time.time() - t0:.1f} s")
PY
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s8_spmv.py --out $OUT ${BENCH_ARGS:-} \
    2>&1 | tee $OUT/bench_s8_spmv_log.txt | cut -c1-180
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-120} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_spmv_s8.py plugins/cuda_kernels/tests/test_cuda_gpu.py \
    -q -p no:cacheprovider --tb=short --maxfail=5 \
    -k "${PYTEST_K:-s8 or ell or ELL or dia_variants or direct or (matches_dense and (DIA or CSR or COO)) or sddmm}" 2>&1 \
    | tee $OUT/pytest_h200_s8_spmv.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
