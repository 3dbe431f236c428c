#!/usr/bin/env bash
# Session 12 (an EXTRA of benchmarks/gpu/run_final.sh): diag_s12_nonfinite.py (does Inf in X reach rows that store
# no entry in its column, per half-precision kernel). Results under $OUT.
timeout ${DIAG_TIMEOUT:-90} python3 plugins/cuda_kernels/benchmarks/diag_s12_nonfinite.py --out $OUT 2>&1 \
  | grep -v Warn | sed "s/'rows_storing_j0'/st/; s/'storing_nonfinite'/st_nf/; s/'others_nonfinite'/o_nf/" | cut -c1-200 | tail -40
