#!/usr/bin/env bash
# EXTRA script of run_final.sh (session 20): the SciPy plugin, for the GPU runs' tests that need it
python3 -m pip install -q --no-deps --no-build-isolation -e plugins/scipy_backend 2>&1 | tail -2
