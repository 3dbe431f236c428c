"""Where the Jacobian of ``nonlinear_solve`` comes from (docs/nonlinear.md, "The residual and its
Jacobian"): returned by ``F``, a user callable, coloring on a pattern, the dense Jacobian by AD,
or none (matrix-free products). Mixed into :class:`~._problem.Problem`, whose residual it uses."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...errors import InputError
from ...format import CSR
from ...tensor import SparseTensor
from ..coloring import colored_jacobian, forward_ad

__all__ = ["Jacobians", "JACOBIAN_MODES", "DENSE_JACOBIAN_MAX"]

JACOBIAN_MODES = ("dense", "coloring", "matrix-free")
DENSE_JACOBIAN_MAX = 512


class Jacobians:
    """The Jacobian sources of :class:`~._problem.Problem` (mixed in; uses its residual ``f``/``flat``,
    shape, dtype, device and record)."""

    def _choose_jacobian(self, jacobian: Any, pattern: Any, dense_max: int) -> None:
        self.jacobian_fn = None
        if callable(jacobian):
            if self.returns_jacobian:
                raise InputError("nonlinear_solve: F returns (r, J) and jacobian= is given too; use one of them")
            self.jac_kind = "user"
            self.jacobian_fn = jacobian
            return
        if jacobian is not None and jacobian not in JACOBIAN_MODES:
            raise InputError(
                f"nonlinear_solve: jacobian must be a callable J(u, *params) -> SparseTensor or one of "
                f"{JACOBIAN_MODES}, got {jacobian!r}"
            )
        if self.returns_jacobian:
            if jacobian is not None or pattern is not None:
                raise InputError("nonlinear_solve: F returns (r, J); drop jacobian= / jac_pattern= (or make F return r alone)")
            self.jac_kind = "returned"
            return
        if jacobian == "coloring" and pattern is None:
            raise InputError("nonlinear_solve: jacobian='coloring' needs jac_pattern= (a SparseTensor or (rows, cols))")
        if pattern is not None and jacobian in (None, "coloring"):
            self.jac_kind = "coloring"
            self.colored = colored_jacobian(pattern, self.n, self.device, self.dtype)
            return
        if jacobian == "dense" or (jacobian is None and self.n <= dense_max):
            self.jac_kind = "dense"
            idx = torch.arange(self.n, device=self.device)
            rows, cols = idx.repeat_interleave(self.n), idx.repeat(self.n)
            vals = torch.zeros(self.n * self.n, dtype=self.dtype, device=self.device)
            self.dense_pattern = SparseTensor.from_coo(vals, rows, cols, shape=(self.n, self.n), format=CSR)
            self._dense_slots = self.dense_pattern.entries()
            return
        self.jac_kind = "matrix-free"

    def _check_J(self, J: object, where: str) -> SparseTensor:
        if not isinstance(J, SparseTensor):
            raise InputError(f"nonlinear_solve: the Jacobian from {where} must be a SparseTensor, got {type(J).__name__}")
        if tuple(J.shape) != (self.n, self.n):
            raise InputError(
                f"nonlinear_solve: the Jacobian from {where} has shape {tuple(J.shape)}; for u of shape {self.shape} "
                f"({self.n} unknowns, flattened row-major) it must be ({self.n}, {self.n})"
            )
        if J.dtype != self.dtype or J.device != self.device:
            raise InputError(
                f"nonlinear_solve: the Jacobian from {where} is {J.dtype} on {J.device}; u is {self.dtype} on "
                f"{self.device}: build it with u's dtype and device"
            )
        return J

    def jacobian_at(self, x: torch.Tensor, params: tuple, iteration: int) -> SparseTensor:
        """The sparse Jacobian at ``x`` (all modes but matrix-free)."""
        self.record.jevals += 1
        kind = self.jac_kind
        if kind == "returned":
            last = self._last_J
            if last is None or not (last[0] is x or torch.equal(last[0], x)):
                self.f(x, params)
            J = self._check_J(self._last_J[1], "F")
        elif kind == "user":
            J = self._check_J(self.jacobian_fn(x.reshape(self.shape), *params), "jacobian=")
        elif kind == "coloring":
            fn = self.flat(params)
            J = self.colored.jacobian(fn, x, self.ad)
            if self.check_pattern and not self._jac_checked:
                self.colored.check(fn, x, J, self.ad)
                self._jac_checked = True
        elif kind == "dense":
            fn = self.flat(params)
            with torch.enable_grad():
                if self.ad == "forward":
                    D = forward_ad(torch.func.jacfwd(fn), x.detach())
                else:
                    D = torch.func.jacrev(fn)(x.detach())
            coords, slot = self._dense_slots
            vals = torch.zeros(self.dense_pattern.values.shape, dtype=self.dtype, device=self.device)
            vals[slot] = D.detach()[coords[0], coords[1]]
            J = self.dense_pattern.with_values(vals)
        else:  # pragma: no cover - callers check
            raise AssertionError(kind)
        if not bool(torch.isfinite(J.values).all()):
            raise InputError(
                f"nonlinear_solve: the Jacobian ({kind}) at iteration {iteration} contains NaN or Inf; F is not "
                f"differentiable at that u (check F and the starting point)"
            )
        return J

    def linearize(self, x: torch.Tensor, params: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
        """``v -> J v`` at ``x`` for matrix-free Newton (on ``(n, k)`` blocks)."""
        fn = self.flat(params)
        x = x.detach()
        if self.ad == "forward":
            def jvp(V: torch.Tensor) -> torch.Tensor:
                return torch.stack([forward_ad(torch.func.jvp, fn, (x,), (V[:, c],))[1] for c in range(V.shape[1])], 1)

            return jvp
        # Reverse mode: J v = d/dw <J^T w, v>; the graph of J^T w is built once per Newton step.
        with torch.enable_grad():
            xg = x.clone().requires_grad_()
            r = fn(xg)
            w = torch.zeros_like(r, requires_grad=True)
            (g,) = torch.autograd.grad(r, xg, w, create_graph=True, allow_unused=True)
        if g is None or not g.requires_grad:  # F does not depend on u (or linearly with J^T w constant)
            raise InputError("nonlinear_solve: F does not depend on u (its Jacobian is zero); Newton cannot proceed")

        def jvp_rev(V: torch.Tensor) -> torch.Tensor:
            cols = []
            for c in range(V.shape[1]):
                (jv,) = torch.autograd.grad(g, w, V[:, c], retain_graph=True, allow_unused=True)
                cols.append(torch.zeros_like(x) if jv is None else jv)
            return torch.stack(cols, 1)

        return jvp_rev
