"""``nonlinear_solve``: roots of ``F(u, *params) = 0`` by Newton, Anderson or Picard, with
gradients with respect to ``params`` by the implicit function theorem (one adjoint solve).

The residual ``F`` is any torch function of ``u`` (a tensor of ``u0``'s shape) and the
parameters; it returns the residual (``u``'s shape), or ``(residual, J)`` with ``J`` the sparse
Jacobian ``dF/du`` as a :class:`SparseTensor` of shape ``(n, n)`` (``n = u0.numel()``, ``u``
flattened in row-major order). Where ``J`` comes from, in this order:

1. ``F`` returns ``(r, J)``, or ``jacobian=`` is a callable ``J(u, *params)``: the user's.
2. ``jac_pattern=`` (a SparseTensor whose entries are the pattern, or a ``(rows, cols)`` pair):
   coloring (``ops/coloring.py``): one AD pass per color, assembled on the pattern.
3. no pattern and ``n <= jacobian_dense_max`` (512): the dense Jacobian (``torch.func.jacfwd`` /
   ``jacrev``), handed to the linear solver as a full sparse matrix.
4. otherwise: matrix-free Newton-Krylov, GMRES on Jacobian-vector products.

``jacobian="dense" | "coloring" | "matrix-free"`` forces 2-4. ``ad="reverse"`` (default) gets
derivatives by reverse mode (VJPs; works through everything autograd differentiates,
sparsetorch's own ``A @ u`` included); ``ad="forward"`` by forward mode (JVPs:
``torch.func.jvp``/``jacfwd``, which need forward-mode support in every op of ``F``).

Which method runs: ``method=None`` (the default) lets the library choose: Newton (line search,
then a dogleg trust-region step where the line search fails), and when Newton fails, Anderson
and then Picard on the fixed-point map ``u - omega M^-1 F(u)``, each from the best iterate so
far; ``info.attempts`` records each. A method named by ``method=`` (a name, or a record
``Newton(...)``, ``Anderson(...)``, ``Picard(...)`` carrying its options) is pinned: it runs alone
and raises a :class:`NotConvergedError` naming what to try.

Linear systems with a sparse ``J`` go through dispatch (the same path as
:class:`sparsetorch.Solver`): one plan per pattern, chosen once and reused at every Newton step
with new values (a direct backend keeps its symbolic analysis and refactorizes); the backward
pass solves ``J^T lambda = g`` on that same plan with ``adjoint=True`` (a transpose solve of the
factorization, or the Krylov method on the transposed operator), never assuming symmetry, at
the ``u`` returned, whichever method found it.

See docs/nonlinear.md for the math, the options and the caveats.

Layout: ``_methods.py`` (the method records and how names and keywords become them),
``_problem.py`` (checks, residual, linear solvers, preconditioner, info), ``_jacobian.py`` (the
Jacobian sources), ``_iterations.py`` (the driver and hand-over, Anderson, Picard), ``_newton.py``
(Newton with its line search and trust-region step), ``_common.py`` (what the iterations share),
``_linear.py`` (one dispatch plan per Jacobian pattern), ``_records.py``
(info). The adjoint rule is in ``autograd/nonlinear.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ...autograd.nonlinear import implicit_solve
from ...errors import InputError
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import is_plain, vmapped
from ._jacobian import DENSE_JACOBIAN_MAX, JACOBIAN_MODES
from ._methods import AUTO_ORDER, METHODS, UNSET, Anderson, Method, Newton, Picard
from ._problem import Problem
from ._records import NonlinearAttempt, NonlinearSolveInfo

__all__ = ["nonlinear_solve", "NonlinearSolveInfo", "NonlinearAttempt", "Newton", "Anderson", "Picard", "Method",
           "METHODS", "JACOBIAN_MODES", "AUTO_ORDER"]


def nonlinear_solve(
    F: Callable[..., Any],
    u0: torch.Tensor,
    params: Sequence[Any] | torch.Tensor | SparseTensor = (),
    *,
    method: str | Method | None = None,
    jacobian: Callable[..., SparseTensor] | str | None = None,
    jac_pattern: SparseTensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    ad: str = "reverse",
    rtol: float | None = None,
    atol: float = 0.0,
    maxiter: int | None = UNSET,
    line_search: bool = UNSET,
    max_backtracks: int = UNSET,
    depth: int = UNSET,
    damping: float = UNSET,
    omega: float = UNSET,
    preconditioner: SparseTensor | Callable | str | None = None,
    linear_options: dict[str, Any] | None = None,
    jacobian_dense_max: int = DENSE_JACOBIAN_MAX,
    check_pattern: bool = True,
    on_nonconvergence: str = "raise",
    callback: Callable[[int, float], None] | None = None,
    return_info: bool = False,
):
    """Solve ``F(u, *params) = 0`` for ``u``, starting from ``u0``; differentiable in ``params``.

    Args:
        F: ``F(u, *params)`` returns the residual (``u``'s shape and dtype), or ``(r, J)`` with
            ``J`` a :class:`SparseTensor` ``(n, n)``, ``J[i, j] = dF_i/du_j`` on the flattened ``u``.
        u0: the initial guess (float32/float64, any shape); it gets no gradient.
        params: a tuple of parameters passed to ``F`` after ``u``: tensors and SparseTensors get
            gradients (a SparseTensor's through its values), anything else is passed as is. A
            single tensor or SparseTensor may be given bare.
        method: None (default): the library chooses: Newton, and if it fails, Anderson, then
            Picard (see below), each from the best iterate found so far, until one converges.
            Or pin one, which then runs alone and raises naming what to try when it fails:
            "newton" (backtracking line search on ``||F||``; where it fails, or the linear solve
            fails, a dogleg trust-region step), "anderson" (Anderson acceleration of
            ``G(u) = u - omega M^-1 F(u)``, memory ``depth``, mixing ``damping``) or "picard"
            (``u <- u - omega M^-1 F(u)``; for ``F(u) = u - g(u)`` and ``omega = 1`` that is
            ``u <- g(u)``). ``M`` is ``preconditioner`` (identity by default). Or pin one with its
            options as a record: ``Newton(line_search=True, max_backtracks=20, maxiter=None)``,
            ``Anderson(depth=5, damping=1.0, omega=1.0, maxiter=None)``,
            ``Picard(omega=1.0, damping=1.0, maxiter=None)``; the keywords below that records
            carry (``maxiter``, ``line_search``, ``max_backtracks``, ``depth``, ``damping``,
            ``omega``) then must not be given (:class:`InputError` naming the field to set).
        jacobian: a callable ``J(u, *params) -> SparseTensor``, or "dense", "coloring",
            "matrix-free" to force how ``J`` is formed (default: see the module docstring).
        jac_pattern: the Jacobian's sparsity pattern (SparseTensor ``(n, n)``, values ignored, or
            ``(rows, cols)``) for the coloring Jacobian. It must contain every entry of ``J``;
            ``check_pattern`` (default on) verifies that once with a random probe.
        ad: "reverse" (VJPs) or "forward" (JVPs) for Jacobians made by autograd.
        rtol, atol: converged when ``||F(u)|| <= max(rtol ||F(u0)||, atol)``. With no ``rtol``
            (the accuracy contract, ``sparsetorch.ops.accuracy``): ``rtol = default_rtol(dtype)``
            (1e-10 in float64, 1e-5 in float32), and Newton also stops, converged, when its step
            falls below the rounding of ``u`` (the residual is then as small as the dtype allows;
            ``info.extra["at_precision"]``). An explicit ``rtol``/``atol`` keeps its meaning.
        maxiter: iteration limit of each attempt (default 50 Newton, 200 Anderson, 1000 Picard).
        line_search, max_backtracks, depth, damping, omega: the options of the method records
            (see ``method``; defaults True, 20, 5, 1.0, 1.0), for a method given by name or None.
        line_search: Newton backtracks (halving, at most ``max_backtracks`` times) until
            ``||F(u + a du)|| <= (1 - 1e-4 a) ||F(u)||``, and takes a dogleg trust-region step
            where that fails; ``False``: plain Newton (full steps, no recovery).
        preconditioner: for Anderson/Picard (pinned, or tried after Newton when
            ``method=None``): a SparseTensor ``P`` (``M^-1 r`` is a solve with ``P``, factorized
            once), "jacobian" (``P = J(u0)``, the chord method), or a callable ``r -> M^-1 r`` on
            tensors of ``u``'s shape.
        linear_options: options of the linear solves (those of :func:`sparsetorch.solve`:
            ``backend``, ``method``, ``preconditioner``, ``rtol`` (default ``default_rtol(dtype)``:
            1e-10 in float64, 1e-5 in float32), ``maxiter``, ..., plus ``properties`` (default
            "general": the Jacobian's symmetry may change from step to step; pass "spd" when ``J``
            is SPD at every ``u`` to allow CG/Cholesky), ``on_nonconvergence``, ``cache``).
            Matrix-free Newton uses GMRES with ``rtol``, ``atol``, ``maxiter``, ``restart`` and a
            callable ``preconditioner``; without ``rtol`` it picks an inexact-Newton forcing term
            ``min(0.1, ||F_k|| / ||F_0||)``.
        jacobian_dense_max: largest ``n`` for the automatic dense Jacobian.
        on_nonconvergence: "raise" (:class:`NotConvergedError`, ``.info`` holds the record),
            "warn" (:class:`NotConvergedWarning`, returns ``u`` anyway: the pinned method's last
            iterate, or the best iterate of all attempts) or "ignore".
        callback: ``callback(iteration, ||F(u)||)`` after every iteration (and for ``u0``, as 0);
            iterations are counted across attempts.
        return_info: also return a :class:`NonlinearSolveInfo`.

    Returns:
        ``u`` (``u0``'s shape), or ``(u, info)``. Gradients of a loss of ``u`` with respect to
        ``params`` come from one adjoint solve ``J^T lambda = dL/du`` at the returned ``u`` and one
        VJP of ``F`` (``dL/dparams = -lambda^T dF/dparams``), whatever the iteration count and
        whichever method found ``u``.
    """
    _no_functorch(u0, params)
    problem = Problem.create(
        F, u0, params, method=method, jacobian=jacobian, jac_pattern=jac_pattern, ad=ad, rtol=rtol, atol=atol,
        maxiter=maxiter, line_search=line_search, max_backtracks=max_backtracks, depth=depth, damping=damping,
        omega=omega, preconditioner=preconditioner, linear_options=linear_options,
        jacobian_dense_max=jacobian_dense_max, check_pattern=check_pattern, on_nonconvergence=on_nonconvergence,
        callback=callback,
    )
    u = implicit_solve(problem, problem.leaves)
    if not return_info:
        return u
    return u, problem.info()


def _no_functorch(u0: Any, params: Any) -> None:
    """A named error under torch.func transforms (grad / vmap / jacrev over nonlinear_solve), which the solver cannot
    run under: it loops on data-dependent convergence tests and reads numbers on the host; they surfaced as torch's
    internal errors ("Cannot access data pointer", "data-dependent control flow", ".item()"; session 26's sweep)."""
    tensors = [u0] + [p.values if isinstance(p, SparseTensor) else p
                      for p in (params if isinstance(params, (tuple, list)) else (params,))]
    for t in tensors:
        if isinstance(t, torch.Tensor) and (not is_plain(t) or vmapped(t)):
            raise InputError("nonlinear_solve does not run under torch.func transforms (grad, vmap, jacrev, jvp): it "
                             "loops on data-dependent convergence tests; differentiate it with torch.autograd "
                             "(loss.backward() or torch.autograd.grad: one adjoint solve per call)")
