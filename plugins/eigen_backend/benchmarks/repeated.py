"""Repeated solves with new values on one pattern: Eigen with plan reuse vs SciPy splu from scratch
vs torch-sla 0.4.0 (its CPU direct path, SciPy SuperLU); and single (cold) solves.

Workload per case: R value sets A_t = (1 + 0.1 t) A + 0.01 t I on A's pattern (SPD stays SPD),
b = ones; each step solves A_t x = b once.

- ``eigen``: ``sparsetorch.solve(A_t, b, backend="eigen", method=...)``, the user path: dispatch,
  plan cache (pattern analysed once, at t = 0), ``set_values`` (numeric factorization), solve.
  Cholesky (SimplicialLLT) for SPD, LU (SparseLU) for convection-diffusion.
- ``scipy_splu``: ``scipy.sparse.linalg.splu(A_t_csc).solve(b)`` with SciPy's defaults (COLAMD,
  partial pivoting): ordering + symbolic + numeric every time, as a user calling SciPy would.
- ``scipy_splu_symmetric``: the same with SuperLU's symmetric mode (``MMD_AT_PLUS_A``,
  ``diag_pivot_thresh=0.1``, ``SymmetricMode``), SciPy's best setting for these symmetric patterns.
- ``torch_sla``: ``torch_sla.spsolve(val, row, col, shape, b, backend="scipy", method="lu")``
  (torch-sla 0.4.0 has no Eigen backend; its CPU direct path is SciPy's SuperLU via COO->CSR->CSC).

Reports per case the median seconds per step (warm steps; the first Eigen step, which also builds
the plan, is reported separately), the ratios scipy/eigen, and the relative residuals. Run under
the bench lock on an otherwise idle machine:

    flock /tmp/sparsetorch-bench.lock env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        PYTHONPATH=core python plugins/eigen_backend/benchmarks/repeated.py \\
        --out benchmarks/results/eigen_repeated_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.format import CSR


def laplacian(m: int, dim: int, convection: float = 0.0) -> sp.csr_array:
    """The 5-/7-point Laplacian on an m^dim grid; with convection c > 0 a central-difference
    first derivative (cell Peclet number 2c) in every direction: tridiag(-1 - c, 2, -1 + c)."""
    T = sp.diags_array([-1.0 - convection, 2.0, -1.0 + convection], offsets=[-1, 0, 1], shape=(m, m))
    I = sp.eye_array(m)
    if dim == 2:
        A = sp.kron(I, T) + sp.kron(T, I)
    else:
        A = sp.kron(sp.kron(I, I), T) + sp.kron(sp.kron(I, T), I) + sp.kron(sp.kron(T, I), I)
    A = sp.csr_array(A)
    A.sum_duplicates()
    A.sort_indices()
    return A


def to_sparsetorch(A: sp.csr_array) -> st.SparseTensor:
    coo = A.tocoo()
    return st.SparseTensor.from_coo(torch.from_numpy(coo.data.copy()), torch.from_numpy(coo.row.astype(np.int64)),
                                    torch.from_numpy(coo.col.astype(np.int64)), shape=A.shape, format=CSR)


def values_at(A: sp.csr_array, t: int) -> np.ndarray:
    """Values of (1 + 0.1 t) A + 0.01 t I on A's pattern (CSR order)."""
    v = A.data * (1.0 + 0.1 * t)
    diag = np.flatnonzero(A.indices == np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)))
    v[diag] += 0.01 * t
    return v


def rel_res(A: sp.csr_array, v: np.ndarray, x: np.ndarray, b: np.ndarray) -> float:
    At = sp.csr_array((v, A.indices, A.indptr), shape=A.shape)
    return float(np.linalg.norm(b - At @ x) / np.linalg.norm(b))


