"""The zero-copy hand-off to SciPy, and the spmm plan (products and adjoint products)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.format import BSR, COO, CSC, CSR
from sparsetorch.testing.problems import random_rectangular

from sparsetorch_scipy._convert import Handoff
from sparsetorch_scipy.matmul import SpmmPlan


def _shares(arr: np.ndarray, t: torch.Tensor) -> bool:
    return bool(np.shares_memory(arr, t.detach().numpy()))


@pytest.mark.parametrize("index", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_csr_and_csc_hand_over_without_copies(index, layout) -> None:
    S = sp.random_array((30, 20), density=0.2, format=layout, random_state=0, dtype=np.float64)
    S.indices, S.indptr = S.indices.astype(index), S.indptr.astype(index)
    A = st.from_package(S)
    h = Handoff(A)
    data = h.values(A.values)
    M = h.matrix(data[0])
    assert h.kind == layout and not h.converted and h.shares_indices
    assert _shares(M.data, A.values) and _shares(M.indices, A.crd(1)) and _shares(M.indptr, A.pos(1))
    assert M.indices.dtype == index
    np.testing.assert_array_equal(M.toarray(), S.toarray())
    np.testing.assert_array_equal(h.matrix(data[0], transpose=True).toarray(), S.toarray().T)


def test_int64_narrowed_once_for_superlu_and_pyamg() -> None:
    S = sp.random_array((25, 25), density=0.2, format="csr", random_state=1) + sp.eye_array(25)
    S = sp.csr_array(S)
    S.indices, S.indptr = S.indices.astype(np.int64), S.indptr.astype(np.int64)
    A = st.from_package(S)
    h = Handoff(A, int32=True)
    assert h.indices.dtype == np.int32 and not h.shares_indices
    first = h.indices
    assert _shares(h.values(A.values), A.values)  # values still without a copy
    h.values(2 * A.values)
    assert h.indices is first  # narrowed once per pattern, not per value set


def test_views_are_read_only() -> None:
    A = st.SparseTensor.from_dense(torch.eye(4, dtype=torch.float64), CSR)
    M = Handoff(A).matrix(Handoff(A).values(A.values)[0])
    with pytest.raises(ValueError, match="read-only"):
        M.data[0] = 5.0
    assert float(A.values[0]) == 1.0


@pytest.mark.parametrize("fmt", [COO, BSR(2, 2)], ids=["COO", "BSR"])
def test_other_formats_are_converted_once(fmt) -> None:
    A = random_rectangular(10, 14, format=fmt, seed=2)
    h = Handoff(A)
    assert h.kind == "csr" and h.converted
    np.testing.assert_allclose(h.matrix(h.values(A.values)[0]).toarray(), A.to_dense().numpy())
    A2 = A.with_values(3 * A.values)
    np.testing.assert_allclose(h.matrix(h.values(A2.values)[0]).toarray(), A2.to_dense().numpy())


@pytest.mark.parametrize("fmt", [CSR, CSC, COO], ids=["CSR", "CSC", "COO"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128], ids=["float32", "complex128"])
@pytest.mark.parametrize("k", [1, 3])
def test_spmm_and_adjoint(fmt, dtype, k) -> None:
    A = random_rectangular(10, 14, format=fmt, dtype=dtype, seed=3)
    D = A.to_dense()
    plan = SpmmPlan(A.detach())
    plan.set_values(A.values)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(14, k, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(10, k, generator=g, dtype=torch.float64).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(plan.apply(X), D @ X, **tol)
    torch.testing.assert_close(plan.apply(Y, adjoint=True), D.mH @ Y, **tol)


def test_spmm_input_is_not_copied_before_scipy(monkeypatch) -> None:
    A = random_rectangular(8, 8, seed=4)
    plan = SpmmPlan(A.detach())
    plan.set_values(A.values)
    X = torch.randn(8, 2, dtype=torch.float64)
    seen = []
    mat = plan._mats[0]

    class Spy:
        def __matmul__(self, other):
            seen.append(other)
            return mat @ other

    plan._mats = [Spy()]
    plan.apply(X)
    assert _shares(seen[0], X)


def test_matmul_through_dispatch_with_value_batch(scipy_backend) -> None:
    A = random_rectangular(6, 9, seed=5)
    Ab = A.with_values(torch.stack([A.values, -A.values]))
    X = torch.randn(2, 9, 2, dtype=torch.float64)
    Y = st.matmul(Ab, X, backend="scipy")
    torch.testing.assert_close(Y, Ab.to_dense() @ X)
