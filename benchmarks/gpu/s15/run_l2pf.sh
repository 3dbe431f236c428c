#!/usr/bin/env bash
# Session 15, first kernel call: L2 prefetches before griddepcontrol.wait for weights read cold.
# DELTA(4) half "tc8pkbrp" / "tc8pkbrp4" / "tc8pkbfrp" (kernels/delta.cu WPF: a warp's first rows asked of L2) and
# csr16_x12a's flag 8 (XV_VALS_L2: each lane's values asked of L2 before the wait): their GPU tests, then
# bench_s11_delta.py warm and cold against tc8pkbr / tc8pkbfr / the defaults, and bench_llm_gpu.py (batch 1, 90 %,
# graph20cold column) with x12a flags 6 (the default) and 14. Results tarred into $OUT/l2pf.tar.gz.
#   PREWARM=delta,mma PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32,int64 source plugins/cuda_kernels/benchmarks/device_setup.sh
#   bash benchmarks/gpu/s15/run_l2pf.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT0=${OUT:-/tmp/out}; OUT=/tmp/l2pf; mkdir -p $OUT $OUT0
B=plugins/cuda_kernels/benchmarks
timeout ${DTEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py \
  -k "tc8pkbrp or tc8pkbfrp or rows_past or every_row_offset" -q -p no:cacheprovider --tb=short \
  > $OUT/pytest_h200_s15_delta_l2pf.txt 2>&1
echo "delta pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s15_delta_l2pf.txt | head; tail -1 $OUT/pytest_h200_s15_delta_l2pf.txt
timeout ${MTEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_mma.py \
  -k "pdl_back_to_back or x12a" -q -p no:cacheprovider --tb=short > $OUT/pytest_h200_s15_x12a_l2pf.txt 2>&1
echo "mma pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s15_x12a_l2pf.txt | head; tail -1 $OUT/pytest_h200_s15_x12a_l2pf.txt
for mode in cold warm; do
  timeout 200 python3 $B/bench_s11_delta.py --out $OUT --name cuda_delta_h200_s15_l2pf_$mode.json $([ $mode = cold ] && echo --cold) \
    --variants ${VARIANTS:-default,tc8pkbr,tc8pkbrp,tc8pkbrp4,tc8pkbfr,tc8pkbfrp} --densities ${DENS:-0.1,0.5} --no-csr 2>&1 \
    | grep -v "^  " | cut -c1-100 | grep -E "DELTA|GEMV" | sed 's/DELTA(4) //'
done
for f in 6 14; do
  timeout 150 python3 benchmarks/bench_llm_gpu.py --out $OUT/llm_h200_s15_x12a_f$f.json --no-backward --sparsities 90% \
    --batches 1 --repeats 15 --csr16-flags $f 2>&1 | tail -4
  python3 - $OUT/llm_h200_s15_x12a_f$f.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    de, us = r["dense"], r["sparsetorch"]
    print(sys.argv[1][-8:], r["in_features"], r["out_features"], r["dtype"], "warm %.2f/%.2f=%.2fx cold %.2f/%.2f=%.2fx" % (
        de["graph20_s"] * 1e6, us["graph20_s"] * 1e6, de["graph20_s"] / us["graph20_s"],
        de["graph20cold_s"] * 1e6, us["graph20cold_s"] * 1e6, de["graph20cold_s"] / us["graph20cold_s"]))
PY
done
tar czf $OUT0/l2pf.tar.gz -C $OUT .
