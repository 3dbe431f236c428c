#!/usr/bin/env bash
# One device call (session 8, stencil SpMV): install, compile the kernel modules in parallel (NVRTC,
# into the disk cache), the GPU tests this work touched, bench_s8_spmv.py. Results under $OUT.
#   TESTS=0 / BENCH=0 skip a part; BENCH_ARGS, PYTEST_K pass options on.
PREWARM=${PREWARM:-fast,spmv,sddmm} source plugins/cuda_kernels/benchmarks/device_setup.sh
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
