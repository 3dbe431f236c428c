"""svds(which="SM") where session 31 left it refusing or raising (session 32): non-square matrices, a null space
larger than k, exactly singular square matrices. Every triplet is checked against the dense SVD (numpy, float64 /
complex128): the values, A v = s u and A^H u = s v, orthonormal U and V."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.ops import svd as svd_module

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _triplets_ok(A, U, S, Vh, k, which="SM"):
    D = A.toarray()
    U, S, V = U.resolve_conj().numpy(), S.numpy(), Vh.resolve_conj().numpy().conj().T
    sv = np.sort(np.linalg.svd(D, compute_uv=False))
    ref = sv[:k] if which == "SM" else sv[-k:]
    np.testing.assert_allclose(np.sort(S), ref, atol=1e-10 * max(1.0, ref.max()), rtol=0)
    scale = np.abs(D).max()
    assert np.linalg.norm(D @ V - U * S, axis=0).max() <= 1e-9 * scale
    assert np.linalg.norm(D.conj().T @ U - V * S, axis=0).max() <= 1e-9 * scale
    np.testing.assert_allclose(U.conj().T @ U, np.eye(k), atol=1e-10)
    np.testing.assert_allclose(V.conj().T @ V, np.eye(k), atol=1e-10)


@pytest.mark.parametrize("shape", [(400, 150), (150, 400)])
@pytest.mark.parametrize("seed", [0, 1])
def test_smallest_of_a_rectangular_matrix(shape, seed):
    A = sp.random(*shape, density=0.05, format="csr", random_state=seed) + sp.eye(*shape)
    U, S, Vh = st.svds(st.SparseTensor.from_package(sp.csr_matrix(A)), 4, which="SM")
    _triplets_ok(A, U, S, Vh, 4)


def test_smallest_of_a_complex_rectangular_matrix():
    A = sp.csr_matrix(sp.random(200, 90, 0.06, random_state=3) + 1j * sp.random(200, 90, 0.06, random_state=4))
    U, S, Vh = st.svds(st.SparseTensor.from_package(A), 3, which="SM")
    _triplets_ok(A, U, S, Vh, 3)


def test_a_tall_rank_deficient_matrix_gives_its_zero_singular_value():
    """Two equal columns: sigma_min = 0, and its left vector must lie in the null space of A^H (the SVD of A V alone
    gives any vector orthogonal to A V there). SciPy 1.x's svds misses this zero on such matrices."""
    A = sp.lil_matrix(sp.random(300, 60, 0.08, random_state=7) + sp.eye(300, 60))
    A[:, 5] = A[:, 9]
    A = sp.csr_matrix(A)
    U, S, Vh = st.svds(st.SparseTensor.from_package(A), 3, which="SM")
    _triplets_ok(A, U, S, Vh, 3)
    assert float(S.min()) <= 1e-12


@pytest.mark.parametrize("shape", [(120, 120), (200, 90), (90, 200)])
def test_a_null_space_larger_than_k(shape):
    """diag(1..5, 0, ..., 0): the dilation's null space has any basis (all [u; 0] possible); the answer is k zero
    singular values with vectors from both null spaces (session 31 raised NotConvergedError)."""
    d = np.r_[1.0, 2, 3, 4, 5, np.zeros(min(shape) - 5)]
    A = sp.csr_matrix(sp.diags(d, shape=shape))
    U, S, Vh = st.svds(st.SparseTensor.from_package(A), 5, which="SM")
    _triplets_ok(A, U, S, Vh, 5)
    assert float(S.max()) <= 1e-12


def test_an_exactly_singular_square_matrix():
    """A zero row and a zero column: shift-invert at exactly 0 met a zero pivot; now shift-invert just below 0 (or the
    Gram route) answers with S containing 0, and cond is at least 1 / u."""
    A = sp.lil_matrix(sp.random(150, 150, 0.05, random_state=11) + 2 * sp.eye(150))
    A[17, :] = 0
    A[:, 40] = 0
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    T = st.SparseTensor.from_package(A)
    U, S, Vh = st.svds(T, 2, which="SM")
    _triplets_ok(A, U, S, Vh, 2)
    assert float(S.min()) <= 1e-12
    assert float(st.cond(T)) >= 1 / np.finfo(np.float64).eps


def test_the_smallest_values_are_differentiable_through_the_gram_route():
    A = sp.csr_matrix(sp.random(60, 25, 0.2, random_state=5) + sp.eye(60, 25))
    T = st.SparseTensor.from_package(A)
    v = T.values.clone().requires_grad_()
    svd_module.svds(T.with_values(v), 2, which="SM", return_singular_vectors=False).sum().backward()
    D = torch.from_numpy(A.toarray()).requires_grad_()
    torch.linalg.svdvals(D)[-2:].sum().backward()
    (coords, slots) = T.entries()
    torch.testing.assert_close(v.grad[slots], D.grad[coords[0], coords[1]], rtol=1e-8, atol=1e-10)


def test_a_gram_matrix_too_full_is_refused_before_it_is_formed():
    """One dense row of 8000 entries bounds A^H A at 6.4e7 entries (> GRAM_MAX_ENTRIES): an InputError naming the
    bound and what to do, before any product."""
    n = 8000
    rows = np.r_[np.zeros(n, dtype=np.int64), np.arange(1, n + 1)]
    cols = np.r_[np.arange(n), np.arange(n)]
    A = sp.csr_matrix((np.ones(2 * n), (rows, cols)), shape=(n + 1, n))
    with pytest.raises(st.InputError, match="GRAM_MAX_ENTRIES"):
        st.svds(st.SparseTensor.from_package(A), 2, which="SM")


@pytest.mark.parametrize("shape", [(2000, 150), (150, 2000)])
def test_largest_of_a_strongly_rectangular_matrix_through_the_gram_route(shape):
    A = sp.csr_matrix(sp.random(*shape, density=0.01, random_state=2))
    T = st.SparseTensor.from_package(A)
    assert svd_module._gram_first(T)
    U, S, Vh = st.svds(T, 5)
    _triplets_ok(A, U, S, Vh, 5, "LM")


def test_largest_past_the_rank_through_the_gram_route():
    """Rank 3, k = 5: two zero singular values among the 'largest', their left vectors from the null space of A^H."""
    L = sp.random(400, 3, density=0.2, random_state=8)
    R = sp.random(3, 40, density=0.1, random_state=9)
    A = sp.csr_matrix(L @ R)
    assert np.linalg.matrix_rank(A.toarray()) == 3
    T = st.SparseTensor.from_package(A)
    assert svd_module._gram_first(T)
    U, S, Vh = st.svds(T, 5)
    _triplets_ok(A, U, S, Vh, 5, "LM")
    assert float(S.min()) <= 1e-10 * float(S.max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("which, shape", [("SM", (300, 80)), ("SM", (80, 300)), ("SM", (120, 120)), ("LM", (1200, 100))])
def test_svds_routes_on_cuda(which, shape):
    """The Gram route (spgemm, shift-invert / Lanczos on the device) and the dilation, on CUDA values: the same
    triplets as the dense SVD (numpy, float64)."""
    A = sp.csr_matrix(sp.random(*shape, density=0.05, random_state=1) + sp.eye(*shape))
    T = st.SparseTensor.from_package(A).to("cuda")
    U, S, Vh = st.svds(T, 3, which=which)
    assert U.device.type == "cuda" and S.device.type == "cuda"
    _triplets_ok(A, U.cpu(), S.cpu(), Vh.cpu(), 3, which)
