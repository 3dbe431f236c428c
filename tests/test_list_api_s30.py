"""SparseTensorList's everyday API (session 30): torch-sla's ``L.solve(bs)``, ``L @ xs``, ``det``,
``slogdet``, ``logdet``, ``eigsh``, ``norm``, scalar and member-wise arithmetic, ``T`` and the
block-diagonal round trip.

References: dense float64 (complex128) torch (``torch.linalg.solve``, ``slogdet``, ``eigvalsh``,
``matrix_norm``) and NumPy on each member; gradients by ``torch.autograd.gradcheck``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64


def _dense(n: int, seed: int, dtype=DT, symmetric=True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.4)
    if dtype.is_complex:
        d = d + 1j * torch.randn(n, n, generator=g, dtype=torch.float64) * (d != 0)
    d = d.to(dtype)
    if symmetric:
        d = d + d.mH
    return d + (d.abs().sum(1).max() + 1) * torch.eye(n, dtype=dtype)  # diagonally dominant


def _list(sizes, seed=0, dtype=DT, symmetric=True):
    ds = [_dense(n, seed + i, dtype, symmetric) for i, n in enumerate(sizes)]
    return st.SparseTensorList([st.SparseTensor.from_dense(d) for d in ds]), ds


def test_solve_takes_a_list_or_a_stacked_tensor_and_answers_in_kind():
    L, ds = _list([4, 7, 5])
    bs = [torch.randn(d.shape[0], dtype=DT) for d in ds]
    xs = L.solve(bs)
    assert isinstance(xs, list) and len(xs) == 3
    for x, d, b in zip(xs, ds, bs):
        torch.testing.assert_close(x, torch.linalg.solve(d, b), rtol=1e-10, atol=1e-12)
    U, us = _list([5, 5])
    B = torch.randn(2, 5, 3, dtype=DT)
    X = U.solve(B)
    assert isinstance(X, torch.Tensor) and X.shape == (2, 5, 3)
    torch.testing.assert_close(X, torch.linalg.solve(torch.stack(us), B), rtol=1e-10, atol=1e-12)
    X, infos = U.solve(B, return_info=True)
    assert X.shape == (2, 5, 3) and len(infos) == 2 and all(i.residual < 1e-10 for i in infos)


def test_solve_is_differentiable_in_the_members_and_the_right_hand_sides():
    L, _ = _list([3, 4], seed=10, symmetric=False)
    vals = [a.values.clone().requires_grad_() for a in L]
    bs = [torch.randn(a.shape[0], 2, dtype=DT, requires_grad=True) for a in L]

    def f(v0, v1, b0, b1):
        return tuple(L.with_values([v0, v1]).solve([b0, b1]))

    assert torch.autograd.gradcheck(f, (*vals, *bs))


def test_matvec_and_the_operator():
    L, ds = _list([4, 6], seed=20, symmetric=False)
    xs = [torch.randn(d.shape[1], dtype=DT) for d in ds]
    for ys in (L.matvec(xs), L @ xs):
        assert isinstance(ys, list)
        for y, d, x in zip(ys, ds, xs):
            torch.testing.assert_close(y, d @ x)
    U, us = _list([5, 5], seed=22)
    X = torch.randn(2, 5, 3, dtype=DT)
    Y = U @ X
    assert isinstance(Y, torch.Tensor) and Y.shape == (2, 5, 3)
    torch.testing.assert_close(Y, torch.stack(us) @ X)
    # round trip: A_i (A_i^-1 b_i) = b_i
    torch.testing.assert_close(U @ U.solve(X), X, rtol=1e-10, atol=1e-12)
    v = [a.values.clone().requires_grad_() for a in U]
    assert torch.autograd.gradcheck(lambda v0, v1, x: U.with_values([v0, v1]) @ x, (*v, X.clone().requires_grad_()))


def test_determinants_per_member():
    L, ds = _list([3, 5, 4], seed=30, symmetric=False)
    sign, logabs = L.slogdet()
    ref_sign, ref_log = zip(*[torch.linalg.slogdet(d) for d in ds])
    assert sign.shape == logabs.shape == (3,)
    torch.testing.assert_close(sign, torch.stack(ref_sign))
    torch.testing.assert_close(logabs, torch.stack(ref_log), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(L.det(), torch.stack([torch.linalg.det(d) for d in ds]), rtol=1e-9, atol=0)
    torch.testing.assert_close(L.logdet(), torch.stack([torch.logdet(d) for d in ds]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(L.det().numpy(), [np.linalg.det(d.numpy()) for d in ds], rtol=1e-9)
    v = [a.values.clone().requires_grad_() for a in L]
    assert torch.autograd.gradcheck(lambda *v: L.with_values(list(v)).logdet(), tuple(v))


def test_complex_determinants_and_solve():
    L, ds = _list([3, 4], seed=35, dtype=torch.complex128, symmetric=False)
    sign, logabs = L.slogdet()
    for s, la, d in zip(sign, logabs, ds):
        rs, rl = torch.linalg.slogdet(d)
        torch.testing.assert_close(s, rs, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(la, rl, rtol=1e-10, atol=1e-12)
    bs = [torch.randn(d.shape[0], dtype=torch.complex128) for d in ds]
    for x, d, b in zip(L.solve(bs), ds, bs):
        torch.testing.assert_close(x, torch.linalg.solve(d, b), rtol=1e-10, atol=1e-12)


def test_eigsh_stacks_what_has_one_shape():
    L, ds = _list([6, 8], seed=40)
    w, V = L.eigsh(k=2, which="LA")
    assert w.shape == (2, 2) and isinstance(V, list) and [v.shape for v in V] == [(6, 2), (8, 2)]
    for wi, d in zip(w, ds):
        torch.testing.assert_close(wi, torch.linalg.eigvalsh(d)[-2:], rtol=1e-8, atol=1e-10)
    U, us = _list([7, 7], seed=42)
    w, V = U.eigsh(2, "SA")
    assert w.shape == (2, 2) and isinstance(V, torch.Tensor) and V.shape == (2, 7, 2)
    for wi, Vi, d in zip(w, V, us):
        torch.testing.assert_close(wi, torch.linalg.eigvalsh(d)[:2], rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(d @ Vi, Vi * wi, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("ord,ref", [("fro", "fro"), (1, 1), (float("inf"), float("inf"))])
def test_norms_per_member(ord, ref):
    L, ds = _list([3, 6], seed=50, symmetric=False)
    got = L.norm(ord)
    assert got.shape == (2,)
    torch.testing.assert_close(got, torch.stack([torch.linalg.matrix_norm(d, ref) for d in ds]))
    assert torch.allclose(L.norm("max"), torch.stack([d.abs().max() for d in ds]))


def test_arithmetic_maps_over_the_members():
    L, ds = _list([3, 4], seed=60, symmetric=False)
    M, es = _list([3, 4], seed=70, symmetric=False)
    cases = [(L * 2, [2 * d for d in ds]), (2 * L, [2 * d for d in ds]), (L / 4, [d / 4 for d in ds]),
             (-L, [-d for d in ds]), (L + M, [a + b for a, b in zip(ds, es)]), (L - M, [a - b for a, b in zip(ds, es)]),
             (L * torch.tensor(3.0, dtype=DT), [3 * d for d in ds]), (L.T, [d.T for d in ds])]
    for got, ref in cases:
        assert isinstance(got, st.SparseTensorList) and len(got) == 2
        for g, r in zip(got.to_dense(), ref):
            torch.testing.assert_close(g, r)
    v = L[0].values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: (L.with_values([v, L[1].values]) * 3 - M)[0].values, (v,))


def test_arithmetic_errors_name_the_shapes():
    L, _ = _list([3, 4])
    M, _ = _list([3, 5])
    with pytest.raises(st.ValidationError, match=r"member 1 of 2.*\(4, 4\).*\(5, 5\)"):
        L + M
    with pytest.raises(st.ValidationError, match="2 and 1 members"):
        L - L[:1]
    with pytest.raises(TypeError):
        L * torch.ones(2, dtype=DT)
    with pytest.raises(TypeError):
        L * "a"


def test_block_diagonal_round_trip_and_gradients():
    L, ds = _list([3, 5, 2], seed=80, symmetric=False)
    B = L.to_block_diagonal()
    assert B.shape == (10, 10) and B.format == st.format.CSR
    torch.testing.assert_close(B.to_dense(), torch.block_diag(*ds))
    back = st.SparseTensorList.from_block_diagonal(B, [3, 5, 2])
    assert back.shapes == L.shapes
    for a, d in zip(back.to_dense(), ds):
        torch.testing.assert_close(a, d)
    # rectangular blocks
    R = st.SparseTensorList([st.SparseTensor.from_dense(torch.arange(6, dtype=DT).reshape(2, 3) + 1),
                             st.SparseTensor.from_dense(torch.ones(4, 1, dtype=DT))])
    BR = R.to_block_diagonal()
    torch.testing.assert_close(BR.to_dense(), torch.block_diag(*R.to_dense()))
    back = st.SparseTensorList.from_block_diagonal(BR, [(2, 3), (4, 1)])
    assert all(torch.equal(a, b) for a, b in zip(back.to_dense(), R.to_dense()))
    # differentiable both ways, and a solve on the block matrix equals the members' solves
    vals = [a.values.clone().requires_grad_() for a in L]
    assert torch.autograd.gradcheck(lambda *v: L.with_values(list(v)).to_block_diagonal().to_dense(), tuple(vals))
    vB = B.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda v: tuple(m.to_dense() for m in st.SparseTensorList.from_block_diagonal(B.with_values(v), [3, 5, 2])), (vB,))
    b = torch.randn(10, dtype=DT)
    torch.testing.assert_close(st.solve(B, b), torch.cat(L.solve(list(b.split([3, 5, 2])))), rtol=1e-10, atol=1e-12)


def test_block_diagonal_errors():
    L, _ = _list([3, 4])
    B = L.to_block_diagonal()
    with pytest.raises(st.ValidationError, match=r"make a 6x6 matrix, A is 7x7"):
        st.SparseTensorList.from_block_diagonal(B, [3, 3])
    full = st.SparseTensor.from_dense(torch.ones(4, 4, dtype=DT))
    with pytest.raises(st.ValidationError, match=r"8 nonzero entries outside the diagonal blocks \[\(2, 2\), \(2, 2\)\]"):
        st.SparseTensorList.from_block_diagonal(full, [2, 2])
    with pytest.raises(st.ValidationError, match="empty"):
        st.SparseTensorList([]).to_block_diagonal()


def test_operand_count_and_shape_errors():
    L, _ = _list([3, 4])
    with pytest.raises(st.InputError, match="2 members need 2 operands, got 1"):
        L.solve([torch.ones(3, dtype=DT)])
    with pytest.raises(st.InputError, match=r"leading dimension of 2.*shape \(3, 3\)"):
        L @ torch.ones(3, 3, dtype=DT)
    with pytest.raises(st.InputError, match=r"member 1 of 2.*shape \(3,\)"):
        L.solve([torch.ones(3, dtype=DT), torch.ones(3, dtype=DT)])
    with pytest.raises(st.InputError, match=r"member 1 of 2"):
        L @ [torch.ones(3, dtype=DT), torch.ones(3, dtype=DT)]
    with pytest.raises(st.InputError, match="rtol"):
        L.solve([torch.ones(3, dtype=DT), torch.ones(4, dtype=DT)], tol=1e-8)
    # sparsetorch.norm still takes one matrix (the method maps)
    with pytest.raises(st.InputError, match="per matrix"):
        st.norm(L)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_list_api_on_cuda():
    L, ds = _list([4, 6], seed=90)
    L = L.to("cuda")
    bs = [torch.randn(d.shape[0], dtype=DT, device="cuda") for d in ds]
    for x, d, b in zip(L.solve(bs), ds, bs):
        torch.testing.assert_close(x, torch.linalg.solve(d.cuda(), b), rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(L.logdet().cpu(), torch.stack([torch.logdet(d) for d in ds]), rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(L.to_block_diagonal().to_dense().cpu(), torch.block_diag(*ds))


@pytest.mark.parametrize("fmt", ["DIA", "DENSE", "CSR", "ELL"])
def test_block_diagonal_round_trip_in_formats_that_store_zeros(fmt):
    L = st.SparseTensorList([st.SparseTensor.from_dense(torch.tensor([[1.0, 2], [0, 3]], dtype=torch.float64)),
                             st.SparseTensor.from_dense(torch.tensor([[4.0, 0], [5, 6]], dtype=torch.float64))])
    back = st.SparseTensorList.from_block_diagonal(L.to_block_diagonal(format=fmt), [2, 2])
    for a, b in zip(back, L):
        assert torch.equal(a.to_dense(), b.to_dense())


def test_member_right_hand_side_batches_broadcast_and_empty_lists_stack():
    L = st.SparseTensorList([st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64) * 2),
                             st.SparseTensor.from_dense(torch.eye(2, dtype=torch.float64) * 4)])
    bs = [torch.randn(2, 3, 1, dtype=torch.float64), torch.randn(5, 2, 2, dtype=torch.float64)]
    xs = L.solve(bs)
    torch.testing.assert_close(xs[0], bs[0] / 2)
    torch.testing.assert_close(xs[1], bs[1] / 4)
    empty = st.SparseTensorList([])
    assert empty.det().shape == (0,) and empty.norm().shape == (0,)
