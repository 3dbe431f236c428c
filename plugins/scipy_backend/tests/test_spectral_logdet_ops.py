"""The scipy eigsh / eigs / logdet plans through the core's user-facing ops (sparsetorch.eigsh,
eigs, slogdet, logdet), values and gradients against dense float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.testing.problems import poisson2d

from _helpers import poisson_scipy


@pytest.fixture(autouse=True)
def _loaded(scipy_backend):
    yield


def _random(n: int, seed: int, density: float = 0.3, symmetric: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < density)
    D += torch.diag(torch.randn(n, generator=g, dtype=torch.float64) + 3.0 * torch.sign(torch.randn(n, generator=g)))
    return (D + D.T) / 2 if symmetric else D


@pytest.mark.parametrize("seed", range(4))
def test_slogdet_and_gradient(seed) -> None:
    D = _random(20, seed)
    A = st.SparseTensor.from_dense(D)
    sign, logabs, info = st.slogdet(A, backend="scipy", return_info=True)
    ref_sign, ref_log = np.linalg.slogdet(D.numpy())
    assert (info.backend, info.method) == ("scipy", "lu")
    assert float(sign) == ref_sign and float(logabs) == pytest.approx(ref_log, rel=1e-12)
    v = A.values.detach().clone().requires_grad_(True)
    st.slogdet(A.with_values(v), backend="scipy")[1].backward()
    coords, slot = A.entries()
    expected = torch.linalg.inv(D).T[coords[0], coords[1]]  # d log|det A| / dA = A^-T on the pattern
    torch.testing.assert_close(v.grad[slot], expected, rtol=1e-10, atol=1e-12)


def test_logdet_gradcheck_and_poisson_64() -> None:
    A = poisson2d(5, 4)
    v = A.values.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: st.logdet(A.with_values(v), backend="scipy", cache=False), (v,))
    P = st.from_package(poisson_scipy(64, 2))
    value = st.logdet(P, backend="scipy")
    assert torch.isfinite(value) and float(value) > 0


@pytest.mark.parametrize("method", ["arpack", "lobpcg"])
def test_eigsh_values_and_eigenvalue_gradient(method) -> None:
    A = poisson2d(7, 6)
    D = A.to_dense()
    full = torch.linalg.eigvalsh(D)
    v = A.values.detach().clone().requires_grad_(True)
    w, V = st.eigsh(A.with_values(v), 3, which="SA", backend="scipy", method=method, tol=1e-10, properties="spd")
    torch.testing.assert_close(w.detach(), full[:3], rtol=1e-8, atol=1e-10)
    (w * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    Dv = D.clone().requires_grad_(True)
    (torch.linalg.eigvalsh(Dv)[:3] * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dv.grad[coords[0], coords[1]], rtol=1e-6, atol=1e-8)


def test_eigs_values_and_eigenvalue_gradient_with_left_vectors() -> None:
    D = _random(24, 11)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone().requires_grad_(True)
    w, V = st.eigs(A.with_values(v), 3, which="LR", backend="scipy", method="arpack")
    full = torch.linalg.eigvals(D)
    ref = full[torch.argsort(-full.real, stable=True)[:3]]
    torch.testing.assert_close(w.detach(), ref, rtol=1e-8, atol=1e-10)
    c = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    (w.real * c).sum().backward()
    Dv = D.clone().requires_grad_(True)
    wd = torch.linalg.eigvals(Dv)
    (wd[torch.argsort(-wd.real.detach(), stable=True)[:3]].real * c).sum().backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dv.grad[coords[0], coords[1]], rtol=1e-6, atol=1e-8)
