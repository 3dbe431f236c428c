#!/usr/bin/env bash
# One device call (session 10, batch-64 SpMM through per-row column bitmaps, kernels/spmm_bm.cu): install,
# compile the spmm_bm and mma modules (NVRTC, float16 and bfloat16, in parallel, into the disk cache), a smoke
# product, the GPU tests (test_cuda_spmm_bm.py), bench_s10_bm.py (BENCH_ARGS), optionally the LLM layer bench
# (LLM=1: benchmarks/bench_llm_gpu.py at 90 %, batch 64, forward only). Results under $OUT.
PREWARM=${PREWARM:-spmm_bm,mma} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 source plugins/cuda_kernels/benchmarks/device_setup.sh
timeout ${SMOKE_TIMEOUT:-40} python3 - <<'PY' 2>&1 | tail -5
import torch, sparsetorch as st
from sparsetorch.format import CSR
from sparsetorch_cuda.plan import CudaSpmmPlan
D = (torch.rand(300, 512) < 0.1).double() * torch.randn(300, 512, dtype=torch.float64)
D = D.half().double()
A = st.SparseTensor.from_dense(D.half(), mask=D != 0).convert(CSR, index_dtype=torch.int32).cuda()
p = CudaSpmmPlan(A); p.set_values(A.values); p.mma_kernel = "bm"
x = torch.randn(64, 512, dtype=torch.float64).half()
y = p.apply(x.cuda().mT).mT.double().cpu()
ref = x.double() @ D.T
print("smoke bm", p._bm_ok(64), p.bm_split(64), float((y - ref).norm() / ref.norm()))
PY
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-120} python3 -m pytest ${TESTS:-plugins/cuda_kernels/tests/test_cuda_spmm_bm.py} -q -x -p no:cacheprovider \
    --tb=short ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest_h200_s10_bm.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s10_bm.py --out $OUT ${BENCH_ARGS:---ablation} \
    2>&1 | tee $OUT/bench_s10_bm_log.txt | cut -c1-600
fi
if [ -n "${BENCH2_ARGS:-}" ]; then  # a second bench run (e.g. bfloat16), its own --tag
  timeout ${BENCH_TIMEOUT:-200} python3 plugins/cuda_kernels/benchmarks/bench_s10_bm.py --out $OUT ${BENCH2_ARGS} \
    2>&1 | tee $OUT/bench_s10_bm2_log.txt | cut -c1-600
fi
if [ "${LLM:-0}" = 1 ]; then
  # BM_AUTO_LLM="lo,hi,k_lo,k_hi": the _spmm_bm.BM_AUTO rule this run uses (default: the committed one)
  timeout ${LLM_TIMEOUT:-200} python3 - ${LLM_ARGS:---no-backward --sparsities 90% --batches 64 --repeats 15} \
    --out $OUT/llm_h200_s10_bm.json <<'PY' 2>&1 | tail -${LLM_TAIL:-20}
import os, runpy, sys
from sparsetorch_cuda import _spmm_bm
rule = os.environ.get("BM_AUTO_LLM")
if rule:
    lo, hi, k_lo, k_hi = rule.split(",")
    _spmm_bm.BM_AUTO = (float(lo), float(hi), int(k_lo), int(k_hi))
print("BM_AUTO", _spmm_bm.BM_AUTO, flush=True)
sys.argv = ["benchmarks/bench_llm_gpu.py", *sys.argv[1:]]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/bench_llm_gpu.py", run_name="__main__")
PY
fi
