"""eigsh eigenvector gradients at a repeated eigenvalue (session 27's sweep): a loss that reads some
vectors of the eigenspace and not others has no gradient and raises DegenerateEigenvalueError,
whether the unread copy is computed (k=3) or not (k=2); a loss of the whole eigenspace (the
projector's diagonal) keeps its gradient, checked against a dense float64 reference.

The matrix is the 4 x 4 grid Laplacian, whose eigenvalue 2 - 2 cos(pi/5) + 2 - 2 cos(2 pi/5) = 1.7639
has two copies. The loss (v_1^2 * arange(16)).sum() is constant (7.5) on that eigenspace, so its
first-order rotation coupling is exactly zero: the old check let it through with a different
gradient for every method, and with k=2 the singular but consistent bordered system's LU returned
an arbitrary component along the missing copy."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import DegenerateEigenvalueError

N = 16
WEIGHTS = torch.arange(N, dtype=torch.float64)


def _methods():
    out = [None, "dense", "lanczos"]
    if "scipy" in st.registry().names:
        out.append("arpack")
    return out


METHODS = _methods()


def _grid(dtype=torch.float64):
    m = 4
    T = 2 * torch.eye(m, dtype=torch.float64) - torch.diag(torch.ones(m - 1, dtype=torch.float64), 1) \
        - torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)
    I = torch.eye(m, dtype=torch.float64)
    D = torch.kron(T, I) + torch.kron(I, T)
    r, c = D.nonzero(as_tuple=True)
    return D, r, c, D[r, c].to(dtype)


def _eigsh(v, r, c, k, method, **kw):
    A = st.SparseTensor.from_coo(v, r, c, shape=(N, N))
    opts = {} if method is None else {"method": method}
    if method == "lanczos":
        opts["tol"] = 1e-12
    return st.eigsh(A, k, which="SA", **opts, **kw)


def _reference(D, cols, grads, r, c):
    """dL/dA on the stored entries, from a dense float64 eigendecomposition: for each computed vector
    x_i with gradient g_i, q_i = sum over the eigenpairs at another eigenvalue of u_j (u_j^T g_i) /
    (w_i - w_j), and dA[r, c] = sum_i (q_i[r] x_i[c] + x_i[r] q_i[c]) / 2."""
    W, U = torch.linalg.eigh(D)
    ref = torch.zeros(r.numel(), dtype=torch.float64)
    for (wi, x), g in zip(cols, grads):
        far = (W - wi).abs() > 1e-8
        q = U[:, far] @ ((U[:, far].T @ g) / (wi - W[far]))
        ref = ref + 0.5 * (q[r] * x[c] + x[r] * q[c])
    return ref


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("method", METHODS)
def test_loss_reading_one_vector_of_a_repeated_pair_raises(method, k):
    _, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, k, method)
    assert abs(float(w[1].detach()) - 1.7639320225002102) < 1e-9
    loss = (V[:, 1] ** 2 * WEIGHTS).sum()  # 7.5 for every unit vector of the eigenspace
    match = "not among the" if k == 2 else "reads eigenvector 1 and not eigenvector 2"
    with pytest.raises(DegenerateEigenvalueError, match=match):
        torch.autograd.grad(loss, v)


@pytest.mark.parametrize("k", [2, 3])
def test_loss_reading_one_vector_of_a_repeated_pair_raises_in_float32(k):
    _, r, c, v0 = _grid(torch.float32)
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, k, "dense")
    loss = (V[:, 1] ** 2 * WEIGHTS.float()).sum()
    with pytest.raises(DegenerateEigenvalueError):
        torch.autograd.grad(loss, v)


def test_missing_copy_raises_with_a_mass_matrix_too():
    _, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    idx = torch.arange(N)
    M = st.SparseTensor.from_coo(torch.full((N,), 4.0, dtype=torch.float64), idx, idx, shape=(N, N))
    A = st.SparseTensor.from_coo(v, r, c, shape=(N, N))
    w, V = st.eigsh(A, 2, M=M, which="SA", method="dense")
    with pytest.raises(DegenerateEigenvalueError, match="not among the"):
        torch.autograd.grad((V[:, 1] ** 2 * WEIGHTS).sum(), v)


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("method", METHODS)
def test_projector_loss_at_a_repeated_pair_matches_a_dense_reference(method, k):
    D, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, k, method)
    loss = ((V[:, 1:3] ** 2).sum(1) * WEIGHTS).sum()  # the weighted diagonal of the eigenspace's projector
    g = torch.autograd.grad(loss, v)[0]
    Vd = V.detach()
    cols = [(float(w[i].detach()), Vd[:, i]) for i in (1, 2)]
    ref = _reference(D, cols, [2 * WEIGHTS * x for _, x in cols], r, c)
    torch.testing.assert_close(g, ref, rtol=1e-7, atol=1e-8)


def test_projector_reference_against_finite_differences():
    # the reference above, checked once against central differences of the dense projector along a
    # symmetric direction (the pair stays apart from the rest of the spectrum)
    D, r, c, _ = _grid()
    W, U = torch.linalg.eigh(D)
    S = (W - W[1]).abs() < 1e-8
    assert int(S.sum()) == 2
    ref = _reference(D, [(float(W[1]), U[:, i]) for i in torch.nonzero(S).flatten().tolist()],
                     [2 * WEIGHTS * U[:, i] for i in torch.nonzero(S).flatten().tolist()], r, c)
    E = torch.zeros(N, N, dtype=torch.float64)
    E[r, c] = torch.cos((r * 3 + c * 3 + r * c).to(torch.float64))
    E = E + E.T

    def proj_loss(A):
        w, u = torch.linalg.eigh(A)
        return ((u[:, 1:3] ** 2).sum(1) * WEIGHTS).sum()

    h = 1e-5
    fd = (proj_loss(D + h * E) - proj_loss(D - h * E)) / (2 * h)
    assert abs(float((ref * E[r, c]).sum() - fd)) < 1e-6 * max(1.0, abs(float(fd)))


@pytest.mark.parametrize("method", METHODS)
def test_norm_of_one_vector_of_a_split_pair_has_zero_gradient(method):
    # a loss whose gradient lies along the vector itself (its norm) exists even with the copy missing
    _, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, 2, method)
    g = torch.autograd.grad(7.5 * (V[:, 1] ** 2).sum() + w.sum(), v)[0]
    vv = v.clone().requires_grad_()
    w2, _ = _eigsh(vv, r, c, 2, method)
    torch.testing.assert_close(g, torch.autograd.grad(w2.sum(), vv)[0], rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_ignored_missing_copy_drops_its_coupling_on_a_consistent_singular_system(method):
    # degenerate="ignore": the bordered system is singular but LU does not say so; the coupling to the
    # missing copy is dropped (projected out), the same for every method
    D, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, 2, method, degenerate="ignore")
    x = V[:, 1]
    g = torch.autograd.grad((x ** 2 * WEIGHTS).sum(), v)[0]
    xd = x.detach()
    ref = _reference(D, [(float(w[1].detach()), xd)], [2 * WEIGHTS * xd], r, c)
    torch.testing.assert_close(g, ref, rtol=1e-7, atol=1e-8)


def test_warn_policy_warns_for_an_unread_copy():
    _, r, c, v0 = _grid()
    v = v0.clone().requires_grad_()
    w, V = _eigsh(v, r, c, 3, "dense", degenerate="warn")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        torch.autograd.grad((V[:, 1] ** 2 * WEIGHTS).sum(), v)
    assert any("not eigenvector 2" in str(x.message) for x in rec)


def test_near_repeated_pair_outside_the_computed_ones_keeps_its_gradient():
    # the copies split by ~1e-6 (above degenerate_tol * max|w|): the gradient exists, large but finite
    D, r, c, v0 = _grid()
    bump = torch.zeros(N, dtype=torch.float64)
    bump[0] = 3e-6
    Dp = D + torch.diag(bump)
    vp = Dp[r, c].clone().requires_grad_()
    W = torch.linalg.eigvalsh(Dp)
    assert 1e-8 * 1.8 < float(W[2] - W[1]) < 1e-5
    w, V = _eigsh(vp, r, c, 2, "dense")
    x = V[:, 1]
    g = torch.autograd.grad((x ** 2 * WEIGHTS).sum(), vp)[0]
    xd = x.detach()
    ref = _reference(Dp, [(float(w[1].detach()), xd)], [2 * WEIGHTS * xd], r, c)
    torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5)
