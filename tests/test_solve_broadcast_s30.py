"""Broadcasting in ``sparsetorch.solve`` (session 30): torch.linalg.solve's rules.

``B`` is a batch of vectors when ``B.ndim == 1`` or ``B.shape == A.shape[:-1]``, else a batch of
``(n, k)`` blocks; the batch dimensions of A (its value batch) and B broadcast. An unbatched A
solves every right-hand side of a batched B with one factorization (the batch folded into the
columns); a batched A takes an unbatched or size-1 batch B expanded. References: torch.linalg.solve
on the dense float64 (complex128) matrices, shapes and values alike, and its refusals.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64
N = 6


def _dense(n: int, seed: int, dtype=DT) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.4)
    if dtype.is_complex:
        d = d + 1j * torch.randn(n, n, generator=g, dtype=torch.float64) * (d != 0)
    d = d.to(dtype)
    return d + (d.abs().sum(1).max() + 1) * torch.eye(n, dtype=dtype)  # diagonally dominant


def _batched(seeds, dtype=DT):
    """A value batch on one pattern (the union of the members'), and its dense members."""
    ds = [_dense(N, s, dtype) for s in seeds]
    mask = torch.stack(ds).ne(0).any(0)
    A = st.SparseTensor.from_dense(torch.stack(ds), mask=mask)
    return A, torch.stack(ds)


def _rhs(shape, seed, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    return b.to(dtype) if not dtype.is_complex else (b + 1j * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


UNBATCHED_CASES = [(4, N, 2), (2, 3, N, 1), (N, 3), (N,), (0, N, 2), (3, N, 0)]


@pytest.mark.parametrize("shape", UNBATCHED_CASES)
def test_an_unbatched_matrix_solves_a_batch_of_right_hand_sides(shape):
    D = _dense(N, 0)
    A = st.SparseTensor.from_dense(D)
    b = _rhs(shape, 1)
    x = st.solve(A, b)
    ref = torch.linalg.solve(D, b)
    assert x.shape == ref.shape
    torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-12)


BATCHED_CASES = [(N,), (N, 2), (1, N, 2), (3, N), (3, N, 2), (5, 1, N, 2), (5, 3, N, 1), (2, 1, 1, N, 3)]


@pytest.mark.parametrize("shape", BATCHED_CASES)
def test_a_batched_matrix_broadcasts_against_the_right_hand_side(shape):
    A, D = _batched([2, 3, 4])
    b = _rhs(shape, 5)
    x = st.solve(A, b)
    ref = torch.linalg.solve(D, b)
    assert x.shape == ref.shape
    torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-12)


def test_a_size_one_batch_of_a_folds_into_the_columns():
    A, D = _batched([6])
    A1 = A.with_values(A.values.reshape(1, 1, -1))  # A of shape (1, 1, n, n)
    D1 = D.reshape(1, 1, N, N)
    for shape in [(4, N, 2), (3, 4, N, 1), (N, 2), (1, N, 3)]:
        b = _rhs(shape, 7)
        x = st.solve(A1, b)
        ref = torch.linalg.solve(D1, b)
        assert x.shape == ref.shape, shape
        torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-12)


def test_the_ambiguous_shapes_read_as_torch_reads_them():
    # B.shape == A.shape[:-1] (batch of n vectors, n == batch size): vectors, not one (n, n) block
    Ds = [_dense(N, s) for s in range(N)]
    mask = torch.stack(Ds).ne(0).any(0)
    A = st.SparseTensor.from_dense(torch.stack(Ds), mask=mask)
    b = _rhs((N, N), 8)
    x = st.solve(A, b)
    ref = torch.linalg.solve(torch.stack(Ds), b)
    assert x.shape == ref.shape == (N, N)
    torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-12)
    # an unbatched (n, n) B over a batch of 3: one block for every member
    A3, D3 = _batched([1, 2, 3])
    b = _rhs((N, N), 9)
    torch.testing.assert_close(st.solve(A3, b), torch.linalg.solve(D3, b), rtol=1e-10, atol=1e-12)


