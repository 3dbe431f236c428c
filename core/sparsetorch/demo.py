"""`sparsetorch demo`: a short tour of formats, conversion, interop and gradients on CPU.

Every number printed is computed and checked here (against dense float64 references); the demo
exits with status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch

from . import format as F
from .format import Dimension, LevelFormat, TensorFormat
from .tensor import SparseTensor


def poisson2d(n: int, dtype: torch.dtype = torch.float64) -> SparseTensor:
    """The 5-point Laplacian on an n x n grid (n² unknowns), built from COO triplets."""
    k = torch.arange(n * n)
    r, c = k // n, k % n
    rows, cols, vals = [k], [k], [torch.full((n * n,), 4.0, dtype=dtype)]
    for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
        ok = (r + dr >= 0) & (r + dr < n) & (c + dc >= 0) & (c + dc < n)
        rows.append(k[ok])
        cols.append(((r + dr) * n + (c + dc))[ok])
        vals.append(torch.full((int(ok.sum()),), -1.0, dtype=dtype))
    return SparseTensor.from_coo(torch.cat(vals), torch.cat(rows), torch.cat(cols), shape=(n * n, n * n), format=F.CSR)


class _Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> str:
        if not ok:
            self.failed.append(what)
        return "ok" if ok else "FAILED"


def run(args: argparse.Namespace | None = None) -> int:
    n = int(getattr(args, "n", None) or 24)
    check = _Checks()
    print(f"sparsetorch demo: formats, conversion, interop and gradients (torch {torch.__version__}, CPU)\n")

    # 1. The DSL ---------------------------------------------------------------------------------
    i, j = Dimension("i"), Dimension("j")
    csc = TensorFormat([i, j], {j: LevelFormat.DENSE, i: LevelFormat.COMPRESSED})
    parsed = TensorFormat.parse("(row, col) -> (col : dense, row : compressed)")
    print("1. Format DSL")
    print(f"   object API  : {csc}   == CSC: {csc == F.CSC}")
    print(f"   string form : {parsed}   == CSC: {check(parsed == F.CSC, 'parse CSC')}")
    print(f"   BSR(2, 3)   : {F.BSR(2, 3)}")
    print(f"   DIA         : {F.DIA}")
    print(f"   DELTA(4)    : {F.DELTA(4)}")
    print(f"   NM(2, 4)    : {F.NM(2, 4)}\n")

    # 2. One matrix, every format -----------------------------------------------------------------
    A = poisson2d(n)
    dense = A.to_dense()
    print(f"2. 2-D Poisson matrix {tuple(A.shape)}, {A.nse} nonzeros, converted to each format on CPU")
    print(f"   {'format':<10} {'stored':>8} {'index+value bytes':>18} {'convert ms':>11}  round trip")
    for name, fmt in F.named_formats().items():
        if name.startswith("NM"):
            continue  # Poisson rows are not 2:4 sparse; shown below on a pruned matrix
        t0 = time.perf_counter()
        B = A.convert(fmt)
        ms = (time.perf_counter() - t0) * 1e3
        nbytes = sum(b.numel() * b.element_size() for b in (*B.pos_buffers, *B.crd_buffers) if b is not None)
        nbytes += B.values.numel() * B.values.element_size()
        ok = torch.equal(B.to_dense(), dense) and torch.equal(B.convert(F.CSR).to_dense(), dense)
        print(f"   {name:<10} {B.nse:>8} {nbytes:>18} {ms:>11.2f}  {check(ok, name)}")

    W = torch.randn(8, 16, dtype=torch.float64)
    keep = W.abs().reshape(8, 4, 4).topk(2, dim=-1).indices
    mask = torch.zeros(8, 4, 4, dtype=torch.bool).scatter_(-1, keep, True).reshape(8, 16)
    S = SparseTensor.from_dense(W * mask, F.NM(2, 4))
    print(f"   NM(2,4) of a pruned 8x16 weight: {S.nse} slots for {int(mask.sum())} nonzeros, "
          f"dense equal: {check(torch.equal(S.to_dense(), W * mask), 'NM')}\n")

    # 3. Views --------------------------------------------------------------------------------------
    At = A.T
    shares = At.values.data_ptr() == A.values.data_ptr() and At.crd(1).data_ptr() == A.crd(1).data_ptr()
    print("3. Transpose is a view: A.T has format", At.format, "(CSC)" if At.format == F.CSC else "")
    print(f"   shares A's buffers: {check(shares, 'T shares')}, equals dense transpose: "
          f"{check(torch.equal(At.to_dense(), dense.T), 'T values')}\n")

    # 4. Interop ------------------------------------------------------------------------------------
    print("4. Zero-copy interop")
    tc = A.to_package("torch")
    back = SparseTensor.from_package(tc)
    print(f"   torch CSR   : shares memory {check(tc.values().data_ptr() == A.values.data_ptr(), 'torch out')}, "
          f"back: {check(back.values.data_ptr() == A.values.data_ptr(), 'torch in')}")
    if importlib.util.find_spec("scipy") is not None:
        sp = A.to_package("scipy")
        import numpy as np

        same = np.shares_memory(sp.data, A.values.numpy())
        print(f"   SciPy {type(sp).__name__:<9}: shares memory {check(same, 'scipy out')}, "
              f"A @ 1 via SciPy equals dense: {check(np.allclose(sp @ np.ones(A.shape[1]), dense.sum(1).numpy()), 'scipy matvec')}")
    else:
        print("   SciPy not installed: skipped (pip install 'sparsetorch[scipy]')")
    print()

    # 5. Gradients ----------------------------------------------------------------------------------
    vals = torch.randn(6, dtype=torch.float64, requires_grad=True)
    row, col = torch.tensor([0, 1, 1, 2, 0, 2]), torch.tensor([0, 1, 2, 2, 0, 0])
    T = SparseTensor.from_coo(vals, row, col, shape=(3, 3), format=F.CSR)
    x = torch.randn(3, dtype=torch.float64)
    loss = (T.to_dense() @ x).square().sum()
    loss.backward()
    ref_vals = vals.detach().clone().requires_grad_(True)
    ref = torch.zeros(3, 3, dtype=torch.float64).index_put((row, col), ref_vals, accumulate=True)
    (ref @ x).square().sum().backward()
    print("5. Gradients flow from a SparseTensor back to the COO values the user passed in")
    print(f"   duplicates summed (nse {T.nse} from 6 triplets); d loss / d values matches dense autograd: "
          f"{check(torch.allclose(vals.grad, ref_vals.grad), 'grad')}\n")

    # 6. Solve through dispatch, with the adjoint gradient -------------------------------------------
    from .ops import solve
    from .ops.explain import explain

    P = poisson2d(n)
    g = torch.Generator().manual_seed(0)
    b = torch.randn(P.shape[0], dtype=torch.float64, generator=g)
    print(f"6. Solve A x = b for the 2-D Poisson matrix ({P.shape[0]} unknowns) through cost-based dispatch")
    print("   " + str(explain("solve", P, b)).replace("\n", "\n   "))
    x, info = solve(P, b, return_info=True)
    ref = torch.linalg.solve(P.to_dense(), b)
    print(f"   chose {info.backend}/{info.method}: relative residual {info.residual:.1e}, "
          f"error vs dense {float((x - ref).norm() / ref.norm()):.1e}: "
          f"{check(info.residual <= 1e-6 and bool((x - ref).norm() <= 1e-4 * ref.norm()), 'solve')}")
    x_cg, info_cg = solve(P, b, method="cg", rtol=1e-10, return_info=True)
    print(f"   method='cg': {info_cg.iterations} iterations, residual {info_cg.residual:.1e}, "
          f"matches: {check(torch.allclose(x_cg, ref, rtol=1e-7, atol=1e-9), 'cg')}")
    # d/dv of L = sum(x^2) for one stored value v of A, by the adjoint rule vs central differences.
    v = P.values.clone().requires_grad_(True)
    loss = solve(P.with_values(v), b, method="cg", rtol=1e-12).square().sum()
    (grad,) = torch.autograd.grad(loss, v)
    k, eps = 7, 1e-6
    vp, vm = P.values.clone(), P.values.clone()
    vp[k] += eps
    vm[k] -= eps
    # Differences need exact solves: LU (an independent method for the check).
    fd = (solve(P.with_values(vp), b, method="lu").square().sum()
          - solve(P.with_values(vm), b, method="lu").square().sum()) / (2 * eps)
    ok = abs(float(grad[k]) - float(fd)) <= 1e-5 * max(1.0, abs(float(fd)))
    print(f"   dL/dA_vals[{k}] of L = |x|^2: adjoint (CG) {float(grad[k]):.6e}, finite differences (LU) "
          f"{float(fd):.6e}: {check(ok, 'adjoint grad')}\n")

    if check.failed:
        print("FAILED checks:", ", ".join(check.failed))
        return 1
    print("All checks passed. Next: `sparsetorch info`; the test suite: bash scripts/test.sh")
    return 0
