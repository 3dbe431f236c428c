#!/usr/bin/env bash
# One device call (session 10, issue 16 goal 5: host time of Matmul.execute and st.matmul):
# install; compile the modules the call needs in parallel; the A/B of trees (bench_host_ab.py, one
# process per tree and round, trees alternated: s7 = ab_s7.tar.gz, base = ab_base.tar.gz, both
# `git archive --format=tar.gz <commit> core plugins/cuda_kernels plugins/cupy_backend` put in the repo
# root for the call, new = this tree); bench_s7b --cases host on this tree; the tests of the direct
# path. Results under $OUT. ROUNDS (default 2), TESTS=0 skips the tests.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources fast,spmv,structured,delta --values float32,float64 --indices int32,int64 2>&1 | tail -1
TREES=""
for t in s7 base; do
  if [ -f ab_$t.tar.gz ]; then mkdir -p /tmp/ab_$t && tar xzf ab_$t.tar.gz -C /tmp/ab_$t && TREES="$TREES $t"; fi
done
B=plugins/cuda_kernels/benchmarks/bench_host_ab.py
for r in $(seq 1 "${ROUNDS:-2}"); do
  for t in $TREES new; do
    if [ "$t" = new ]; then P=$PWD; else P=/tmp/ab_$t; fi
    PYTHONPATH=$P/core:$P/plugins/cuda_kernels:$P/plugins/cupy_backend timeout 90 python3 $B --label "$t" --round "$r" \
      --out "$OUT/ab.jsonl" 2>&1 | tail -4 | cut -c1-900
  done
done
python3 $B --combine "$OUT/ab.jsonl" --json "$OUT/host_h200_s10_ab.json" \
  --note "trees: s7 = 420070b, base = the commit before session 10's host work, new = the working tree" 2>&1 | cut -c1-1500
timeout 60 python3 plugins/cuda_kernels/benchmarks/bench_s7b.py --cases host --out "$OUT" --prefix host_h200_s10 2>&1 \
  | grep -v "^  " | cut -c1-160
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-120}" python3 -m pytest plugins/cuda_kernels/tests/test_cuda_plugin.py tests/test_ust_semantics.py \
    tests/test_matmul_lean_paths.py plugins/cuda_kernels/tests/test_cuda_gpu.py \
    -k "not test_cuda_gpu or execute or graph_capture or side_stream or repeated_calls or through_st_matmul" \
    -q -p no:cacheprovider --tb=short 2>&1 | tee "$OUT/pytest_h200_s10_host.txt" \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -"${TEST_TAIL:-25}"
fi
