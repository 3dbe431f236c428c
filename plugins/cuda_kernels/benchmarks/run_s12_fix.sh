#!/usr/bin/env bash
# Session 12 (an EXTRA of benchmarks/gpu/run_final.sh): the non-finite fix-up (spmm_fixup): diag_s12_nonfinite.py
# (which kernels keep sparse semantics now), then bench_s12_cc.py at 4096^2 k = 16 / 64 (the plan's default with
# and without the fix-up, side by side). Results under $OUT.
timeout ${DIAG_TIMEOUT:-60} python3 plugins/cuda_kernels/benchmarks/diag_s12_nonfinite.py --out $OUT 2>&1 \
  | grep -v Warn | grep -c "'sparse_semantics': True" | sed 's/^/kernels with sparse semantics: /'
grep -o '"kernel": "[^"]*"\|"sparse_semantics": [a-z]*' $OUT/diag_s12_nonfinite.json | paste - - | grep false | cut -c1-80
timeout ${BENCH_TIMEOUT:-90} python3 plugins/cuda_kernels/benchmarks/bench_s12_cc.py --out $OUT --ks ${BENCH_KS:-16,64} \
  --shapes ${BENCH_SHAPES:-4096x4096,4096x11008} 2>&1 | tail -4 | sed 's/cc_rounds.*cc_once_us/... cc_once_us/' | cut -c1-260
