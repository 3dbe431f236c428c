#!/usr/bin/env bash
# EXTRA script of run_final.sh (session 20): install the SciPy plugin (the GPU tests that need it run
# then), and time the default solve on the GPU, refined and not (default_solve.py).
python3 -m pip install -q --no-deps --no-build-isolation -e plugins/scipy_backend 2>&1 | tail -2
python3 benchmarks/gpu/s20/default_solve.py --out "$OUT/default_solve_h200_s20.json" --repeats 5
