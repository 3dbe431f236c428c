"""LU vs AMG-CG vs CG crossover on 2-D and 3-D Poisson, and what auto-dispatch picks.

For each problem and candidate, the wall time of one cold ``sparsetorch.solve(A, b, ...,
cache=False)`` (plan + numeric phase + solve, as a first call pays) at ``rtol=1e-6`` is measured
(best of a few runs), beside the cost model's estimate; then ``sparsetorch.explain`` says which
offer auto-dispatch would run, with the calibrated rates of this machine and with the fixed
default rates. Results go to JSON (machine, versions, command included)::

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=core:plugins/scipy_backend \\
        python plugins/scipy_backend/benchmarks/crossover.py --out plugins/scipy_backend/benchmarks/results/crossover_cpu.json

``--quick`` runs the small sizes only (a smoke test, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import scipy
import torch

import sparsetorch as st
from sparsetorch.backend import calibrate, get_backends

CANDIDATES = [
    # (label, backend, method, preconditioner)
    ("scipy lu", "scipy", "lu", None),
    ("scipy cg+amg", "scipy", "cg", "amg"),
    ("scipy amg", "scipy", "amg", None),
    ("scipy cg+jacobi", "scipy", "cg", "jacobi"),
    ("torch cg+jacobi", "torch", "cg", "jacobi"),
]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _helpers import poisson_scipy as poisson  # noqa: E402  (one Poisson builder for tests and benchmark)


def time_solve(A: st.SparseTensor, b: torch.Tensor, backend: str, method: str, pre: str | None, reps: int) -> dict:
    best, info = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        x, info = st.solve(A, b, backend=backend, method=method, preconditioner=pre, rtol=1e-6, cache=False,
                           return_info=True, properties="spd")
        best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "iterations": info.iterations, "residual": info.residual}


def estimate(A: st.SparseTensor, b: torch.Tensor, backend: str, method: str, pre: str | None, rates: str) -> float:
    """The cost model's estimate under the fixed default rates or this machine's calibrated ones."""
    if rates == "defaults":
        os.environ["SPARSETORCH_CALIBRATION"] = "defaults"
    try:
        table = st.explain("solve", A, b, rtol=1e-6, backend=backend, method=method, preconditioner=pre, properties="spd")
        return float(table.chosen.seconds)
    finally:
        os.environ.pop("SPARSETORCH_CALIBRATION", None)


def chosen(A: st.SparseTensor, b: torch.Tensor) -> tuple[str, str | None]:
    row = st.explain("solve", A, b, rtol=1e-6).chosen
    return f"{row.backend} {row.method}", row.offer.preconditioner if row.offer else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-lu-seconds", type=float, default=60.0, help="skip LU when its estimate is above this")
    args = ap.parse_args()
    if "scipy" not in get_backends().names:  # a source checkout: register the plugin in-process
        import sparsetorch_scipy.plugin as plugin

        get_backends().register(plugin, "scipy")
    sizes = [(2, 64), (2, 128), (3, 16), (3, 24)] if args.quick else [
        (2, 64), (2, 128), (2, 256), (2, 512), (3, 16), (3, 24), (3, 32), (3, 40), (3, 48)]
    measured_rates = calibrate("cpu", save=False)
    rows = []
    for dim, m in sizes:
        Asp = poisson(m, dim)
        n = Asp.shape[0]
        A = st.from_package(Asp)
        b = torch.ones(n, dtype=torch.float64)
        row = {"problem": f"{dim}-D Poisson {m}^{dim}", "n": n, "nnz": int(Asp.nnz), "results": {}}
        for label, backend, method, pre in CANDIDATES:
            est = {kind: estimate(A, b, backend, method, pre, kind) for kind in ("defaults", "calibrated")}
            if label == "scipy lu" and est["defaults"] > args.max_lu_seconds:
                row["results"][label] = {"skipped": f"estimate {est['defaults']:.0f} s > --max-lu-seconds"}
                continue
            slow = (method == "lu" and n > 60000) or n > 200000
            row["results"][label] = time_solve(A, b, backend, method, pre, 1 if slow else 3)
            row["results"][label].update({f"estimated_seconds_{k}": v for k, v in est.items()})
        fastest = min((k for k, v in row["results"].items() if "seconds" in v), key=lambda k: row["results"][k]["seconds"])
        fastest_scipy = min((k for k, v in row["results"].items() if "seconds" in v and k.startswith("scipy")),
                            key=lambda k: row["results"][k]["seconds"])
        row["fastest"] = fastest
        row["fastest_scipy"] = fastest_scipy
        row["auto_calibrated"] = chosen(A, b)
        os.environ["SPARSETORCH_CALIBRATION"] = "defaults"
        row["auto_defaults"] = chosen(A, b)
        os.environ.pop("SPARSETORCH_CALIBRATION")
        rows.append(row)
        cells = "  ".join(f"{k}: {v['seconds']:.3g}s/{v['estimated_seconds_defaults']:.3g}e ({v['iterations']} it)" if "seconds" in v
                          else f"{k}: skipped" for k, v in row["results"].items())
        print(f"{row['problem']:>22} n={n:>7}  {cells}  | fastest {fastest}; auto {row['auto_calibrated']} / defaults {row['auto_defaults']}",
              flush=True)
    out = {
        "benchmark": "plugins/scipy_backend/benchmarks/crossover.py",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "environment": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "scipy": scipy.__version__, "pyamg": __import__("pyamg").__version__, "sparsetorch": st.__version__},
        "rates_calibrated": {"bandwidth": measured_rates.bandwidth, "flops": measured_rates.flops, "launch": measured_rates.launch},
        "rtol": 1e-6,
        "rows": rows,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