def run_case(name: str, m: int, dim: int, convection: float, steps: int, skip: set[str], spd_method: str = "cholesky") -> dict:
    A = laplacian(m, dim, convection)
    n = A.shape[0]
    spd = convection == 0.0
    method = spd_method if spd else "lu"
    At = to_sparsetorch(A)
    b = np.ones(n)
    bt = torch.from_numpy(b)
    vals = [values_at(A, t) for t in range(steps)]
    row = {"case": name, "n": n, "nnz": int(A.nnz), "spd": spd, "eigen_method": method, "steps": steps}
    print(f"== {name}: n={n}, nnz={A.nnz}, {steps} value sets", flush=True)

    # Eigen through sparsetorch, plan reused (the cache keeps it between calls).
    st.plan_cache().clear()
    times, res = [], []
    for v in vals:
        Av = At.with_values(torch.from_numpy(v))
        t0 = time.perf_counter()
        x = st.solve(Av, bt, backend="eigen", method=method, properties="spd" if spd else None)
        times.append(time.perf_counter() - t0)
        res.append(rel_res(A, v, x.numpy(), b))
    row["eigen_first_step_s"] = times[0]
    row["eigen_step_s"] = statistics.median(times[1:]) if len(times) > 1 else times[0]
    row["eigen_residual"] = max(res)
    # the split: numeric factorization + solve only (the plan's set_values + solve, no dispatch)
    with st.Solver(At, backend="eigen", method=method, properties="spd" if spd else None) as s:
        s.plan()
        split = []
        for v in vals[1:3]:
            t0 = time.perf_counter()
            s.update_values(torch.from_numpy(v))
            s.solve(bt)
            split.append(time.perf_counter() - t0)
    row["eigen_solver_step_s"] = min(split) if split else None
    print(f"  eigen {method}: first {times[0]:.3f}s, median step {row['eigen_step_s']:.3f}s, Solver step "
          f"{row['eigen_solver_step_s']:.3f}s, res {row['eigen_residual']:.1e}", flush=True)

    # SciPy splu from scratch, defaults (COLAMD).
    def splu_steps(label: str, **kw) -> None:
        times, res = [], []
        for v in vals:
            csc = sp.csr_array((v, A.indices, A.indptr), shape=A.shape).tocsc()
            t0 = time.perf_counter()
            x = spla.splu(csc, **kw).solve(b)
            times.append(time.perf_counter() - t0)
            res.append(rel_res(A, v, x, b))
        row[f"{label}_step_s"] = statistics.median(times)
        row[f"{label}_residual"] = max(res)
        row[f"ratio_{label}_over_eigen"] = row[f"{label}_step_s"] / row["eigen_step_s"]
        print(f"  {label}: median step {row[f'{label}_step_s']:.3f}s ({row[f'ratio_{label}_over_eigen']:.2f}x eigen), "
              f"res {max(res):.1e}", flush=True)

    if "scipy" not in skip:
        splu_steps("scipy_splu")
    if "scipy_sym" not in skip:
        splu_steps("scipy_splu_symmetric", permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.1,
                   options={"SymmetricMode": True})

    # torch-sla 0.4.0, its SciPy path.
    if "torch_sla" not in skip:
        import torch_sla

        coo = A.tocoo()
        r_, c_ = torch.from_numpy(coo.row.astype(np.int64)), torch.from_numpy(coo.col.astype(np.int64))
        perm = np.lexsort((coo.col, coo.row))  # COO of a canonical CSR is in CSR order already
        assert np.all(perm == np.arange(len(perm)))
        times, res = [], []
        for v in vals:
            vt = torch.from_numpy(v)
            t0 = time.perf_counter()
            x = torch_sla.spsolve(vt, r_, c_, A.shape, bt, backend="scipy", method="lu")
            times.append(time.perf_counter() - t0)
            res.append(rel_res(A, v, x.numpy(), b))
        row["torch_sla_step_s"] = statistics.median(times)
        row["torch_sla_residual"] = max(res)
        row["ratio_torch_sla_over_eigen"] = row["torch_sla_step_s"] / row["eigen_step_s"]
        print(f"  torch-sla scipy/lu: median step {row['torch_sla_step_s']:.3f}s "
              f"({row['ratio_torch_sla_over_eigen']:.2f}x eigen)", flush=True)

    # Single cold solve: Eigen without the plan cache (analysis + factorization + solve).
    t0 = time.perf_counter()
    x = st.solve(At.with_values(torch.from_numpy(vals[0])), bt, backend="eigen", method=method,
                 properties="spd" if spd else None, cache=False)
    row["single_eigen_s"] = time.perf_counter() - t0
    row["single_eigen_residual"] = rel_res(A, vals[0], x.numpy(), b)
    if "scipy_splu_step_s" in row:
        row["single_scipy_splu_s"] = row["scipy_splu_step_s"]  # every SciPy step is a cold solve
        row["single_ratio_scipy_over_eigen"] = row["single_scipy_splu_s"] / row["single_eigen_s"]
    print(f"  single: eigen {row['single_eigen_s']:.3f}s" + (f", scipy {row['single_scipy_splu_s']:.3f}s"
                                                            if "single_scipy_splu_s" in row else ""), flush=True)
    return row


CASES = {
    "poisson2d_256": (256, 2, 0.0, 10),
    "poisson3d_40": (40, 3, 0.0, 3),
    "convdiff2d_256": (256, 2, 0.4, 10),
    "convdiff3d_40": (40, 3, 0.4, 3),
}
QUICK = {"poisson2d_64": (64, 2, 0.0, 5), "poisson3d_16": (16, 3, 0.0, 4), "convdiff2d_64": (64, 2, 0.4, 5),
         "convdiff3d_16": (16, 3, 0.4, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--cases", default=None, help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--skip", default="", help="comma-separated: scipy, scipy_sym, torch_sla")
    ap.add_argument("--spd-method", default="cholesky", choices=("cholesky", "ldlt", "lu"),
                    help="Eigen's method for the SPD cases (default cholesky: SimplicialLLT)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import sparsetorch_eigen
    import sparsetorch_eigen.plugin
    from sparsetorch.backend import get_backends

    if "eigen" not in get_backends().names:  # a source-tree run (in-place build, no entry point)
        get_backends().register(sparsetorch_eigen.plugin, "eigen")

    cases = QUICK if args.quick else CASES
    if args.cases:
        cases = {k: v for k, v in {**CASES, **QUICK}.items() if k in args.cases.split(",")}
    skip = set(filter(None, args.skip.split(",")))
    rows = [run_case(k, *v, skip=skip, spd_method=args.spd_method) for k, v in cases.items()]
    try:
        import torch_sla

        tsla = getattr(torch_sla, "__version__", "?")
    except ImportError:
        tsla = None
    out = {
        "benchmark": "eigen_repeated_cpu",
        "command": "flock /tmp/sparsetorch-bench.lock env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
                   f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} python plugins/eigen_backend/benchmarks/repeated.py "
                   + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {"torch": torch.__version__, "scipy": scipy.__version__, "numpy": np.__version__,
                     "sparsetorch": st.__version__, "sparsetorch_eigen": sparsetorch_eigen.__version__,
                     "eigen": sparsetorch_eigen.eigen_version(), "torch_sla": tsla},
        "threads": {"torch": torch.get_num_threads(), "eigen": sparsetorch_eigen.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                    "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")},
        "workload": "R value sets (1 + 0.1 t) A + 0.01 t I on one pattern, b = ones, one solve each; medians per step",
        "cases": rows,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
