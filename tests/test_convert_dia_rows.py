"""DIA (row-indexed diagonals) -> CSR on the CPU (``construct._dia_rows_to_csr``): the rows that
hold every diagonal are raveled, only the edge rows masked. Against the dense matrix, over
shapes where the edges overlap (offsets spanning more than the rows), and the value map (the
gradient path, values requiring grad) against the converted pattern."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
import sparsetorch.tensor.construct as construct
from sparsetorch.format import CSR, DIA


def _banded(m: int, n: int, offsets, rng) -> torch.Tensor:
    D = torch.zeros(m, n, dtype=torch.float64)
    for o in offsets:
        for i in range(m):
            if 0 <= i + o < n:
                D[i, i + o] = float(rng.uniform(0.5, 1.5)) * (1 if rng.random() < 0.5 else -1)
    return D


@pytest.mark.parametrize("seed", range(6))
def test_dia_rows_to_csr_matches_dense_over_shapes(seed: int, monkeypatch) -> None:
    rng = np.random.default_rng(seed)
    calls = []
    real = construct._dia_rows_to_csr
    monkeypatch.setattr(construct, "_dia_rows_to_csr", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(40):
        m, n = int(rng.integers(1, 25)), int(rng.integers(1, 25))
        k = int(rng.integers(1, min(6, m + n - 1) + 1))
        offsets = rng.choice(np.arange(-m + 1, n), size=k, replace=False)
        D = _banded(m, n, offsets, rng)
        A = st.SparseTensor.from_dense(D).convert(DIA)
        B = A.convert(CSR)
        torch.testing.assert_close(B.to_dense(), D, rtol=0, atol=0)
        ptr, col = B.pos(1), B.crd(1)
        assert int(ptr[-1]) == int((D != 0).sum())
        for r in range(m):  # columns increasing within each row
            c = col[int(ptr[r]):int(ptr[r + 1])]
            assert bool((c[1:] > c[:-1]).all())
    assert calls, "the DIA rows path was not taken"


def test_dia_rows_to_csr_value_map_carries_gradients() -> None:
    rng = np.random.default_rng(7)
    D = _banded(30, 12, (-29, -3, 0, 2, 11), rng)  # offsets span more than the columns: no full row
    A = st.SparseTensor.from_dense(D).convert(DIA)
    v = A.values.detach().clone().requires_grad_(True)
    Ag = st.SparseTensor(A.format, A.shape, list(A._pos), list(A._crd), v, check=False)
    B = Ag.convert(CSR)
    w = torch.randn(B.values.shape, dtype=torch.float64)
    (B.values * w).sum().backward()
    G = st.SparseTensor(A.format, A.shape, list(A._pos), list(A._crd), v.grad, check=False).to_dense()
    W = st.SparseTensor(B.format, B.shape, list(B._pos), list(B._crd), w, check=False).to_dense()
    torch.testing.assert_close(G, W, rtol=0, atol=0)
    torch.testing.assert_close(B.to_dense().detach(), D, rtol=0, atol=0)
