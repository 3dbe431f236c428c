"""The default ``st.solve`` on the GPU before and after session 20's refinement of iterative
answers to a direct method's backward error (fallback.Route._sharpen).

"unrefined" passes ``rtol`` a hair above the contract's default (1.0000001e-10 / 1.0000001e-5), which
the route treats as an explicit tolerance: the session-19 behaviour. "default" passes nothing. Each
row: the method dispatch ran, its iterations, the wall time of the call (median of ``--repeats``
calls after one warm-up, synchronized), and the infinity-norm backward error
``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` computed in float64.

    python benchmarks/gpu/s20/default_solve.py --out $OUT/default_solve_h200_s20.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import sparsetorch as st
from sparsetorch.format import CSR


def poisson2d(m: int, dtype, device) -> st.SparseTensor:
    n = m * m
    idx = torch.arange(n, device=device)
    i, j = idx // m, idx % m
    rows, cols, vals = [idx], [idx], [torch.full((n,), 4.0, dtype=dtype, device=device)]
    for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        ok = (i + di >= 0) & (i + di < m) & (j + dj >= 0) & (j + dj < m)
        rows.append(idx[ok])
        cols.append(((i + di) * m + (j + dj))[ok])
        vals.append(torch.full((int(ok.sum()),), -1.0, dtype=dtype, device=device))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    return st.SparseTensor.from_coo(v, r, c, shape=(n, n), format=CSR)


def poisson3d(m: int, dtype, device) -> st.SparseTensor:
    n = m ** 3
    idx = torch.arange(n, device=device)
    i, j, l = idx // (m * m), (idx // m) % m, idx % m
    rows, cols, vals = [idx], [idx], [torch.full((n,), 6.0, dtype=dtype, device=device)]
    for di, dj, dl in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)):
        ok = (i + di >= 0) & (i + di < m) & (j + dj >= 0) & (j + dj < m) & (l + dl >= 0) & (l + dl < m)
        rows.append(idx[ok])
        cols.append(((i + di) * m * m + (j + dj) * m + (l + dl))[ok])
        vals.append(torch.full((int(ok.sum()),), -1.0, dtype=dtype, device=device))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    return st.SparseTensor.from_coo(v, r, c, shape=(n, n), format=CSR)


def conv_diff2d(m: int, pe: float, dtype, device) -> st.SparseTensor:
    """Upwind convection-diffusion, nonsymmetric (BiCGStab's kind)."""
    n = m * m
    h = 1.0 / (m + 1)
    idx = torch.arange(n, device=device)
    i, j = idx // m, idx % m
    rows, cols, vals = [idx], [idx], [torch.full((n,), 4.0 / h**2 + 2 * pe / h, dtype=dtype, device=device)]
    for di, dj, w in ((1, 0, -1 / h**2), (-1, 0, -1 / h**2 - pe / h), (0, 1, -1 / h**2), (0, -1, -1 / h**2 - pe / h)):
        ok = (i + di >= 0) & (i + di < m) & (j + dj >= 0) & (j + dj < m)
        rows.append(idx[ok])
        cols.append(((i + di) * m + (j + dj))[ok])
        vals.append(torch.full((int(ok.sum()),), w, dtype=dtype, device=device))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    return st.SparseTensor.from_coo(v, r, c, shape=(n, n), format=CSR)


def berr(A: st.SparseTensor, x: torch.Tensor, b: torch.Tensor) -> float:
    A64 = A.to(torch.float64) if A.dtype != torch.float64 else A
    x, b = x.double(), b.double()
    r = b - A64 @ x
    D = A64.to_dense() if A64.shape[0] <= 4096 else None
    if D is not None:
        anorm = float(D.abs().sum(1).max())
    else:
        rows = A64.entries()[0][0]
        anorm = float(torch.zeros(A64.shape[0], dtype=torch.float64, device=x.device).index_add_(0, rows, A64.values.abs()).max())
    return float(r.abs().max() / (anorm * x.abs().max() + b.abs().max()))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int):
    fn()
    _sync()
    ts = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        _sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names (default: all)")
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    cases = [("poisson2d 1000^2", lambda dt: poisson2d(1000, dt, dev)), ("poisson2d 300^2", lambda dt: poisson2d(300, dt, dev)),
             ("upwind conv-diff 300^2, Pe 100", lambda dt: conv_diff2d(300, 100.0, dt, dev)),
             ("poisson3d 20^3", lambda dt: poisson3d(20, dt, dev)), ("poisson3d 40^3", lambda dt: poisson3d(40, dt, dev)),
             ("upwind conv-diff 30^2, Pe 1e4", lambda dt: conv_diff2d(30, 1e4, dt, dev))]
    if args.cases:
        cases = [c for c in cases if any(part in c[0] for part in args.cases.split(","))]
    for name, make in cases:
        for dt, loose in ((torch.float64, 1.0000001e-10), (torch.float32, 1.0000001e-5)):
            A = make(dt)
            gen = torch.Generator(dev).manual_seed(0)
            b = torch.randn(A.shape[0], dtype=dt, device=dev, generator=gen)
            for label, kw in (("unrefined (rtol just above the default)", {"rtol": loose}), ("default", {})):
                try:
                    t, (x, info) = timed(lambda: st.solve(A, b, return_info=True, **kw), args.repeats)
                    row = dict(case=name, dtype=str(dt), call=label, seconds=t, backward_error=berr(A, x, b),
                               attempts=[(a.backend, a.method, a.iterations, str(a.status)) for a in info.attempts])
                except Exception as exc:  # noqa: BLE001 - a row says what failed
                    row = dict(case=name, dtype=str(dt), call=label, error=f"{type(exc).__name__}: {exc}"[:300])
                print(row, flush=True)
                rows.append(row)
    meta = dict(command=" ".join(sys.argv), python=platform.python_version(), torch=torch.__version__,
                device=torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", sparsetorch=st.__version__,
                backends=[i.name for i in st.dispatch.select.get_backends().info()] if hasattr(st, "dispatch") else None)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
