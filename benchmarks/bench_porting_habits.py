"""What a user porting torch-sla code does every day, timed against SciPy's same call in one process
(session 23's sweep of such code): products and solves on a matrix built from unsorted COO triplets,
a training loop on a matrix built once from a parameter, and least squares on a wide matrix.

Cases (each answer checked against SciPy / NumPy, relative max error in the JSON):

- ``matvec_coo``: one-shot ``A @ x`` on a matrix from ``from_coo`` (triplets shuffled, as an assembly
  loop leaves them; 2-D Poisson m^2), repeated; against SciPy's CSR ``A @ x``.
- ``train_loop``: ``p`` a parameter, ``A = from_coo(p, row, col)`` built once, then per step a solve, a
  scalar loss, backward and an SGD step; against SciPy ``splu`` of the same values plus the transposed
  solve of the gradient (what the adjoint needs), per step.
- ``lstsq_wide``: the default ``st.lstsq`` on a 50 x n random matrix (5 % dense), first call; against
  SciPy's ``lsqr`` at tight tolerances.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_porting_habits.py [--out benchmarks/results/porting_habits_cpu.json]

Times by ``time.perf_counter`` on this machine (2 shared cores: read the ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st

import _record


def _poisson_triplets(m: int, seed: int = 0):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    P = (sp.kron(T, sp.eye(m)) + sp.kron(sp.eye(m), T)).tocoo()
    perm = np.random.default_rng(seed).permutation(P.nnz)
    return P.tocsr(), torch.from_numpy(P.row[perm].astype(np.int64)), torch.from_numpy(P.col[perm].astype(np.int64)), \
        torch.from_numpy(P.data[perm].copy())


def _median(f, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def matvec_coo(m: int, reps: int) -> dict:
    S, r, c, v = _poisson_triplets(m)
    n = S.shape[0]
    A = st.SparseTensor.from_coo(v, r, c, shape=(n, n))
    x = torch.randn(n, dtype=torch.float64)
    xn = x.numpy()
    for _ in range(5):
        A @ x
        S @ xn
    ours, ref = _median(lambda: A @ x, reps), _median(lambda: S @ xn, reps)
    err = float(np.abs((A @ x).numpy() - S @ xn).max() / np.abs(S @ xn).max())
    return {"case": "matvec_coo", "m": m, "n": n, "nnz": int(S.nnz), "format": A.format.name, "ours_s": ours,
            "scipy_s": ref, "ratio": ours / ref, "max_rel_error": err}


def train_loop(m: int, steps: int) -> dict:
    S, r, c, v = _poisson_triplets(m, seed=1)
    n = S.shape[0]
    b = torch.randn(n, dtype=torch.float64)
    p = torch.nn.Parameter(v.clone())
    A = st.SparseTensor.from_coo(p, r, c, shape=(n, n))
    opt = torch.optim.SGD([p], lr=1e-4)
    ts, last = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        x = st.solve(A, b)
        loss = x.square().sum()
        loss.backward()
        opt.step()
        ts.append(time.perf_counter() - t0)
        last = x.detach()
    # SciPy: the same values, one LU per step, the forward and the transposed (adjoint) solve
    pv = p.detach().numpy()
    M = sp.csc_matrix((pv, (r.numpy(), c.numpy())), shape=(n, n))
    bn = b.numpy()

    def scipy_step():
        lu = spla.splu(M)
        xs = lu.solve(bn)
        lu.solve(2 * xs, trans="T")

    ref = _median(scipy_step, steps)
    err = float(np.abs(st.solve(A, b).detach().numpy() - spla.spsolve(M, bn)).max() / np.abs(spla.spsolve(M, bn)).max())
    ours = statistics.median(ts[steps // 2:])
    return {"case": "train_loop", "m": m, "n": n, "steps": steps, "ours_step_s": ours, "scipy_step_s": ref,
            "ratio": ours / ref, "first_step_s": ts[0], "max_rel_error": err,
            "matrix_follows_parameter": bool(torch.equal(A.values, p)), "last_norm": float(last.norm())}


def lstsq_wide(ncols: int) -> dict:
    A = sp.csr_array(sp.random(50, ncols, density=0.05, random_state=1))
    b = np.random.default_rng(0).standard_normal(50)
    At = st.from_package(A)
    t0 = time.perf_counter()
    x, info = st.lstsq(At, torch.from_numpy(b), return_info=True)
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    spla.lsqr(A, b, atol=1e-14, btol=1e-14)
    ref = time.perf_counter() - t0
    xn = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    return {"case": "lstsq_wide", "shape": [50, ncols], "nnz": int(A.nnz), "ours_first_s": ours, "scipy_lsqr_s": ref,
            "ratio": ours / ref, "method": f"{info.backend}/{info.method}",
            "rel_error_vs_numpy": float(np.linalg.norm(x.numpy() - xn) / np.linalg.norm(xn))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/results/porting_habits_cpu.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    jobs = [(matvec_coo, m, args.reps) for m in (40, 80)] + [(train_loop, m, args.steps) for m in (40, 80)]
    jobs += [(lstsq_wide, ncols) for ncols in (2000, 20000)]
    for fn, *a in jobs:
        try:
            rows.append(fn(*a))
        except Exception as exc:  # noqa: BLE001 - a tree where the habit fails (the "before" run) records why
            rows.append({"case": fn.__name__, "args": a, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    for r in rows:
        print({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    _record.write(args.out, {"benchmark": "porting_habits", **_record.header("bench_porting_habits.py", argv), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
