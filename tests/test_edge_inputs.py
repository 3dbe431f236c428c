"""Edge inputs found by session 19's outside sweep: matrices with no stored entries through every
product path, non-finite and far-away eigsh shifts, shapes that are not non-negative integers,
scalars that are not numbers (or complex against real operands), non-array values, contradictory
property tags, dense forms too large to index."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSC, CSR

F64 = torch.float64
SCIPY = importlib.util.find_spec("sparsetorch_scipy") is not None
needs_scipy = pytest.mark.skipif(not SCIPY, reason="the SciPy plugin (plugins/scipy_backend) is not installed")


@pytest.fixture
def empty():
    return st.SparseTensor.from_dense(torch.zeros(3, 3, dtype=F64))


@pytest.mark.parametrize("case", ["T@x", "csc@x", "coo@x", "x@A", pytest.param("scipy", marks=needs_scipy), "weight"])
def test_products_of_a_matrix_with_no_entries_are_zero(empty, case):
    x = torch.arange(1.0, 4.0, dtype=F64)
    assert empty.nse == 0
    y = {
        "T@x": lambda: empty.T @ x,
        "csc@x": lambda: empty.convert(CSC) @ x,
        "coo@x": lambda: empty.convert(COO) @ x,
        "x@A": lambda: x @ empty,
        "scipy": lambda: st.matmul(empty, x, backend="scipy"),
        "weight": lambda: st.nn.SparseWeight(empty).T @ x,
    }[case]()
    assert torch.equal(y, torch.zeros(3, dtype=F64))
    # a rectangular one and several columns
    R = st.SparseTensor.from_dense(torch.zeros(4, 2, dtype=F64))
    assert torch.equal(st.matmul(R, torch.ones(2, 3, dtype=F64), backend="scipy" if SCIPY else None), torch.zeros(4, 3, dtype=F64))


@pytest.mark.parametrize("method", [None, pytest.param("arpack", marks=needs_scipy)])
def test_eigsh_of_the_zero_matrix(empty, method):
    w, V = st.eigsh(empty, 2, method=method)
    assert torch.equal(w, torch.zeros(2, dtype=F64))
    torch.testing.assert_close(V.T @ V, torch.eye(2, dtype=F64))


def _laplacian(n=16):
    D = 2 * torch.eye(n, dtype=F64) - torch.diag(torch.ones(n - 1, dtype=F64), 1) - torch.diag(torch.ones(n - 1, dtype=F64), -1)
    return D, st.SparseTensor.from_dense(D)


@pytest.mark.parametrize("sigma", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("method", [None, "lanczos", pytest.param("arpack", marks=needs_scipy)])
def test_eigsh_refuses_a_non_finite_shift(sigma, method):
    _, A = _laplacian()
    with pytest.raises(st.InputError, match="sigma must be finite"):
        st.eigsh(A, 2, sigma=sigma, method=method)


def test_eigs_refuses_a_non_finite_shift():
    _, A = _laplacian()
    with pytest.raises(st.InputError, match="sigma must be a finite number"):
        st.eigs(A, 2, sigma=complex(float("nan"), 0))


@pytest.mark.parametrize("sigma", [100.0, 1e300, -1e300])
def test_eigsh_far_shift_gives_the_nearest_end_of_the_spectrum(sigma):
    D, A = _laplacian()
    ev = torch.linalg.eigvalsh(D)
    w, _ = st.eigsh(A, 2, sigma=sigma)
    want = ev[-2:] if sigma > 0 else ev[:2]
    torch.testing.assert_close(w, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, -3), (3.5, 3), (3, None), ("3", 3)])
def test_shapes_must_be_non_negative_integers(shape):
    e = torch.zeros(0, dtype=torch.long)
    with pytest.raises(st.ValidationError, match="shape"):
        st.SparseTensor.from_coo(torch.zeros(0, dtype=F64), e, e, shape=shape, format=CSR)


def test_integer_like_shapes_are_accepted():
    i = torch.tensor([0, 2])
    for shape in [(np.int64(3), np.int32(4)), (torch.tensor(3), 4), torch.Size([3, 4])]:
        A = st.SparseTensor.from_coo(torch.ones(2, dtype=F64), i, i, shape=shape, format=CSR)
        assert tuple(A.shape) == (3, 4) and all(type(s) is int for s in A.shape)


def test_from_coo_names_values_that_are_not_numbers():
    with pytest.raises(st.ValidationError, match="values must be a tensor"):
        st.SparseTensor.from_coo(None, torch.tensor([0]), torch.tensor([0]), shape=(3, 3), format=CSR)
    with pytest.raises(st.ValidationError, match="index array 1"):
        st.SparseTensor.from_coo(torch.ones(1, dtype=F64), torch.tensor([0]), None, shape=(3, 3), format=CSR)


@pytest.mark.parametrize("kw", [{"alpha": "2"}, {"alpha": True}, {"alpha": [2.0]}])
def test_matmul_scalars_must_be_numbers(kw):
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    with pytest.raises(st.InputError, match="must be a number"):
        st.matmul(A, torch.ones(3, dtype=F64), **kw)


def test_complex_scalars_need_complex_operands():
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    with pytest.raises(st.InputError, match="complex"):
        st.matmul(A, torch.ones(3, dtype=F64), alpha=1j)
    # a complex number with no imaginary part is the real number
    torch.testing.assert_close(st.matmul(A, torch.ones(3, dtype=F64), alpha=complex(3, 0)), torch.full((3,), 6.0, dtype=F64))
    Ac = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=torch.complex128))
    torch.testing.assert_close(st.matmul(Ac, torch.ones(3, dtype=torch.complex128), alpha=1j),
                               torch.full((3,), 2j, dtype=torch.complex128))


def test_contradictory_properties_are_refused():
    A = st.SparseTensor.from_dense(2 * torch.eye(3, dtype=F64))
    for props in (["spd", "general"], ["symmetric", "nonsymmetric"]):
        with pytest.raises(st.InputError, match="contradict"):
            st.solve(A, torch.ones(3, dtype=F64), properties=props)


def test_to_dense_beyond_what_a_tensor_can_index():
    H = st.SparseTensor.from_coo(torch.ones(1, dtype=F64), torch.tensor([0]), torch.tensor([0]), shape=(10**12, 10**12),
                                 format=COO)
    with pytest.raises(st.InputError, match="to_dense"):
        H.to_dense()


def test_solve_broadcasts_an_unbatched_rhs_over_a_value_batch():
    D = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=F64)
    dense = torch.stack([D, 2 * D + torch.eye(3, dtype=F64)])
    A = st.SparseTensor.from_dense(dense)
    assert tuple(A.batch_shape) == (2,)
    for b in (torch.tensor([1.0, -2.0, 0.5], dtype=F64), torch.randn(3, 2, dtype=F64)):
        x = st.solve(A, b)
        torch.testing.assert_close(x, torch.linalg.solve(dense, b if b.dim() == 2 else b.expand(2, 3)), rtol=1e-12, atol=1e-12)

    def f(vals, b):
        return st.solve(A.with_values(vals), b)

    vals = A.values.detach().clone().requires_grad_()
    b = torch.tensor([1.0, -2.0, 0.5], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (vals, b))


def test_a_solution_that_overflows_the_dtype_says_so():
    import scipy.sparse as sp

    A = sp.diags([-np.ones(99), 2 * np.ones(100), -np.ones(99)], [-1, 0, 1], format="csr") * 1e-150
    with pytest.raises(st.NotConvergedError, match="does not fit in torch.float64") as exc:
        st.solve(st.from_package(A), torch.full((100,), 1e200, dtype=F64))
    assert "maxiter" not in str(exc.value)  # no advice about iterations: the scale is the problem
