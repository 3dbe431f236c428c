#!/usr/bin/env bash
# One device call (session 9, batch-64 SpMM on the 2:4 sparse tensor cores): install, compile the spmm_sp module
# (NVRTC, float16 and bfloat16, in parallel, into the disk cache), a smoke product, the GPU tests
# (test_cuda_spmm_sp.py), bench_s9_sp.py (BENCH_ARGS), optionally Nsight Compute on single launches (NCU=1,
# PROFILE: configurations). Results under $OUT.
PREWARM=${PREWARM:-spmm_sp} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 source plugins/cuda_kernels/benchmarks/device_setup.sh
timeout ${SMOKE_TIMEOUT:-40} python3 - <<'PY' 2>&1 | tail -5
import torch, sparsetorch as st
from sparsetorch.format import CSR
from sparsetorch_cuda.plan import CudaSpmmPlan
D = (torch.rand(300, 512) < 0.1).double() * torch.randn(300, 512, dtype=torch.float64)
D = D.half().double()
A = st.SparseTensor.from_dense(D.half(), mask=D != 0).convert(CSR, index_dtype=torch.int32).cuda()
p = CudaSpmmPlan(A); p.set_values(A.values); p.mma_kernel = "sp"
x = torch.randn(64, 512, dtype=torch.float64).half()
y = p.apply(x.cuda().mT).double().cpu()
ref = D @ x.double().T
print("smoke sp", p.sp_choice(64), float((y - ref).norm() / ref.norm()))
PY
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-120} python3 -m pytest ${TESTS:-plugins/cuda_kernels/tests/test_cuda_spmm_sp.py} -q -x -p no:cacheprovider \
    --tb=short ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest_h200_s9_sp.txt | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/bench_s9_sp.py --out $OUT ${BENCH_ARGS:---layer} \
    2>&1 | tee $OUT/bench_s9_sp_log.txt | cut -c1-700
fi
if [ "${NCU:-0}" = 1 ]; then
  if command -v ncu >/dev/null; then
    timeout ${NCU_TIMEOUT:-60} ncu --kernel-name regex:spmm_sp --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      python3 plugins/cuda_kernels/benchmarks/bench_s9_sp.py --out $OUT --profile ${PROFILE:-r2w2k4_s8,r4w4k2_s8} \
      > $OUT/ncu_s9_sp.txt 2>&1
    grep -E "spmm_sp_|Duration|Throughput|Stall|Warp Cycles|Issued|Eligible|Active Warps|Registers|Achieved|No Eligible|Pipe|Mem Busy|L2 Hit|DRAM" $OUT/ncu_s9_sp.txt | cut -c1-110 | head -${NCU_TAIL:-70}
  else
    echo "no ncu on this machine"
  fi
fi
