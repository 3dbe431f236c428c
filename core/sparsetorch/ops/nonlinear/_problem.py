"""The problem of one ``nonlinear_solve`` call: the checks, ``F`` and its parameters, the linear
solvers, the preconditioner of the fixed-point methods and the info record. Where the Jacobian
comes from is in ``_jacobian.py``, the iterations in ``_iterations.py`` and ``_newton.py``, the
adjoint (backward pass) in ``autograd/nonlinear.py``."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ...errors import InputError, NotConvergedError, NotConvergedWarning
from ...tensor import SparseTensor
from ..accuracy import default_rtol
from ..coloring import ColoredJacobian
from ..info import IterationResult, Status
from ..solve import options_from_kwargs
from ._iterations import Iterations
from ._jacobian import Jacobians
from ._linear import LinearSolver
from ._methods import KEYWORDS, _check_number, check_method, resolve
from ._records import NonlinearAttempt, NonlinearSolveInfo

_POLICIES = ("raise", "warn", "ignore")
_LINEAR_EXTRA = ("properties", "on_nonconvergence", "cache")


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


@dataclass
class _Record:
    """What the iterations of one call leave behind (all attempts together)."""

    history: list[float] = field(default_factory=list)
    iterations: int = 0
    status: Status = Status.MAX_ITERATIONS
    reason: str = ""
    method: str = ""
    fevals: int = 0
    jevals: int = 0
    gmres: list[IterationResult] = field(default_factory=list)
    adjoint: list[IterationResult] = field(default_factory=list)
    attempts: list[NonlinearAttempt] = field(default_factory=list)
    #: (x, r, ||r||) of the finite iterate with the smallest residual so far, any attempt
    best: tuple | None = None
    #: True when a default tolerance was met at the dtype's precision (the Newton step or the
    #: fixed-point update fell below the rounding of u) rather than by the relative residual
    at_precision: bool = False
    #: ||F|| at the u returned (the last attempt's iterate, or the best one when every attempt failed)
    result_norm: float | None = None


class Problem(Jacobians, Iterations):
    """Everything one ``nonlinear_solve`` call needs; the handle of its autograd Function (whose
    adjoint rule, ``autograd/nonlinear.py``, uses its residual, Jacobian and linear solver)."""

    @classmethod
    def create(cls, F, u0, params, **kw) -> "Problem":
        self = cls()
        if not callable(F):
            raise InputError(f"nonlinear_solve: F must be a callable F(u, *params), got {type(F).__name__}")
        self.F = F
        self.u0 = _check_u0(u0)
        self.shape = tuple(self.u0.shape)
        self.n = self.u0.numel()
        self.dtype, self.device = self.u0.dtype, self.u0.device
        check_method(kw["method"])
        if kw["on_nonconvergence"] not in _POLICIES:
            raise InputError(f"nonlinear_solve: on_nonconvergence must be one of {_POLICIES}, got {kw['on_nonconvergence']!r}")
        self.policy = kw["on_nonconvergence"]
        if kw["ad"] not in ("reverse", "forward"):
            raise InputError(f"nonlinear_solve: ad must be 'reverse' (VJPs) or 'forward' (JVPs), got {kw['ad']!r}")
        self.ad = kw["ad"]
        # The accuracy contract (ops/accuracy.py): no rtol given means ||F(u)|| <= default_rtol(dtype)
        # ||F(u0)|| (1e-10 in float64, 1e-5 in float32), or, where rounding in F stops the residual
        # above that, a step below the rounding of u (the residual as small as the dtype allows).
        self.default_tolerance = kw["rtol"] is None
        rtol = default_rtol(self.dtype) if kw["rtol"] is None else kw["rtol"]
        self.rtol = _check_number("rtol", rtol, low=0)
        self.atol = _check_number("atol", kw["atol"], low=0)
        if self.rtol == 0 and self.atol == 0:
            raise InputError("nonlinear_solve: rtol and atol are both 0: the iteration could never stop; give one of them")
        #: a method the caller named (a name or a record) is pinned: it raises when it fails;
        #: method=None lets the library try AUTO_ORDER in turn. ``order``: the method records
        #: (each carrying its options: maxiter, line search, memory, damping, omega) to try.
        self.pinned, self.order = resolve(kw["method"], {k: kw[k] for k in KEYWORDS})
        self.method = self.order[0].name
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
            r0 = self.f(x0, self.bind(self.detached_leaves()), first=True)
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

    def detached_leaves(self, leaves: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
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

    # Linear solver setup ------------------------------------------------------------------------
    def _linear_setup(self, linear_options: dict[str, Any] | None) -> None:
        if not isinstance(linear_options, (dict, type(None))):
            raise InputError(f"nonlinear_solve: linear_options must be a dict of solve options, got {type(linear_options).__name__}")
        lo = dict(linear_options or {})
        extra = {k: lo.pop(k) for k in _LINEAR_EXTRA if k in lo}
        self._user_linear_rtol = lo.get("rtol")
        # The linear solves (Newton steps, the preconditioner, the adjoint) meet the same contract:
        # default_rtol(dtype), the accuracy of a backward-stable direct solve in that dtype.
        lo.setdefault("rtol", default_rtol(self.dtype))
        self.linear_options = options_from_kwargs("nonlinear_solve linear_options", lo)
        policy = extra.get("on_nonconvergence", "raise")
        if policy not in _POLICIES:
            raise InputError(f"nonlinear_solve: linear_options on_nonconvergence must be one of {_POLICIES}, got {policy!r}")
        self.linear_policy = policy
        # A Jacobian's symmetry or definiteness at one iterate says nothing about the next (a
        # convection term that vanishes at u0, a reaction term that changes sign): unless the user
        # vouches for it, plan for a general matrix (LU, GMRES, BiCGStab; never CG or MINRES).
        props = extra.get("properties", "general")
        cache = bool(extra.get("cache", True))
        self.linear = LinearSolver(self.linear_options, props, policy, cache)
        # The fixed-point methods' preconditioner P has a solver of its own: Newton (tried first when
        # the library chooses) loads J on the other one, and P's factorization must survive that.
        self.pre_linear = LinearSolver(self.linear_options, props, policy, cache)

    def _setup_preconditioner(self, pre: Any) -> None:
        """Check ``preconditioner=`` now; factorize it when a fixed-point method first needs it."""
        self.pre_kind = None
        self.pre_fn = None
        self.pre_matrix: SparseTensor | None = None
        self.pre_ready = False
        if pre is None:
            return
        if self.pinned and self.method == "newton":
            raise InputError(
                "nonlinear_solve: preconditioner= is for method='anderson'/'picard' (the fixed-point map "
                "u - omega M^-1 F(u)), or for method=None, where the library may hand over to them; for Newton's "
                "linear solves use linear_options={'preconditioner': ...}"
            )
        if isinstance(pre, SparseTensor):
            P = self._check_J(pre, "preconditioner=")
            if not bool(torch.isfinite(P.values).all()):
                raise InputError("nonlinear_solve: the preconditioner matrix P contains NaN or Inf; fix its values")
            self.pre_kind = "matrix"
            self.pre_matrix = P.detach()
        elif isinstance(pre, str) and pre == "jacobian":
            if self.jac_kind == "matrix-free":
                raise InputError(
                    "nonlinear_solve: preconditioner='jacobian' needs a sparse Jacobian (F returning (r, J), jacobian=, "
                    f"jac_pattern=, or n <= jacobian_dense_max); here n = {self.n} and none is given"
                )
            self.pre_kind = "jacobian"
        elif callable(pre) and not isinstance(pre, torch.Tensor):
            self.pre_kind = "callable"
            self.pre_fn = pre
        else:
            got = repr(pre) if isinstance(pre, str) else type(pre).__name__
            raise InputError(
                f"nonlinear_solve: preconditioner must be a SparseTensor P, 'jacobian', or a callable r -> M^-1 r, got {got}"
                + ("; wrap a dense matrix with sparsetorch.SparseTensor.from_dense" if isinstance(pre, torch.Tensor) else "")
            )

    def prepare_preconditioner(self, params: tuple) -> None:
        """Load ``P`` (or ``J(u0)`` for the chord method) on the preconditioner's solver, once."""
        if self.pre_ready or self.pre_kind not in ("matrix", "jacobian"):
            return
        if self.pre_kind == "matrix":
            self.pre_linear.load(self.pre_matrix)
        else:
            self.pre_linear.load(self.jacobian_at(self.u0.reshape(-1), params, 0))
        self.pre_ready = True

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
        return self.pre_linear.solve(r)

    # Operator solves -------------------------------------------------------------------------------
    def operator_solve(self, matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, *, rtol: float,
                       atol: float, M: Callable | None = None,
                       maxiter: int | None = None) -> tuple[torch.Tensor, IterationResult]:
        """``(x, IterationResult)`` of GMRES on ``matvec`` (``(n, k)`` blocks), with ``linear_options``'
        maxiter, restart (30) and check interval (8): matrix-free Newton's steps (JVPs) and its
        adjoint solves (VJPs, ``autograd/nonlinear.py``).

        This calls the torch backend's GMRES directly rather than through dispatch
        (``sparsetorch.solve(..., method="gmres")`` or ``Solver``): dispatch plans for a SparseTensor
        operand (its pattern, format, nnz and device are what backends bid on), while a matrix-free
        Jacobian is a Python callable of products, which no request can describe and which only this
        GMRES (the ``Operator`` interface of ``backends/torch_native/krylov``) accepts. It is the one
        place the nonlinear solver reaches into a backend.
        """
        from ...backends.torch_native.krylov import gmres

        o = self.linear_options
        return gmres(matvec, b, rtol=rtol, atol=atol, maxiter=o.get("maxiter") if maxiter is None else maxiter,
                     restart=int(o.get("restart") or 30), M=M, check_every=int(o.get("check_every") or 8))

    def linear_failed(self, res: IterationResult, where: str) -> None:
        """Report a matrix-free GMRES that stopped short, per ``linear_options["on_nonconvergence"]``."""
        msg = (
            f"nonlinear_solve: matrix-free GMRES ({where}) stopped after {res.iterations} iterations with relative "
            f"residual {res.residual:.3g} ({res.status.value}: {res.reason}); give jac_pattern= for a sparse Jacobian "
            f"and a direct solver, a preconditioner in linear_options, or a larger maxiter"
        )
        if self.linear_policy == "raise":
            raise NotConvergedError(msg, res)
        if self.linear_policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=5)

    # Info -----------------------------------------------------------------------------------------
    def info(self) -> NonlinearSolveInfo:
        rec = self.record
        tried = [a.method for a in rec.attempts] or [self.method]
        newton = "newton" in tried
        mf = self.jac_kind == "matrix-free" and newton
        # Newton's linear solver when it ran, else the fixed-point methods' preconditioner solver.
        lin = self.linear if (self.linear.plans or not self.pre_linear.plans) else self.pre_linear
        lin_iters = tuple(r.iterations for r in (rec.gmres if mf else lin.results))
        if mf:
            backend, lmethod = "torch", "gmres (matrix-free)"
        elif lin.offer is not None:
            backend, lmethod = lin.offer.backend, lin.offer.method
        else:
            backend = lmethod = None
        used = newton or self.pre_kind == "jacobian"
        colors = self.colored.ncolors(self.ad) if self.colored is not None else None
        residual = rec.result_norm if rec.result_norm is not None else (rec.history[-1] if rec.history else float("nan"))
        return NonlinearSolveInfo(
            method=rec.method or self.method, iterations=rec.iterations, converged=rec.status is Status.CONVERGED,
            status=rec.status, reason=rec.reason, residual=residual,
            initial_residual=rec.history[0] if rec.history else float("nan"), residual_history=tuple(rec.history),
            function_evaluations=rec.fevals, jacobian=self.jac_kind if used else None, jacobian_evaluations=rec.jevals,
            colors=colors, linear_backend=backend, linear_method=lmethod, linear_iterations=lin_iters,
            plans_built=self.linear.plans + self.pre_linear.plans,
            plan_reused=(self.linear if self.linear.plans else self.pre_linear).first_reused,
            attempts=tuple(rec.attempts), method_pinned=self.pinned,
            extra={"adjoint": rec.adjoint, "jacobian_source": self.jac_kind, "at_precision": rec.at_precision},
        )
