#!/usr/bin/env bash
# Session 22 (issue 17, batch 64): spmm_wd's GPU tests, then bench_wd.py (warm and cold, fp16 / bf16, 4096^2 and
# 4096 -> 11008; dense, the plan's product, spmm_cc; ablation; TUNE=1 every configuration).
#   bash benchmarks/gpu/s22/run_s22.sh       (on the lent H200, from the repository root; results under $OUT)
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-s22}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# compile spmm_wd (both half types) beside the plan's and spmm_cc's modules, in parallel
python3 -c "from sparsetorch_cuda import _spmm_wd; _spmm_wd.prewarm('sm_90')" &
P1=$!
if [ "${OTHERS:-1}" = 1 ]; then
  python3 -m sparsetorch_cuda.compile --sources mma,spmm_cc --values float16,bfloat16 --indices int32 2>&1 | tail -1
fi
wait $P1; echo "spmm_wd prewarm rc $?"
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short -x \
    plugins/cuda_kernels/tests/test_cuda_spmm_wd.py ${TESTK:+-k "$TESTK"} > $OUT/pytest_h200_${TAG}_wd.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_h200_${TAG}_wd.txt | head -20
  tail -2 $OUT/pytest_h200_${TAG}_wd.txt
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/gpu/s22/bench_wd.py --out $OUT --name spmm_wd_h200_${TAG}.json \
    ${BENCH_ARGS:-} 2>&1 | grep -v Warning
  echo "bench exit $?"
fi
if [ "${NCU:-0}" = 1 ]; then
  S=smsp__average_warps_issue_stalled
  M=$S"_short_scoreboard_per_issue_active.ratio,"$S"_long_scoreboard_per_issue_active.ratio,"$S"_wait_per_issue_active.ratio"
  M=$M","$S"_not_selected_per_issue_active.ratio,"$S"_selected_per_issue_active.ratio,"$S"_math_pipe_throttle_per_issue_active.ratio"
  M=$M","$S"_mio_throttle_per_issue_active.ratio,"$S"_lg_throttle_per_issue_active.ratio,"$S"_barrier_per_issue_active.ratio"
  M=$M","$S"_no_instruction_per_issue_active.ratio,"$S"_membar_per_issue_active.ratio,"$S"_sleeping_per_issue_active.ratio"
  M=$M","$S"_misc_per_issue_active.ratio,"$S"_dispatch_stall_per_issue_active.ratio,"$S"_branch_resolving_per_issue_active.ratio"
  M=$M",sm__inst_executed.sum,smsp__inst_executed.avg.per_cycle_active,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
  M=$M",sm__cycles_active.avg,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
  M=$M",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum"
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k regex:spmm_wd --metrics $M \
    python3 benchmarks/gpu/s22/bench_wd.py --out $OUT --profile > $OUT/ncu_${TAG}_wd.txt 2>&1
  echo "ncu rc $?"
  grep -E "^  spmm_|gpu__time|stalled|inst_executed|warps_active|cycles|wavefronts|conflicts|hmma|lts__|ERR|rror" $OUT/ncu_${TAG}_wd.txt \
    | sed 's/  */ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | cut -c1-90 | head -${NCU_TAIL:-140}
fi