def test_vectors_and_info_keep_working_through_the_fold():
    D = _dense(N, 10)
    A = st.SparseTensor.from_dense(D)
    b = _rhs((3, N, 2), 11)
    x, info = st.solve(A, b, return_info=True)
    torch.testing.assert_close(x, torch.linalg.solve(D, b), rtol=1e-10, atol=1e-12)
    assert info.residual < 1e-10


def test_complex_broadcasting():
    D = _dense(N, 12, torch.complex128)
    A = st.SparseTensor.from_dense(D)
    b = _rhs((2, N, 3), 13, torch.complex128)
    torch.testing.assert_close(st.solve(A, b), torch.linalg.solve(D, b), rtol=1e-10, atol=1e-12)
    Ab, Db = _batched([14, 15], torch.complex128)
    b = _rhs((4, 1, N, 2), 16, torch.complex128)
    torch.testing.assert_close(st.solve(Ab, b), torch.linalg.solve(Db, b), rtol=1e-10, atol=1e-12)


def test_gradients_flow_through_the_fold():
    D = _dense(4, 17)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_()
    b = _rhs((3, 4, 2), 18).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, b: st.solve(A.with_values(v), b), (v, b))


def test_gradients_flow_through_the_expansion():
    ds = [_dense(4, s) for s in (19, 20)]
    mask = torch.stack(ds).ne(0).any(0)
    A = st.SparseTensor.from_dense(torch.stack(ds), mask=mask)
    v = A.values.clone().requires_grad_()
    for shape in [(1, 4, 2), (3, 1, 4, 1), (4, 2)]:
        b = _rhs(shape, 21).requires_grad_()
        assert torch.autograd.gradcheck(lambda v, b: st.solve(A.with_values(v), b), (v, b)), shape


def test_gradients_against_the_dense_reference():
    D = _dense(N, 22)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_()
    b = _rhs((2, 3, N, 2), 23)
    b1, b2 = b.clone().requires_grad_(), b.clone().requires_grad_()
    st.solve(A.with_values(v), b1).square().sum().backward()
    Dd = D.clone().requires_grad_()
    torch.linalg.solve(Dd, b2).square().sum().backward()
    rows, cols = A.coordinates()[0]
    torch.testing.assert_close(v.grad, Dd.grad[rows, cols], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("a_batch,shape", [((), (4, N)), ((), (N + 1,)), ((), (2, N + 1, 2)), ((3,), (1, N)),
                                          ((3,), (2, N, 2)), ((3,), (4, 2, N, 1)), ((), (5, 4, N))])
def test_shapes_torch_refuses_are_refused_with_the_shapes(a_batch, shape):
    if a_batch:
        A, D = _batched([24, 25, 26])
    else:
        D = _dense(N, 24)
        A = st.SparseTensor.from_dense(D)
    b = _rhs(shape, 27)
    with pytest.raises(RuntimeError):
        torch.linalg.solve(D, b)
    with pytest.raises(st.InputError, match=r"right-hand side has shape " + str(shape).replace("(", r"\(").replace(")", r"\)")) as err:
        st.solve(A, b)
    assert str(tuple(A.shape)) in str(err.value) or str(tuple(A.batch_shape)) in str(err.value)


def test_other_errors_are_unchanged():
    D = _dense(N, 28)
    A = st.SparseTensor.from_dense(D)
    with pytest.raises(st.InputError, match="dtype"):
        st.solve(A, torch.ones(3, N, 2, dtype=torch.float32))
    with pytest.raises(st.InputError, match="must be a torch.Tensor"):
        st.solve(A, [1.0] * N)
    with pytest.raises(st.InputError, match="NaN"):
        st.solve(A, torch.full((2, N, 1), float("nan"), dtype=DT))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_broadcasting_on_cuda():
    D = _dense(N, 29).cuda()
    A = st.SparseTensor.from_dense(D)
    b = _rhs((3, N, 2), 30).cuda()
    torch.testing.assert_close(st.solve(A, b), torch.linalg.solve(D, b), rtol=1e-9, atol=1e-11)
    Ab, Db = _batched([31, 32])
    Ab, Db = Ab.to("cuda"), Db.cuda()
    b = _rhs((4, 1, N, 2), 33).cuda()
    torch.testing.assert_close(st.solve(Ab, b), torch.linalg.solve(Db, b), rtol=1e-9, atol=1e-11)
