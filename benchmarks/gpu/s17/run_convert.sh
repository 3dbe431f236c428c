#!/usr/bin/env bash
# Session 17, device call: the short path of GPU CSR -> COO (construct.FAST_DIRECT / _same_major) and
# the cuda plugin's leaner launch: the conversion tests on the GPU, bench_convert_gpu against CuPy (with
# the general steps timed alternately beside it), and a cProfile of both paths. Results under $OUT.
# Usage (on the device, repository root): TAG=s17a bash benchmarks/gpu/s17/run_convert.sh
# (CONVERT_TESTS=0 / PROFILE=0 leave out the tests / the profile: the final call runs the tests itself)
set -o pipefail
TAG=${TAG:-s17a}
export PREWARM=spmv PREWARM_VALUES=float32,float64 PREWARM_INDICES=all
source plugins/cuda_kernels/benchmarks/device_setup.sh
if [ "${CONVERT_TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_convert_lean.py \
    tests/test_convert_direct.py tests/test_conversion_kernels.py plugins/cuda_kernels/tests/test_cuda_convert.py \
    > $OUT/pytest_h200_${TAG}_convert.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_${TAG}_convert.txt | head -20; tail -2 $OUT/pytest_h200_${TAG}_convert.txt
fi
timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_convert_gpu.py --reps 21 --only-peers --out $OUT/convert_cuda_${TAG}.json 2>&1 \
  | grep -v Warn | cut -c1-1500 | tail -8
if [ "${PROFILE:-1}" = 1 ]; then
  timeout 120 python3 benchmarks/gpu/s17/profile_coo.py 3000 > $OUT/profile_coo_${TAG}.txt 2>&1; tail -c 2500 $OUT/profile_coo_${TAG}.txt
fi
