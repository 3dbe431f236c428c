"""DIA (row-indexed diagonals) and DIA_J (column-indexed) -> CSR on the CPU
(``construct._dia_rows_to_csr``): the rows that hold every diagonal are written slice by slice,
only the edge rows gathered entry by entry. Against the dense matrix, over shapes where the
edges overlap (offsets spanning more than the rows), and the value map (the gradient path,
values requiring grad) against the converted pattern; DIA_J also against SciPy's kernel path
(bit for bit) and where each path is chosen."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
import sparsetorch.tensor.construct as construct
from sparsetorch.format import CSR, DIA, DIA_J


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


def _check_value_gradients(A: st.SparseTensor) -> st.SparseTensor:
    """A -> CSR with gradients on A's values: the gradient of <w, B.values> is w placed back at A's slots."""
    v = A.values.detach().clone().requires_grad_(True)
    Ag = st.SparseTensor(A.format, A.shape, list(A._pos), list(A._crd), v, check=False)
    B = Ag.convert(CSR)
    w = torch.randn(B.values.shape, dtype=torch.float64)
    (B.values * w).sum().backward()
    G = st.SparseTensor(A.format, A.shape, list(A._pos), list(A._crd), v.grad, check=False).to_dense()
    W = st.SparseTensor(B.format, B.shape, list(B._pos), list(B._crd), w, check=False).to_dense()
    torch.testing.assert_close(G, W, rtol=0, atol=0)
    return B


def test_dia_rows_to_csr_value_map_carries_gradients() -> None:
    rng = np.random.default_rng(7)
    D = _banded(30, 12, (-29, -3, 0, 2, 11), rng)  # offsets span more than the columns: no full row
    A = st.SparseTensor.from_dense(D).convert(DIA)
    B = _check_value_gradients(A)
    torch.testing.assert_close(B.to_dense().detach(), D, rtol=0, atol=0)


# DIA_J (column-indexed diagonals) through the same path -----------------------------------------


def _dia_j(D: torch.Tensor, idt: torch.dtype = torch.int64) -> st.SparseTensor:
    return st.SparseTensor.from_dense(D).convert(DIA_J, index_dtype=idt)


def _fresh(A: st.SparseTensor) -> st.SparseTensor:
    """The same buffers in a new tensor: no conversion cached on it."""
    return st.SparseTensor(A.format, A.shape, A.pos_buffers, A.crd_buffers, A.values, check=False)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_scipy", [True, False])
def test_dia_j_rows_path_matches_dense_and_the_kernel(seed: int, use_scipy: bool, monkeypatch) -> None:
    """DIA_J -> CSR in NumPy (forced for any number of diagonals) equals the dense matrix, keeps
    every slot inside the shape, and gives the buffers SciPy's kernel path gives (bit for bit)."""
    rng = np.random.default_rng(100 + seed)
    monkeypatch.setattr(construct, "USE_SCIPY", use_scipy)
    monkeypatch.setattr(construct, "SCIPY_MIN_ENTRIES", 0)
    calls = []
    real = construct._dia_rows_to_csr
    monkeypatch.setattr(construct, "_dia_rows_to_csr", lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    for _ in range(30):
        m, n = int(rng.integers(1, 30)), int(rng.integers(1, 30))
        k = int(rng.integers(1, min(8, m + n - 1) + 1))
        offsets = rng.choice(np.arange(-m + 1, n), size=k, replace=False)
        D = _banded(m, n, offsets, rng)
        idt = torch.int32 if rng.random() < 0.5 else torch.int64
        A = _dia_j(D, idt)
        vals = A.values.clone()
        vals[::4] = 0.0  # explicit zeros stay entries
        vals[1::7] = -0.0
        A = A.with_values(vals)
        monkeypatch.setattr(construct, "DIA_J_MIN_DIAGONALS", 0)
        monkeypatch.setattr(construct, "DIA_J_MAX_EDGE_SHARE", 1.0)
        B = _fresh(A).convert(CSR)
        monkeypatch.setattr(construct, "DIA_J_MIN_DIAGONALS", 10**9)  # SciPy's kernel where it is there
        R = _fresh(A).convert(CSR)
        assert B.pos(1).dtype == idt and B.crd(1).dtype == idt
        torch.testing.assert_close(B.to_dense(), A.to_dense(), rtol=0, atol=0)
        inside = sum(max(0, min(n, m + o) - max(0, o)) for o in A.crd(0).tolist())
        assert B.nse == inside
        assert torch.equal(B.pos(1), R.pos(1)) and torch.equal(B.crd(1), R.crd(1))
        assert torch.equal(B.values.view(torch.int64), R.values.view(torch.int64))  # signed zeros too
        B.validate()
    assert "DIA_J" in calls


def test_dia_j_rows_path_value_map_and_gradients(monkeypatch) -> None:
    """The value map (computed on first use) and the gradient path of the NumPy DIA_J path."""
    monkeypatch.setattr(construct, "DIA_J_MIN_DIAGONALS", 0)
    monkeypatch.setattr(construct, "DIA_J_MAX_EDGE_SHARE", 1.0)
    rng = np.random.default_rng(9)
    D = _banded(18, 30, (-17, -2, 0, 1, 2, 3, 29), rng)  # edge rows on both sides, a run of offsets
    A = _dia_j(D)
    conv = construct.conversion(A, CSR, torch.int64, values_too=True)
    first = conv.values(A.values)
    assert callable(conv._src)  # the map is computed on first use
    torch.testing.assert_close(conv.values(A.values), first, rtol=0, atol=0)
    _check_value_gradients(A)


@pytest.mark.parametrize("offsets,numpy_path", [
    (np.arange(-15, 15), True),  # a band of 30 diagonals: NumPy
    (np.arange(-3, 4), False),  # few diagonals: SciPy's kernel
    (np.r_[np.arange(-150, -135), np.arange(135, 150)], False),  # most entries in edge rows: the kernel
])
def test_dia_j_takes_the_kernel_where_it_is_faster(offsets, numpy_path: bool, monkeypatch) -> None:
    pytest.importorskip("scipy")
    monkeypatch.setattr(construct, "SCIPY_MIN_ENTRIES", 0)
    rng = np.random.default_rng(2)
    n = 200
    A = st.SparseTensor(DIA_J, (n, n), [torch.tensor([0, offsets.size]), None], [torch.from_numpy(offsets), None],
                        torch.from_numpy(rng.standard_normal(offsets.size * n)), check=True)
    got = []
    real = construct._dia_rows_to_csr
    monkeypatch.setattr(construct, "_dia_rows_to_csr", lambda *a, **k: got.append(real(*a, **k)) or got[-1])
    B = A.convert(CSR)
    assert (got[-1] is not None) == numpy_path
    torch.testing.assert_close(B.to_dense(), A.to_dense(), rtol=0, atol=0)
