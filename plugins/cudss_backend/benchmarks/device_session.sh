#!/usr/bin/env bash
# One H200 session for the cudss plugin (repo root as cwd). cuDSS 0.8.0.10 and 1.0.0.35 (cu13 wheels)
# travel as one blob (0.8's bytes, then 1.0's) split in 62 MB chunks: chunks 00..02 were copied to
# /root/stash by earlier calls, the last one comes in .whl/parts/03. Stages (STAGES env):
#   tests08 tests10 bench08 bench10 cupy suite eigen   (outputs under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W08=nvidia_cudss_cu13-0.8.0.10-py3-none-manylinux_2_17_x86_64.whl
W10=nvidia_cudss_cu13-1.0.0.35-py3-none-manylinux_2_17_x86_64.whl
if [[ ! -f /tmp/site10/nvidia/cu13/lib/libcudss.so.1 ]]; then
  cat /root/stash/blob.0* .whl/parts/03/blob.03 > /tmp/blob
  mkdir -p /tmp/w
  head -c 80682451 /tmp/blob > /tmp/w/$W08
  tail -c 161032426 /tmp/blob > /tmp/w/$W10
  md5sum /tmp/w/*.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site08 /tmp/w/$W08
  python3 -m pip install -q --no-index --no-deps --target /tmp/site10 /tmp/w/$W10
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/peers/*.whl
  rm -f /tmp/blob
fi
# /tmp/site08 on the path: nvmath-python finds libcudss.so.0 there; ours is picked explicitly.
export PYTHONPATH=/tmp/site:/tmp/site08:core:plugins/cudss_backend
L08=/tmp/site08/nvidia/cu13/lib/libcudss.so.0
L10=/tmp/site10/nvidia/cu13/lib/libcudss.so.1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
for stage in ${STAGES:-tests08 tests10 bench08}; do
  echo "=== $stage"
  case $stage in
    tests08|tests10)
      lib=$L08; [[ $stage == tests10 ]] && lib=$L10
      SPARSETORCH_CUDSS_LIBRARY=$lib timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -W ignore -rs \
        ${TEST_ARGS:-plugins/cudss_backend/tests} 2>&1 | tee "$OUT/pytest_cudss_${stage#tests}.txt" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -25 ;;
    bench08|bench10)
      lib=$L08; peers="--peers nvmath,torch-sla"; [[ $stage == bench10 ]] && { lib=$L10; peers="--peers ''"; }
      SPARSETORCH_CUDSS_LIBRARY=$lib timeout ${BENCH_TIMEOUT:-330} python3 plugins/cudss_backend/benchmarks/bench_cudss.py \
        --out "$OUT/cudss_h200_${stage#bench}.json" ${BENCH_ARGS:-} $peers 2>&1 | grep -v Warning | tee "$OUT/bench_cudss_${stage#bench}.txt" | cut -c1-700 | tail -20 ;;
    suite)  # the GPU suite (benchmarks/gpu), cuDSS 0.8 for the direct case (same as nvmath's)
      PYTHONPATH=$PYTHONPATH:plugins/cupy_backend SPARSETORCH_CUDSS_LIBRARY=$L08 timeout ${SUITE_TIMEOUT:-480} \
        python3 benchmarks/gpu/suite.py --out "$OUT/suite" --cases ${SUITE_CASES:-spmv,cg_1m,backward_1m,direct_1m} 2>&1 \
        | grep -v Warning | tee "$OUT/suite_log.txt" | cut -c1-300 | tail -40 ;;
    eigen)  # eigsh on the GPU (block Lanczos vs lobpcg vs torch-sla)
      timeout ${EIGEN_TIMEOUT:-150} python3 benchmarks/bench_spectral_gpu.py --grid ${EIGEN_GRID:-256} --repeats 2 \
        --out "$OUT/spectral_gpu.json" 2>&1 | grep -v Warning | tail -15 ;;
    cupy)  # the CuPy plugin's GPU tests that failed on 2026-11-29 (issue 8), with their messages
      PYTHONPATH=$PYTHONPATH:plugins/cupy_backend timeout 200 python3 -m pytest -q -p no:cacheprovider -W ignore \
        ${CUPY_ARGS:-plugins/cupy_backend/tests/test_cupy_conformance.py -k identity_rhs} 2>&1 | tee "$OUT/pytest_cupy.txt" | \
        grep -E "Error|error|FAILED|passed|failed" | cut -c1-400 | tail -30 ;;
  esac
done
