"""Eigen-solvers and determinants, side by side with torch-sla 0.4.0 and SciPy, in one run.

Correctness on random problems against NumPy float64 (det signs, logdet of an ill-scaled SPD
matrix, eigs of non-symmetric matrices, eigenvector gradients), then timings on a 2-D Poisson
matrix (eigsh of the smallest eigenvalues, logdet, each with its backward pass).

    PYTHONPATH=core python benchmarks/bench_spectral_det.py [--grid 256] [--repeats 3]

Writes benchmarks/results/spectral_det_cpu.json. Timings: median of ``--repeats`` runs, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.testing.problems import poisson2d

try:
    import torch_sla
except ImportError:  # the peer is optional
    torch_sla = None


def _timed(fn, repeats):
    """Median wall time; sparsetorch's plan cache is emptied before each run, so every run
    analyses and factorizes from scratch like the peers (same values would otherwise hit the
    cached factorization)."""
    times, out = [], None
    for _ in range(repeats):
        st.plan_cache().clear()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _sla(A: st.SparseTensor, values=None):
    coords, vals = A.coordinates()
    return torch_sla.SparseTensor(vals if values is None else values, coords[0], coords[1], tuple(A.shape))


def _random_nonsym(n, seed, density=0.15):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < density)
    return D + torch.diag(torch.randn(n, generator=g, dtype=torch.float64) * 3)


def correctness(trials: int) -> dict:
    out: dict = {}
    # 1. det signs on random non-symmetric matrices
    wrong = {"sparsetorch": 0, "torch_sla": 0}
    rel_err = {"sparsetorch": 0.0, "torch_sla": 0.0}
    for seed in range(trials):
        D = _random_nonsym(30, seed)
        ref = np.linalg.det(D.numpy())
        A = st.SparseTensor.from_dense(D)
        ours = float(st.det(A))
        wrong["sparsetorch"] += int(np.sign(ours) != np.sign(ref))
        rel_err["sparsetorch"] = max(rel_err["sparsetorch"], abs(ours - ref) / abs(ref))
        if torch_sla is not None:
            theirs = float(_sla(A).det())
            wrong["torch_sla"] += int(np.sign(theirs) != np.sign(ref))
            rel_err["torch_sla"] = max(rel_err["torch_sla"], abs(theirs - ref) / abs(ref))
    out["det_sign_wrong"] = {"trials": trials, "n": 30, **wrong}
    out["det_max_rel_error"] = rel_err
    # 2. logdet of the 1/h^2-scaled 64x64-grid Poisson matrix (det overflows float64)
    m = 64
    A = poisson2d(m)
    A = A.with_values(A.values * (m + 1) ** 2)
    j = torch.arange(1, m + 1, dtype=torch.float64)
    lam = (2 - 2 * torch.cos(j * torch.pi / (m + 1))) * (m + 1) ** 2
    ref = float(torch.log(lam[:, None] + lam[None, :]).sum())
    res = {"reference": ref, "sparsetorch": float(st.logdet(A))}
    if torch_sla is not None:
        res["torch_sla"] = float(_sla(A).logdet())
    out["logdet_poisson64_scaled"] = res
    # 3. eigs of random non-symmetric matrices: max distance to the nearest true eigenvalue
    err = {"sparsetorch": 0.0, "torch_sla": 0.0}
    for seed in range(min(trials, 20)):
        D = _random_nonsym(40, 100 + seed)
        ref = np.linalg.eigvals(D.numpy())
        A = st.SparseTensor.from_dense(D)
        w, _ = st.eigs(A, 4, which="LM")
        err["sparsetorch"] = max(err["sparsetorch"], max(np.min(np.abs(ref - z)) for z in w.numpy()))
        if torch_sla is not None:
            try:
                wt, _ = _sla(A).eigs(k=4, which="LM")
                err["torch_sla"] = max(err["torch_sla"], max(np.min(np.abs(ref - complex(z))) for z in wt.numpy()))
            except Exception as exc:  # record, don't die
                err["torch_sla"] = f"raised {type(exc).__name__}: {exc}"
    out["eigs_max_eigenvalue_error"] = err
    # 4. eigenvector gradient of eigsh (symmetric), against dense autograd
    g = torch.Generator().manual_seed(7)
    n = 40
    M = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.2)
    D = M + M.T + torch.diag(torch.arange(n, dtype=torch.float64))
    A = st.SparseTensor.from_dense(D)
    x = torch.randn(n, generator=g, dtype=torch.float64)

    def loss(w, V):
        return ((V[:, -1] * x).sum()) ** 2

    Dd = D.clone().requires_grad_()
    wd, Vd = torch.linalg.eigh(Dd)
    loss(wd[-2:], Vd[:, -2:]).backward()
    # Compare gradients along symmetric perturbations (g[r, c] + g[c, r]): an entry-wise gradient of
    # a symmetric eigenproblem is convention-dependent off the symmetric subspace.
    coords, slot = A.entries()

    def sym(grad_by_entry):
        G = torch.zeros(n, n, dtype=torch.float64)
        G[coords[0], coords[1]] = grad_by_entry
        return G + G.T

    ref_g = sym(Dd.grad[coords[0], coords[1]])
    v = A.values.clone().requires_grad_()
    w, V = st.eigsh(A.with_values(v), 2, which="LA")
    loss(w, V).backward()
    res = {"sparsetorch_rel_error": float((sym(v.grad[slot]) - ref_g).norm() / ref_g.norm())}
    if torch_sla is not None:
        c2, vals2 = A.coordinates()
        vs = vals2.clone().requires_grad_()
        try:
            wt, Vt = _sla(A, vs).eigsh(k=2, which="LA")
            loss(wt, Vt).backward()
            gs = vs.grad if vs.grad is not None else torch.zeros_like(vs)
            G = torch.zeros(n, n, dtype=torch.float64)
            G[c2[0], c2[1]] = gs
            res["torch_sla_rel_error"] = float(((G + G.T) - ref_g).norm() / ref_g.norm())
            res["torch_sla_grad_norm"] = float(gs.norm())
        except Exception as exc:
            res["torch_sla"] = f"raised {type(exc).__name__}: {exc}"
    out["eigsh_eigenvector_gradient"] = res
    return out


def timings(grid: int, repeats: int) -> dict:
    A = poisson2d(grid)
    n = A.shape[-1]
    res: dict = {"problem": f"2-D Poisson {grid}x{grid} (n={n}), float64"}
    S = A.detach().to_package("scipy").tocsc()
    k = 6
    # eigsh: the 6 smallest eigenvalues (shift-invert at 0 where the method has it)
    rows = {}
    t, (w_ref, _) = _timed(lambda: spla.eigsh(S, k=k, sigma=0.0, which="LM"), repeats)
    rows["scipy eigsh(sigma=0) direct"] = {"seconds": t}
    w_ref = np.sort(w_ref)
    for label, kw in (("sparsetorch auto (sigma=0)", dict(sigma=0.0)),
                      ("sparsetorch lanczos (sigma=0)", dict(sigma=0.0, method="lanczos")),
                      ("sparsetorch lanczos which=SA", dict(which="SA", method="lanczos"))):
        try:
            t, (w, _) = _timed(lambda kw=kw: st.eigsh(A, k, **kw), repeats)
            rows[label] = {"seconds": t, "max_abs_error": float(np.abs(np.sort(w.numpy()) - w_ref).max())}
        except Exception as exc:
            rows[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    v = A.values.clone().requires_grad_()

    def fwd_bwd():
        w, _ = st.eigsh(A.with_values(v), k, sigma=0.0)
        w.sum().backward()

    t, _ = _timed(fwd_bwd, repeats)
    rows["sparsetorch auto (sigma=0) forward+backward (eigenvalues)"] = {"seconds": t}
    if torch_sla is not None:
        try:
            t, (w, _) = _timed(lambda: _sla(A).eigsh(k=k, which="SA"), repeats)
            rows["torch_sla eigsh(which=SA)"] = {"seconds": t, "max_abs_error": float(np.abs(np.sort(w.numpy()) - w_ref).max())}
        except Exception as exc:
            rows["torch_sla eigsh(which=SA)"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    res["eigsh_smallest6"] = rows
    # logdet
    rows = {}
    t, lu = _timed(lambda: spla.splu(S), repeats)
    ref = float(np.sum(np.log(np.abs(lu.U.diagonal()))))
    rows["scipy splu + sum log|U_ii| direct"] = {"seconds": t}
    t, ld = _timed(lambda: st.logdet(A), repeats)
    rows["sparsetorch logdet (auto)"] = {"seconds": t, "abs_error": abs(float(ld) - ref)}
    v = A.values.clone().requires_grad_()

    def ld_bwd():
        st.logdet(A.with_values(v), grad_method="hutchinson", probes=64).backward()

    t, _ = _timed(ld_bwd, repeats)
    rows["sparsetorch logdet forward+backward (hutchinson, 64 probes)"] = {"seconds": t}
    if torch_sla is not None:
        try:
            # torch-sla 0.4.0's logdet raises unless the values require grad: give it values that do
            t, ldt = _timed(lambda: _sla(A, A.coordinates()[1].clone().requires_grad_()).logdet(), repeats)
            rows["torch_sla logdet"] = {"seconds": t, "abs_error": abs(float(ldt) - ref)}
            vs = A.coordinates()[1].clone().requires_grad_()

            def sla_bwd():
                _sla(A, vs).logdet().backward()

            t, _ = _timed(sla_bwd, repeats)
            rows["torch_sla logdet forward+backward"] = {"seconds": t}
        except Exception as exc:
            rows["torch_sla logdet"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    res["logdet"] = rows
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "spectral_det_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {
        "benchmark": "spectral_det",
        "command": "PYTHONPATH=core python benchmarks/bench_spectral_det.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "threads": 1,
                    "note": "2 shared cores; quote ratios, not absolute times"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "scipy": scipy.__version__, "sparsetorch": st.__version__,
                     "torch_sla": getattr(torch_sla, "__version__", "not installed") if torch_sla else "not installed"},
        "correctness": correctness(args.trials),
        "timings": timings(args.grid, args.repeats),
    }
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
