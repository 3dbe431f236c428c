#!/usr/bin/env bash
# Session 13, last call: the 2:4 SpMV with the products on the tensor cores ("tc1" / "tc2", kernels/structured.cu):
# install, compile the structured module, test_nm24_kernels (every NM variant x dtype), then bench_cuda_kernels.py's
# NM(2,4) case (8192^2, fp16 / bf16, every variant against dense cuBLAS GEMV). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
python3 -m sparsetorch_cuda.compile --sources structured --values all --indices int32 2>&1 | tail -1
timeout ${TEST_TIMEOUT:-60} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short -x \
  plugins/cuda_kernels/tests/test_cuda_gpu.py -k nm24_kernels > $OUT/pytest_h200_s13_nm.txt 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|^E  " $OUT/pytest_h200_s13_nm.txt | head -8; tail -1 $OUT/pytest_h200_s13_nm.txt
timeout ${BENCH_TIMEOUT:-70} python3 benchmarks/bench_cuda_kernels.py --cases nm --reps 20 --out $OUT --prefix cuda_kernels_h200_s13_nm 2>&1 | tail -3
python3 - "$OUT/cuda_kernels_h200_s13_nm.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    k = r.get("kernel_s")
    print(f"{r.get('case', ''):<20} {r.get('impl', r.get('label', '')):<40} {k * 1e6 if k else float('nan'):7.2f} us err {r.get('rel_err')}")
PY
