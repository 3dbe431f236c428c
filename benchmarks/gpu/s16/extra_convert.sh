#!/usr/bin/env bash
# Session 16 final call, EXTRA part (benchmarks/gpu/run_final.sh): the csr_rows kernel times and the GPU
# conversions against CuPy, into $OUT.
python3 benchmarks/gpu/s16/csr_rows_kernel.py --out "$OUT/csr_rows_h200_${TAG}.json" 2>&1 | grep -E "^\{" | cut -c1-160
python3 benchmarks/bench_convert_gpu.py --reps 21 --only-peers --out "$OUT/convert_cuda_${TAG}.json" 2>&1 | grep -v Warn | cut -c1-400 | tail -6
