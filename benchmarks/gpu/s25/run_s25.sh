#!/usr/bin/env bash
# Session 25 (issue 17, batch 64): spmm_pb's GPU tests, then bench_pb.py (warm and cold, fp16 / bf16, 4096^2 and
# 4096 -> 11008; dense, the plan's product, spmm_wd; every configuration; ablation).
#   bash benchmarks/gpu/s25/run_s25.sh       (on the lent H200, from the repository root; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-s25}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "from sparsetorch_cuda import _spmm_pb; _spmm_pb.prewarm('sm_90')" &
P1=$!
python3 -c "from sparsetorch_cuda import _spmm_wd; _spmm_wd.prewarm('sm_90')" &
P2=$!
if [ "${OTHERS:-1}" = 1 ]; then
  python3 -m sparsetorch_cuda.compile --sources mma --values float16,bfloat16 --indices int32 2>&1 | tail -1
fi
wait $P1; echo "spmm_pb prewarm rc $?"; wait $P2
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short -x \
    plugins/cuda_kernels/tests/test_cuda_spmm_pb.py ${TESTK:+-k "$TESTK"} > $OUT/pytest_h200_${TAG}_pb.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_h200_${TAG}_pb.txt | head -20
  tail -2 $OUT/pytest_h200_${TAG}_pb.txt
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/gpu/s25/bench_pb.py --out $OUT --name spmm_pb_h200_${TAG}.json \
    ${BENCH_ARGS:-} 2>&1 | grep -v Warning
  echo "bench exit $?"
fi
