#!/usr/bin/env bash
# Session 11, DELTA(4) "range" kernels: sourced by the integrator's one GPU call AFTER the plugin is
# installed and benchmarks/device_setup.sh ran (cwd the repository root, $OUT set; nothing installed
# here). At most ~60 s wall: (1) the new GPU tests of test_cuda_delta.py (the "range" ones; the CPU
# layout / kernel emulations and the host compile test are left out) -> $OUT/pytest_h200_s10_range.txt;
# (2) bench_s10_range.py (dense GEMV, the default "tc", "range", "range1", "range3"; 8192^2 at 50 / 10 /
# 30 %, fp16 + bf16) -> $OUT/cuda_delta_h200_s10_range.json (written after every case). Failures do not
# stop the caller (no set -e effect: every status is caught).
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
range_rc=0
timeout "${RANGE_TEST_TIMEOUT:-25}" python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py -q -p no:cacheprovider \
  --tb=short -k "range and not layout and not compile and not emulated" >"$OUT/pytest_h200_s10_range.txt" 2>&1 || range_rc=$?
echo "range tests: rc $range_rc; $(tail -1 "$OUT/pytest_h200_s10_range.txt")"
range_rc=0
timeout "${RANGE_BENCH_TIMEOUT:-33}" python3 plugins/cuda_kernels/benchmarks/bench_s10_range.py --out "$OUT" \
  >"$OUT/bench_s10_range_log.txt" 2>&1 || range_rc=$?
echo "range bench: rc $range_rc"
grep -v "^  " "$OUT/bench_s10_range_log.txt" | cut -c1-170 | tail -40 || true
