"""The eigenvalue and determinant suites (``eigsh``, ``eigs``, ``slogdet``/``logdet``).

Same pattern as the solve suite: a backend's test module names the backend (and what its
declaration does not say), the kit checks every answer against dense float64 oracles
(``torch.linalg.eigh``/``eigvals``/``slogdet``) and every gradient with ``gradcheck``::

    class MySpectral:
        backend = "mine"                 # eigsh_methods, eigs_methods, logdet_methods default to
        eigsh_which = ("LA", "SA")       # the backend's declared ops["eigsh"/"eigs"/"logdet"]
        supports_sigma = True            # shift-invert
        supports_generalized = True      # A v = w M v

    class TestMyEigsh(MySpectral, EigshConformance): ...
    class TestMyLogdet(MySpectral, LogdetConformance): ...

Symmetric test matrices are random sparse with a spread diagonal (well separated eigenvalues:
grid Laplacians have repeated ones, where eigenvectors are not unique), and gradients are
checked through a symmetric parametrization (the lower triangle), the only perturbations that
keep the problem symmetric.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch

import sparsetorch as st

from ...format import CSR, TensorFormat
from ..problems import poisson2d
from .base import REQUIREMENT_WORDS, ConformanceBase, from_backend_info

__all__ = ["EigshConformance", "EigsConformance", "LogdetConformance", "SymmetricFamily"]


class SymmetricFamily:
    """``A(p)``: a symmetric (Hermitian) sparse matrix built from its lower-triangle values ``p``."""

    def __init__(self, n: int, *, seed: int = 0, density: float = 0.2, dtype=torch.float64, device="cpu",
                 diagonal: torch.Tensor | None = None, fmt: TensorFormat = CSR) -> None:
        g = torch.Generator().manual_seed(seed)
        mask = torch.rand(n, n, generator=g) < density
        mask = torch.tril(mask | mask.T | torch.eye(n, dtype=torch.bool))
        self.rows, self.cols = torch.nonzero(mask, as_tuple=True)
        self.n, self.fmt, self.device = n, fmt, device
        diag = self.rows == self.cols
        p = torch.randn(self.rows.numel(), generator=g, dtype=torch.float64)
        spread = torch.arange(n, dtype=torch.float64) * 1.5 if diagonal is None else diagonal
        p[diag] += spread[self.rows[diag]]
        if dtype.is_complex:
            p = p.to(torch.complex128) + 1j * torch.randn(p.shape, generator=g, dtype=torch.float64) * (~diag)
        self.off = (~diag).to(device)
        self.rows, self.cols = self.rows.to(device), self.cols.to(device)
        self.p0 = p.to(dtype=dtype, device=device)

    def build(self, p: torch.Tensor) -> st.SparseTensor:
        if p.is_complex():
            p = torch.where(self.off, p, p.real.to(p.dtype))
        r = torch.cat([self.rows, self.cols[self.off]])
        c = torch.cat([self.cols, self.rows[self.off]])
        v = torch.cat([p, p[self.off].conj()])
        A = st.SparseTensor.from_coo(v, r, c, shape=(self.n, self.n), format=CSR)
        return A if self.fmt == CSR else A.convert(self.fmt)


def _pick(w_all: torch.Tensor, k: int, which: str, sigma=None) -> torch.Tensor:
    key = w_all if sigma is None else 1.0 / (w_all - sigma)
    order = {"LA": -key, "SA": key, "LM": -key.abs(), "SM": key.abs()}[which]
    return w_all[torch.argsort(order, stable=True)[:k]].sort().values


class _SpectralBase(ConformanceBase):
    #: Methods per op; default: what the backend declares for ``eigsh``, ``eigs`` and ``logdet``.
    eigsh_methods: ClassVar[tuple[str, ...]] = from_backend_info(lambda info, cls: info.methods("eigsh"), ())
    eigs_methods: ClassVar[tuple[str, ...]] = from_backend_info(lambda info, cls: info.methods("eigs"), ())
    logdet_methods: ClassVar[tuple[str, ...]] = from_backend_info(lambda info, cls: info.methods("logdet"), ())
    #: The ``which`` values ``eigsh`` is tested with (not in BackendInfo).
    eigsh_which: ClassVar[tuple[str, ...]] = ("LA", "SA", "LM")
    supports_sigma: ClassVar[bool] = True
    supports_generalized: ClassVar[bool] = False
    eig_n: ClassVar[int] = 40
    eig_tol: ClassVar[dict] = {torch.float64: 1e-8, torch.float32: 1e-3, torch.complex128: 1e-8, torch.complex64: 1e-3}

    def _axes(self) -> dict[str, tuple[list, str, str | None]]:
        extra = {"eig_method": (list(self.eigsh_methods), "none listed", "eigsh_methods"),
                 "which": (list(self.eigsh_which), "none listed", None),
                 "eigs_method": (list(self.eigs_methods), "none listed", "eigs_methods"),
                 "det_method": (list(self.logdet_methods), "none listed", "logdet_methods")}
        return {**extra, **super()._axes()}


class EigshConformance(_SpectralBase):
    def test_eigsh_matches_dense(self, eig_method, which, dtype, device):
        fam = SymmetricFamily(self.eig_n, seed=1, dtype=dtype, device=device)
        A = fam.build(fam.p0)
        w, V = st.eigsh(A, 3, which=which, backend=self.backend, method=eig_method)
        D = A.to_dense().to(torch.complex128 if dtype.is_complex else torch.float64).cpu()
        ref = _pick(torch.linalg.eigvalsh(D), 3, which)
        tol = self.eig_tol[dtype] * float(ref.abs().max())
        assert w.shape == (3,) and V.shape == (self.eig_n, 3)
        assert float((w.cpu().double() - ref).abs().max()) <= tol, f"{self.backend}/{eig_method}: {w} vs {ref}"
        Vd = V.cpu().to(D.dtype)
        resid = torch.linalg.matrix_norm(D @ Vd - Vd * w.cpu().double())
        assert float(resid) <= 10 * tol, f"{self.backend}/{eig_method}: ||AV - VW|| = {float(resid):.3g}"
        torch.testing.assert_close(Vd.mH @ Vd, torch.eye(3, dtype=D.dtype), atol=10 * self.eig_tol[dtype], rtol=0)

    def test_eigsh_formats(self, eig_method, fmt, device):
        fam = SymmetricFamily(self.eig_n, seed=2, fmt=fmt, device=device)
        w, _ = st.eigsh(fam.build(fam.p0), 2, which="LA", backend=self.backend, method=eig_method)
        ref = torch.linalg.eigvalsh(fam.build(fam.p0).to_dense().cpu())[-2:]
        torch.testing.assert_close(w.cpu(), ref, rtol=1e-8, atol=1e-8)

    def test_eigsh_shift_invert(self, eig_method, device):
        self.need("supports_sigma")
        fam = SymmetricFamily(self.eig_n, seed=3, device=device)
        A = fam.build(fam.p0)
        w_all = torch.linalg.eigvalsh(A.to_dense().cpu())
        sigma = float(w_all[10] + 0.3 * (w_all[11] - w_all[10]))
        w, _ = st.eigsh(A, 3, sigma=sigma, backend=self.backend, method=eig_method)
        torch.testing.assert_close(w.cpu(), _pick(w_all, 3, "LM", sigma), rtol=1e-8, atol=1e-8)

    def test_eigsh_generalized(self, eig_method, device):
        self.need("supports_generalized")
        import scipy.linalg

        fam = SymmetricFamily(30, seed=4, device=device, diagonal=torch.arange(30, dtype=torch.float64) + 40)
        mfam = SymmetricFamily(30, seed=5, density=0.1, device=device, diagonal=torch.full((30,), 30.0))
        A, M = fam.build(fam.p0), mfam.build(mfam.p0)
        w, V = st.eigsh(A, 3, M=M, which="SA", backend=self.backend, method=eig_method, properties="spd")
        ref = scipy.linalg.eigh(A.to_dense().cpu().numpy(), M.to_dense().cpu().numpy(), eigvals_only=True)[:3]
        np.testing.assert_allclose(w.cpu().numpy(), ref, rtol=1e-6)
        Vd = V.cpu()
        torch.testing.assert_close(Vd.T @ M.to_dense().cpu() @ Vd, torch.eye(3, dtype=Vd.dtype), atol=1e-6, rtol=0)

    def test_eigsh_gradcheck_values_and_vectors(self, eig_method, device):
        self.need_grad()
        fam = SymmetricFamily(16, seed=6, device=device)
        x = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
        wts = torch.tensor([1.0, 2.0], dtype=torch.float64, device=device)

        def loss(p):
            w, V = st.eigsh(fam.build(p), 2, which="LA", backend=self.backend, method=eig_method, tol=1e-14)
            return (w ** 2).sum() + (((V * x[:, None]).sum(0) ** 2) * wts).sum()

        p = fam.p0.clone().requires_grad_()
        assert torch.autograd.gradcheck(loss, (p,), eps=1e-6, atol=1e-5, rtol=1e-5)

    def test_eigsh_value_batch(self, eig_method, device):
        self.need("supports_batch")
        fam = SymmetricFamily(20, seed=7, device=device)
        A1, A2 = fam.build(fam.p0), fam.build(fam.p0 * 1.5)
        A = A1.with_values(torch.stack([A1.values, A2.values]))
        w, V = st.eigsh(A, 2, which="LA", backend=self.backend, method=eig_method)
        assert w.shape == (2, 2) and V.shape == (2, 20, 2)
        for b, Ab in enumerate((A1, A2)):
            torch.testing.assert_close(w[b].cpu(), torch.linalg.eigvalsh(Ab.to_dense().cpu())[-2:], rtol=1e-8, atol=1e-8)

    def test_eigsh_rejects_nonsymmetric(self, device):
        D = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
        with pytest.raises(st.NotSymmetricError):
            st.eigsh(st.SparseTensor.from_dense(D), 2, backend=self.backend)


class EigsConformance(_SpectralBase):
    def _matrix(self, n, seed, device):
        g = torch.Generator().manual_seed(seed)
        D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.3)
        D = D + torch.diag(torch.randn(n, generator=g, dtype=torch.float64) * 2)
        return st.SparseTensor.from_dense(D.to(device))

    def test_eigs_matches_dense(self, eigs_method, device):
        A = self._matrix(30, 1, device)
        w, V = st.eigs(A, 3, which="LM", backend=self.backend, method=eigs_method)
        ref = np.linalg.eigvals(A.to_dense().cpu().numpy())
        want = ref[np.argsort(-np.abs(ref), kind="stable")[:3]]
        for z in w.cpu().numpy():
            assert np.min(np.abs(want - z)) < 1e-8 * np.abs(want).max(), f"{z} not among {want}"
        Dc = A.to_dense().cpu().to(torch.complex128)
        torch.testing.assert_close(Dc @ V.cpu(), V.cpu() * w.cpu(), atol=1e-7, rtol=0)

    def test_eigs_eigenvalue_gradients(self, eigs_method, device):
        self.need_grad()
        A = self._matrix(14, 2, device)

        def loss(v):
            w, _ = st.eigs(A.with_values(v), 2, which="LR", backend=self.backend, method=eigs_method, tol=1e-14)
            return (w.real * torch.tensor([1.0, -2.0], dtype=torch.float64, device=v.device)).sum() + (w.imag ** 2).sum()

        v = A.values.clone().requires_grad_()
        assert torch.autograd.gradcheck(loss, (v,), eps=1e-6, atol=1e-5, rtol=1e-5)


class LogdetConformance(_SpectralBase):
    """``slogdet``/``logdet`` against NumPy: signs and values on random non-symmetric matrices,
    an ill-scaled SPD one, gradients, complex, value batches. A method with a requirement in
    ``symmetric_only_methods`` (Cholesky, LDL^T) runs only the SPD test."""

    def _needs_general(self, method: str) -> None:
        need = self.requirement(method)
        if need != "general":
            pytest.skip(f"{self.backend}/{method} needs a {REQUIREMENT_WORDS[need]} matrix, this test's is not "
                        "(test_logdet_ill_scaled_spd_is_finite runs it)")

    def _matrix(self, n, seed, device, dtype=torch.float64):
        g = torch.Generator().manual_seed(seed)
        D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.15)
        D = D + torch.diag(torch.randn(n, generator=g, dtype=torch.float64) * 3)
        if dtype.is_complex:
            D = D.to(dtype) + 1j * torch.randn(n, n, generator=g, dtype=torch.float64) * (D != 0)
        return st.SparseTensor.from_dense(D.to(device))

    def test_slogdet_signs_and_values_on_random_nonsymmetric(self, det_method, device):
        self._needs_general(det_method)
        wrong = []
        for seed in range(20):
            A = self._matrix(20, seed, device)
            s, l = st.slogdet(A, backend=self.backend, method=det_method)
            s0, l0 = np.linalg.slogdet(A.to_dense().cpu().numpy())
            if float(s) != s0 or abs(float(l) - l0) > 1e-9 * max(1.0, abs(l0)):
                wrong.append(seed)
        assert not wrong, f"{self.backend}/{det_method}: wrong sign or value for seeds {wrong}"

    def test_logdet_ill_scaled_spd_is_finite(self, det_method, device):
        m = 40
        A = poisson2d(m, device=device)
        A = A.with_values(A.values * (m + 1) ** 2)
        ld = st.logdet(A, backend=self.backend, method=det_method)
        j = torch.arange(1, m + 1, dtype=torch.float64)
        lam = (2 - 2 * torch.cos(j * torch.pi / (m + 1))) * (m + 1) ** 2
        ref = torch.log(lam[:, None] + lam[None, :]).sum()
        torch.testing.assert_close(ld.cpu(), ref, rtol=1e-10, atol=0)

    def test_slogdet_gradcheck(self, det_method, device):
        self._needs_general(det_method)
        self.need_grad()
        A = self._matrix(12, 3, device)
        v = A.values.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda v: st.slogdet(A.with_values(v), backend=self.backend, method=det_method)[1], (v,))

    def test_slogdet_complex(self, det_method, device):
        self._needs_general(det_method)
        self.need("supports_complex")
        A = self._matrix(12, 4, device, torch.complex128)
        s, l = st.slogdet(A, backend=self.backend, method=det_method)
        s0, l0 = np.linalg.slogdet(A.to_dense().cpu().numpy())
        np.testing.assert_allclose(complex(s), s0, rtol=1e-10)
        np.testing.assert_allclose(float(l), l0, rtol=1e-10)
        if self.supports_grad:
            v = A.values.clone().requires_grad_()
            assert torch.autograd.gradcheck(lambda v: st.slogdet(A.with_values(v), backend=self.backend, method=det_method)[1], (v,))

    def test_slogdet_value_batch(self, det_method, device):
        self._needs_general(det_method)
        self.need("supports_batch")
        A1, A2 = self._matrix(10, 5, device), self._matrix(10, 5, device)
        A = A1.with_values(torch.stack([A1.values, -A2.values]))
        s, l = st.slogdet(A, backend=self.backend, method=det_method)
        s0, l0 = np.linalg.slogdet(A.to_dense().cpu().numpy())
        np.testing.assert_array_equal(s.cpu().numpy(), s0)
        np.testing.assert_allclose(l.cpu().numpy(), l0, rtol=1e-10)
