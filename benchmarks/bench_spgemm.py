"""Sparse @ sparse side by side: sparsetorch's ``A @ B`` (no gradient: SciPy's SpGEMM on the CPU; with gradients:
the differentiable pairing, first call and repeated with new values) against SciPy, torch's CSR @ CSR and, on a
GPU, CuPy. Matrices: the 5-point Laplacian of an s x s grid squared (A @ A), and a random sparse A (n x n, d per
row) times its transpose. Median of ``--repeats`` timed calls after one warm-up (first-call columns: one call on a
fresh copy of the pattern). Writes JSON with the machine, versions and command.

    python benchmarks/bench_spgemm.py --out benchmarks/results/spgemm_cpu.json [--device cuda] [--sizes 100,300]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch

import sparsetorch as st
from _record import header, write

warnings.filterwarnings("ignore", category=UserWarning)


def _time(fn, repeats: int, sync) -> float:
    fn()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _first(make, repeats: int, sync) -> float:
    """One call per fresh pattern (nothing cached), median over ``repeats`` fresh copies."""
    out = []
    for _ in range(repeats):
        A, B = make()
        sync()
        t0 = time.perf_counter()
        A @ B
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _cases(sizes: list[int]):
    for s in sizes:
        L = sp.diags([-1.0, -1.0, 4.0, -1.0, -1.0], [-s, -1, 0, 1, s], shape=(s * s, s * s), format="csr")
        yield f"laplacian_{s}x{s}_squared", L, L
        n = s * s
        rng = np.random.default_rng(s)
        R = sp.csr_matrix((rng.standard_normal(8 * n), (np.repeat(np.arange(n), 8), rng.integers(0, n, 8 * n))),
                          shape=(n, n))  # 8 draws per row (repeats summed)
        yield f"random_{n}_d8_times_transpose", R, R.T.tocsr()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="100,300")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for name, a, b in _cases([int(x) for x in args.sizes.split(",")]):
        A = st.SparseTensor.from_package(a).to(dev)
        B = st.SparseTensor.from_package(b).to(dev)
        row = {"case": name, "n": a.shape[0], "nnz_a": int(a.nnz), "nnz_b": int(b.nnz),
               "nnz_c": int((a @ b).nnz), "device": str(dev)}
        row["ours_no_grad_s"] = _time(lambda: A @ B, args.repeats, sync)
        va = A.values.detach().clone().requires_grad_()
        Ag = A.with_values(va)
        row["ours_grad_repeat_s"] = _time(lambda: Ag @ B, args.repeats, sync)
        row["ours_grad_repeat_backward_s"] = _time(lambda: (Ag @ B).values.sum().backward(), args.repeats, sync)

        def fresh():
            A2 = st.SparseTensor.from_package(a.copy()).to(dev)
            return A2.with_values(A2.values.detach().clone().requires_grad_()), B
        row["ours_grad_first_s"] = _first(fresh, max(2, args.repeats // 2), sync)
        ta = A.to_package("torch").to_sparse_csr() if A.format.name != "CSR" else A.to_package("torch")
        tb = B.to_package("torch").to_sparse_csr() if B.format.name != "CSR" else B.to_package("torch")
        row["torch_csr_s"] = _time(lambda: ta @ tb, args.repeats, sync)
        if dev.type == "cpu":
            row["scipy_s"] = _time(lambda: a @ b, args.repeats, sync)
        else:
            try:
                import cupyx.scipy.sparse as csp  # noqa: PLC0415

                ca, cb = csp.csr_matrix(a), csp.csr_matrix(b)
                row["cupy_s"] = _time(lambda: ca @ cb, args.repeats, sync)
            except ImportError:
                pass
        ref = "scipy_s" if "scipy_s" in row else ("cupy_s" if "cupy_s" in row else "torch_csr_s")
        for k in [k for k in row if k.endswith("_s") and k.startswith("ours")]:
            row[k.replace("_s", "_over_" + ref.replace("_s", ""))] = row[k] / row[ref]
        print({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})
        rows.append(row)
    write(args.out, {**header("bench_spgemm.py", argv), "rows": rows})


if __name__ == "__main__":
    main()
