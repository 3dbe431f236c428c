"""Operands of products that an outside sweep got wrong (session 21), each against a dense reference:
conjugate / negative views of the values, a batched b through Matmul's bound path, a conjugate c, an
empty value batch, and numpy.matmul's reading of a 2-D b for a batched A."""

from __future__ import annotations

import torch

import sparsetorch as st

D = torch.tensor([[1 + 2j, 0, 0.5j], [0, 3 - 1j, 0], [2, 0, 1j]], dtype=torch.complex128)


def test_conjugate_and_negative_views_of_the_values_after_a_cached_product():
    # the plan recognised its values by pointer and version, which a conj / neg view shares with the
    # values it views: A @ x was answered for conj(A) @ x
    A = st.SparseTensor.from_dense(D)
    x = torch.tensor([[1.0 + 1j], [2.0], [-1j]], dtype=torch.complex128)
    A @ x  # a plan for the pattern, holding A's values
    Ac = A.with_values(A.values.conj())
    torch.testing.assert_close(Ac @ x, D.conj() @ x)
    torch.testing.assert_close(st.matmul(Ac, x, torch.zeros(3, 1, dtype=torch.complex128)), D.conj() @ x)
    An = A.with_values(torch._neg_view(A.values))
    torch.testing.assert_close(An @ x, -D @ x)
    torch.testing.assert_close(st.solve(Ac, x), torch.linalg.solve(D.conj(), x))


def test_matmul_execute_with_an_unbatched_a_and_a_batched_b():
    torch.manual_seed(0)
    Dr = torch.randn(5, 4, dtype=torch.float64)
    A = st.SparseTensor.from_dense(Dr)
    bb = torch.randn(2, 4, 3, dtype=torch.float64)
    mm = st.Matmul(A, bb)
    for _ in range(2):  # the first call binds, the second takes the bound path
        torch.testing.assert_close(mm.execute(), Dr @ bb)


def test_matmul_into_a_conjugate_view_c():
    A = st.SparseTensor.from_dense(D)
    x = torch.ones(3, 1, dtype=torch.complex128)
    c = torch.zeros(3, 1, dtype=torch.complex128).conj()
    torch.testing.assert_close(st.Matmul(A, x, c, beta=0.0).execute(), D @ x)


def test_empty_value_batch():
    A = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64))
    A0 = A.with_values(torch.ones(0, A.nse, dtype=torch.float64))
    y = st.matmul(A0, torch.ones(3, 2, dtype=torch.float64))
    assert tuple(y.shape) == (0, 3, 2)


def test_a_2d_b_is_one_matrix_for_every_member_as_numpy_reads_it():
    torch.manual_seed(1)
    A = st.SparseTensor.from_dense(torch.randn(4, 4, dtype=torch.float64))
    Ab = A.with_values(torch.randn(4, A.nse, dtype=torch.float64))  # a batch of n = 4 members
    X = torch.randn(4, 4, dtype=torch.float64)
    ref = Ab.to_dense() @ X  # (4, 4, 4), numpy's and torch's reading
    torch.testing.assert_close(Ab @ X, ref)
    torch.testing.assert_close(st.Matmul(Ab, X).execute(), ref)
    P = st.from_package(Ab.to_dense().to_sparse_csr())  # a pattern batch
    torch.testing.assert_close(P @ X, ref)
    # a batch of vectors where the shapes cannot be read otherwise stays one (B != n)
    A3 = A.with_values(torch.randn(3, A.nse, dtype=torch.float64))
    x3 = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(A3 @ x3, torch.einsum("bij,bj->bi", A3.to_dense(), x3))
