"""Loops of one-shot ``sparsetorch.solve(A, b)`` with one matrix and new right-hand sides, against
SciPy's ``spsolve`` per call and ``factorized`` (one SuperLU, then solves), side by side in one
process: what a user's time-stepping or multiple-load loop sees (session 22's speed sweep found
the default solve 6.5-15.7x slower than ``factorized`` on block-diagonal matrices: the LU was priced
as one connected mesh and every call re-ran detection).

Per matrix: the first call (cold pattern: detection, graph measure, planning), the median of the
calls after ``--warm`` calls, and which method answered; every answer checked against SciPy's
(relative max error). Times by ``time.perf_counter`` on this machine (2 shared cores: read ratios).

    python benchmarks/bench_repeat_solve.py [--calls 24] [--out benchmarks/results/repeat_solve_cpu.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.io
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.testing import families as fam

import _record

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def cases() -> list[tuple[str, sp.csr_matrix]]:
    out = [(g.name, g.matrix) for g in (fam.block_diagonal(200, 50, kind="dense", seed=0),
                                         fam.block_diagonal(500, 20, kind="mixed", seed=1),
                                         fam.block_diagonal(40, 20, kind="mesh", seed=2),
                                         fam.convection_diffusion(100, 10.0, seed=0),
                                         fam.poisson(100))]
    for name in ("west0479", "rajat19", "494_bus"):
        M = sp.csr_matrix(scipy.io.mmread(str(DATA / f"{name}.mtx"))).astype(np.float64)
        out.append((name, M))
    return out


def run(name: str, M: sp.csr_matrix, calls: int, warm: int) -> dict:
    rng = np.random.default_rng(0)
    n = M.shape[0]
    bs = [rng.standard_normal(n) for _ in range(calls)]
    Mc = M.tocsc()
    A = st.SparseTensor.from_package(M.copy())
    ours, methods, err = [], [], 0.0
    refs = []
    t_sp = []
    for b in bs:
        t0 = time.perf_counter()
        ref = spla.spsolve(Mc, b)
        t_sp.append(time.perf_counter() - t0)
        refs.append(ref)
    t0 = time.perf_counter()
    f = spla.factorized(Mc)
    t_fact0 = time.perf_counter() - t0
    t_fs = []
    for b in bs:
        t0 = time.perf_counter()
        f(b)
        t_fs.append(time.perf_counter() - t0)
    for b, ref in zip(bs, refs):
        t0 = time.perf_counter()
        x, info = st.solve(A, torch.from_numpy(b), return_info=True)
        ours.append(time.perf_counter() - t0)
        methods.append(f"{info.backend}/{info.method}")
        err = max(err, float(np.abs(x.numpy() - ref).max() / max(np.abs(ref).max(), 1e-300)))
    steady = statistics.median(ours[warm:])
    fact_steady = statistics.median(t_fs[warm:])
    total_ours, total_fact = sum(ours), t_fact0 + sum(t_fs)
    return {"matrix": name, "n": n, "nnz": int(M.nnz), "calls": calls,
            "ours_first_s": ours[0], "ours_steady_s": steady, "ours_total_s": total_ours,
            "spsolve_median_s": statistics.median(t_sp), "factorized_setup_s": t_fact0, "factorized_solve_s": fact_steady,
            "factorized_total_s": total_fact,
            "first_over_spsolve": ours[0] / statistics.median(t_sp), "steady_over_factorized_solve": steady / fact_steady,
            "total_over_factorized_total": total_ours / total_fact, "methods": methods, "max_rel_error_vs_spsolve": err}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--warm", type=int, default=12, help="calls before the steady-state median")
    ap.add_argument("--out", default="benchmarks/results/repeat_solve_cpu.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    # warm imports and kernels on a small system so the first call below is the pattern's, not the process's
    st.solve(st.SparseTensor.from_package(fam.poisson(8).matrix), torch.ones(64, dtype=torch.float64))
    rows = []
    for name, M in cases():
        rec = run(name, M, args.calls, args.warm)
        rows.append(rec)
        print(f"{name:32s} n={rec['n']:6d} first {rec['ours_first_s'] * 1e3:8.1f} ms (spsolve {rec['spsolve_median_s'] * 1e3:7.1f}) "
              f"steady {rec['ours_steady_s'] * 1e3:7.2f} ms (factorized solve {rec['factorized_solve_s'] * 1e3:6.2f}) "
              f"total/factorized {rec['total_over_factorized_total']:5.2f}  {rec['methods'][-1]}  err {rec['max_rel_error_vs_spsolve']:.1e}",
              flush=True)
    _record.write(args.out, {**_record.header("bench_repeat_solve.py", argv), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
