"""Session 12: does a non-finite X value reach rows that store no entry in its column? Sparse semantics
(SciPy, cuSPARSE, our CPU backends, the DELTA and csr16 kernels): Y[i] sums A[i, j] X[j] over the stored
entries only, so Inf in X[j] reaches exactly the rows storing column j. A kernel that multiplies a dense
tile (structural zeros included) gives 0 * Inf = NaN in the other rows too, as a dense product would.

    python plugins/cuda_kernels/benchmarks/diag_s12_nonfinite.py --out DIR

Per kernel of the half-precision products (k = 1: csr16 "auto"; k = 16 / 64: the plan's "auto", "fl", "ws",
"tile", "bm"; spmm_cc standalone; 2:4 "sp" on an N:M pattern): a 512 x 1024 matrix at 10 % density with
column j0 = 100 empty in half the rows; X[j0, :] = Inf; counts of rows that store j0 (must be +-Inf or NaN)
and of rows that do not (must be finite under sparse semantics), and of those that came back NaN.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

import sparsetorch as st
from sparsetorch.format import CSR, NM


def main() -> int:
    from sparsetorch_cuda import _spmm_cc
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(12)
    m, n, j0 = 512, 1024, 100
    D = torch.randn(m, n, generator=g, dtype=torch.float64) * (torch.rand(m, n, generator=g) < 0.1)
    D[::2, j0] = 0.0
    D[1::2, j0] = 1.0
    stores = D[:, j0] != 0
    rows = []

    def check(name: str, y: torch.Tensor) -> None:  # y: (m, k)
        y = y.double().cpu()
        fin = torch.isfinite(y).all(1)
        nan = torch.isnan(y).any(1)
        r = {"kernel": name, "rows_storing_j0": int(stores.sum()), "storing_nonfinite": int((~fin & stores).sum()),
             "others": int((~stores).sum()), "others_nonfinite": int((~fin & ~stores).sum()),
             "others_nan": int((nan & ~stores).sum())}
        r["sparse_semantics"] = r["others_nonfinite"] == 0 and r["storing_nonfinite"] == r["rows_storing_j0"]
        rows.append(r)
        print(r, flush=True)

    for dtype in (torch.float16, torch.bfloat16):
        Dh = D.to(dtype)
        A = st.SparseTensor.from_dense(Dh, mask=Dh != 0).convert(CSR, index_dtype=torch.int32).to("cuda")
        for k in (1, 16, 64):
            X = torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype)
            X[j0] = float("inf")
            Xc = X.cuda()
            kinds = ("auto",) if k == 1 else ("auto", "fl", "ws", "tile", "bm")
            for kind in kinds:
                plan = CudaSpmmPlan(A)
                plan.set_values(A.values)
                plan.mma_kernel = kind
                try:
                    y = plan.apply(Xc.T.contiguous().T)  # X^T contiguous, as a layer passes it
                    check(f"{str(dtype)[6:]} k={k} {kind}", y)
                except Exception as exc:  # noqa: BLE001 - recorded
                    rows.append({"kernel": f"{str(dtype)[6:]} k={k} {kind}", "error": f"{type(exc).__name__}: {exc}"})
            if k > 1:
                op = _spmm_cc.CcSpmm(A.pos(1), A.crd(1), A.values, (m, n))
                check(f"{str(dtype)[6:]} k={k} spmm_cc", op(Xc.T.contiguous()).T)
        # 2:4
        D24 = D.clone()
        D24.view(m, n // 4, 4)[..., 2:] = 0
        D24[::2, j0] = 0.0
        D24[1::2, j0] = 1.0
        A24 = st.SparseTensor.from_dense(D24.to(dtype), mask=D24 != 0).convert(NM(2, 4), index_dtype=torch.int32).to("cuda")
        stores_24 = D24[:, j0] != 0
        assert torch.equal(stores_24, stores)
        for k in (16, 64):
            X = torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype)
            X[j0] = float("inf")
            plan = CudaSpmmPlan(A24)
            plan.set_values(A24.values)
            try:
                check(f"{str(dtype)[6:]} k={k} NM(2,4) auto", plan.apply(X.cuda().T.contiguous().T))
            except Exception as exc:  # noqa: BLE001 - recorded
                rows.append({"kernel": f"{str(dtype)[6:]} k={k} NM(2,4)", "error": f"{type(exc).__name__}: {exc}"})
    doc = {"benchmark": "diag_s12_nonfinite", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "method": __doc__.split("\n\n")[2].strip(),
           "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "diag_s12_nonfinite.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
