#!/usr/bin/env bash
# Session 18, second call: the tc kernels' GPU tests after the probe flags went into tc_unit, then gather_probe.py
# (where tc8pkbfr's time goes: conflicts, gathers, loads; warm and cold). Results tarred into $OUT/probe.tar.gz.
#   PREWARM=delta PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32,int64 source plugins/cuda_kernels/benchmarks/device_setup.sh
#   bash benchmarks/gpu/s18/run_probe.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT0=${OUT:-/tmp/out}; OUT=/tmp/probe; mkdir -p $OUT $OUT0
TAG=${TAG:-s18b}
timeout ${DTEST_TIMEOUT:-200} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
  -k "${TESTK:-tc_ or tq_}" -q -p no:cacheprovider --tb=short > $OUT/pytest_h200_${TAG}_delta_tc.txt 2>&1
echo "delta pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_${TAG}_delta_tc.txt | head -20; tail -1 $OUT/pytest_h200_${TAG}_delta_tc.txt
timeout ${PTIMEOUT:-240} python3 benchmarks/gpu/s18/gather_probe.py --out $OUT 2>&1 | tail -40
tar czf $OUT0/probe.tar.gz -C $OUT .
