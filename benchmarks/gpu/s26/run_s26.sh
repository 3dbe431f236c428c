#!/usr/bin/env bash
# Session 26 prepared this for the next device call (session 26 itself was lent no device). One call covers:
#  1. the compile / load path unified in session 26 (spmm_wd, spmm_pb, spmm_cc, krylov through compile.py's
#     caches and launch.kernel): their GPU tests;
#  2. session 25's unmeasured spmm_pb variants (the deep pipeline "pbd" / "pbrd", PDL behind the permute): tests
#     and bench_pb.py;
#  3. the session-24 dense lstsq CUDA test and the core's CUDA tests touched since (trust, nn planned).
#   bash benchmarks/gpu/s26/run_s26.sh   (on the lent H200, from the repository root; results under $OUT)
# Knobs: TAG (file names), PARTS (subset of "unified pb core bench"), TESTK (a -k filter for the pb tests).
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-s26}
PARTS=${PARTS:-unified pb core bench}
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/scipy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# the modules these parts load, compiled in parallel processes first (NVRTC on the host's cores)
python3 -m sparsetorch_cuda.compile --sources spmm_pb,spmm_wd,spmm_cc --values float16,bfloat16 --indices int32 2>&1 | tail -1 &
P1=$!
python3 -m sparsetorch_cuda.compile --sources krylov --values float32,float64 2>&1 | tail -1 &
P2=$!
python3 -m sparsetorch_cuda.compile --sources mma --values float16,bfloat16 --indices int32 2>&1 | tail -1
wait $P1; wait $P2
run_tests() {  # name, timeout, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short "$@" > $OUT/pytest_h200_${TAG}_$name.txt 2>&1
  echo "$name: pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_${TAG}_$name.txt | head -20
  tail -1 $OUT/pytest_h200_${TAG}_$name.txt
}
if has unified; then
  run_tests unified 150 plugins/cuda_kernels/tests/test_cuda_spmm_wd.py plugins/cuda_kernels/tests/test_cuda_spmm_cc.py \
    plugins/cuda_kernels/tests/test_cuda_cg.py plugins/cuda_kernels/tests/test_cuda_bicgstab.py \
    plugins/cuda_kernels/tests/test_cuda_plugin.py
fi
if has pb; then
  run_tests pb 200 plugins/cuda_kernels/tests/test_cuda_spmm_pb.py \
    -k "${TESTK:-every_kernel or flags or plan_route or (matches_masked_dense and (4096 or 129))}"
fi
if has core; then
  run_tests core 120 tests/test_lstsq.py tests/test_trust_gpu.py tests/test_nn_gpu_planned.py tests/test_half.py -k "cuda or gpu or dense"
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/gpu/s25/bench_pb.py --out $OUT --name spmm_pb_h200_${TAG}.json \
    ${BENCH_ARGS:-} 2>&1 | grep -v Warning
  echo "bench exit $?"
fi
