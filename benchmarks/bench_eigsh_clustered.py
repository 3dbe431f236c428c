"""``sparsetorch.eigsh`` (the default route) against SciPy's ARPACK on symmetric matrices whose wanted end is
clustered (session 30's sweep: 3-7x slower than ``scipy.sparse.linalg.eigsh`` there).

Families (each: a base matrix plus a diagonal that pushes a dozen eigenvalues to one end, within ``rel`` relative
of each other):

- ``lap2``: 2-D Dirichlet Laplacian (5-point), spikes of ``4.5 (1 + rel j)`` at 12 random nodes: the pushed
  eigenvalues sit just above the Laplacian's own top (~8), so the wanted ones have a tiny relative gap;
- ``lap3``: the 3-D (7-point) Laplacian with spikes of ``6.5 (1 + rel j)`` (its top is ~12);
- ``rand``: a random sparse SPD matrix (a weighted graph Laplacian plus the identity, ~8 entries a row) with
  spikes of ``1 + rel j`` times its largest degree.

For each case and ``which``: ours (``st.eigsh(A, k, which=which)``, the default route), SciPy's ARPACK as a user
calls it (``scipy.sparse.linalg.eigsh(A, k, which=which)``: its random start differs per call, so the median of
``--reps`` calls) and SciPy's ARPACK from the start vector the plugin uses (the same products as ours: the
difference is the route's own work). Medians of ``--reps`` calls each, the three called in turn (ours: warm
calls, after a first one that is timed apart: it includes property detection and plan building). Ratios
``ours / scipy``. On a shared machine the small cases (tens of ms) are noisy.

Run: ``python benchmarks/bench_eigsh_clustered.py [--size moderate|small|large] [--reps 3] [--tag NAME]``; writes
``benchmarks/results/eigsh_clustered[_TAG].json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

import sparsetorch as st

from _record import header, write

SIZES = {
    # (family, size parameter, rel, seed): the size parameter is the grid side (lap2, lap3) or n (rand)
    "small": [("lap2", 45, 1e-6, 0), ("lap3", 13, 1e-5, 0), ("rand", 2000, 1e-5, 0)],
    "moderate": [("lap2", 50, 1e-6, 0), ("lap2", 70, 1e-6, 4), ("lap2", 100, 1e-4, 0), ("lap3", 14, 1e-5, 0),
                 ("rand", 2000, 1e-5, 0), ("rand", 5000, 1e-6, 1)],
    "large": [("lap2", 200, 1e-5, 0), ("lap3", 46, 1e-5, 0), ("rand", 20000, 1e-5, 0), ("lap2", 316, 1e-5, 0)],
}


def laplacian(m: int, dim: int) -> sp.csr_matrix:
    T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    eye = sp.identity(m)
    if dim == 2:
        return sp.csr_matrix(sp.kron(T, eye) + sp.kron(eye, T))
    return sp.csr_matrix(sp.kron(sp.kron(T, eye), eye) + sp.kron(sp.kron(eye, T), eye) + sp.kron(sp.kron(eye, eye), T))


def random_spd(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    R = sp.random(n, n, density=4.0 / n, random_state=rng, data_rvs=lambda s: rng.random(s))
    W = sp.triu(R + R.T, 1)
    W = W + W.T
    deg = np.asarray(W.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(deg + 1.0) - W)


def clustered(family: str, size: int, rel: float, seed: int, count: int = 12) -> sp.csr_matrix:
    """The base matrix of ``family`` plus ``count`` diagonal spikes ``top (1 + rel j)`` at random nodes."""
    rng = np.random.default_rng(seed)
    if family == "rand":
        B = random_spd(size, rng)
        top = float(B.diagonal().max())
    else:
        B = laplacian(size, 2 if family == "lap2" else 3)
        top = 4.5 if family == "lap2" else 6.5
    n = B.shape[0]
    d = np.zeros(n)
    d[rng.choice(n, count, replace=False)] = top * (1 + rel * np.arange(count))
    return sp.csr_matrix(B + sp.diags(d))


def to_sparsetorch(A: sp.csr_matrix) -> st.SparseTensor:
    C = A.tocoo()
    return st.SparseTensor.from_coo(torch.from_numpy(C.data.copy()), torch.from_numpy(C.row.astype(np.int64)),
                                    torch.from_numpy(C.col.astype(np.int64)), shape=C.shape)


def plugin_start(n: int) -> np.ndarray:
    """The start vector the SciPy plugin gives ARPACK when the caller gives none (sparsetorch_scipy.spectral._v0)."""
    return np.random.default_rng((n, 0, 0x5EED)).standard_normal(n)


def interleaved(fns: list, reps: int) -> list[tuple[float, object]]:
    """Median seconds and last output of each of ``fns``, called in turn ``reps`` times (interleaved, so that a
    busy phase of a shared machine falls on all of them alike)."""
    times: list[list[float]] = [[] for _ in fns]
    outs: list[object] = [None] * len(fns)
    for _ in range(reps):
        for j, fn in enumerate(fns):
            t0 = time.perf_counter()
            outs[j] = fn()
            times[j].append(time.perf_counter() - t0)
    return [(statistics.median(t), o) for t, o in zip(times, outs)]


def run_case(family: str, size: int, rel: float, seed: int, which: str, k: int, reps: int) -> dict:
    A = clustered(family, size, rel, seed)
    n = A.shape[0]
    S = to_sparsetorch(A)
    v0 = plugin_start(n)
    t0 = time.perf_counter()
    st.eigsh(S, k, which=which)
    first = time.perf_counter() - t0
    (t_scipy, _), (t_same, w_same), (t_ours, out) = interleaved(
        [lambda: sla.eigsh(A, k=k, which=which)[0], lambda: sla.eigsh(A, k=k, which=which, v0=v0)[0],
         lambda: st.eigsh(S, k, which=which, return_info=True)], reps)
    w, V, info = out
    wn = w.numpy()
    resid = float(np.max(np.linalg.norm(A @ V.numpy() - V.numpy() * wn, axis=0)) / max(np.abs(wn).max(), 1e-300))
    attempts = [{"method": f"{a['backend']}/{a['method']}", "seconds": round(a["seconds"], 4),
                 "accepted": a["accepted"], "why": a["why"][:160]} for a in info.extra["attempts"]]
    row = {"family": family, "size": size, "n": n, "nnz": int(A.nnz), "rel": rel, "seed": seed, "which": which, "k": k,
           "scipy_s": t_scipy, "scipy_same_v0_s": t_same, "ours_s": t_ours, "ours_first_call_s": first,
           "ratio": t_ours / t_scipy, "ratio_same_v0": t_ours / t_same,
           "max_abs_diff_vs_scipy": float(np.abs(np.sort(w_same) - wn).max()), "residual": resid,
           "attempts": attempts}
    print(f"{family:5s} n={n:6d} rel={rel:.0e} {which}: scipy {t_scipy:7.3f} s (same v0 {t_same:7.3f} s)  ours "
          f"{t_ours:7.3f} s (first {first:6.3f})  ratio {row['ratio']:5.2f} (same v0 {row['ratio_same_v0']:5.2f})  "
          f"tries {[a['method'] + ('+' if a['accepted'] else '-') for a in attempts]}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="moderate")
    p.add_argument("--which", default="LA,LM,SA")
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    rows = []
    for family, size, rel, seed in SIZES[args.size]:
        for which in args.which.split(","):
            rows.append(run_case(family, size, rel, seed, which, args.k, args.reps))
    ratios = [r["ratio"] for r in rows]
    same = [r["ratio_same_v0"] for r in rows]
    summary = {"cases": len(rows), "ratio_median": statistics.median(ratios), "ratio_max": max(ratios),
               "ratio_same_v0_median": statistics.median(same), "ratio_same_v0_max": max(same)}
    print(summary)
    rec = {**header("bench_eigsh_clustered.py", argv if argv is not None else sys.argv[1:]), "tag": args.tag,
           "size": args.size, "reps": args.reps, "summary": summary, "rows": rows}
    out = args.out or f"benchmarks/results/eigsh_clustered{'_' + args.tag if args.tag else ''}.json"
    write(out, rec)


if __name__ == "__main__":
    main()
