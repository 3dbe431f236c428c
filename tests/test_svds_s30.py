"""sparsetorch.svds / cond (torch-sla's A.svd(k) and A.condition_number()): singular values and vectors against
torch.linalg.svd of the dense matrix in float64, gradients by gradcheck, the singular and non-square cases."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.ops.svd import cond, svds

DT = torch.float64


def _matrix(m: int, n: int, seed: int, dtype: torch.dtype = DT, density: float = 0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < density)
    r = min(m, n)
    D[:r, :r] += 3 * torch.eye(r, dtype=dtype)
    return D


@pytest.mark.parametrize("shape", [(30, 30), (40, 25), (25, 40)])
@pytest.mark.parametrize("fmt", ["CSR", "COO", "CSC"])
def test_largest_triplets_match_the_dense_svd(shape, fmt):
    D = _matrix(*shape, seed=shape[0] + shape[1])
    A = st.SparseTensor.from_dense(D).convert(fmt)
    U, S, Vh = svds(A, 4)
    ref = torch.linalg.svdvals(D)
    torch.testing.assert_close(S, ref[:4], rtol=1e-12, atol=1e-12)
    assert torch.all(S[:-1] >= S[1:])  # descending
    torch.testing.assert_close(U.mT @ D @ Vh.mT, torch.diag(S), rtol=0, atol=1e-11)
    torch.testing.assert_close(U.mT @ U, torch.eye(4, dtype=DT), rtol=0, atol=1e-11)
    torch.testing.assert_close(Vh @ Vh.mT, torch.eye(4, dtype=DT), rtol=0, atol=1e-11)


def test_smallest_singular_values_of_a_square_matrix():
    D = _matrix(40, 40, seed=3)
    U, S, Vh = svds(st.SparseTensor.from_dense(D), 3, which="SM")
    ref = torch.linalg.svdvals(D)
    torch.testing.assert_close(S, ref[-3:], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(D @ Vh.mT, U * S, rtol=0, atol=1e-10)


def test_complex_values():
    D = _matrix(20, 20, seed=5, dtype=torch.complex128)
    U, S, Vh = svds(st.SparseTensor.from_dense(D), 3)
    torch.testing.assert_close(S, torch.linalg.svdvals(D)[:3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(U.mH @ D @ Vh.mH, torch.diag(S).to(D.dtype), rtol=0, atol=1e-11)


def test_cond_matches_the_dense_condition_number_and_is_huge_when_singular():
    D = _matrix(30, 30, seed=7)
    A = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(cond(A), torch.linalg.cond(D), rtol=1e-9, atol=0)
    torch.testing.assert_close(A.condition_number(), torch.linalg.cond(D), rtol=1e-9, atol=0)
    Ds = D.clone()
    Ds[4] = 0
    c = cond(st.SparseTensor.from_dense(Ds))  # numerically singular: at least ~1/u, as the dense cond says
    assert torch.isinf(c) or c > 1e14, c


def test_gradients_of_singular_values_and_cond():
    D = _matrix(12, 12, seed=11, density=0.4)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: svds(A.with_values(v), 2, return_singular_vectors=False), (v,))
    assert torch.autograd.gradcheck(lambda v: cond(A.with_values(v)), (v,))
    # against the dense gradient of sigma_1 + sigma_2, sampled at the stored entries
    Dd = D.clone().requires_grad_()
    torch.linalg.svdvals(Dd)[:2].sum().backward()
    svds(A.with_values(v), 2, return_singular_vectors=False).sum().backward()
    (coords, slots) = A.entries()
    torch.testing.assert_close(v.grad[slots], Dd.grad[coords[0], coords[1]], rtol=1e-9, atol=1e-11)


def test_method_spelling_and_errors():
    D = _matrix(10, 8, seed=13)
    A = st.SparseTensor.from_dense(D)
    U, S, Vh = A.svd(2)  # torch-sla's spelling
    torch.testing.assert_close(S, torch.linalg.svdvals(D)[:2], rtol=1e-12, atol=1e-12)
    with pytest.raises(st.InputError, match=r"min\(m, n\) = 8"):
        svds(A, 8)
    S_small = svds(A, 2, which="SM", return_singular_vectors=False)  # non-square: the Gram route (session 32)
    torch.testing.assert_close(S_small, torch.linalg.svdvals(D)[-2:], rtol=1e-10, atol=1e-12)
    with pytest.raises(st.InputError, match="which"):
        svds(A, 2, which="LA")
    with pytest.raises(st.InputError, match="square"):
        cond(A)
    with pytest.raises(st.InputError, match="p=2"):
        cond(st.SparseTensor.from_dense(_matrix(5, 5, seed=1)), p=1)


# is_symmetric / is_hermitian / is_positive_definite (torch-sla's methods), against the dense definitions
def test_symmetry_questions_take_the_callers_tolerances():
    D = _matrix(15, 15, seed=17)
    S = D + D.T
    A = st.SparseTensor.from_dense(S)
    assert A.is_symmetric() and st.is_symmetric(A) and A.is_hermitian()
    assert not st.SparseTensor.from_dense(D).is_symmetric()
    i, j = [int(t) for t in ((S != 0) & ~torch.eye(15, dtype=torch.bool)).nonzero()[0]]
    P = S.clone()
    P[i, j] *= 1 + 1e-6  # within rtol=1e-5 of the transposed entry
    assert st.SparseTensor.from_dense(P).is_symmetric()
    assert not st.SparseTensor.from_dense(P).is_symmetric(atol=0, rtol=1e-9)
    one_sided = S.clone()
    one_sided[i, j], one_sided[j, i] = 1.0, 0.0  # stored on one side only: compared with 0
    assert not st.SparseTensor.from_dense(one_sided).is_symmetric()
    assert not st.SparseTensor.from_dense(_matrix(4, 6, seed=1)).is_symmetric()  # not square
    # duplicates of an unordered COO are summed first
    r, c = torch.tensor([0, 1, 0]), torch.tensor([1, 0, 1])
    dup = st.SparseTensor.from_coo(torch.tensor([1.0, 2.0, 1.0], dtype=DT), r, c, shape=(2, 2))
    assert dup.is_symmetric()
    H = torch.tensor([[2.0, 1 + 1j], [1 - 1j, 3.0]], dtype=torch.complex128)
    assert st.SparseTensor.from_dense(H).is_hermitian() and not st.SparseTensor.from_dense(H).is_symmetric()


@pytest.mark.parametrize("method", ["auto", "cholesky", "eigenvalue"])
def test_positive_definite_against_eigvalsh(method):
    g = torch.Generator().manual_seed(19)
    for trial in range(6):
        B = torch.randn(12, 12, generator=g, dtype=DT) * (torch.rand(12, 12, generator=g) < 0.3)
        S = B @ B.T + (0.5 if trial % 2 else -0.5) * torch.eye(12, dtype=DT) * float(torch.linalg.eigvalsh(B @ B.T)[3])
        want = bool(torch.linalg.eigvalsh(S)[0] > 0)
        assert st.SparseTensor.from_dense(S).is_positive_definite(method) == want, (trial, method)
    assert not st.SparseTensor.from_dense(_matrix(8, 8, seed=2)).is_positive_definite(method)  # not symmetric


def test_gershgorin_is_sufficient_only():
    dominant = torch.tensor([[4.0, 1, 0], [1, 3, 1], [0, 1, 2]], dtype=DT)
    assert st.SparseTensor.from_dense(dominant).is_positive_definite("gershgorin")
    spd_not_dominant = torch.tensor([[1.0, 0.9, 0.9], [0.9, 1, 0.9], [0.9, 0.9, 1]], dtype=DT)  # eigenvalues > 0
    A = st.SparseTensor.from_dense(spd_not_dominant)
    assert not A.is_positive_definite("gershgorin") and A.is_positive_definite()
    with pytest.raises(st.InputError, match="method"):
        A.is_positive_definite("sylvester")


def test_torch_matmul_of_two_sparse_tensors():
    D = _matrix(9, 9, seed=23)
    A = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(torch.matmul(A, A).to_dense(), D @ D)


# found by the session's outside sweep: repeated or vanishing singular values
@pytest.mark.parametrize("D", [torch.eye(6, dtype=DT), torch.diag(torch.tensor([1.0, 1, 2, 3, 3, 5], dtype=DT)),
                               torch.linalg.qr(torch.randn(6, 6, dtype=DT, generator=torch.Generator().manual_seed(1)))[0]],
                         ids=["identity", "repeated", "orthogonal"])
def test_repeated_singular_values_stay_nonnegative_and_orthonormal(D):
    A = st.SparseTensor.from_dense(D)
    ref = torch.linalg.svdvals(D)
    for which, want in (("LM", ref[:2]), ("SM", ref[-2:])):
        U, S, Vh = svds(A, 2, which=which)
        torch.testing.assert_close(S, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(U.mT @ U, torch.eye(2, dtype=DT), rtol=0, atol=1e-10)
        torch.testing.assert_close(Vh @ Vh.mT, torch.eye(2, dtype=DT), rtol=0, atol=1e-10)
        torch.testing.assert_close(D @ Vh.mT, U * S, rtol=0, atol=1e-10)
    torch.testing.assert_close(cond(A), torch.linalg.cond(D), rtol=1e-10, atol=0)


def test_rank_deficient_vectors_are_orthonormal():
    g = torch.Generator().manual_seed(2)
    D = torch.randn(6, 1, generator=g, dtype=DT) @ torch.randn(1, 4, generator=g, dtype=DT)
    U, S, Vh = svds(st.SparseTensor.from_dense(D), 2)
    torch.testing.assert_close(S, torch.linalg.svdvals(D)[:2], rtol=1e-10, atol=1e-12)
    assert bool((S >= 0).all())
    torch.testing.assert_close(U.mT @ U, torch.eye(2, dtype=DT), rtol=0, atol=1e-10)
    torch.testing.assert_close(Vh @ Vh.mT, torch.eye(2, dtype=DT), rtol=0, atol=1e-10)


def test_vector_gradients_raise_instead_of_vanishing():
    A = st.SparseTensor.from_dense(_matrix(8, 8, seed=31))
    v = A.values.detach().clone().requires_grad_()
    U, S, Vh = svds(A.with_values(v), 2)
    with pytest.raises(st.InputError, match="singular vectors"):
        U.sum().backward()
    g = torch.func.grad(lambda v: svds(A.with_values(v), 2, return_singular_vectors=False).sum())(v.detach())
    assert g.shape == v.shape


def test_positive_definite_refuses_two_batch_dims_whatever_the_values():
    D = torch.eye(3, dtype=DT).expand(1, 2, 3, 3).clone()
    A = st.SparseTensor.from_dense(D, batch_dims=2)
    for method in ("auto", "cholesky", "eigenvalue", "gershgorin"):
        with pytest.raises(st.InputError, match="one batch dimension"):
            A.is_positive_definite(method)
