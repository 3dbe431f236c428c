"""The solve suite: ``solve`` and ``Solver`` against dense oracles (values, batches, complex,
requirements, gradients, plans, the plan cache)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from ...format import CSR, TensorFormat
from ...tensor import SparseTensor
from ..problems import Problem
from ._checks import loss, slots_on_pattern, transpose_slots
from .base import REQUIREMENT_WORDS, ConformanceBase, _name

__all__ = ["SolveConformance"]


class SolveConformance(ConformanceBase):
    """``solve`` and ``Solver`` against dense oracles: values, batches, gradients, plans, cache."""

    # Values -------------------------------------------------------------------------------------
    def test_solve_matches_dense(self, method, fmt, dtype, device):
        p = self.problem(method, fmt=fmt, dtype=dtype, device=device)
        b = p.rhs()
        x, info = self.solve(p.A, b, method, return_info=True)
        assert (info.backend, info.method) == (self.backend, method), f"dispatch chose {info.backend}/{info.method}"
        assert x.dtype == dtype and x.device == b.device and x.shape == b.shape
        self.assert_close(x, p.solution(b), dtype, f"solve {method} {p.name} in {_name(fmt)}")

    def test_solve_multiple_rhs(self, method, dtype, device):
        self.need("supports_multiple_rhs")
        p = self.problem(method, dtype=dtype, device=device, variant="random")
        B = p.rhs(3)
        X = self.solve(p.A, B, method)
        assert X.shape == B.shape
        self.assert_close(X, p.solution(B), dtype, f"solve {method} with B (n, 3)")
        # Each column as its own solve gives the same columns.
        for j in range(B.shape[-1]):
            self.assert_close(X[:, j], p.solution(B[:, j]), dtype, f"column {j}")

    def test_solve_identity_rhs(self, method, device):
        """B = I: sparse right-hand sides (the cotangents of a Jacobian, ``jacrev``, are unit
        vectors) on a random-pattern matrix; every column must be solved, whatever its support."""
        self.need("supports_multiple_rhs")
        dtype = self.base_dtype
        p = self.problem(method, dtype=dtype, device=device, grid=self.grad_grid, variant="random")
        eye = torch.eye(p.n, dtype=dtype, device=device)
        X = self.solve(p.A, eye, method)
        self.assert_close(X, torch.linalg.inv(p.dense), dtype, f"solve {method} {p.name} with B = I")

    def test_solve_value_batch(self, method, dtype, device):
        self.need("supports_batch")
        p = self.problem(method, dtype=dtype, device=device)
        Ab = p.value_batch(3)
        b = p.rhs(batch=(3,))
        x = self.solve(Ab, b, method)
        self.assert_close(x, p.solution(b, Ab), dtype, f"solve {method} on a value batch, b (3, n)")
        if self.supports_multiple_rhs:
            B = p.rhs(2, batch=(3,))
            X = self.solve(Ab, B, method)
            self.assert_close(X, p.solution(B, Ab), dtype, f"solve {method} on a value batch, B (3, n, 2)")

    def test_solve_complex(self, method, complex_dtype, device):
        self.need("supports_complex")
        p = self.problem(method, dtype=complex_dtype, device=device)
        b = p.rhs()
        x = self.solve(p.A, b, method)
        assert x.dtype == complex_dtype
        self.assert_close(x, p.solution(b), complex_dtype, f"solve {method} {p.name}")
        if self.supports_multiple_rhs:
            B = p.rhs(2)
            self.assert_close(self.solve(p.A, B, method), p.solution(B), complex_dtype, f"solve {method} {p.name}, B (n, 2)")

    # Requirements -------------------------------------------------------------------------------
    def test_method_requirement_respected(self, constrained_method, device):
        """A method that needs SPD/symmetric A, pinned on a non-symmetric A, is declined with the
        reason (NoBackendError naming the method and what it needs), never run."""
        method = constrained_method
        need = self.requirement(method)
        p = self.problem(None, kind="general", dtype=self.base_dtype, device=device)
        with pytest.raises(st.NoBackendError) as info:
            self.solve(p.A, p.rhs(), method)
        msg = str(info.value)
        words = REQUIREMENT_WORDS[need]
        assert method.lower() in msg.lower() and words in msg.lower(), (
            f"the NoBackendError for {method} on a non-symmetric matrix must name {method!r} and say "
            f"{words!r}; got:\n{msg}"
        )
        table = info.value.table
        rows = [r for r in table.declines if r.backend == self.backend and r.method == method]
        assert rows, f"no decline row for {self.backend}/{method} in the explain table:\n{table}"
        assert any(words in r.reason.lower() for r in rows), f"decline reasons for {method}: {[r.reason for r in rows]}"

    # Gradients ----------------------------------------------------------------------------------
    def _grad_problem(self, method: str, fmt: TensorFormat = CSR, device: str = "cpu") -> Problem:
        return self.problem(method, fmt=fmt, dtype=torch.float64, device=device, grid=self.grad_grid)

    def _grad_function(self, A: SparseTensor, method: str):
        """(values, b) -> solve(A.with_values(values), b). For methods that need a symmetric A the
        values are symmetrized first, ``(v + v^T) / 2`` on the pattern, so that gradcheck's
        one-entry perturbations stay inside the method's domain (Cholesky reads one triangle),
        and the structure is passed as ``properties=`` (a perturbed Laplacian is SPD but no
        longer diagonally dominant, which is what detection looks for)."""
        need = self.requirement(method)
        if need == "general":
            return lambda values, rhs: self.solve(A.with_values(values), rhs, method, rtol=1e-12)
        perm = transpose_slots(A)
        return lambda values, rhs: self.solve(A.with_values((values + values[..., perm]) / 2), rhs, method, rtol=1e-12,
                                              properties=need)

    def test_gradcheck(self, method, device):
        """gradcheck in float64 of (values, b) -> solve(A.with_values(values), b)."""
        self.need_grad()
        p = self._grad_problem(method, device=device)
        v = p.A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        f = self._grad_function(p.A, method)
        assert torch.autograd.gradcheck(f, (v, b), atol=self.grad_atol(method), rtol=1e-3)

    def test_gradient_matches_dense_oracle(self, method, fmt, device):
        """Gradients w.r.t. values live on the pattern (padding slots get 0) and match dense autograd."""
        self.need_grad()
        p = self._grad_problem(method, fmt=fmt, device=device)
        A = p.A
        g = torch.Generator().manual_seed(7)
        w = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)
        v = A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        x = self.solve(A.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(loss(x, w), (v, b))
        vd = A.values.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(A.with_values(vd).to_dense(), bd)
        gvd, gbd = torch.autograd.grad(loss(xd, w), (vd, bd))
        assert gv.shape == v.shape, f"dL/dvalues has shape {tuple(gv.shape)}, values {tuple(v.shape)}"
        on = slots_on_pattern(A)
        assert torch.all(gv[..., ~on] == 0), "dL/dvalues is nonzero on padding slots (off the pattern)"
        self.assert_close(gb, gbd, torch.float64, f"dL/db ({method}, {_name(fmt)})", scale=10)
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues ({method}, {_name(fmt)})", scale=10)

    def test_gradient_complex_matches_dense_oracle(self, method, device):
        self.need("supports_complex")
        self.need("supports_grad")
        if torch.complex128 not in self.complex_dtypes:
            pytest.skip(f"{self.backend}: complex gradient checks run in complex128, which is not in complex_dtypes")
        p = self.problem(method, dtype=torch.complex128, device=device, grid=self.grad_grid)
        A = p.A
        w = p.rhs(seed=11)
        v = A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        x = self.solve(A.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(loss(x, w), (v, b))
        vd = A.values.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(A.with_values(vd).to_dense(), bd)
        gvd, gbd = torch.autograd.grad(loss(xd, w), (vd, bd))
        self.assert_close(gb, gbd, torch.complex128, f"dL/db ({method}, complex)", scale=10)
        self.assert_close(gv, gvd, torch.complex128, f"dL/dvalues ({method}, complex)", scale=10)

    def test_gradient_value_batch(self, method, device):
        self.need_grad()
        self.need("supports_batch")
        p = self._grad_problem(method, device=device)
        Ab = p.value_batch(2)
        v = Ab.values.detach().clone().requires_grad_()
        b = p.rhs(batch=(2,)).requires_grad_()
        w = p.rhs(batch=(2,), seed=5)
        x = self.solve(Ab.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(loss(x, w), (v, b))
        vd = v.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(Ab.with_values(vd).to_dense(), bd.unsqueeze(-1)).squeeze(-1)
        gvd, gbd = torch.autograd.grad(loss(xd, w), (vd, bd))
        self.assert_close(gb, gbd, torch.float64, f"dL/db on a value batch ({method})", scale=10)
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues on a value batch ({method})", scale=10)

    def test_gradgradcheck(self, direct_method, device):
        """Second derivatives (create_graph through the adjoint solve) by gradgradcheck."""
        self.need_grad()
        method = direct_method
        p = self._grad_problem(method, device=device)
        v = p.A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        f = self._grad_function(p.A, method)
        assert torch.autograd.gradgradcheck(f, (v, b), atol=1e-6, rtol=1e-3)

    def test_second_derivatives_match_dense_oracle(self, direct_method, device):
        """A Hessian-vector product through create_graph=True matches dense autograd."""
        self.need_grad()
        method = direct_method
        p = self._grad_problem(method, device=device)
        A = p.A
        g = torch.Generator().manual_seed(3)
        w = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)
        uv = torch.randn(A.values.shape, generator=g, dtype=torch.float64).to(device) * slots_on_pattern(A)
        ub = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)

        def hvp(solver):
            v = A.values.detach().clone().requires_grad_()
            b = p.rhs().requires_grad_()
            x = solver(v, b)
            gv, gb = torch.autograd.grad(loss(x, w), (v, b), create_graph=True)
            return torch.autograd.grad((gv * uv).sum() + (gb * ub).sum(), (v, b))

        got = hvp(lambda v, b: self.solve(A.with_values(v), b, method, rtol=1e-12))
        ref = hvp(lambda v, b: torch.linalg.solve(A.with_values(v).to_dense(), b))
        self.assert_close(got[0], ref[0], torch.float64, f"Hessian-vector product, values part ({method})", scale=10)
        self.assert_close(got[1], ref[1], torch.float64, f"Hessian-vector product, b part ({method})", scale=10)

    def test_func_grad_over_rhs(self, method, device):
        self.need_grad()
        p = self._grad_problem(method, device=device)
        b = p.rhs()
        got = torch.func.grad(lambda rhs: (self.solve(p.A, rhs, method, rtol=1e-12) ** 2).sum())(b)
        dense = p.dense
        ref = torch.func.grad(lambda rhs: (torch.linalg.solve(dense, rhs) ** 2).sum())(b)
        self.assert_close(got, ref, torch.float64, f"torch.func.grad over b ({method})", scale=10)

    def test_vmap_over_rhs_matches_loop(self, method, device):
        dtype = self.base_dtype
        p = self.problem(method, dtype=dtype, device=device, grid=self.grad_grid)
        B = p.rhs(batch=(4,))  # (4, n): vmap maps over the leading dimension
        got = torch.func.vmap(lambda rhs: self.solve(p.A, rhs, method))(B)
        loop = torch.stack([self.solve(p.A, B[i], method) for i in range(B.shape[0])])
        assert got.shape == loop.shape
        self.assert_close(got, loop, dtype, f"vmap over right-hand sides vs a loop ({method})")
        self.assert_close(got, p.solution(B.T).T, dtype, f"vmap over right-hand sides vs dense ({method})")

    # Solver (plan / factorize / update_values / solve) ----------------------------------------------
    def test_solver_matches_fresh_solves(self, method, dtype, device):
        p = self.problem(method, dtype=dtype, device=device)
        A = p.A
        b = p.rhs()
        v2 = p.value_batch(2).values[1].clone()  # new values on the same pattern, same structure
        with st.Solver(A, backend=self.backend, method=method, rtol=self.rtol[dtype]) as s:
            table = s.plan()
            assert table.chosen is not None and (table.chosen.backend, table.chosen.method) == (self.backend, method)
            assert (s.backend, s.method) == (self.backend, method)
            s.factorize()
            x1 = s.solve(b)
            self.assert_close(x1, p.solution(b), dtype, f"Solver({method}).solve")
            self.assert_close(x1, self.solve(A, b, method), dtype, f"Solver({method}) vs solve()")
            if self.supports_multiple_rhs:
                B = p.rhs(2)
                self.assert_close(s.solve(B), p.solution(B), dtype, f"Solver({method}).solve with B (n, 2)")
            s.update_values(v2)
            x2 = s.solve(b)
            A2 = A.with_values(v2)
            self.assert_close(x2, p.solution(b, A2), dtype, f"Solver({method}) after update_values")
            self.assert_close(x2, self.solve(A2, b, method), dtype, f"Solver({method}) after update_values vs solve()")
            s.update_values(A.values)
            self.assert_close(s.solve(b), x1, dtype, f"Solver({method}) back to the first values")

    def test_solver_reports_plan_reuse(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        with st.Solver(p.A, backend=self.backend, method=method, rtol=self.rtol[self.base_dtype]) as s:
            s.plan()
            s.factorize()
            s.solve(p.rhs())
            s.update_values(p.A.values * 2)
            x, info = s.solve(p.rhs(), return_info=True)
        assert (info.backend, info.method) == (self.backend, method)
        assert info.plan_reused, "a Solver's solve after update_values reused its plan, but info.plan_reused is False"

    # Plan cache ---------------------------------------------------------------------------------
    def test_plan_cache_reused_for_new_values(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A, p.rhs()
        # small CPU patterns share plans by content: an earlier test's plan on this pattern would
        # make the first solve a hit already
        st.plan_cache().clear()
        x1, i1 = self.solve(A, b, method, return_info=True)
        hits = st.plan_cache().hits
        A2 = A.with_values(p.value_batch(2).values[1].clone())
        x2, i2 = self.solve(A2, b, method, return_info=True)
        assert st.plan_cache().hits > hits, "a second solve on the same pattern did not hit the plan cache"
        assert i2.plan_reused and not i1.plan_reused
        self.assert_close(x2, p.solution(b, A2), self.base_dtype, f"solve {method} with new values on a cached plan")
        # And back: the cached plan must not keep the second values.
        self.assert_close(self.solve(A, b, method), x1, self.base_dtype, f"solve {method} back on the first values")

    def test_plan_cache_not_reused_for_other_pattern(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A, p.rhs()
        self.solve(A, b, method)
        # The same matrix with its unknowns renumbered: same shape and nnz, another pattern.
        perm = torch.randperm(p.n, generator=torch.Generator().manual_seed(2)).to(device)
        dense = p.dense[perm][:, perm]
        B = SparseTensor.from_dense(dense.to(A.dtype), A.format)
        assert B.nse == A.nse and tuple(B.shape) == tuple(A.shape)
        misses = st.plan_cache().misses
        x, info = self.solve(B, b, method, return_info=True)
        assert not info.plan_reused, "a plan was reused for a different sparsity pattern"
        assert st.plan_cache().misses > misses
        self.assert_close(x, torch.linalg.solve(dense, b.to(dense.dtype)), self.base_dtype, f"solve {method} on the other pattern")

    @pytest.mark.parametrize("change", ["with_values", "in_place", "numpy_view"])
    def test_value_changes_always_seen(self, method, change, device):
        """Whatever way A's values change between two solves, the second solve sees them."""
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A.with_values(p.A.values.detach().clone()), p.rhs()
        self.solve(A, b, method)
        if change == "with_values":
            A = A.with_values(A.values * 2)
        elif change == "in_place":
            A.values.mul_(2)  # bumps the tensor's version counter
        else:
            A.values.numpy()[...] *= 2  # a write torch cannot see (NumPy, DLPack, gradcheck's .data)
        x = self.solve(A, b, method)
        self.assert_close(x, p.solution(b, A), self.base_dtype, f"solve {method} after values changed ({change})")

    @pytest.mark.parametrize("change", ["in_place", "numpy_view"])
    def test_structure_change_seen_by_method_choice(self, change, device):
        """An SPD matrix made non-symmetric between two solves (method left to dispatch): the
        second solve is right, or refused with NoBackendError, never silently wrong (a method
        chosen for the old structure, e.g. Cholesky reading one triangle)."""
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        dtype = self.base_dtype
        p = self.problem(None, kind="spd", dtype=dtype, device=device, grid=self.grad_grid)
        A, b = p.A.with_values(p.A.values.detach().clone()), p.rhs()
        self.solve(A, b, None)
        coords, slot = A.entries()
        k = int(slot[coords[0] != coords[1]][0])  # an off-diagonal entry
        if change == "in_place":
            A.values[k] = 3.0
        else:
            A.values.numpy()[k] = 3.0
        try:
            x = self.solve(A, b, None)
        except st.NoBackendError:
            return  # this backend has no method for a general matrix: refusing is right
        self.assert_close(x, p.solution(b, A), dtype, f"auto-chosen method after A lost its symmetry ({change})")
