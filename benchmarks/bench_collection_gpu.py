"""The default ``solve`` on the collection's matrices moved to a GPU (issue 14's contract there).

For every square matrix in tests/data (SuiteSparse, CC-BY; tests/data/README.md) and the
generated families of ``sparsetorch.testing.families``: b = A x_true and a random b, float64, the
matrix and b on ``cuda``; auto's choice, time (synchronized), attempts, and the true relative
residual computed in SciPy float64 on the host, beside SciPy spsolve's on the CPU. Writes JSON.

    python benchmarks/bench_collection_gpu.py --out benchmarks/results/collection_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy
import scipy.io
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.testing import families

ROOT = Path(__file__).resolve().parents[1]


def _matrices():
    for f in sorted((ROOT / "tests" / "data").glob("*.mtx")):
        M = scipy.io.mmread(f)
        if M.shape[0] == M.shape[1]:
            yield f.stem, sp.csr_matrix(M), False
    for g in families.collection():
        yield g.name, sp.csr_matrix(g.matrix), bool(g.singular)


def _residual(M, x, b) -> float:
    if x is None or not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.linalg.norm(b - M @ x) / np.linalg.norm(b))


def contract_ok(rec: dict) -> bool:
    """The contract of test_collection.py: SingularMatrixError where the matrix is singular by
    construction or SciPy reports it singular with a random b; for a consistent b on a matrix
    SciPy calls singular, SingularMatrixError or an x meeting 1e-10; else an x within
    max(100 x SciPy's residual, 1e-10)."""
    singular = rec["singular_by_construction"] or rec["scipy_singular"]
    if singular and not (rec["scipy_singular"] and not rec["singular_by_construction"] and rec["rhs"] == "A_x_true"):
        return rec["outcome"] == "SingularMatrixError"
    if singular:
        return rec["outcome"] == "SingularMatrixError" or (rec["outcome"] == "answer" and rec["residual"] <= 1e-10)
    return rec["outcome"] == "answer" and rec["residual"] <= max(100 * (rec["scipy_residual"] or 0.0), 1e-10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "collection_gpu.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    records = []
    for name, M, singular in _matrices():
        dtype = np.complex128 if np.iscomplexobj(M.data) else np.float64
        M = M.astype(dtype)
        rng = np.random.default_rng(7)
        for kind in ("A_x_true", "random"):
            v = rng.standard_normal(M.shape[0]).astype(dtype)
            b = M @ v if kind == "A_x_true" else v
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t = time.perf_counter()
                xs = spla.spsolve(M.tocsc(), b)
                ts = time.perf_counter() - t
            sp_singular = any(issubclass(w.category, spla.MatrixRankWarning) for w in caught) or not np.all(np.isfinite(xs))
            A = st.SparseTensor.from_package(M.copy()).to(dev)
            bt = torch.from_numpy(b.copy()).to(dev)
            rec = {"matrix": name, "n": M.shape[0], "nnz": int(M.nnz), "rhs": kind, "singular_by_construction": singular,
                   "scipy_singular": bool(sp_singular), "scipy_residual": None if sp_singular else _residual(M, xs, b),
                   "scipy_seconds": ts}
            try:
                torch.cuda.synchronize()
                t = time.perf_counter()
                x, info = st.solve(A, bt, return_info=True)
                torch.cuda.synchronize()
                rec["seconds"] = time.perf_counter() - t
                rec["choice"] = f"{info.backend}/{info.method}"
                rec["attempts"] = [str(a) for a in info.attempts]
                rec["residual"] = _residual(M, x.cpu().numpy(), b)
                rec["outcome"] = "answer"
            except st.SparseTorchError as exc:
                rec["outcome"] = type(exc).__name__
                rec["message"] = str(exc)[:500]
            rec["contract_ok"] = contract_ok(rec)
            records.append(rec)
            print(f"{name:28s} {kind:9s} {'ok ' if rec['contract_ok'] else 'BAD'} {rec.get('choice', rec['outcome']):22s} "
                  f"res {rec.get('residual', float('nan')):.1e} scipy {rec['scipy_residual'] or float('nan'):.1e}",
                  flush=True)
    out = {
        "benchmark": "collection_gpu",
        "command": "python benchmarks/bench_collection_gpu.py",
        "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(0)},
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "scipy": scipy.__version__,
                     "sparsetorch": st.__version__,
                     "backends": [b.name for b in st.registry().info()]},
        "summary": {"cases": len(records), "contract_ok": sum(r["contract_ok"] for r in records)},
        "records": records,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(out["summary"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
