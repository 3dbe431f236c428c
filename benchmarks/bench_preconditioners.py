"""The torch backend's preconditioners side by side on one device: CG on 2-D Poisson (SPD) with none, "jacobi",
"ic0", "ssor", "polynomial"; BiCGStab on upwind convection-diffusion (unsymmetric) with "jacobi", "ilu0", "ssor",
"polynomial"; SciPy's CG / BiCGStab with Jacobi and PyAMG (smoothed aggregation) as a CPU reference where they run.
Each row: iterations, seconds (the median of ``--reps`` warm calls: the preconditioner's numeric setup is in each
call, as it is for new values; the symbolic part is per pattern and cached), the true relative residual.

Run: ``python benchmarks/bench_preconditioners.py [--device cpu|cuda] [--sizes 100,300] [--reps 3] [--out PATH]``;
writes ``benchmarks/results/preconditioners_<device>.json`` by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

import sparsetorch as st
from sparsetorch.testing import families

from _record import header, write


def poisson(m: int) -> sp.csr_matrix:
    return families.poisson(m).matrix


def convection(m: int, peclet: float = 50.0) -> sp.csr_matrix:
    return families.convection_diffusion(m, peclet).matrix


def timed(fn, reps: int, sync) -> tuple[float, object]:
    out, times = None, []
    for _ in range(reps + 1):  # the first call builds the plan (and the pattern's symbolic part): not counted
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="100,300")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for m in (int(s) for s in a.sizes.split(",")):
        for family, A, method, pres in (("poisson", poisson(m), "cg", (None, "jacobi", "ic0", "ssor", "polynomial")),
                                        ("convection", convection(m), "bicgstab", ("jacobi", "ilu0", "ssor", "polynomial"))):
            n = A.shape[0]
            b_np = np.random.default_rng(0).standard_normal(n)
            T = st.SparseTensor.from_package(A).to(device=dev)
            b = torch.tensor(b_np, device=dev)
            for pre in pres:
                def ours(pre=pre):
                    return st.solve(T, b, backend="torch", method=method, preconditioner=pre, rtol=a.rtol,
                                    return_info=True, cache=True)
                try:
                    secs, (x, info) = timed(ours, a.reps, sync)
                    res = float(np.linalg.norm(A @ x.cpu().numpy() - b_np) / np.linalg.norm(b_np))
                    row = dict(family=family, n=n, method=method, impl="sparsetorch torch", preconditioner=pre or "none",
                               iterations=info.iterations, seconds=secs, residual=res)
                except Exception as exc:  # noqa: BLE001 - a benchmark row records what failed
                    row = dict(family=family, n=n, method=method, impl="sparsetorch torch", preconditioner=pre or "none",
                               error=f"{type(exc).__name__}: {exc}"[:300])
                rows.append(row)
                print(row, flush=True)
            if dev.type == "cpu":
                solver = sla.cg if method == "cg" else sla.bicgstab
                inv = 1.0 / A.diagonal()
                refs = [("jacobi", sla.LinearOperator(A.shape, matvec=lambda v: inv * v))]
                try:
                    import pyamg  # noqa: PLC0415

                    ml = pyamg.smoothed_aggregation_solver(A) if method == "cg" else None
                    if ml is not None:
                        refs.append(("amg (PyAMG, setup included)", None))
                except ImportError:
                    ml = None
                for name, M in refs:
                    count = [0]

                    def cb(_x, count=count):
                        count[0] += 1

                    def scipy_run(M=M, name=name, count=count, cb=cb):
                        count[0] = 0
                        pre = M if M is not None else pyamg.smoothed_aggregation_solver(A).aspreconditioner()
                        return solver(A, b_np, rtol=a.rtol, M=pre, callback=cb, maxiter=20 * n)[0]

                    secs, x = timed(scipy_run, a.reps, sync)
                    res = float(np.linalg.norm(A @ x - b_np) / np.linalg.norm(b_np))
                    row = dict(family=family, n=n, method=method, impl="scipy", preconditioner=name,
                               iterations=count[0], seconds=secs, residual=res)
                    rows.append(row)
                    print(row, flush=True)
    rec = header("bench_preconditioners.py", argv)
    if dev.type == "cuda":
        rec["machine"]["gpu"] = torch.cuda.get_device_name(dev)
    rec["rows"] = rows
    write(a.out or f"benchmarks/results/preconditioners_{dev.type}.json", rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
