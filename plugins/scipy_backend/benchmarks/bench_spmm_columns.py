"""SciPy's CSR product against torch's CPU kernel for k = 1, 8, 16, 64 right-hand columns.

Three float64 matrices (2-D Poisson 256², a 4096² random matrix at 10 %, a 65536² random matrix
with 1M entries), C-contiguous X, one thread each, best of 7 after a warm-up. The ratio SciPy /
torch calibrates the SciPy plugin's multi-column product cost (``cost.MULTI_COLUMN_FACTOR``).

    python plugins/scipy_backend/benchmarks/bench_spmm_columns.py   # writes results/spmm_columns.json
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp
import torch

HERE = Path(__file__).resolve().parent


def _best(fn, repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _matrices(rng: np.random.Generator) -> dict:
    m = 256
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    out = {"poisson 256^2": (sp.kron(sp.eye(m), t) + sp.kron(t, sp.eye(m))).tocsr(),
           "random 4096^2 10%": sp.random(4096, 4096, density=0.1, format="csr", random_state=1, dtype=np.float64)}
    n, nnz = 65536, 1_000_000
    out["random 65536^2 1M"] = sp.csr_matrix((rng.standard_normal(nnz), (rng.integers(0, n, nnz), rng.integers(0, n, nnz))),
                                             shape=(n, n))
    return out


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    for name, A in _matrices(rng).items():
        A.sort_indices()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr).int(), torch.from_numpy(A.indices).int(),
                                         torch.from_numpy(A.data), A.shape)
        for k in (1, 8, 16, 64):
            X = np.ascontiguousarray(rng.standard_normal((A.shape[1], k)))
            Xt = torch.from_numpy(X)
            assert np.allclose(A @ X, (At @ Xt).numpy())
            s, t_ = _best(lambda: A @ X), _best(lambda: At @ Xt)
            rows.append({"matrix": name, "nnz": int(A.nnz), "k": k, "scipy_s": s, "torch_s": t_, "ratio": s / t_})
            print(f"{name:20s} k={k:3d}  scipy {s * 1e3:8.3f} ms  torch {t_ * 1e3:8.3f} ms  ratio {s / t_:.2f}", flush=True)
    doc = {"benchmark": "SciPy vs torch CSR product, k columns, CPU",
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/scipy_backend/benchmarks/bench_spmm_columns.py",
           "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": 1},
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "scipy": scipy.__version__,
                        "numpy": np.__version__},
           "rows": rows}
    out = HERE / "results" / "spmm_columns.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
