#!/usr/bin/env bash
# Session 12, third call: spmm_cc's one-reduction builds ("_o"): the GPU tests, bench_s12_cc.py (once vs per round,
# dense, the plan's default; skeletons), then Nsight Compute stall reasons of spmm_cc (both builds, full and flags 15).
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=plugins/cuda_kernels/benchmarks
PREWARM=${PREWARM:-mma,spmm_cc} PREWARM_VALUES=float16,bfloat16 PREWARM_INDICES=int32 source $B/device_setup.sh
if [ "${TEST:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -W ignore --tb=short \
    plugins/cuda_kernels/tests/test_cuda_spmm_cc.py -k "not host" > $OUT/pytest_h200_s12c_cc.txt 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_h200_s12c_cc.txt | head; tail -2 $OUT/pytest_h200_s12c_cc.txt
fi
timeout ${BENCH_TIMEOUT:-150} python3 $B/bench_s12_cc.py --out $OUT ${BENCH_ARGS:-} 2>&1 | tail -12
if [ "${NCU:-1}" = 1 ]; then
  S=smsp__average_warps_issue_stalled
  M=$S"_short_scoreboard_per_issue_active.ratio,"$S"_long_scoreboard_per_issue_active.ratio,"$S"_wait_per_issue_active.ratio"
  M=$M","$S"_not_selected_per_issue_active.ratio,"$S"_selected_per_issue_active.ratio,"$S"_math_pipe_throttle_per_issue_active.ratio"
  M=$M","$S"_mio_throttle_per_issue_active.ratio,"$S"_lg_throttle_per_issue_active.ratio,"$S"_barrier_per_issue_active.ratio"
  M=$M","$S"_no_instruction_per_issue_active.ratio,"$S"_drain_per_issue_active.ratio,"$S"_membar_per_issue_active.ratio"
  M=$M","$S"_sleeping_per_issue_active.ratio,"$S"_misc_per_issue_active.ratio,"$S"_dispatch_stall_per_issue_active.ratio,"$S"_branch_resolving_per_issue_active.ratio"
  M=$M",sm__inst_executed.sum,smsp__inst_executed.avg.per_cycle_active,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
  M=$M",sm__cycles_active.avg,sm__cycles_elapsed.avg,smsp__cycles_active.avg,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
  timeout ${NCU_TIMEOUT:-120} ncu --clock-control none -k regex:${NCU_KERNELS:-spmm_cc} --metrics $M \
    python3 $B/bench_s12_cc.py --profile > $OUT/ncu_s12c_cc.txt 2>&1
  echo "ncu rc $?"
  grep -E "^  spmm_|gpu__time|stalled|inst_executed|warps_active|cycles|wavefronts|ERR|rror" $OUT/ncu_s12c_cc.txt \
    | sed 's/  */ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | cut -c1-80 | head -${NCU_TAIL:-130}
fi
