"""The error suite: every bad input raises the library's named error with a message that names
the problem, whatever the backend; and inputs are never modified."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import sparsetorch as st
from ...format import CSR
from ...tensor import SparseTensor
from ..problems import Problem, make_problem, random_rectangular
from ._checks import assert_unchanged, snapshot
from .base import ConformanceBase, _name

__all__ = ["ErrorConformance"]


class ErrorConformance(ConformanceBase):
    """Every bad input raises the library's named error, with a message that names the problem,
    whatever the backend; and inputs are never modified."""

    def _spd(self, device: str | None = None) -> Problem:
        return make_problem("spd", (4, 3), dtype=self.base_dtype, device=device or self.base_device)

    def _first_method(self) -> str | None:
        return self.methods[0] if self.methods else None

    def test_non_square_matrix(self, device):
        A = random_rectangular(6, 8, dtype=self.base_dtype, device=device)
        with pytest.raises(st.InputError, match=r"square.*6x8"):
            st.solve(A, torch.ones(6, dtype=self.base_dtype, device=device), backend=self.backend, method=self._first_method())

    def test_rhs_shape_mismatch(self, device):
        p = self._spd(device=device)
        n = p.n
        dt = self.base_dtype
        for bad in (torch.ones(n - 1, dtype=dt, device=device), torch.ones(n + 1, 2, dtype=dt, device=device)):
            with pytest.raises(st.InputError, match=r"shape") as info:
                st.solve(p.A, bad, backend=self.backend, method=self._first_method())
            assert str(tuple(bad.shape)) in str(info.value) and str(n) in str(info.value)
        with pytest.raises(st.InputError, match=r"shape"):
            st.matmul(p.A, torch.ones(n + 2, dtype=dt, device=device), backend=self.backend)

    def test_dtype_mismatch(self, device):
        p = self._spd(device=device)
        other = torch.float32 if p.A.dtype == torch.float64 else torch.float64
        b = p.rhs(dtype=other)
        names = [_name(p.A.dtype), _name(other)]
        pattern = f"{names[0]}.*{names[1]}|{names[1]}.*{names[0]}"
        with pytest.raises(st.InputError, match=pattern):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())
        with pytest.raises(st.InputError, match=pattern):
            st.matmul(p.A, b, backend=self.backend)

    def test_integer_rhs(self, device):
        p = self._spd(device=device)
        b = torch.ones(p.n, dtype=torch.int64, device=device)
        with pytest.raises(st.InputError, match=r"int64"):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())

    def test_device_mismatch(self):
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA to put A and b on different devices")
        p = self._spd()
        b = p.rhs().cuda()
        with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())
        with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
            st.matmul(p.A, b, backend=self.backend)

    @pytest.mark.parametrize("where", ["A", "b"])
    @pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
    def test_nonfinite_input_rejected(self, method, where, bad, device):
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A, b = p.A, p.rhs()
        if where == "A":
            vals = A.values.detach().clone()
            vals[1] = bad
            A = A.with_values(vals)
        else:
            b = b.clone()
            b[2] = bad
        with pytest.raises(st.InputError) as info:
            self.solve(A, b, method)
        msg = str(info.value)
        assert ("NaN" in msg or "Inf" in msg) and "check_finite=False" in msg, msg
        assert ("A's values" in msg) if where == "A" else ("right-hand side" in msg), msg

    @pytest.mark.parametrize("where", ["A", "b"])
    def test_check_finite_false_skips_the_check(self, method, where, device):
        """With check_finite=False the NaN reaches the method: no InputError; the method may
        return non-finite values or stop with its own named error."""
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A, b = p.A, p.rhs()
        if where == "A":
            vals = A.values.detach().clone()
            vals[1] = math.nan
            A = A.with_values(vals)
        else:
            b = b.clone()
            b[2] = math.nan
        try:
            x = self.solve(A, b, method, check_finite=False, on_nonconvergence="ignore")
        except st.InputError as exc:  # pragma: no cover - the failure we test for
            pytest.fail(f"check_finite=False still raised InputError: {exc}")
        except st.SparseTorchError:
            pass  # the method met the NaN itself and said so with a named error
        else:
            assert x.shape == b.shape

    def test_singular_matrix_direct(self, general_direct_method, device):
        """An exactly singular matrix (a zero row and column) with a direct method."""
        method = general_direct_method
        kind = self.requirement(method)
        p = self.problem(method, kind=kind, dtype=self.base_dtype, device=device, grid=(4, 3))
        dense = p.dense.clone()
        dense[3, :] = 0
        dense[:, 3] = 0
        A = SparseTensor.from_dense(dense.to(self.base_dtype), CSR)
        with pytest.raises(st.SingularMatrixError, match=r"singular"):
            self.solve(A, p.rhs(), method)

    def test_indefinite_matrix_with_spd_forced(self, spd_method, device):
        """properties='spd' on a symmetric indefinite matrix: the method finds out and says so."""
        method = spd_method
        p = self.problem(None, kind="symmetric", dtype=self.base_dtype, device=device, grid=(4, 3))
        with pytest.raises(st.IndefiniteMatrixError, match=r"(?i)positive definite"):
            self.solve(p.A, p.rhs(), method, properties="spd")

    @pytest.mark.parametrize("policy", ["raise", "warn", "ignore"])
    def test_maxiter_reached(self, iterative_method, policy, device):
        method = iterative_method
        p = self.problem(method, dtype=self.base_dtype, device=device)
        b = p.rhs()
        kw = dict(maxiter=2, rtol=1e-12, on_nonconvergence=policy)
        if method in self.restarted_methods:
            kw["restart"] = 2  # maxiter counts restart cycles there
        if policy == "raise":
            with pytest.raises(st.NotConvergedError, match=r"maxiter") as info:
                self.solve(p.A, b, method, **kw)
            rec = info.value.info
            assert rec is not None and not rec.converged and rec.status is st.Status.MAX_ITERATIONS, rec
            assert rec.residual > 1e-12
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, info = self.solve(p.A, b, method, return_info=True, **kw)
        ours = [w for w in caught if issubclass(w.category, st.SparseTorchWarning)]
        if policy == "warn":
            assert any(issubclass(w.category, st.NotConvergedWarning) for w in ours), [str(w.message) for w in caught]
        else:
            assert not ours, [str(w.message) for w in ours]
        assert x.shape == b.shape and torch.isfinite(x).all()
        assert not info.converged and info.status is st.Status.MAX_ITERATIONS, info
        assert info.residual > 1e-12, info

    def test_zero_tolerances(self):
        p = self._spd()
        with pytest.raises(st.InputError, match=r"rtol.*atol"):
            st.solve(p.A, p.rhs(), backend=self.backend, method=self._first_method(), rtol=0, atol=0)

    def test_unknown_method(self):
        p = self._spd()
        with pytest.raises(st.NoBackendError) as info:
            st.solve(p.A, p.rhs(), backend=self.backend, method="no_such_method")
        msg = str(info.value)
        assert "no_such_method" in msg and "Candidates" in msg, msg
        for m in self.methods:
            assert f"{self.backend}/{m}:" in msg, f"the candidate {self.backend}/{m} and its reason are not listed:\n{msg}"
        lines = [ln for ln in msg.splitlines() if ln.strip().startswith(f"- {self.backend}")]
        assert lines and all(ln.split(":", 1)[1].strip() for ln in lines), f"a candidate without a reason:\n{msg}"

    def test_inputs_never_modified(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A = p.A.with_values(p.A.values.detach().clone().requires_grad_(self.supports_grad))
        b = p.rhs().requires_grad_(self.supports_grad)
        before = snapshot(A, b)
        x = self.solve(A, b, method)
        if self.supports_grad:
            x.pow(2).sum().backward()
        assert_unchanged(before, A, b, what=f"solve({method})")
        with st.Solver(A.detach(), backend=self.backend, method=method, rtol=self.rtol[A.dtype]) as s:
            s.solve(b.detach())
            s.update_values(A.values.detach() * 2)
            s.solve(b.detach())
        assert_unchanged(before, A, b, what=f"Solver({method})")
