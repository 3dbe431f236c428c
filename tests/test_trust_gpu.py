"""The default solve's accuracy contract on the GPU (session 20): an iterative answer (torch's or the
cuda plugin's CG / BiCGStab) is refined to a direct method's backward error, judged in float64
against the matrix itself. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import CSR

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _grid(m: int, dtype, *, pe: float = 0.0) -> st.SparseTensor:
    """5-point Laplacian on an m x m grid, plus upwind convection of Peclet number ``pe`` (nonsymmetric)."""
    n = m * m
    h = 1.0 / (m + 1)
    idx = torch.arange(n)
    i, j = idx // m, idx % m
    rows, cols, vals = [idx], [idx], [torch.full((n,), 4.0 / h**2 + 2 * pe / h, dtype=torch.float64)]
    for di, dj, w in ((1, 0, -1 / h**2), (-1, 0, -1 / h**2 - pe / h), (0, 1, -1 / h**2), (0, -1, -1 / h**2 - pe / h)):
        ok = (i + di >= 0) & (i + di < m) & (j + dj >= 0) & (j + dj < m)
        rows.append(idx[ok])
        cols.append(((i + di) * m + (j + dj))[ok])
        vals.append(torch.full((int(ok.sum()),), w, dtype=torch.float64))
    A = st.SparseTensor.from_coo(torch.cat(vals), torch.cat(rows), torch.cat(cols), shape=(n, n), format=CSR)
    return A.to(dtype).cuda()


def _berr(A: st.SparseTensor, x: torch.Tensor, b: torch.Tensor) -> float:
    D = A.to_dense().double()
    x, b = x.double(), b.double()
    r = b - D @ x
    return float(r.abs().max() / (D.abs().sum(1).max() * x.abs().max() + b.abs().max()))


@pytest.mark.parametrize("pe", [0.0, 50.0], ids=["poisson", "upwind"])
@pytest.mark.parametrize("backend", [None, "torch", "cuda"])
def test_default_gpu_answers_reach_a_direct_methods_backward_error(pe, backend):
    from sparsetorch.dispatch.select import get_backends

    if backend is not None and backend not in {i.name for i in get_backends().info()}:
        pytest.skip(f"backend {backend!r} not installed")
    method = "cg" if pe == 0.0 else "bicgstab"
    A = _grid(60, torch.float64, pe=pe)
    b = torch.randn(A.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1)).cuda()
    kw = {} if backend is None else {"backend": backend, "method": method}
    x, info = st.solve(A, b, return_info=True, **kw)
    u = torch.finfo(torch.float64).eps / 2
    assert _berr(A, x, b) <= 128 * u, info.attempts
    ref = torch.linalg.solve(A.to_dense().cpu(), b.cpu())
    assert float((x.cpu() - ref).norm() / ref.norm()) <= 1e-11, info.attempts
    # an explicit tolerance keeps its meaning: not refined past it
    if backend is not None:
        x2 = st.solve(A, b, rtol=1e-6, **kw)
        rel = float((b - A @ x2).norm() / b.norm())
        assert 1e-12 < rel <= 1e-6, rel  # (blocks of iterations between checks may pass 1e-6 by a few digits)


def test_default_gpu_float32_answer():
    A = _grid(60, torch.float32)
    b = torch.randn(A.shape[0], dtype=torch.float32, generator=torch.Generator().manual_seed(2)).cuda()
    x = st.solve(A, b)
    u = torch.finfo(torch.float32).eps / 2
    assert _berr(A, x, b) <= 128 * u
