#!/usr/bin/env bash
# One device call (session 11, s11d: the DELTA(4) "tc8p" / "tq" kernels): install; compile the delta module
# (half types, both index types) and the modules the benchmark's other rows need; the DELTA GPU tests
# (TESTS=1; TEST_K: pytest -k, by default the tests of tc8pk, the plan's default, "all" for the whole file),
# then bench_s11_delta.py (BENCH=1; BENCH_ARGS passes options, by default the rows default (tc8pk), tc (session
# 10's default), tc8p at 50 / 10 / 30 %, two rounds), then Nsight Compute on profile_s11_delta.py (PROFILE=1, off by default). Results under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
B=plugins/cuda_kernels/benchmarks
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cuda_kernels -e plugins/cupy_backend 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m sparsetorch_cuda.compile --sources delta,mma --values float16,bfloat16 --indices int32 2>&1 | tail -1
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m sparsetorch_cuda.compile --sources delta,fast --values ${TEST_VALUES:-all} --indices all 2>&1 | tail -1
  K=${TEST_K:-tc8pk or (None and (tc_matches or low_sparsity)) or every_row_offset or compile}
  [ "$K" = all ] && K=""
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest plugins/cuda_kernels/tests/test_cuda_delta.py ${K:+-k "$K"} \
    -q -p no:cacheprovider --tb=short 2>&1 | tee $OUT/pytest_h200_s11d_delta.txt \
    | grep -v "^  \|^$\|Warning\|warnings" | tail -${TEST_TAIL:-25}
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 $B/bench_s11_delta.py --out $OUT ${BENCH_ARGS:---variants default,tc,tc8p} \
    2>&1 | tee $OUT/bench_s11d_delta_log.txt | grep -v "^  " | cut -c1-160
fi
if [ "${PROFILE:-0}" = 1 ]; then
  S=smsp__average_warps_issue_stalled
  M=$S"_short_scoreboard_per_issue_active.ratio,"$S"_long_scoreboard_per_issue_active.ratio,"$S"_wait_per_issue_active.ratio"
  M=$M","$S"_not_selected_per_issue_active.ratio,"$S"_selected_per_issue_active.ratio,"$S"_math_pipe_throttle_per_issue_active.ratio"
  M=$M","$S"_mio_throttle_per_issue_active.ratio,"$S"_lg_throttle_per_issue_active.ratio,"$S"_barrier_per_issue_active.ratio"
  M=$M","$S"_no_instruction_per_issue_active.ratio,"$S"_drain_per_issue_active.ratio"
  M=$M",l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
  M=$M",sm__inst_executed.sum,smsp__inst_executed.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
  M=$M",dram__bytes_read.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
  M=$M",lts__t_sectors_srcunit_tex_op_read.sum,sm__cycles_active.avg"
  timeout ${NCU_TIMEOUT:-120} ncu --clock-control none -k regex:'delta_(tc|tq|c8)' --metrics $M \
    python3 $B/profile_s11_delta.py ${PROFILE_ARGS:-} >$OUT/ncu_s11d_delta.txt 2>&1
  echo "ncu rc $?"
  grep -E "^  delta_|launched|gpu__time|dram__|stalled|bank_conflicts|wavefronts|inst_executed|warps_active|ERR|rror" \
    $OUT/ncu_s11d_delta.txt | sed 's/  */ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | cut -c1-90 | head -${NCU_TAIL:-140}
fi
