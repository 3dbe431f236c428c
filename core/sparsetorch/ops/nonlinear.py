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

Linear systems with a sparse ``J`` go through dispatch (the same path as
:class:`sparsetorch.Solver`): one plan per pattern, chosen once and reused at every Newton step
with new values (a direct backend keeps its symbolic analysis and refactorizes); the backward
pass solves ``J^T lambda = g`` on that same plan with ``adjoint=True`` (a transpose solve of the
factorization, or the Krylov method on the transposed operator), never assuming symmetry.

See docs/nonlinear.md for the math, the options and the caveats.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..autograd.handles import SolveHandle
from ..autograd.nonlinear import implicit_solve
from ..errors import InputError, NotConvergedError, NotConvergedWarning, SingularMatrixError
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain
from ._dispatch import CALL_OPTIONS, obtain_plan
from .coloring import ColoredJacobian, colored_jacobian, forward_ad
from .info import IterationResult, Status
from .solve import options_from_kwargs, solve_request

__all__ = ["nonlinear_solve", "NonlinearSolveInfo", "METHODS", "JACOBIAN_MODES"]

METHODS = ("newton", "anderson", "picard")
JACOBIAN_MODES = ("dense", "coloring", "matrix-free")
_POLICIES = ("raise", "warn", "ignore")
_LINEAR_EXTRA = ("properties", "on_nonconvergence", "cache")
DENSE_JACOBIAN_MAX = 512
_MAXITER = {"newton": 50, "anderson": 200, "picard": 1000}
_ARMIJO = 1e-4


@dataclass(frozen=True)
class NonlinearSolveInfo:
    """What ``nonlinear_solve(..., return_info=True)`` returns beside ``u``.

    ``residual`` is ``||F(u)||_2`` at the returned ``u`` (absolute), ``residual_history`` the norms
    after each iteration, starting with ``||F(u0)||``. ``jacobian`` says where ``J`` came from
    ("returned", "user", "coloring", "dense", "matrix-free", or None when no Jacobian was
    needed); ``linear_backend``/``linear_method`` the linear solver used (the last plan),
    ``linear_iterations`` its iteration count per linear solve, ``plans_built`` how many linear
    plans were chosen (1 when the pattern stayed the same), ``plan_reused`` whether the first one
    came from the plan cache (an earlier call on the same pattern). ``extra["adjoint"]`` collects the
    adjoint solves' :class:`IterationResult` once the backward pass has run.
    """

    method: str
    iterations: int
    converged: bool
    status: Status
    reason: str
    residual: float
    initial_residual: float
    residual_history: tuple[float, ...]
    function_evaluations: int
    jacobian: str | None
    jacobian_evaluations: int
    colors: int | None
    linear_backend: str | None
    linear_method: str | None
    linear_iterations: tuple[int, ...]
    plans_built: int
    plan_reused: bool = False
    extra: dict = field(default_factory=dict, compare=False)


