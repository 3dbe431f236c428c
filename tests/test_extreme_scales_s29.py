"""Block-diagonal systems whose blocks lie at opposite ends of the exponent range (session 29's outside tester).

``blockdiag(B * 1e-160, B * 1e160)`` (B a shifted 2-D Laplacian: symmetric indefinite, condition ~30) with b = ones
has a solution spanning 1e-160..1e160: ||A|| ||x|| ~ 1e320 overflows float64 while every block, and every row, is
harmless. The route scaled all values by one power of two (the smallest entries landed at 3e-308, the solution
overflowed, LU answered NaN), squared norms of 1e160 (torch and NumPy do not scale them: "the residual's norm
overflows"), and multiplied norms (backward error 0, condition inf); the property scan tagged ``zero_minor``
(a_ii a_jj and a_ij^2 both inf). In float32 the same happens at 1e+-19. Answers are checked block by block against
scipy.sparse.linalg.spsolve in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

sp = pytest.importorskip("scipy.sparse")
spl = pytest.importorskip("scipy.sparse.linalg")

import sparsetorch as st  # noqa: E402
from sparsetorch.ops.properties import _detect  # noqa: E402


def _block(symmetric: bool = True):
    L = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(20, 20))
    identity = sp.identity(20)
    B = sp.kron(identity, L) + sp.kron(L, identity) - 0.5 * sp.identity(400)
    if not symmetric:
        B = B + sp.diags([0.3], [1], shape=(400, 400))
    return sp.csr_matrix(B)


def _check(blocks, scales, np_dtype, torch_dtype):
    A = sp.csr_matrix(sp.block_diag([blk * s for blk, s in zip(blocks, scales)])).astype(np_dtype)
    n = A.shape[0]
    b = np.ones(n)
    ref = spl.spsolve(A.astype(np.float64).tocsc(), b)
    x = st.solve(st.from_package(A), torch.ones(n, dtype=torch_dtype)).double().numpy()
    assert np.isfinite(x).all()
    cond = max(np.linalg.cond(blk.toarray()) for blk in blocks)
    u = float(torch.finfo(torch_dtype).eps) / 2
    at = 0
    for blk in blocks:
        m = blk.shape[0]
        err = np.abs(x[at:at + m] - ref[at:at + m]).max() / np.abs(ref[at:at + m]).max()
        assert err <= 64 * cond * u, (at, err, cond)
        at += m


@pytest.mark.parametrize("symmetric", [True, False])
def test_float64_blocks_1e160(symmetric):
    B = _block(symmetric)
    _check([B, B], [1e-160, 1e160], np.float64, torch.float64)


def test_float64_blocks_1e300():
    B = _block()
    _check([B, B], [1e-300, 1e300], np.float64, torch.float64)


@pytest.mark.parametrize("symmetric", [True, False])
def test_float32_blocks_1e19(symmetric):
    B = _block(symmetric)
    _check([B, B], [1e-19, 1e19], np.float32, torch.float32)


def test_float32_twelve_blocks_1e18():
    B = _block()
    _check([B] * 12, [1e-18 if i % 2 else 1e18 for i in range(12)], np.float32, torch.float32)


@pytest.mark.parametrize("scale,np_dtype", [(1e160, np.float64), (1e19, np.float32)])
def test_no_zero_minor_from_overflow(scale, np_dtype):
    B = _block()
    A = st.from_package(sp.csr_matrix(sp.block_diag([B / scale, B * scale])).astype(np_dtype))
    assert "zero_minor" not in _detect(A)
    table = st.explain("solve", A, torch.ones(800, dtype=A.dtype))
    assert "zero_minor" not in str(table)


def test_zero_minor_still_found_beyond_the_range():
    # unit-valued graph matrix scaled by 1e200: a_ii a_jj == a_ij^2 exactly, though both overflow
    L = sp.diags([-1.0, 1.0, -1.0], [-1, 0, 1], shape=(30, 30))
    assert "zero_minor" in _detect(st.from_package(sp.csr_matrix(L * 1e200)))
    assert "zero_minor" in _detect(st.from_package(sp.csr_matrix(L)))
    assert "zero_minor" not in _detect(st.from_package(sp.csr_matrix(L * 1e200 + sp.identity(30) * 1e199)))
