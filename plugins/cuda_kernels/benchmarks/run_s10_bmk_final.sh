#!/usr/bin/env bash
# Task H6 (issue 17): spmm_bmk's GPU tests and benchmark in the integrator's final call, run after
# device_setup.sh (plugin installed, modules compiled), cwd the repository root, results under $OUT.
# At most ~60 s: pytest (tests/test_cuda_spmm_bmk.py, its CPU emulation left out: it passes on the host)
# under 28 s, then the bench (bench_s10_bmk.py: 4096^2 and 4096 -> 11008 at 90 %, k = 64, float16 then
# bfloat16; bmk, dense, auto (spmm_ws / spmm_fl), bm) under 30 s: $OUT/cuda_kernels_h200_s10_bmk.json.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout "${BMK_TEST_TIMEOUT:-28}" python3 -m pytest plugins/cuda_kernels/tests/test_cuda_spmm_bmk.py -q -p no:cacheprovider -k "${BMK_TEST_K:-not emulated}" \
  -W ignore --tb=short > "$OUT/pytest_h200_s10_bmk.txt" 2>&1
echo "bmk pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_h200_s10_bmk.txt" | head -20
tail -2 "$OUT/pytest_h200_s10_bmk.txt"
timeout "${BMK_BENCH_TIMEOUT:-30}" python3 plugins/cuda_kernels/benchmarks/bench_s10_bmk.py --out "$OUT" \
  --commit "$(git rev-parse --short HEAD 2>/dev/null)" ${BMK_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_s10_bmk_log.txt" | cut -c1-700
echo "bmk bench exit $?"
