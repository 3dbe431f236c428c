#!/usr/bin/env bash
# One device call (session 11, helper H2: the strip-compacted tensor-core SpMM, kernels/spmm_cc.cu, _spmm_cc.py):
# install, compile the spmm_cc module (float16 / bfloat16, sm_90; _spmm_cc.prewarm) and the mma module (the plan's
# default kernels) in parallel into the disk cache, the GPU tests (tests/test_cuda_spmm_cc.py; the host-compile test
# is skipped: the prewarm just built the module), then bench_s11_cc.py (BENCH_ARGS; default: k = 64 only, both
# layers, float16, densities 10 % and 50 %). Results under $OUT.
#   bash plugins/cuda_kernels/benchmarks/run_s11_cc.sh          # tests + the k = 64 benchmark
#   TEST=0 BENCH_ARGS="--ks 1,16,64,128 --dtypes float16,bfloat16 --ablation --rot 4" bash .../run_s11_cc.sh
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
python3 -c "from sparsetorch_cuda import _spmm_cc as c; c.prewarm('sm_90')" &
python3 -m sparsetorch_cuda.compile --sources mma --values float16,bfloat16 --indices int32
wait
echo "compiled in $(( $(date +%s) - t0 )) s"
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-90} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_spmm_cc.py -q -x -p no:cacheprovider \
    -k "not host" --tb=short ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest_h200_s11b_cc.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-20}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 plugins/cuda_kernels/benchmarks/bench_s11_cc.py --out $OUT \
    ${BENCH_ARGS:---ks 64 --dtypes float16 --densities 0.1,0.5 --variants z:8,dense:8} 2>&1 | tee $OUT/bench_s11b_log.txt | cut -c1-900
fi
