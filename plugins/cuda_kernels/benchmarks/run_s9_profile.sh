#!/usr/bin/env bash
# One device call (session 9): install, compile the delta module (float16, int32), profile_s9_delta.py
# --time (graph-timed rows -> $OUT/cuda_delta_h200_s9_profile.json), then the same kernels under Nsight
# Compute (each launched twice; counters with caches flushed per pass, clocks left alone) -> $OUT/ncu_s9_delta.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels 2>&1 | tail -1
python3 -m sparsetorch_cuda.compile --sources delta --values float16 --indices int32 2>&1 | tail -1
P=plugins/cuda_kernels/benchmarks/profile_s9_delta.py
timeout ${TIME_TIMEOUT:-80} python3 $P --time --out $OUT 2>&1 | tee $OUT/profile_s9_time.txt
S=smsp__average_warps_issue_stalled
M=$S"_mio_throttle_per_issue_active.ratio,"$S"_short_scoreboard_per_issue_active.ratio,"$S"_long_scoreboard_per_issue_active.ratio"
M=$M","$S"_lg_throttle_per_issue_active.ratio,"$S"_barrier_per_issue_active.ratio,"$S"_wait_per_issue_active.ratio"
M=$M","$S"_not_selected_per_issue_active.ratio,"$S"_selected_per_issue_active.ratio,"$S"_math_pipe_throttle_per_issue_active.ratio"
M=$M","$S"_no_instruction_per_issue_active.ratio,"$S"_dispatch_stall_per_issue_active.ratio,"$S"_drain_per_issue_active.ratio"
M=$M",l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
M=$M",sm__inst_executed.sum,smsp__inst_executed.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
M=$M",dram__bytes_read.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
M=$M",sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"
timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k regex:delta_ --launch-count 12 --metrics $M \
  --section SpeedOfLight --section ComputeWorkloadAnalysis python3 $P --profile >$OUT/ncu_s9_delta.txt 2>&1
R=$?
echo "ncu rc $R"
if [ $R != 0 ]; then  # a metric this ncu does not know: the sections alone
  tail -5 $OUT/ncu_s9_delta.txt
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k regex:delta_ --launch-count 12 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis_Tables python3 $P --profile \
    >$OUT/ncu_s9_delta.txt 2>&1
  echo "ncu (sections) rc $?"
fi
grep -E "^  delta_|Duration|Memory Throughput|DRAM Throughput|stalled|bank_conflicts|wavefronts|inst_executed|dram__|warps_active|pipe_lsu|op_shfl|Issue Slots Busy|ERR|rror" $OUT/ncu_s9_delta.txt | sed 's/  */ /g' | cut -c1-110 | head -220
