#!/usr/bin/env bash
# One device call (session 11, helper s11f): install, compile the kernel modules the call needs (NVRTC, in
# parallel, into the disk cache), bench_s11_dia.py (the s11 DIA variants on the 114^3 stencil, CUDA graph and
# Matmul.execute back to back), the DIA GPU tests, and with CONVERT=1 the GPU conversion benchmarks
# (benchmarks/bench_convert_gpu.py, benchmarks/profile_convert_s11f.py). Results under $OUT.
#   BENCH=0 / TESTS=0 skip a part; BENCH_ARGS, PYTEST_K pass options on.
#   bash plugins/cuda_kernels/benchmarks/run_s11_dia.sh                 # tests + DIA benchmark
#   CONVERT=1 bash plugins/cuda_kernels/benchmarks/run_s11_dia.sh       # and the conversion benchmarks
OUT=${OUT:-/tmp/s11f_out}
mkdir -p "$OUT"
PREWARM=${PREWARM:-fast,spmv,sddmm} PREWARM_INDICES=${PREWARM_INDICES:-int64,int32} \
  source plugins/cuda_kernels/benchmarks/device_setup.sh
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/bench_s11_dia.py --out "$OUT" ${BENCH_ARGS:-} \
    > "$OUT/bench_s11f_dia_log.txt" 2>&1
  grep -A80 "^summary" "$OUT/bench_s11f_dia_log.txt" || tail -30 "$OUT/bench_s11f_dia_log.txt"
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_dia_s11.py \
    plugins/cuda_kernels/tests/test_cuda_spmv_s8.py plugins/cuda_kernels/tests/test_cuda_gpu.py \
    -q -p no:cacheprovider --tb=short --maxfail=10 -k "${PYTEST_K:-s11 or dia or DIA}" > "$OUT/pytest_h200_s11f_dia.txt" 2>&1
  grep -v "^  \|^$\|Warning\|warnings" "$OUT/pytest_h200_s11f_dia.txt" | tail -${TEST_TAIL:-15}
fi
if [ "${CONVERT:-0}" = 1 ]; then
  export PYTHONPATH=core${PYTHONPATH:+:$PYTHONPATH}
  timeout ${CONVERT_TIMEOUT:-120} python3 benchmarks/bench_convert_gpu.py --reps 21 --only-peers --profile \
    --out "$OUT/convert_cuda_s11f.json" > "$OUT/convert_cuda_s11f_log.txt" 2>&1; echo "bench_convert_gpu rc $?"
  timeout ${CONVERT_TIMEOUT:-120} python3 benchmarks/profile_convert_s11f.py --out "$OUT" > "$OUT/profile_convert_s11f_log.txt" 2>&1
  echo "profile_convert rc $?"; grep -v "^ " "$OUT/profile_convert_s11f_log.txt" | cut -c1-400 | tail -8
fi
