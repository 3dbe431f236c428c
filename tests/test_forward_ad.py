"""Forward-mode derivatives (jvp) of solve and matmul: against dense torch in float64, through
torch.func.jvp, torch.autograd.forward_ad dual tensors (gradcheck's forward mode), and
forward-over-reverse (Hessian-vector products through the adjoint solve)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSR


def _matrix(n: int = 12, fmt=CSR, complex_: bool = False):
    g = torch.Generator().manual_seed(0)
    D = torch.diag(torch.full((n,), 4.0, dtype=torch.float64))
    D += torch.diag(torch.full((n - 1,), -1.0, dtype=torch.float64), 1)
    D += torch.diag(torch.full((n - 1,), -2.0, dtype=torch.float64), -1)
    D[0, n - 1] = 0.5
    if complex_:
        D = D.to(torch.complex128)
        D += 0.3j * torch.diag(torch.ones(n, dtype=torch.float64))
    A = st.SparseTensor.from_dense(D, format=fmt)
    b = torch.randn(n, 2, generator=g, dtype=torch.float64).to(D.dtype)
    return A, b


def _dense(A: st.SparseTensor, v: torch.Tensor) -> torch.Tensor:
    coords, slot = A.entries()
    m, n = A.format_shape
    D = torch.zeros(m * n, dtype=v.dtype)
    return D.index_add(0, coords[0] * n + coords[1], v[slot]).reshape(m, n)


@pytest.mark.parametrize("fmt", [CSR, COO], ids=["csr", "coo"])
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("method", ["lu", "gmres"])
def test_solve_jvp_matches_dense(fmt, complex_, method) -> None:
    A, b = _matrix(fmt=fmt, complex_=complex_)
    v = A.values.clone()
    g = torch.Generator().manual_seed(1)
    dv = torch.randn(v.shape, generator=g, dtype=torch.float64).to(v.dtype)
    db = torch.randn(b.shape, generator=g, dtype=torch.float64).to(b.dtype)
    kw = dict(method=method, rtol=1e-13) if method != "lu" else dict(method="lu")
    x, dx = torch.func.jvp(lambda v, b: st.solve(A.with_values(v), b, **kw), (v, b), (dv, db))
    xr, dxr = torch.func.jvp(lambda v, b: torch.linalg.solve(_dense(A, v), b), (v, b), (dv, db))
    torch.testing.assert_close(x, xr, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(dx, dxr, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_matmul_jvp_matches_dense(complex_) -> None:
    A, X = _matrix(complex_=complex_)
    v = A.values.clone()
    dv, dX = torch.randn_like(v), torch.randn_like(X)
    y, dy = torch.func.jvp(lambda v, X: st.matmul(A.with_values(v), X), (v, X), (dv, dX))
    yr, dyr = torch.func.jvp(lambda v, X: _dense(A, v) @ X, (v, X), (dv, dX))
    torch.testing.assert_close(y, yr, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(dy, dyr, rtol=1e-12, atol=1e-13)


def test_gradcheck_forward_mode() -> None:
    A, b = _matrix(n=8)
    v = A.values.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, b: st.solve(A.with_values(v), b, method="lu"), (v, b),
                                    check_forward_ad=True)
    assert torch.autograd.gradcheck(lambda v, b: st.matmul(A.with_values(v), b), (v, b), check_forward_ad=True)


def test_hessian_vector_product_through_the_adjoint_solve() -> None:
    """jvp of grad (forward over reverse): the backward's adjoint solve and SDDMM get tangents too."""
    A, b = _matrix(n=10)
    b = b[:, 0]
    v = A.values.clone()
    dv = torch.randn_like(v)

    def loss(v, solve):
        x = solve(v)
        return (x * x).sum() + (x * b).sum()

    ours = lambda v: loss(v, lambda v: st.solve(A.with_values(v), b, method="lu"))  # noqa: E731
    ref = lambda v: loss(v, lambda v: torch.linalg.solve(_dense(A, v), b))  # noqa: E731
    _, hv = torch.func.jvp(torch.func.grad(ours), (v,), (dv,))
    _, hv_ref = torch.func.jvp(torch.func.grad(ref), (v,), (dv,))
    torch.testing.assert_close(hv, hv_ref, rtol=1e-8, atol=1e-10)


def test_jacfwd_equals_jacrev_and_dense() -> None:
    """jacfwd = vmap over jvp: the jvp rules under the Functions' vmap rules."""
    A, b = _matrix(n=8)
    b = b[:, 0]
    v = A.values.clone()
    f = lambda v: st.solve(A.with_values(v), b, method="lu")  # noqa: E731
    Jf = torch.func.jacfwd(f)(v)
    torch.testing.assert_close(Jf, torch.func.jacrev(f)(v), rtol=1e-10, atol=1e-12)
    ref = torch.func.jacfwd(lambda v: torch.linalg.solve(_dense(A, v), b))(v)
    torch.testing.assert_close(Jf, ref, rtol=1e-9, atol=1e-11)
    g = lambda X: st.matmul(A, X)  # noqa: E731
    torch.testing.assert_close(torch.func.jacfwd(g)(b), _dense(A, A.values), rtol=1e-13, atol=1e-13)
