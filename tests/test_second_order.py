"""Second derivatives (session 21's gradient sweep): where a rule exists it matches a dense
float64 reference; where it does not (a gradient computed by solves outside autograd) a second
differentiation raises NotImplementedError naming the op instead of reading the gradient as a
constant (slogdet's Hessian came back as zero, det's and eigsh's eigenvector Hessians wrong)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

D = torch.tensor([[4., 1, 0, 0], [1, 5, 1, 0], [0, 2, 6, 1], [0, 0, 1, 7]], dtype=torch.float64)
S = D + D.T


def _second(f, v, u=None):
    g = torch.autograd.grad(f(v), v, create_graph=True)[0]
    u = torch.linspace(-1, 1, v.numel(), dtype=v.dtype) if u is None else u
    return torch.autograd.grad((g * u).sum(), v)[0]


@pytest.mark.parametrize("name,f", [
    ("slogdet", lambda A, v: st.slogdet(A.with_values(v))[1]),
    ("slogdet", lambda A, v: st.logdet(A.with_values(v))),
    ("slogdet", lambda A, v: st.det(A.with_values(v))),
    ("lstsq", lambda A, v: st.lstsq(A.with_values(v), torch.ones(4, dtype=torch.float64)).sum()),
    ("eigsh", lambda A, v: (st.eigsh(A.with_values(v), 1, which="SA")[1][:, 0] @ torch.arange(4.0, dtype=torch.float64)) ** 2),
    ("eigs", lambda A, v: st.eigs(A.with_values(v), 1, which="LM")[0].real.sum()),
])
def test_second_derivative_without_a_rule_raises(name, f):
    A = st.SparseTensor.from_dense(S if name == "eigsh" else D)
    v = A.values.clone().requires_grad_()
    g = torch.autograd.grad(f(A, v), v, create_graph=True)[0]  # the first derivative works with create_graph
    assert torch.isfinite(g).all()
    with pytest.raises(NotImplementedError, match=name):
        torch.autograd.grad(g.sum(), v)


def test_nonlinear_solve_second_derivative_raises():
    A = st.SparseTensor.from_dense(D)
    c = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    u = st.nonlinear_solve(lambda u, c: A @ u + c * u ** 3 - 1, torch.zeros(4, dtype=torch.float64), (c,))
    g = torch.autograd.grad(u.sum(), c, create_graph=True)[0]
    with pytest.raises(NotImplementedError, match="nonlinear_solve"):
        torch.autograd.grad(g, c)


def test_eigenvalue_hessian_matches_dense():
    A = st.SparseTensor.from_dense(S)
    r, c = S.nonzero(as_tuple=True)
    u = torch.cos((r + c).to(torch.float64))  # a symmetric direction (eigsh's matrices stay symmetric)
    v = A.values.clone().requires_grad_()
    H = _second(lambda v: st.eigsh(A.with_values(v), 2, which="SA")[0].sum(), v, u)
    vr = A.values.clone().requires_grad_()
    def dense(v):
        X = torch.zeros(4, 4, dtype=torch.float64).index_put((r, c), v)
        return (X + X.T) / 2  # eigsh reads A as symmetric: w(A) = w((A + A^T) / 2)

    Hr = _second(lambda v: torch.linalg.eigvalsh(dense(v))[:2].sum(), vr, u)
    torch.testing.assert_close(H, Hr, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_eigenvector_gradient_is_hermitian_in_the_stored_entries(dtype):
    # eigsh reads A as Hermitian (w(A) = w((A + A^H) / 2)): an entry's gradient is its mirror's
    # conjugate, so a gradient step on independently stored values keeps A Hermitian (the
    # eigenvector part was q_i v_i^H alone: the step made A non-symmetric, and eigsh then refused it)
    n = 8
    H = torch.diag(torch.arange(1.0, n + 1, dtype=torch.float64)).to(dtype)
    off = torch.full((n - 1,), 0.4, dtype=torch.float64).to(dtype) * (1j if dtype.is_complex else 1)
    H = H + torch.diag(off, 1) + torch.diag(off.conj(), -1)
    A = st.SparseTensor.from_dense(H)
    r, c = (H != 0).nonzero(as_tuple=True)
    z = torch.linspace(-1, 2, n, dtype=torch.float64).to(dtype)

    def loss(V):
        return (V[:, 0].conj() @ z).abs() ** 2

    v = A.values.clone().requires_grad_()
    g = torch.autograd.grad(loss(st.eigsh(A.with_values(v), 2, which="SA")[1]), v)[0]

    def dense(v):
        X = torch.zeros(n, n, dtype=dtype).index_put((r, c), v)
        return (X + X.mH) / 2

    vr = A.values.clone().requires_grad_()
    gr = torch.autograd.grad(loss(torch.linalg.eigh(dense(vr))[1]), vr)[0]
    torch.testing.assert_close(g, gr, rtol=1e-8, atol=1e-10)
    mirror = {(int(i), int(j)): k for k, (i, j) in enumerate(zip(r, c))}
    for k, (i, j) in enumerate(zip(r.tolist(), c.tolist())):
        torch.testing.assert_close(g[k], g[mirror[(j, i)]].conj())
