"""Adjoint rule of the nonlinear solve ``F(u*, theta) = 0`` (implicit function theorem).

Math (DESIGN.md; e.g. Blondel et al., "Efficient and modular implicit differentiation"):

    forward   u* with F(u*, theta) = 0, found by any iteration (Newton, Anderson, Picard),
              run without recording a graph
    backward  J = dF/du at (u*, theta)
              solve J^T lambda = dL/du*           (one adjoint solve: the transpose solve of the
                                                   linear solver's plan, or GMRES on VJPs)
              dL/dtheta = -lambda^T dF/dtheta      (one VJP of F with respect to the parameters)

Differentiating ``F(u*(theta), theta) = 0`` gives ``J du*/dtheta = -dF/dtheta``, so
``dL/dtheta = dL/du* . du*/dtheta = -(J^-T dL/du*)^T dF/dtheta``. Neither the iteration count
nor the iterates enter: the graph is one node that saves ``u*`` and the parameters (O(n) on top
of what the caller already holds), and the backward pass holds one Jacobian (O(nnz)) or, matrix
free, one graph of ``F``. ``u0`` gets no gradient (the root does not depend on it, as long as
the iteration lands on the same root).

The backward pass is not itself differentiable (``first_order_only``: differentiating it again raises): second derivatives
through a nonlinear solve would need the derivative of the adjoint system, not implemented.

The rule is written here against :class:`ImplicitProblem`, what the ops layer's problem
(``ops/nonlinear/_problem.py``) provides: the residual, the Jacobian, the linear solver's plan
and GMRES on an operator (both of which go through layers above this one).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch

from ._first_order import first_order_only

__all__ = ["implicit_solve", "ImplicitProblem", "adjoint_solve", "parameter_vjp"]


class ImplicitProblem(Protocol):
    """What the adjoint rule needs of the forward problem (the handle of :func:`implicit_solve`)."""

    dtype: torch.dtype
    #: where J comes from; "matrix-free": no sparse J, products by AD only
    jac_kind: str
    #: the linear solver of the Newton steps: ``load(J)``, ``solve(b, adjoint=)``, ``results``
    linear: Any
    #: the linear solves' options (``rtol``, ``atol``, ...)
    linear_options: dict
    #: the call's record; the adjoint solves' IterationResults go to ``record.adjoint``
    record: Any

    def run(self, leaves: Sequence[torch.Tensor]) -> torch.Tensor:
        """The forward iteration: ``u*`` from the parameters' tensors."""

    def detached_leaves(self, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]: ...

    def bind(self, leaves: Sequence[torch.Tensor]) -> tuple:
        """The parameters of ``F`` (SparseTensors rebuilt around their values) from the leaves."""

    def flat(self, params: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> F(x, *params)`` on flat ``x``."""

    def jacobian_at(self, x: torch.Tensor, params: tuple, iteration: int) -> Any:
        """The sparse Jacobian at flat ``x`` (every ``jac_kind`` but "matrix-free")."""

    def operator_solve(self, matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, *, rtol: float,
                       atol: float) -> tuple[torch.Tensor, Any]:
        """GMRES on an operator: ``(x, IterationResult)``."""

    def linear_failed(self, res: Any, where: str) -> None:
        """Report (raise or warn, per the linear policy) a solve that did not converge."""


def adjoint_solve(h: ImplicitProblem, u: torch.Tensor, leaves: Sequence[torch.Tensor], g: torch.Tensor) -> torch.Tensor:
    """``lambda`` with ``J(u)^T lambda = g``: a transpose solve on the linear plan (the forward's last
    Jacobian belongs to the previous iterate, so J is formed at ``u``), or GMRES on VJPs
    ``v -> J^T v`` (exact transposes, by reverse mode) when there is no sparse J."""
    params = h.bind(h.detached_leaves(leaves))
    x = u.detach().reshape(-1)
    g = g.detach().reshape(-1).to(h.dtype)
    if h.jac_kind == "matrix-free":
        fn = h.flat(params)
        with torch.enable_grad():
            xg = x.clone().requires_grad_()
            r = fn(xg)

        def vjp(V: torch.Tensor) -> torch.Tensor:
            cols = []
            for c in range(V.shape[1]):
                (jt,) = torch.autograd.grad(r, xg, V[:, c], retain_graph=True, allow_unused=True)
                cols.append(torch.zeros_like(x) if jt is None else jt)
            return torch.stack(cols, 1)

        o = h.linear_options
        lam, res = h.operator_solve(vjp, g.reshape(-1, 1), rtol=o["rtol"], atol=o["atol"])
        h.record.adjoint.append(res)
        if not res.converged:
            h.linear_failed(res, "adjoint solve J^T lambda = dL/du")
        return lam.reshape(-1)
    with torch.no_grad():
        J = h.jacobian_at(x, params, h.record.iterations)
        h.linear.load(J)
        n_before = len(h.linear.results)
        lam = h.linear.solve(g, adjoint=True)
        h.record.adjoint.extend(h.linear.results[n_before:])
    return lam


def parameter_vjp(h: ImplicitProblem, u: torch.Tensor, leaves: Sequence[torch.Tensor], lam: torch.Tensor,
                  need: Sequence[bool]) -> list[torch.Tensor | None]:
    """``-lambda^T dF/dleaf`` at ``(u, leaves)`` for the leaves whose ``need`` is true (one VJP of
    ``F``; zeros for a leaf ``F`` does not use), None for the others."""
    with torch.enable_grad():
        ls = [t.detach().requires_grad_(bool(nd)) for t, nd in zip(leaves, need)]
        r = h.flat(h.bind(ls))(u.detach().reshape(-1))
        wrt = [t for t, nd in zip(ls, need) if nd]
        grads = [None] * len(wrt)
        if r.requires_grad:
            grads = list(torch.autograd.grad(r, wrt, -lam.reshape(-1).to(r.dtype), allow_unused=True))
    out, k = [], 0
    for t, nd in zip(ls, need):
        if not nd:
            out.append(None)
            continue
        gk = grads[k]
        k += 1
        out.append(torch.zeros_like(t) if gk is None else gk)
    return out


class _ImplicitSolve(torch.autograd.Function):
    @staticmethod
    def forward(handle, *leaves: torch.Tensor) -> torch.Tensor:
        return handle.run(leaves)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        handle, *leaves = inputs
        ctx.handle = handle
        ctx.save_for_backward(output, *leaves)

    @staticmethod
    def backward(ctx, du: torch.Tensor):
        u, *leaves = ctx.saved_tensors
        need = ctx.needs_input_grad[1:]
        if not any(need):
            return (None,) * (1 + len(leaves))
        h = ctx.handle
        with torch.no_grad():
            lam = adjoint_solve(h, u.detach(), [t.detach() for t in leaves], du.detach())  # J^T lam = dL/du at u*
        grads = parameter_vjp(h, u, leaves, lam, need)  # -lam^T dF/dtheta
        # no second-order rule: differentiating these again raises (first_order_only)
        return (None, *(first_order_only(g, "nonlinear_solve", du, *leaves) for g in grads))


def implicit_solve(handle: ImplicitProblem, leaves: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``u*`` from ``handle.run(leaves)``, differentiable in ``leaves`` by the adjoint method:
    :func:`adjoint_solve` (``J^T lambda = dL/du*`` at ``u*``) then :func:`parameter_vjp`
    (``-lambda^T dF/dleaf``)."""
    return _ImplicitSolve.apply(handle, *leaves)
