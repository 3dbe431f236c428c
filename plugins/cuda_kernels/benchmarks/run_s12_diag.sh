#!/usr/bin/env bash
# Session 12, first call (an EXTRA of benchmarks/gpu/run_final.sh): the card's clock state read only
# (nvidia-smi -q; a 100 ms clock log in the background for the whole call), then diag_s12_clock.py (SM
# clock measured in-kernel before / after our timed graphs, cold and hot). Results under $OUT.
nvidia-smi -q -d CLOCK,PERFORMANCE > $OUT/smi_q_s12.txt 2>&1
grep -A12 "Clocks Event Reasons\|Applications Clocks\|^    Clocks$" $OUT/smi_q_s12.txt | head -40
nohup nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,clocks_event_reasons.active \
  --format=csv -lms 100 > $OUT/smi_clock_log_s12.csv 2>&1 &
timeout ${DIAG_TIMEOUT:-150} python3 plugins/cuda_kernels/benchmarks/diag_s12_clock.py --out $OUT 2>&1 | tail -20
