"""The torch backend's Krylov plans on a self-adjoint A (SPD / Hermitian, given or detected):
the backward pass's adjoint solve runs A itself and never builds the transposed CSR, gradients
still match dense autograd; a pattern whose values lose their symmetry gets a plan of its own."""

from __future__ import annotations

import torch

import sparsetorch as st
from sparsetorch.dispatch.plan import plan_cache
from sparsetorch.format import CSR
from sparsetorch.testing.problems import poisson2d


def test_spd_backward_reuses_the_forward_operator() -> None:
    plan_cache().clear()
    A = poisson2d(6)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(36, dtype=torch.float64, requires_grad=True)
    x = st.solve(A.with_values(v), b, backend="torch", method="cg", rtol=1e-12)
    x.square().sum().backward()
    (entry,) = [e for e in plan_cache().entries() if e.op == "solve"]
    state = plan_cache().plan(entry.key)
    plan = state.plan
    assert plan.hermitian and plan._mm._values_t is None  # no transposed CSR was built
    D = A.to_dense().detach().requires_grad_(True)
    b2 = b.detach().clone().requires_grad_(True)
    torch.linalg.solve(D, b2).square().sum().backward()
    coords, src = A.entries()
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(v.grad[src], D.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-9)


def test_complex_hermitian_backward_matches_dense() -> None:
    n = 5
    G = torch.randn(n, n, dtype=torch.complex128)
    H = G @ G.mH + n * torch.eye(n, dtype=torch.complex128)
    A = st.SparseTensor.from_dense(H, CSR)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(n, dtype=torch.complex128, requires_grad=True)
    x = st.solve(A.with_values(v), b, backend="torch", method="cg", rtol=1e-13, properties="spd")
    (x.abs() ** 2).sum().backward()
    D = H.clone().requires_grad_(True)
    b2 = b.detach().clone().requires_grad_(True)
    (torch.linalg.solve(D, b2).abs() ** 2).sum().backward()
    coords, src = A.entries()
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(v.grad[src], D.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-9)


def test_values_that_lose_symmetry_get_another_plan() -> None:
    """GMRES takes any matrix: symmetric values first (a self-adjoint plan), then values on the
    same pattern that are not symmetric must not reuse it (the adjoint would be A, not A^T)."""
    plan_cache().clear()
    A = poisson2d(5)
    b = torch.ones(25, dtype=torch.float64)
    st.solve(A, b, backend="torch", method="gmres", rtol=1e-12)
    D = A.to_dense()
    D = D + torch.triu(torch.ones_like(D), 1) * (D != 0) * 0.2  # same pattern, not symmetric
    coords, src = A.entries()
    vals = torch.zeros_like(A.values).index_put((src,), D[coords[0], coords[1]]).requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    st.solve(A.with_values(vals), bb, backend="torch", method="gmres", rtol=1e-12).square().sum().backward()
    plans = [plan_cache().plan(e.key).plan for e in plan_cache().entries() if e.op == "solve"]
    assert len(plans) == 2 and sorted(p.hermitian for p in plans) == [False, True]
    Dg = D.clone().requires_grad_(True)
    b2 = b.clone().requires_grad_(True)
    torch.linalg.solve(Dg, b2).square().sum().backward()
    torch.testing.assert_close(bb.grad, b2.grad, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(vals.grad[src], Dg.grad[coords[0], coords[1]], rtol=1e-7, atol=1e-9)
