"""How far the iteration estimates are off, per matrix class: the data an iteration model per
class (issue 14, "an iteration model that learns") is fitted from.

For every non-singular matrix of the collection (``benchmarks/bench_collection.py``'s cases)
that dispatch does not detect SPD or diagonally dominant (the classes the backends' Poisson-fitted
estimates are not about), each pinned Krylov method + preconditioner below runs once to
``rtol=1e-10`` (``maxiter`` 3000 for BiCGStab and MINRES; GMRES's own limit) and the measured
iterations are set against the backend's own estimate (before the core's class weighing)::

    python benchmarks/bench_iteration_model.py --out benchmarks/results/iteration_model_cpu.json

The JSON lists per matrix its detected properties, ``sqrt(n) / 4`` (the core's factor for the
symmetric, not-definite class), and per method the estimate, the iterations, whether it converged
and the ratio; ``summary`` gives per class and method the median and the spread of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_collection import default_matrices, list_cases, load_matrix, versions  # noqa: E402

METHODS = (("eigen", "bicgstab", "jacobi"), ("eigen", "bicgstab", "ilu"), ("scipy", "gmres", "jacobi"),
           ("scipy", "minres", "jacobi"))


def measure(case: dict) -> dict | None:
    import torch

    import sparsetorch as st
    from sparsetorch.dispatch.select import get_backends
    from sparsetorch.ops.solve import options_from_kwargs, solve_request

    M = load_matrix(case)
    if M.shape[0] != M.shape[1] or case.get("singular"):
        return None
    b = torch.from_numpy(M @ np.ones(M.shape[0]))
    A = st.SparseTensor.from_package(M.copy())
    req = solve_request(A, b.unsqueeze(-1), None, options_from_kwargs("solve", {}))
    props = sorted(req.properties)
    if "spd" in props or "diagonally_dominant" in props:
        return None
    cls = "symmetric" if ("symmetric" in props or "hermitian" in props) else "nonsymmetric"
    raw = {(a.backend, a.method, a.preconditioner): a.iterations for a in get_backends().offers(req)
           if getattr(a, "iterations", None)}
    rows = []
    for key in METHODS:
        if key not in raw or (key[1] == "minres" and cls != "symmetric"):
            continue
        rec = {"backend": key[0], "method": key[1], "preconditioner": key[2], "estimated": raw[key]}
        try:
            _, info = st.solve(st.SparseTensor.from_package(M.copy()), b, backend=key[0], method=key[1],
                               preconditioner=key[2], maxiter=3000, rtol=1e-10, return_info=True,
                               on_nonconvergence="ignore")
            rec.update(iterations=info.iterations, converged=bool(info.converged),
                       ratio=info.iterations / raw[key])
        except Exception as exc:  # noqa: BLE001 - a failure is data
            rec.update(error=f"{type(exc).__name__}: {str(exc)[:200]}")
        rows.append(rec)
    return {"name": case["name"], "n": int(M.shape[0]), "nnz": int(M.nnz), "properties": props, "class": cls,
            "class_factor_sqrt_n_over_4": math.sqrt(M.shape[0]) / 4, "methods": rows}


def summarize(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        for m in r["methods"]:
            if "ratio" not in m:
                continue
            k = f"{r['class']}:{m['method']}+{m['preconditioner']}"
            d = out.setdefault(k, {"ratios": [], "failed": 0})
            d["ratios"].append(m["ratio"])
            d["failed"] += 0 if m["converged"] else 1
    for d in out.values():
        rs = sorted(d.pop("ratios"))
        d.update(cases=len(rs), median_ratio=statistics.median(rs), min_ratio=rs[0], max_ratio=rs[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrices", default=None)
    ap.add_argument("--out", default=str(HERE / "results" / "iteration_model_cpu.json"))
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    path = Path(args.matrices) if args.matrices else default_matrices()
    records = [r for r in (measure(c) for c in list_cases(path, True, 1.0)) if r is not None]
    result = {"benchmark": "iteration_model", "command": "python benchmarks/bench_iteration_model.py "
              + " ".join(sys.argv[1:]), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform()}, "versions": versions(),
              "summary": summarize(records), "matrices": records}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for k, v in sorted(result["summary"].items()):
        print(f"{k:40s} cases {v['cases']:3d} failed {v['failed']:3d} median x{v['median_ratio']:.2g} "
              f"(x{v['min_ratio']:.2g} .. x{v['max_ratio']:.3g})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
