"""The matmul suite: sparse @ dense in every input format (``matmul``, ``A @ X``, ``X @ A``,
``Matmul``), its gradients, and ``norm``, against dense oracles."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch

import sparsetorch as st
from ...format import CSR, TensorFormat
from ...tensor import SparseTensor
from ..problems import oracle_dtype, random_rectangular
from ._checks import assert_unchanged, loss, slots_on_pattern, snapshot
from .base import ConformanceBase, _name

__all__ = ["MatmulConformance"]


class MatmulConformance(ConformanceBase):
    """Sparse @ dense in every input format (``matmul``, ``A @ X``, ``X @ A``, ``Matmul``), its
    gradients, and ``norm``, against dense oracles."""

    #: Shape of the (rectangular) test matrix.
    matmul_shape: ClassVar[tuple[int, int]] = (10, 14)

    def _matrix(self, fmt: TensorFormat, dtype: torch.dtype, device: str, seed: int = 0) -> SparseTensor:
        m, n = self.matmul_shape
        return random_rectangular(m, n, format=fmt, dtype=dtype, device=device, seed=seed)

    @staticmethod
    def _randn(*shape: int, dtype: torch.dtype, device: str, seed: int = 1) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g, dtype=oracle_dtype(dtype)).to(dtype=dtype, device=device)

    def matmul(self, A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
        return st.matmul(A, X, backend=self.backend)

    def test_matmul_matches_dense(self, fmt, dtype, device):
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        m, n = self.matmul_shape
        x = self._randn(n, dtype=dtype, device=device)
        table = st.explain("matmul", A, x, backend=self.backend)
        assert table.chosen is not None and table.chosen.backend == self.backend
        self.assert_close(self.matmul(A, x), D @ x.to(D.dtype), dtype, f"matmul(A, x) in {_name(fmt)}")
        self.assert_close(A @ x, D @ x.to(D.dtype), dtype, f"A @ x in {_name(fmt)}")
        y = self._randn(m, dtype=dtype, device=device, seed=2)
        self.assert_close(y @ A, y.to(D.dtype) @ D, dtype, f"y @ A in {_name(fmt)}")
        if self.supports_multiple_rhs:
            X = self._randn(n, 3, dtype=dtype, device=device)
            self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), dtype, f"matmul(A, X (n, 3)) in {_name(fmt)}")
            self.assert_close(A @ X, D @ X.to(D.dtype), dtype, f"A @ X in {_name(fmt)}")
            Y = self._randn(2, m, dtype=dtype, device=device, seed=3)
            self.assert_close(Y @ A, Y.to(D.dtype) @ D, dtype, f"Y (2, m) @ A in {_name(fmt)}")

    def test_matmul_value_batch(self, fmt, dtype, device):
        self.need("supports_batch")
        A = self._matrix(fmt, dtype, device)
        Ab = A.with_values(torch.stack([A.values, 2 * A.values + 1]))
        D = Ab.to_dense().to(oracle_dtype(dtype))
        n = self.matmul_shape[1]
        x = self._randn(2, n, dtype=dtype, device=device)
        self.assert_close(self.matmul(Ab, x), (D @ x.to(D.dtype).unsqueeze(-1)).squeeze(-1), dtype, f"batched A @ x in {_name(fmt)}")
        if self.supports_multiple_rhs:
            X = self._randn(2, n, 3, dtype=dtype, device=device)
            self.assert_close(self.matmul(Ab, X), D @ X.to(D.dtype), dtype, f"batched A @ X in {_name(fmt)}")

    def test_matmul_complex(self, fmt, complex_dtype, device):
        self.need("supports_complex")
        A = self._matrix(fmt, complex_dtype, device)
        D = A.to_dense().to(torch.complex128)
        n = self.matmul_shape[1]
        X = self._randn(n, 2, dtype=complex_dtype, device=device)
        self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), complex_dtype, f"complex A @ X in {_name(fmt)}")
        y = self._randn(self.matmul_shape[0], dtype=complex_dtype, device=device, seed=4)
        self.assert_close(y @ A, y.to(D.dtype) @ D, complex_dtype, f"complex y @ A in {_name(fmt)}")

    def test_matmul_half_precision_matches_dense(self, fmt, half_dtype, device):
        """float16/bfloat16 products in every input format: the result in the input dtype, within
        a few units of its rounding of the float64 product of the same (half-rounded) operands."""
        A = self._matrix(fmt, half_dtype, device)
        D = A.to_dense().to(torch.float64)
        m, n = self.matmul_shape
        x = self._randn(n, dtype=half_dtype, device=device)
        for what, got, ref in (("matmul(A, x)", self.matmul(A, x), D @ x.double()), ("A @ x", A @ x, D @ x.double())):
            assert got.dtype == half_dtype, f"{self.backend}: {what} in {_name(fmt)} returned {got.dtype}, not {half_dtype}"
            self.assert_close(got, ref, half_dtype, f"{what} in {_name(fmt)}")
        y = self._randn(m, dtype=half_dtype, device=device, seed=2)
        self.assert_close(y @ A, y.double() @ D, half_dtype, f"y @ A in {_name(fmt)}")
        if self.supports_multiple_rhs:
            X = self._randn(n, 3, dtype=half_dtype, device=device)
            self.assert_close(self.matmul(A, X), D @ X.double(), half_dtype, f"matmul(A, X (n, 3)) in {_name(fmt)}")

    def test_matmul_half_precision_gradients(self, fmt, half_dtype, device):
        """dL/dvalues and dL/dX of a half-precision product against the float64 gradients of the
        same half-rounded operands; the gradients come back in the half dtype."""
        self.need_grad()
        A = self._matrix(fmt, half_dtype, device)
        m, n = self.matmul_shape
        k = 2 if self.supports_multiple_rhs else None
        shape_x, shape_w = ((n, k), (m, k)) if k else ((n,), (m,))
        v = A.values.detach().clone().requires_grad_()
        X = self._randn(*shape_x, dtype=half_dtype, device=device).requires_grad_()
        w = self._randn(*shape_w, dtype=half_dtype, device=device, seed=8)
        gv, gx = torch.autograd.grad((self.matmul(A.with_values(v), X) * w).sum(), (v, X))
        assert gv.dtype == half_dtype and gx.dtype == half_dtype, f"gradients in {gv.dtype}/{gx.dtype}, not {half_dtype}"
        vd = v.detach().double().requires_grad_()
        Xd = X.detach().double().requires_grad_()
        coords, slots = A.entries()
        Dd = torch.zeros(m, n, dtype=torch.float64, device=vd.device).index_put(
            (coords[0].long(), coords[1].long()), vd[slots.long()], accumulate=True)
        gvd, gxd = torch.autograd.grad(((Dd @ Xd) * w.double()).sum(), (vd, Xd))
        on = slots_on_pattern(A)
        assert torch.all(gv[..., ~on] == 0), "dL/dvalues is nonzero on padding slots"
        self.assert_close(gx, gxd, half_dtype, f"dL/dX of a half-precision A @ X in {_name(fmt)}")
        self.assert_close(gv[..., on], gvd[..., on], half_dtype, f"dL/dvalues of a half-precision A @ X in {_name(fmt)}")

    def test_Matmul_updates_c_in_place(self, fmt, dtype, device):
        """UST form: ``with Matmul(a, b, c, beta=1.0) as mm: mm.plan(); mm.execute()`` sets c := a @ b + c."""
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        m, n = self.matmul_shape
        k = 3 if self.supports_multiple_rhs else None
        shape_b = (n, k) if k else (n,)
        shape_c = (m, k) if k else (m,)
        b = self._randn(*shape_b, dtype=dtype, device=device)
        c = self._randn(*shape_c, dtype=dtype, device=device, seed=5)
        c0 = c.clone()
        ref = D @ b.to(D.dtype)
        with st.Matmul(A, b, c, beta=1.0, backend=self.backend) as mm:
            table = mm.plan()
            assert table.chosen is not None and table.chosen.backend == self.backend
            out = mm.execute()
            assert out is c, "Matmul.execute must return c, updated in place"
            self.assert_close(c, ref + c0.to(D.dtype), dtype, f"Matmul beta=1 in {_name(fmt)}")
            mm.execute()  # again: accumulates
            self.assert_close(c, 2 * ref + c0.to(D.dtype), dtype, f"Matmul executed twice in {_name(fmt)}")
            b2 = self._randn(*shape_b, dtype=dtype, device=device, seed=6)
            c.copy_(c0)
            mm.reset_operands(b=b2, alpha=2.0, beta=0.5)
            mm.execute()
            self.assert_close(c, 2 * (D @ b2.to(D.dtype)) + 0.5 * c0.to(D.dtype), dtype, f"Matmul alpha=2, beta=0.5 in {_name(fmt)}")
            mm.reset_operands(a=A.with_values(3 * A.values), alpha=1.0, beta=0.0)
            mm.execute()
            self.assert_close(c, 3 * (D @ b2.to(D.dtype)), dtype, f"Matmul with new values in {_name(fmt)}")
        with st.Matmul(A, b, backend=self.backend) as mm:
            mm.plan()
            self.assert_close(mm.execute(), ref, dtype, f"Matmul without c in {_name(fmt)}")

    def test_matmul_gradcheck(self, fmt, device):
        self.need_grad()
        A = self._matrix(fmt, torch.float64, device)
        n = self.matmul_shape[1]
        v = A.values.detach().clone().requires_grad_()
        X = self._randn(n, 2, dtype=torch.float64, device=device).requires_grad_()
        assert torch.autograd.gradcheck(lambda values, x: self.matmul(A.with_values(values), x), (v, X))

    def test_matmul_gradient_matches_dense_oracle(self, fmt, device):
        self.need_grad()
        A = self._matrix(fmt, torch.float64, device)
        m, n = self.matmul_shape
        w = self._randn(m, 2, dtype=torch.float64, device=device, seed=8)
        v = A.values.detach().clone().requires_grad_()
        X = self._randn(n, 2, dtype=torch.float64, device=device).requires_grad_()
        gv, gx = torch.autograd.grad(loss(self.matmul(A.with_values(v), X), w), (v, X))
        vd = v.detach().clone().requires_grad_()
        Xd = X.detach().clone().requires_grad_()
        gvd, gxd = torch.autograd.grad(loss(A.with_values(vd).to_dense() @ Xd, w), (vd, Xd))
        assert torch.all(gv[..., ~slots_on_pattern(A)] == 0), "dL/dvalues is nonzero on padding slots"
        self.assert_close(gx, gxd, torch.float64, f"dL/dX of A @ X in {_name(fmt)}")
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues of A @ X in {_name(fmt)}")

    def test_matmul_vmap_over_x(self, device):
        dtype = self.base_dtype
        A = self._matrix(CSR, dtype, device)
        n = self.matmul_shape[1]
        Xs = self._randn(4, n, dtype=dtype, device=device)
        got = torch.func.vmap(lambda x: self.matmul(A, x))(Xs)
        D = A.to_dense().to(oracle_dtype(dtype))
        self.assert_close(got, Xs.to(D.dtype) @ D.T, dtype, "vmap of matmul over x")

    @pytest.mark.parametrize("ord", ["fro", 1, math.inf, "max"], ids=["fro", "1", "inf", "max"])
    def test_norm_matches_dense(self, fmt, dtype, device, ord):
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        ref = D.abs().amax() if ord == "max" else torch.linalg.matrix_norm(D, ord)
        self.assert_close(st.norm(A, ord).reshape(()), ref, dtype, f"norm(A, {ord!r}) in {_name(fmt)}")
        if self.supports_batch:
            Ab = A.with_values(torch.stack([A.values, -3 * A.values]))
            Db = Ab.to_dense().to(oracle_dtype(dtype))
            refb = Db.abs().amax((-2, -1)) if ord == "max" else torch.linalg.matrix_norm(Db, ord)
            self.assert_close(st.norm(Ab, ord), refb, dtype, f"norm of a value batch, {ord!r}, in {_name(fmt)}")

    def test_matmul_inputs_never_modified(self, fmt, device):
        dtype = self.base_dtype
        A = self._matrix(fmt, dtype, device)
        A = A.with_values(A.values.detach().clone().requires_grad_(self.supports_grad))
        m, n = self.matmul_shape
        X = self._randn(n, 2, dtype=dtype, device=device).requires_grad_(self.supports_grad)
        c = self._randn(m, 2, dtype=dtype, device=device, seed=9)
        before = snapshot(A, X)
        y = self.matmul(A, X)
        z = X.T @ A.T  # the x @ A form on the transposed view
        if self.supports_grad:
            (y.sum() + z.sum()).backward()
        assert_unchanged(before, A, X, what=f"matmul in {_name(fmt)}")
        with st.Matmul(A.detach(), X.detach(), c, beta=1.0, backend=self.backend) as mm:
            mm.execute()
        assert_unchanged(before, A, X, what=f"Matmul in {_name(fmt)} (only c is written)")

    @pytest.mark.parametrize("change", ["with_values", "in_place", "numpy_view"])
    def test_matmul_value_changes_always_seen(self, fmt, change, device):
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        dtype = self.base_dtype
        A = self._matrix(fmt, dtype, device)
        A = A.with_values(A.values.detach().clone())
        X = self._randn(self.matmul_shape[1], 2, dtype=dtype, device=device)
        self.matmul(A, X)
        if change == "with_values":
            A = A.with_values(A.values * 2)
        elif change == "in_place":
            A.values.mul_(2)
        else:
            A.values.numpy()[...] *= 2
        D = A.to_dense().to(oracle_dtype(dtype))
        self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), dtype, f"A @ X after values changed ({change}) in {_name(fmt)}")