def nonlinear_solve(
    F: Callable[..., Any],
    u0: torch.Tensor,
    params: Sequence[Any] | torch.Tensor | SparseTensor = (),
    *,
    method: str = "newton",
    jacobian: Callable[..., SparseTensor] | str | None = None,
    jac_pattern: SparseTensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    ad: str = "reverse",
    rtol: float | None = None,
    atol: float = 0.0,
    maxiter: int | None = None,
    line_search: bool = True,
    max_backtracks: int = 20,
    depth: int = 5,
    damping: float = 1.0,
    omega: float = 1.0,
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
        method: "newton" (with backtracking line search on ``||F||``), "anderson" (Anderson
            acceleration of ``G(u) = u - omega M^-1 F(u)``, memory ``depth``, mixing ``damping``)
            or "picard" (``u <- u - omega M^-1 F(u)``; for ``F(u) = u - g(u)`` and ``omega = 1``
            that is ``u <- g(u)``). ``M`` is ``preconditioner`` (identity by default).
        jacobian: a callable ``J(u, *params) -> SparseTensor``, or "dense", "coloring",
            "matrix-free" to force how ``J`` is formed (default: see the module docstring).
        jac_pattern: the Jacobian's sparsity pattern (SparseTensor ``(n, n)``, values ignored, or
            ``(rows, cols)``) for the coloring Jacobian. It must contain every entry of ``J``;
            ``check_pattern`` (default on) verifies that once with a random probe.
        ad: "reverse" (VJPs) or "forward" (JVPs) for Jacobians made by autograd.
        rtol, atol: converged when ``||F(u)|| <= max(rtol ||F(u0)||, atol)``; ``rtol`` defaults to
            1e-10 in float64 and 1e-4 in lower precision.
        maxiter: iteration limit (default 50 Newton, 200 Anderson, 1000 Picard iterations).
        line_search: Newton backtracks (halving, at most ``max_backtracks`` times) until
            ``||F(u + a du)|| <= (1 - 1e-4 a) ||F(u)||``.
        preconditioner: for Anderson/Picard: a SparseTensor ``P`` (``M^-1 r`` is a solve with
            ``P``, factorized once), "jacobian" (``P = J(u0)``, the chord method), or a callable
            ``r -> M^-1 r`` on tensors of ``u``'s shape.
        linear_options: options of the linear solves (those of :func:`sparsetorch.solve`:
            ``backend``, ``method``, ``preconditioner``, ``rtol`` (default 1e-10 in float64,
            1e-5 otherwise), ``maxiter``, ..., plus ``properties`` (default "general": the
            Jacobian's symmetry may change from step to step; pass "spd" when ``J`` is SPD at every
            ``u`` to allow CG/Cholesky), ``on_nonconvergence``, ``cache``). Matrix-free Newton uses GMRES with ``rtol``, ``atol``, ``maxiter``,
            ``restart`` and a callable ``preconditioner``; without ``rtol`` it picks an
            inexact-Newton forcing term ``min(0.1, ||F_k|| / ||F_0||)``.
        jacobian_dense_max: largest ``n`` for the automatic dense Jacobian.
        on_nonconvergence: "raise" (:class:`NotConvergedError`, ``.info`` holds the record),
            "warn" (:class:`NotConvergedWarning`, returns the last iterate) or "ignore".
        callback: ``callback(iteration, ||F(u)||)`` after every iteration (and for ``u0``, as 0).
        return_info: also return a :class:`NonlinearSolveInfo`.

    Returns:
        ``u`` (``u0``'s shape), or ``(u, info)``. Gradients of a loss of ``u`` with respect to
        ``params`` come from one adjoint solve ``J^T lambda = dL/du`` at ``u`` and one VJP of
        ``F`` (``dL/dparams = -lambda^T dF/dparams``), whatever the iteration count.
    """
    problem = _Problem.create(
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


# --------------------------------------------------------------------------------------------------
# Checks


def _check_u0(u0: object) -> torch.Tensor:
    if not isinstance(u0, torch.Tensor):
        raise InputError(f"nonlinear_solve: u0 must be a torch.Tensor, got {type(u0).__name__}")
    if u0.layout != torch.strided:
        raise InputError(f"nonlinear_solve: u0 must be dense (strided), got layout {u0.layout}")
    if u0.dtype.is_complex:
        raise InputError(
            f"nonlinear_solve: u0 has dtype {u0.dtype}; complex unknowns are not supported: solve for the "
            f"real and imaginary parts as one real vector"
        )
    if not u0.dtype.is_floating_point:
        raise InputError(f"nonlinear_solve: u0 has dtype {u0.dtype}; use a floating dtype, e.g. u0.to(torch.float64)")
    if u0.numel() == 0:
        raise InputError(f"nonlinear_solve: u0 has no entries (shape {tuple(u0.shape)})")
    if not bool(torch.isfinite(u0).all()):
        bad = int(torch.nonzero(~torch.isfinite(u0.detach().reshape(-1)))[0, 0])
        raise InputError(f"nonlinear_solve: u0 contains NaN or Inf (first at flat index {bad}); start from finite values")
    return u0.detach()


def _default_rtol(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-4


def _default_linear_rtol(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-5


def _check_number(name: str, value: object, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        raise InputError(f"nonlinear_solve: {name} must be a number in {lo}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _same_pattern(A: SparseTensor, B: SparseTensor) -> bool:
    if A.format != B.format or tuple(A.shape) != tuple(B.shape) or A.index_dtype != B.index_dtype:
        return False
    if A.pattern_key == B.pattern_key:
        return True
    for a, b in zip((*A.pos_buffers, *A.crd_buffers), (*B.pos_buffers, *B.crd_buffers)):
        if (a is None) != (b is None):
            return False
        if a is not None and (a.shape != b.shape or not torch.equal(a, b)):
            return False
    return True


# --------------------------------------------------------------------------------------------------
# The linear solver: one dispatch plan per pattern, reused while the pattern stays the same


#: Jacobian patterns seen by earlier calls (private copies of their index buffers, zero values), so
#: that a Jacobian rebuilt with fresh buffers on a known pattern meets its plan in the plan cache
#: across calls (a training loop), not only across Newton steps. Bounded; most recent last.
_PATTERNS: "OrderedDict[int, SparseTensor]" = OrderedDict()
_PATTERNS_MAX = 8


def _canonical_pattern(J: SparseTensor) -> SparseTensor:
    for key, P in _PATTERNS.items():
        if _same_pattern(P, J):
            _PATTERNS.move_to_end(key)
            return P
    P = J.detach().with_values(torch.zeros_like(J.values.detach())).convert(J.format, copy=True)
    _PATTERNS[id(P)] = P
    while len(_PATTERNS) > _PATTERNS_MAX:
        _PATTERNS.popitem(last=False)
    return P


class _LinearSolver:
    def __init__(self, options: dict[str, Any], properties: Any, policy: str, cache: bool) -> None:
        self.options = options
        self.properties = properties
        self.policy = policy
        self.cache = cache
        self.J: SparseTensor | None = None
        self.state = None
        self.offer = None
        self.plans = 0
        self.first_reused = False
        self.results: list[IterationResult] = []

    def load(self, J: SparseTensor) -> None:
        """New matrix: same pattern keeps the plan (numeric phase only), another pattern re-plans."""
        if self.J is None or not _same_pattern(self.J, J):
            Jd = J.detach()
            if self.cache and is_plain(Jd.values):
                Jd = _canonical_pattern(Jd).with_values(Jd.values)
            request = solve_request(Jd, None, self.properties, self.options)
            self.state, self.offer, _ = obtain_plan("solve", Jd, request, cache=self.cache)
            if self.plans == 0:
                self.first_reused = bool(self.state.reused)
            self.plans += 1
            self.J = Jd
        else:
            self.J = self.J.with_values(J.values.detach())
        self.state.load(self.J.values)

    def solve(self, b: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``J x = b`` (``J^T x = b`` when ``adjoint``) for a flat ``b``, on the current plan."""
        call = {k: self.options.get(k) for k in CALL_OPTIONS}
        h = SolveHandle(self.state, self.J, adjoint, self.policy, self.results, call_options=call)
        return h.run(self.J.values, b.reshape(-1, 1)).reshape(-1)


# --------------------------------------------------------------------------------------------------
# The problem: F, its parameters, the Jacobian source, the iterations and the adjoint


@dataclass
class _Record:
    history: list[float] = field(default_factory=list)
    iterations: int = 0
    status: Status = Status.MAX_ITERATIONS
    reason: str = ""
    fevals: int = 0
    jevals: int = 0
    gmres: list[IterationResult] = field(default_factory=list)
    adjoint: list[IterationResult] = field(default_factory=list)


class _Problem:
    """Everything one ``nonlinear_solve`` call needs; the handle of its autograd Function."""

    @classmethod
    def create(cls, F, u0, params, **kw) -> "_Problem":
        self = cls()
        if not callable(F):
            raise InputError(f"nonlinear_solve: F must be a callable F(u, *params), got {type(F).__name__}")
        self.F = F
        self.u0 = _check_u0(u0)
        self.shape = tuple(self.u0.shape)
        self.n = self.u0.numel()
        self.dtype, self.device = self.u0.dtype, self.u0.device
        method = kw["method"]
        if method not in METHODS:
            raise InputError(f"nonlinear_solve: method must be one of {METHODS}, got {method!r}")
        self.method = method
        if kw["on_nonconvergence"] not in _POLICIES:
            raise InputError(f"nonlinear_solve: on_nonconvergence must be one of {_POLICIES}, got {kw['on_nonconvergence']!r}")
        self.policy = kw["on_nonconvergence"]
        if kw["ad"] not in ("reverse", "forward"):
            raise InputError(f"nonlinear_solve: ad must be 'reverse' (VJPs) or 'forward' (JVPs), got {kw['ad']!r}")
        self.ad = kw["ad"]
        rtol = _default_rtol(self.dtype) if kw["rtol"] is None else kw["rtol"]
        self.rtol = _check_number("rtol", rtol, low=0)
        self.atol = _check_number("atol", kw["atol"], low=0)
        if self.rtol == 0 and self.atol == 0:
            raise InputError("nonlinear_solve: rtol and atol are both 0: the iteration could never stop; give one of them")
        maxiter = _MAXITER[method] if kw["maxiter"] is None else kw["maxiter"]
        if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
            raise InputError(f"nonlinear_solve: maxiter must be a positive int or None, got {kw['maxiter']!r}")
        self.maxiter = maxiter
        self.line_search = bool(kw["line_search"])
        mb = kw["max_backtracks"]
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
            raise InputError(f"nonlinear_solve: max_backtracks must be an int >= 0, got {mb!r}")
        self.max_backtracks = mb
        depth = kw["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise InputError(f"nonlinear_solve: depth (Anderson memory) must be an int >= 0, got {depth!r}")
        self.depth = depth if method == "anderson" else 0
        self.damping = _check_number("damping", kw["damping"], low=0, high=1, low_open=True)
        self.omega = _check_number("omega", kw["omega"], low=0, low_open=True)
        self.callback = kw["callback"]
        if self.callback is not None and not callable(self.callback):
            raise InputError(f"nonlinear_solve: callback must be callable(iteration, residual_norm), got {type(self.callback).__name__}")
        dmax = kw["jacobian_dense_max"]
        if isinstance(dmax, bool) or not isinstance(dmax, int) or dmax < 0:
            raise InputError(f"nonlinear_solve: jacobian_dense_max must be an int >= 0, got {dmax!r}")
        self.check_pattern = bool(kw["check_pattern"])
        self._bind_params(params)
        self._linear_setup(kw["linear_options"])
        self.record = _Record()
        self._last_J: tuple[torch.Tensor, SparseTensor] | None = None
        self._jac_checked = False
        self.colored: ColoredJacobian | None = None
        self.dense_pattern: SparseTensor | None = None
        # The first evaluation tells whether F returns (r, J), and checks the residual's shape.
        self.returns_jacobian: bool | None = None
        x0 = self._x0 = self.u0.reshape(-1)
        with torch.no_grad():
            r0 = self.f(x0, self.bind(self._detached_leaves()), first=True)
        if not bool(torch.isfinite(r0).all()):
            bad = int(torch.nonzero(~torch.isfinite(r0))[0, 0])
            raise InputError(
                f"nonlinear_solve: F(u0) contains NaN or Inf at iteration 0 (first at flat index {bad}, "
                f"value {r0[bad].item()}); start from a point where F is finite"
            )
        self._r0 = r0
        self._choose_jacobian(kw["jacobian"], kw["jac_pattern"], dmax)
        self._setup_preconditioner(kw["preconditioner"])
        return self

    # Parameters ---------------------------------------------------------------------------------
    def _bind_params(self, params: Any) -> None:
        if isinstance(params, (torch.Tensor, SparseTensor)):
            params = (params,)
        if not isinstance(params, (tuple, list)):
            raise InputError(
                f"nonlinear_solve: params must be a tuple of the extra arguments of F (tensors, SparseTensors or "
                f"constants), got {type(params).__name__}; wrap one parameter as (p,)"
            )
        self.slots: list[tuple[str, Any]] = []
        leaves: list[torch.Tensor] = []
        for p in params:
            if isinstance(p, SparseTensor):
                self.slots.append(("sparse", p.detach()))
                leaves.append(p.values)
            elif isinstance(p, torch.Tensor):
                self.slots.append(("tensor", None))
                leaves.append(p)
            else:
                self.slots.append(("const", p))
        self.leaves = tuple(leaves)

    def _detached_leaves(self, leaves: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        return [t.detach() for t in (self.leaves if leaves is None else leaves)]

    def bind(self, leaves: Sequence[torch.Tensor]) -> tuple:
        out, it = [], iter(leaves)
        for kind, tmpl in self.slots:
            if kind == "tensor":
                out.append(next(it))
            elif kind == "sparse":
                out.append(tmpl.with_values(next(it)))
            else:
                out.append(tmpl)
        return tuple(out)

    # Residual -------------------------------------------------------------------------------------
    def f(self, x: torch.Tensor, params: tuple, *, first: bool = False) -> torch.Tensor:
        """Flat residual ``F(x)``; keeps a returned Jacobian with the ``x`` it belongs to."""
        self.record.fevals += 1
        out = self.F(x.reshape(self.shape), *params)
        J = None
        if isinstance(out, (tuple, list)):
            if len(out) != 2 or not isinstance(out[1], SparseTensor):
                raise InputError(
                    f"nonlinear_solve: F returned a {type(out).__name__} of {len(out)} items; it must return the "
                    f"residual, or (residual, J) with J a SparseTensor"
                )
            out, J = out
        if first:
            self.returns_jacobian = J is not None
        elif (J is not None) != self.returns_jacobian:
            raise InputError("nonlinear_solve: F returned (r, J) on some calls and r alone on others; be consistent")
        if not isinstance(out, torch.Tensor):
            raise InputError(f"nonlinear_solve: F must return a torch.Tensor residual, got {type(out).__name__}")
        if tuple(out.shape) != self.shape:
            raise InputError(
                f"nonlinear_solve: F returned a residual of shape {tuple(out.shape)}, but u has shape {self.shape}; "
                f"F(u, *params) must return one residual per unknown, in u's shape"
            )
        if out.dtype != self.dtype or out.device != self.device:
            raise InputError(
                f"nonlinear_solve: F returned a residual of dtype {out.dtype} on {out.device}, but u0 is {self.dtype} "
                f"on {self.device}; make F keep u's dtype and device (cast its parameters)"
            )
        if J is not None:
            self._last_J = (x, J)
        return out.reshape(-1)

    def flat(self, params: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> F(x)`` flat, for AD (does not count evaluations or keep Jacobians)."""

        def fn(x: torch.Tensor) -> torch.Tensor:
            out = self.F(x.reshape(self.shape), *params)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return out.reshape(-1)

        return fn

    # Jacobian -------------------------------------------------------------------------------------
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
            from ..format import CSR

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

    # Linear solver setup ------------------------------------------------------------------------
    def _linear_setup(self, linear_options: dict[str, Any] | None) -> None:
        if not isinstance(linear_options, (dict, type(None))):
            raise InputError(f"nonlinear_solve: linear_options must be a dict of solve options, got {type(linear_options).__name__}")
        lo = dict(linear_options or {})
        extra = {k: lo.pop(k) for k in _LINEAR_EXTRA if k in lo}
        self._user_linear_rtol = lo.get("rtol")
        lo.setdefault("rtol", _default_linear_rtol(self.dtype))
        self.linear_options = options_from_kwargs("nonlinear_solve linear_options", lo)
        policy = extra.get("on_nonconvergence", "raise")
        if policy not in _POLICIES:
            raise InputError(f"nonlinear_solve: linear_options on_nonconvergence must be one of {_POLICIES}, got {policy!r}")
        self.linear_policy = policy
        # A Jacobian's symmetry or definiteness at one iterate says nothing about the next (a
        # convection term that vanishes at u0, a reaction term that changes sign): unless the user
        # vouches for it, plan for a general matrix (LU, GMRES, BiCGStab; never CG or MINRES).
        props = extra.get("properties", "general")
        self.linear = _LinearSolver(self.linear_options, props, policy, bool(extra.get("cache", True)))

    def _setup_preconditioner(self, pre: Any) -> None:
        self.pre_kind = None
        self.pre_fn = None
        if pre is None:
            return
        if self.method == "newton":
            raise InputError(
                "nonlinear_solve: preconditioner= is for method='anderson'/'picard' (the fixed-point map "
                "u - omega M^-1 F(u)); for Newton's linear solves use linear_options={'preconditioner': ...}"
            )
        if isinstance(pre, SparseTensor):
            P = self._check_J(pre, "preconditioner=")
            if not bool(torch.isfinite(P.values).all()):
                raise InputError("nonlinear_solve: the preconditioner matrix P contains NaN or Inf; fix its values")
            self.pre_kind = "matrix"
            self.linear.load(P)
        elif isinstance(pre, str) and pre == "jacobian":
            if self.jac_kind == "matrix-free":
                raise InputError(
                    "nonlinear_solve: preconditioner='jacobian' needs a sparse Jacobian (F returning (r, J), jacobian=, "
                    f"jac_pattern=, or n <= jacobian_dense_max); here n = {self.n} and none is given"
                )
            self.pre_kind = "jacobian"
            params = self.bind(self._detached_leaves())
            self.linear.load(self.jacobian_at(self.u0.reshape(-1), params, 0))
        elif callable(pre) and not isinstance(pre, torch.Tensor):
            self.pre_kind = "callable"
            self.pre_fn = pre
        else:
            got = repr(pre) if isinstance(pre, str) else type(pre).__name__
            raise InputError(
                f"nonlinear_solve: preconditioner must be a SparseTensor P, 'jacobian', or a callable r -> M^-1 r, got {got}"
                + ("; wrap a dense matrix with sparsetorch.SparseTensor.from_dense" if isinstance(pre, torch.Tensor) else "")
            )

    def precondition(self, r: torch.Tensor) -> torch.Tensor:
        if self.pre_kind is None:
            return r
        if self.pre_kind == "callable":
            out = self.pre_fn(r.reshape(self.shape))
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != self.shape:
                raise InputError(
                    f"nonlinear_solve: the preconditioner callable must return a tensor of u's shape {self.shape}, got "
                    f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
                )
            return out.reshape(-1)
        return self.linear.solve(r)

    # Forward ----------------------------------------------------------------------------------------
    def run(self, leaves: Sequence[torch.Tensor]) -> torch.Tensor:
        params = self.bind(self._detached_leaves(leaves))
        with torch.no_grad():
            x = self._x0
            r = self._r0
            if self.method == "newton":
                x = self._newton(x, r, params)
            else:
                x = self._fixed_point(x, r, params)
        self._finish()
        return x.reshape(self.shape).clone()  # never an alias of u0

    def _target(self) -> float:
        return max(self.rtol * self.record.history[0], self.atol)

    def _note(self, it: int, norm: float) -> None:
        self.record.history.append(norm)
        self.record.iterations = it
        if self.callback is not None:
            self.callback(it, norm)

    def _not_finite(self, it: int, r: torch.Tensor, what: str) -> None:
        bad = torch.nonzero(~torch.isfinite(r))
        where = f" (first at flat index {int(bad[0, 0])})" if bad.numel() else ""
        self.record.status = Status.NOT_FINITE
        self.record.reason = f"F returned NaN or Inf at iteration {it}{where} {what}; the last finite iterate is returned"

    def _newton(self, x: torch.Tensor, r: torch.Tensor, params: tuple) -> torch.Tensor:
        rec = self.record
        norm = float(torch.linalg.vector_norm(r))
        self._note(0, norm)
        target = self._target()
        for it in range(1, self.maxiter + 1):
            if norm <= target:
                break
            dx = self._newton_step(x, r, params, it, norm)
            alpha = 1.0
            accepted = None
            best = None
            for _ in range(self.max_backtracks + 1 if self.line_search else 1):
                xt = x + alpha * dx
                rt = self.f(xt, params)
                finite = bool(torch.isfinite(rt).all())
                nt = float(torch.linalg.vector_norm(rt)) if finite else math.inf
                if not self.line_search:
                    if not finite:
                        self._not_finite(it, rt, "at the full Newton step (line_search=False)")
                        return x
                    accepted = (xt, rt, nt)
                    break
                if finite and (best is None or nt < best[2]):
                    best = (xt, rt, nt)
                if nt <= (1 - _ARMIJO * alpha) * norm:
                    accepted = (xt, rt, nt)
                    break
                alpha *= 0.5
            if accepted is None:
                rec.status = Status.BREAKDOWN
                rec.reason = (
                    f"line search at iteration {it}: no step in [2^-{self.max_backtracks}, 1] along the Newton direction "
                    f"reduced ||F|| = {norm:.3e} (best {best[2] if best else math.inf:.3e}); the Jacobian may be wrong or "
                    f"singular there, or no root is near u0"
                )
                return x
            x, r, norm = accepted
            self._note(it, norm)
        if norm <= target:
            rec.status, rec.reason = Status.CONVERGED, ""
        else:
            rec.status = Status.MAX_ITERATIONS
            rec.reason = f"maxiter ({self.maxiter}) reached with ||F|| = {norm:.3e} above the target {target:.3e}"
        return x

    def _newton_step(self, x: torch.Tensor, r: torch.Tensor, params: tuple, it: int, norm: float) -> torch.Tensor:
        if self.jac_kind == "matrix-free":
            from ..backends.torch_native.krylov import gmres

            o = self.linear_options
            if o.get("backend") not in (None, "torch") or o.get("method") not in (None, "gmres"):
                raise InputError(
                    "nonlinear_solve: matrix-free Newton-Krylov runs GMRES on Jacobian-vector products; linear_options "
                    f"backend={o.get('backend')!r}, method={o.get('method')!r} need a sparse Jacobian (give jac_pattern= "
                    f"or jacobian=)"
                )
            pre = o.get("preconditioner")
            if pre is not None and not callable(pre):
                raise InputError(
                    f"nonlinear_solve: matrix-free Newton takes a callable preconditioner (X -> M^-1 X on (n, k) blocks), "
                    f"got {pre!r}"
                )
            if self._user_linear_rtol is not None:
                eta = float(self._user_linear_rtol)
            else:  # inexact Newton forcing term; no tighter than the outer target needs
                eta = min(0.1, max(norm / self.record.history[0], 0.5 * self._target() / max(norm, 1e-300)))
            mv = self.linearize(x, params)
            dx, res = gmres(mv, -r.reshape(-1, 1), rtol=eta, atol=float(o.get("atol") or 0.0),
                            maxiter=o.get("maxiter"), restart=int(o.get("restart") or 30), M=pre,
                            check_every=int(o.get("check_every") or 8))
            self.record.gmres.append(res)
            if not res.converged and res.status is not Status.MAX_ITERATIONS:
                self._linear_failed(res, f"Newton iteration {it}")
            return dx.reshape(-1)
        J = self.jacobian_at(x, params, it)
        try:
            self.linear.load(J)
            return self.linear.solve(-r)
        except SingularMatrixError as exc:
            raise SingularMatrixError(f"nonlinear_solve: the Jacobian at Newton iteration {it} is singular: {exc}", exc.row) from exc

    def _linear_failed(self, res: IterationResult, where: str) -> None:
        msg = (
            f"nonlinear_solve: matrix-free GMRES ({where}) stopped after {res.iterations} iterations with relative "
            f"residual {res.residual:.3g} ({res.status.value}: {res.reason}); give jac_pattern= for a sparse Jacobian "
            f"and a direct solver, a preconditioner in linear_options, or a larger maxiter"
        )
        if self.linear_policy == "raise":
            raise NotConvergedError(msg, res)
        if self.linear_policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=5)

    def _fixed_point(self, x: torch.Tensor, r: torch.Tensor, params: tuple) -> torch.Tensor:
        """Anderson (type II, Walker & Ni) on ``G(x) = x - omega M^-1 F(x)``; depth 0 is Picard."""
        rec = self.record
        norm = float(torch.linalg.vector_norm(r))
        self._note(0, norm)
        target = self._target()
        beta, m = self.damping, self.depth
        dX: list[torch.Tensor] = []
        dG: list[torch.Tensor] = []
        x_prev = g_prev = None
        for it in range(1, self.maxiter + 1):
            if norm <= target:
                break
            g = -self.omega * self.precondition(r)  # G(x) - x
            if m and x_prev is not None:
                dX.append(x - x_prev)
                dG.append(g - g_prev)
                if len(dX) > m:
                    dX.pop(0)
                    dG.pop(0)
            x_prev, g_prev = x, g
            if dX:
                DG = torch.stack(dG, 1)
                gamma = _lstsq(DG, g)
                x_new = x + beta * g - (torch.stack(dX, 1) + beta * DG) @ gamma
            else:
                x_new = x + beta * g
            r_new = self.f(x_new, params)
            if not bool(torch.isfinite(r_new).all()):
                self._not_finite(it, r_new, f"({self.method})")
                return x
            x, r = x_new, r_new
            norm = float(torch.linalg.vector_norm(r))
            self._note(it, norm)
        if norm <= target:
            rec.status, rec.reason = Status.CONVERGED, ""
        else:
            rec.status = Status.MAX_ITERATIONS
            rec.reason = (
                f"maxiter ({self.maxiter}) reached with ||F|| = {norm:.3e} above the target {target:.3e}; "
                f"{self.method} converges linearly at best: try method='newton', a preconditioner, or a smaller omega"
            )
        return x

    def _finish(self) -> None:
        rec = self.record
        if rec.status is Status.CONVERGED:
            return
        msg = (
            f"nonlinear_solve ({self.method}) did not converge: {rec.reason}. Iterations {rec.iterations}, "
            f"||F(u0)|| = {rec.history[0]:.3e}, ||F(u)|| = {rec.history[-1]:.3e}; pass on_nonconvergence='warn' to "
            f"get u anyway"
        )
        if self.policy == "raise":
            raise NotConvergedError(msg, self.info())
        if self.policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=6)

    # Backward -------------------------------------------------------------------------------------
    def adjoint(self, u: torch.Tensor, leaves: Sequence[torch.Tensor], g: torch.Tensor) -> torch.Tensor:
        """``lambda`` with ``J(u)^T lambda = g``: a transpose solve on the linear plan, or GMRES on VJPs."""
        params = self.bind(self._detached_leaves(leaves))
        x = u.detach().reshape(-1)
        g = g.detach().reshape(-1).to(self.dtype)
        if self.jac_kind == "matrix-free":
            from ..backends.torch_native.krylov import gmres

            fn = self.flat(params)
            with torch.enable_grad():
                xg = x.clone().requires_grad_()
                r = fn(xg)

            def vjp(V: torch.Tensor) -> torch.Tensor:
                cols = []
                for c in range(V.shape[1]):
                    (jt,) = torch.autograd.grad(r, xg, V[:, c], retain_graph=True, allow_unused=True)
                    cols.append(torch.zeros_like(x) if jt is None else jt)
                return torch.stack(cols, 1)

            o = self.linear_options
            lam, res = gmres(vjp, g.reshape(-1, 1), rtol=o["rtol"], atol=o["atol"], maxiter=o.get("maxiter"),
                             restart=int(o.get("restart") or 30), check_every=int(o.get("check_every") or 8))
            self.record.adjoint.append(res)
            if not res.converged:
                self._linear_failed(res, "adjoint solve J^T lambda = dL/du")
            return lam.reshape(-1)
        with torch.no_grad():
            J = self.jacobian_at(x, params, self.record.iterations)
            self.linear.load(J)
            n_before = len(self.linear.results)
            lam = self.linear.solve(g, adjoint=True)
            self.record.adjoint.extend(self.linear.results[n_before:])
        return lam

    def param_vjp(self, u: torch.Tensor, leaves: Sequence[torch.Tensor], lam: torch.Tensor, need: Sequence[bool]):
        """``-lambda^T dF/dleaf`` for the leaves that need a gradient."""
        with torch.enable_grad():
            ls = [t.detach().requires_grad_(bool(nd)) for t, nd in zip(leaves, need)]
            r = self.flat(self.bind(ls))(u.detach().reshape(-1))
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

    # Info -----------------------------------------------------------------------------------------
    def info(self) -> NonlinearSolveInfo:
        rec = self.record
        mf = self.jac_kind == "matrix-free" and self.method == "newton"
        lin_iters = tuple(r.iterations for r in (rec.gmres if mf else self.linear.results))
        if mf:
            backend, lmethod = "torch", "gmres (matrix-free)"
        elif self.linear.offer is not None:
            backend, lmethod = self.linear.offer.backend, self.linear.offer.method
        else:
            backend = lmethod = None
        used = self.method == "newton" or self.pre_kind == "jacobian"
        colors = self.colored.ncolors(self.ad) if self.colored is not None else None
        return NonlinearSolveInfo(
            method=self.method, iterations=rec.iterations, converged=rec.status is Status.CONVERGED, status=rec.status,
            reason=rec.reason, residual=rec.history[-1] if rec.history else float("nan"),
            initial_residual=rec.history[0] if rec.history else float("nan"), residual_history=tuple(rec.history),
            function_evaluations=rec.fevals, jacobian=self.jac_kind if used else None, jacobian_evaluations=rec.jevals,
            colors=colors, linear_backend=backend, linear_method=lmethod, linear_iterations=lin_iters,
            plans_built=self.linear.plans, plan_reused=self.linear.first_reused, extra={"adjoint": rec.adjoint, "jacobian_source": self.jac_kind},
        )


def _lstsq(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimum-norm least squares ``min ||A x - b||`` for a tall ``(n, m)`` A, small m (SVD, any device)."""
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    keep = s > s[0] * max(A.shape) * torch.finfo(A.dtype).eps * 1e3 if s.numel() else s > 0
    inv = torch.where(keep, 1 / torch.where(keep, s, torch.ones_like(s)), torch.zeros_like(s))
    return Vh.transpose(0, 1) @ (inv * (U.transpose(0, 1) @ b))
