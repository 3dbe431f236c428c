"""Gradients through ``sparsetorch.solve(..., backend="scipy")``: gradcheck in float64 for every
solver family, preconditioned ones included (the backward pass is one adjoint solve on the same
plan: transposed SuperLU solve, A^H with M^-H, the same AMG hierarchy)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.testing.problems import convection_diffusion, poisson2d


def _transpose_slots(A: st.SparseTensor) -> torch.Tensor:
    coords, slot = A.entries()
    n = A.format_shape[1]
    lin = coords[0] * n + coords[1]
    order = torch.argsort(lin)
    at = torch.searchsorted(lin[order], coords[1] * n + coords[0])
    perm = torch.arange(A.values.shape[-1])
    perm[slot] = slot[order[at]]
    return perm


@pytest.mark.parametrize(("method", "pre", "kind"), [
    ("lu", None, "general"),
    ("gmres", "ilu", "general"),
    ("bicgstab", "jacobi", "general"),
    ("gmres", "amg", "general"),
    ("cg", "amg", "spd"),
    ("amg", None, "spd"),
    ("minres", "jacobi", "spd"),
])
def test_gradcheck(scipy_backend, method, pre, kind) -> None:
    A = convection_diffusion(4, 3) if kind == "general" else poisson2d(4, 3)
    v = A.values.detach().clone().requires_grad_()
    b = torch.linspace(0.5, 1.5, 12, dtype=torch.float64).requires_grad_()
    perm = _transpose_slots(A)

    def f(values, rhs):
        if kind == "spd":  # stay symmetric under gradcheck's one-entry perturbations
            values = (values + values[perm]) / 2
        return st.solve(A.with_values(values), rhs, backend="scipy", method=method, preconditioner=pre, rtol=1e-12,
                        properties=None if kind == "general" else "spd", cache=False)

    x, info = st.solve(A, b.detach(), backend="scipy", method=method, preconditioner=pre, return_info=True,
                       properties=None if kind == "general" else "spd")
    assert (info.backend, info.method, info.preconditioner) == ("scipy", method, pre)
    atol = 1e-7 if method == "lu" else 1e-5
    assert torch.autograd.gradcheck(f, (v, b), atol=atol, rtol=1e-3)


def test_complex_gradient_matches_dense(scipy_backend) -> None:
    A = convection_diffusion(4, 3, dtype=torch.complex128)
    v = A.values.detach().clone().requires_grad_()
    b = torch.ones(12, dtype=torch.complex128, requires_grad=True)
    x = st.solve(A.with_values(v), b, backend="scipy", method="lu")
    gv, gb = torch.autograd.grad((x.abs() ** 2).sum(), (v, b))
    vd, bd = v.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    xd = torch.linalg.solve(A.with_values(vd).to_dense(), bd)
    gvd, gbd = torch.autograd.grad((xd.abs() ** 2).sum(), (vd, bd))
    torch.testing.assert_close(gb, gbd)
    torch.testing.assert_close(gv, gvd)
