"""Distributed ``nonlinear_solve``: Newton-Krylov on each rank's residual, adjoint gradients.

``F(u, *params)`` is called on every rank with that rank's rows ``u`` ``(n_local,)`` and returns
its rows of the residual; it reaches neighbours' values through :func:`halo_exchange` or
``A @ u`` of a :class:`DSparseTensor` (so it is collective: every rank calls it the same number
of times, which the solver guarantees by taking every decision on reduced norms).

Newton (the core's ``nonlinear_solve`` rule): ``J du = -F(u)``, then backtracking (halving, at
most ``max_backtracks``) until ``||F(u + a du)|| <= (1 - 1e-4 a) ||F(u)||``; converged when
``||F(u)|| <= max(rtol ||F(u0)||, atol)`` (``rtol=None``: ``default_rtol(dtype)``) or, with the
default ``rtol``, when the step falls below the rounding of ``u``. The Jacobian:

- ``jacobian=J(u, *params) -> DSparseTensor`` (assembled per rank on its rows): the Newton system
  by :func:`sparsetorch_distributed.solve` (block-Jacobi preconditioned; ``linear_options``);
- ``jacobian=None``: matrix-free, distributed GMRES on finite-difference products
  ``J v ~ (F(u + h v) - F(u)) / h`` with ``h = sqrt(eps) (1 + ||u||) / ||v||`` and the forcing term
  ``min(0.1, ||F_k|| / ||F_0||)`` (inexact Newton).

Gradients (``F(u*, p) = 0``): ``J^T lam = dL/du`` at the returned ``u``, then
``dL/dp = -lam^T dF/dp`` (one VJP of ``F``; ``p`` the tensor params and the values of the
DSparseTensor / SparseTensor params, which ``F`` receives rebuilt on those values). With an assembled ``J`` the adjoint is a transposed
distributed solve; matrix-free it is distributed GMRES on exact VJPs of ``F`` by autograd (their
halo parts run the transposed exchange). The adjoint runs at 1e-2 x the contract's rtol.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

import sparsetorch as st
from sparsetorch.backend import Status, default_rtol

from .comm import dtype_code, get_comm
from .errors import DistributedError
from .krylov import Reducer, _Abort, gmres
from .ops import GRAD_FLAGS, grad_flags, settle_grad_mode

__all__ = ["nonlinear_solve", "DNonlinearInfo"]

_POLICIES = ("raise", "warn", "ignore")


@dataclass(frozen=True)
class DNonlinearInfo:
    """What ``nonlinear_solve(..., return_info=True)`` returns beside ``u`` (the same on every rank)."""

    method: str
    jacobian: str                  # "assembled" or "matrix-free"
    iterations: int
    residual: float                # ||F(u)|| / ||F(u0)||
    converged: bool
    status: Status
    rtol: float
    residual_history: tuple[float, ...] = ()
    linear_iterations: int = 0
    backtracks: int = 0
    at_precision: bool = False
    world_size: int = 1
    seconds: float = field(default=0.0, compare=False)
    backend: str = "distributed"


@dataclass
class _Cfg:
    jacobian: Callable | None
    rtol: float
    default_tol: bool
    atol: float
    maxiter: int
    line_search: bool
    max_backtracks: int
    linear_options: dict
    on_nonconvergence: str


def _norm(red: Reducer, v: torch.Tensor) -> float:
    (s,) = red([torch.dot(v, v)])
    return math.sqrt(max(s, 0.0))


def _newton(F, u0: torch.Tensor, params: tuple, cfg: _Cfg, comm, red: Reducer):
    from .solve import solve

    u = u0.detach().clone()
    with torch.no_grad():
        r = F(u, *params)
    f0 = _norm(red, r)
    fn = f0
    hist = [1.0 if f0 > 0 else 0.0]
    tol = max(cfg.rtol * f0, cfg.atol)
    eps = torch.finfo(u.dtype).eps
    lin_its, backtracks, at_precision = 0, 0, False
    status = Status.MAX_ITERATIONS
    it = 0
    if not math.isfinite(fn):
        return u, dict(iterations=0, residual=float("nan"), status=Status.NOT_FINITE, history=tuple(hist),
                       linear_iterations=0, backtracks=0, at_precision=False)
    if fn <= tol:
        status = Status.CONVERGED
    while status != Status.CONVERGED and it < cfg.maxiter:
        it += 1
        with torch.no_grad():
            if cfg.jacobian is not None:
                J = cfg.jacobian(u, *params)
                opts = {"rtol": default_rtol(u.dtype), **cfg.linear_options, "return_info": True}
                du, linfo = solve(J.detach(), -r, **opts)
                lin_its += linfo.iterations
            else:
                du, k = _jfnk_step(F, u, params, r, fn, f0, red, cfg)
                lin_its += k
        unorm = _norm(red, u)
        dnorm = _norm(red, du)
        a, tries = 1.0, 0
        with torch.no_grad():
            while True:
                trial = u + a * du
                rt = F(trial, *params)
                ft = _norm(red, rt)
                if not cfg.line_search or (math.isfinite(ft) and ft <= (1 - 1e-4 * a) * fn):
                    break
                if tries >= cfg.max_backtracks:
                    break
                a *= 0.5
                tries += 1
        backtracks += tries
        if cfg.line_search and not (math.isfinite(ft) and ft < fn):
            status = Status.BREAKDOWN  # no step along du decreased ||F||: keep u (the best iterate)
            break
        step = a * dnorm
        u, r, fn = trial, rt, ft
        hist.append(fn / f0 if f0 > 0 else 0.0)
        if not math.isfinite(fn):
            status = Status.NOT_FINITE
            break
        if fn <= tol:
            status = Status.CONVERGED
        elif cfg.default_tol and step <= 10 * eps * max(unorm, 1e-300):
            status, at_precision = Status.CONVERGED, True
    return u, dict(iterations=it, residual=fn / f0 if f0 > 0 else 0.0, status=status, history=tuple(hist),
                   linear_iterations=lin_its, backtracks=backtracks, at_precision=at_precision)


def _jfnk_step(F, u, params, r, fn, f0, red: Reducer, cfg: _Cfg):
    """Matrix-free Newton step: GMRES on finite-difference Jacobian products."""
    eps = torch.finfo(u.dtype).eps
    unorm = _norm(red, u)

    def Jv(v):
        vn = _norm(red, v)
        if vn == 0.0:
            return torch.zeros_like(v)
        h = math.sqrt(eps) * (1.0 + unorm) / vn
        return (F(u + h * v, *params) - r) / h

    eta = cfg.linear_options.get("rtol", min(0.1, fn / f0 if f0 > 0 else 0.1))
    M = cfg.linear_options.get("preconditioner")
    maxit = cfg.linear_options.get("maxiter", 200)
    du, res = gmres(Jv, -r, torch.zeros_like(r), M, eta * fn, maxit, red, None,
                    restart=cfg.linear_options.get("restart", 30))
    return du, res.iterations


def _adjoint_rtol(dtype) -> float:
    """The adjoint solve runs 100x tighter than the contract (floored at 10 eps): its error enters
    every parameter's gradient, amplified by the cancellation in ``lam^T dF/dp``."""
    return max(1e-2 * default_rtol(dtype), 10 * torch.finfo(dtype).eps)


class _Slots:
    """The params as ``F`` takes them, flattened to tensors for autograd (the core's ``nonlinear_solve`` rule): a
    tensor is itself, a :class:`DSparseTensor` its local slot values (``A.values``, ``(*batch, nse_local)``) and a
    ``sparsetorch.SparseTensor`` its values, both bound back by ``with_values`` (the same pattern, no new plan);
    anything else is passed as is. Their gradients land on those values, and from there on the tensors they were
    built from (the entry values of ``from_local_rows``, ``A.values`` of ``scatter``'s source)."""

    def __init__(self, params: tuple) -> None:
        from .tensor import DSparseTensor

        self.kinds: list[tuple[str, object]] = []
        leaves: list[torch.Tensor] = []
        for p in params:
            if isinstance(p, DSparseTensor):
                self.kinds.append(("sparse", p))
                leaves.append(p.values)   # (inside the input agreement: a deferred with_values error is agreed)
            elif isinstance(p, st.SparseTensor):
                self.kinds.append(("sparse", p.detach()))
                leaves.append(p.values)
            elif isinstance(p, torch.Tensor):
                self.kinds.append(("tensor", None))
                leaves.append(p)
            else:
                self.kinds.append(("const", p))
        self.leaves = tuple(leaves)

    def bind(self, leaves) -> tuple:
        out, it = [], iter(leaves)
        for kind, tmpl in self.kinds:
            if kind == "tensor":
                out.append(next(it))
            elif kind == "sparse":
                out.append(tmpl.with_values(next(it)))  # type: ignore[union-attr]
            else:
                out.append(tmpl)
        return tuple(out)


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


class _Implicit(torch.autograd.Function):
    """u* as a function of the params' tensors (:class:`_Slots`): forward runs Newton; backward the adjoint."""

    @staticmethod
    def forward(ctx, u0, F, cfg: _Cfg, comm, recs: list, slots: _Slots, *leaves):
        red = Reducer(comm, u0.device, torch.float64 if u0.dtype == torch.float64 else torch.float32)
        params = slots.bind([t.detach() for t in leaves])
        try:
            u, rec = _newton(F, u0, params, cfg, comm, red)
        except _Abort:
            comm.agree(red.error, "distributed nonlinear_solve")
            raise DistributedError("a rank flagged an error but none reported it") from None  # unreachable
        recs.append(rec)
        ctx.F, ctx.cfg, ctx.comm, ctx.u, ctx.slots = F, cfg, comm, u, slots
        ctx.save_for_backward(*leaves)
        return u

    @staticmethod
    def backward(ctx, g):
        from .solve import _Config, _solve_columns

        F, cfg, comm, u, slots = ctx.F, ctx.cfg, ctx.comm, ctx.u, ctx.slots
        saved = ctx.saved_tensors
        # every floating leaf is differentiated (also those that need no gradient here: F's collectives inside
        # this backward must record gradients alike on every rank)
        fresh = [s.detach().requires_grad_(True) if _differentiable(s) else s for s in saved]
        leaves = [t for t in fresh if _differentiable(t)]
        params = slots.bind(fresh)
        ub = u.detach().requires_grad_(True)
        with torch.enable_grad():
            r = F(ub, *params)
        red = Reducer(comm, u.device, torch.float64 if u.dtype == torch.float64 else torch.float32)
        g = g.contiguous()
        if cfg.jacobian is not None:
            with torch.no_grad():
                J = cfg.jacobian(u, *slots.bind([t.detach() for t in fresh])).detach()
            lo = cfg.linear_options
            scfg = _Config(lo.get("method"), lo.get("preconditioner", "block_jacobi"), _adjoint_rtol(u.dtype),
                           0.0, lo.get("maxiter"), lo.get("restart", 30), "raise", lo.get("local_options"), False)
            L2, infos = _solve_columns(J, None, g[:, None], scfg, transpose=True, symmetric=False)
            lam = L2[:, 0]
            if infos[0]["status"] != Status.CONVERGED:
                raise st.NotConvergedError(f"nonlinear_solve backward: the adjoint solve J^T lam = dL/du did not "
                                           f"converge ({infos[0]['status'].value}, relative residual "
                                           f"{infos[0]['residual']:.3g})")
        else:
            def JTv(v):
                (out,) = torch.autograd.grad(r, ub, v, retain_graph=True)
                return out

            (gg,) = red([torch.dot(g, g)])
            tol = _adjoint_rtol(u.dtype) * math.sqrt(max(gg, 0.0))
            try:
                lam, res = gmres(JTv, g, torch.zeros_like(g), None, tol, max(1000, 10 * g.numel()), red, None, restart=50)
            except _Abort:
                comm.agree(red.error, "distributed nonlinear_solve backward")
                raise DistributedError("a rank flagged an error but none reported it") from None  # unreachable
            if res.status != Status.CONVERGED:
                raise st.NotConvergedError(f"nonlinear_solve backward: the matrix-free adjoint GMRES stopped "
                                           f"({res.status.value} after {res.iterations} iterations)")
        grads = torch.autograd.grad(r, leaves, -lam, allow_unused=True) if leaves else ()
        it = iter(grads)
        out = []
        for t in fresh:
            if _differentiable(t):
                gp = next(it)
                out.append(gp if gp is not None else torch.zeros_like(t))
            else:
                out.append(None)
        return (None, None, None, None, None, None, *out)


def nonlinear_solve(F: Callable, u0: torch.Tensor, params: Sequence = (), *, comm=None, jacobian: Callable | None = None,
                    rtol: float | None = None, atol: float = 0.0, maxiter: int = 50, line_search: bool = True,
                    max_backtracks: int = 20, linear_options: dict | None = None, on_nonconvergence: str = "raise",
                    return_info: bool = False):
    """Solve ``F(u, *params) = 0`` for this rank's rows ``u`` by distributed Newton-Krylov;
    differentiable in the tensor ``params`` and in the values of ``DSparseTensor`` /
    ``sparsetorch.SparseTensor`` params (adjoint; ``F`` receives them rebuilt on the same pattern by
    ``with_values``, as the core's ``nonlinear_solve`` passes a SparseTensor). Collective.

    ``jacobian``: ``J(u, *params) -> DSparseTensor`` assembled per rank (Newton systems by
    :func:`~sparsetorch_distributed.solve` with ``linear_options``: ``method``, ``preconditioner``,
    ``rtol`` (default ``default_rtol``), ...), or None for matrix-free GMRES on finite-difference
    products (``linear_options``: ``rtol`` (default the forcing term ``min(0.1, ||F_k|| / ||F_0||)``),
    ``maxiter``, ``restart``, a local ``preconditioner`` callable). Converged when
    ``||F(u)|| <= max(rtol ||F(u0)||, atol)``, ``rtol=None`` being ``default_rtol(dtype)`` (then
    also when the Newton step falls below the rounding of ``u``). Returns ``u`` (or
    ``(u, DNonlinearInfo)``). See the module docstring for the method and the gradients.

    Gradients land on each rank's own ``params`` (a DSparseTensor's on this rank's values, and from
    there on the entry values it was built from); a parameter every rank holds a copy of (a
    replicated scalar) gets on each rank that rank's share of the gradient: sum them with
    :func:`global_sum` for the total.
    """
    from .solve import _float_bits

    comm = get_comm(comm)
    t0 = time.perf_counter()
    params = tuple(params) if isinstance(params, (tuple, list)) else (params,)
    with comm.checked("distributed nonlinear_solve", same=("dtype", "maxiter", "assembled", "params", "rtol", "atol",
                                                           "line_search", "max_backtracks"), flags=GRAD_FLAGS) as chk:
        if not isinstance(u0, torch.Tensor) or u0.dim() != 1 or u0.dtype not in (torch.float32, torch.float64):
            raise st.InputError(f"nonlinear_solve: u0 must be this rank's rows, a 1-D float32/float64 tensor, got "
                                f"{getattr(u0, 'shape', type(u0).__name__)}")
        if on_nonconvergence not in _POLICIES:
            raise st.InputError(f"nonlinear_solve: on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
        if not isinstance(maxiter, int) or maxiter < 0:
            raise st.InputError(f"nonlinear_solve: maxiter must be an int >= 0, got {maxiter!r}")
        for name, val in (("rtol", rtol), ("atol", atol)):
            if name == "rtol" and val is None:
                continue
            try:
                ok = float(val) >= 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise st.InputError(f"nonlinear_solve: {name} must be a number >= 0{' or None' if name == 'rtol' else ''}, "
                                    f"got {val!r} on rank {comm.rank}")
        # (made here: a conversion failing after the agreement raised on this rank alone)
        cfg = _Cfg(jacobian, default_rtol(u0.dtype) if rtol is None else float(rtol), rtol is None, float(atol), maxiter,
                   bool(line_search), int(max_backtracks), dict(linear_options or {}), on_nonconvergence)
        chk.same({"dtype": dtype_code(u0.dtype), "maxiter": maxiter, "assembled": int(jacobian is not None),
                  "params": len(params), "rtol": _float_bits(rtol), "atol": _float_bits(atol),
                  "line_search": int(cfg.line_search), "max_backtracks": cfg.max_backtracks},
                 shown={"rtol": rtol, "atol": atol})
        # DSparseTensor / SparseTensor params as their values (read here: a deferred input error is agreed)
        slots = _Slots(params)
        leaves = slots.leaves
        mine = any(t.requires_grad for t in leaves)
        grad_flags(chk, mine)   # (the same all_reduce: no collective of its own)
    if settle_grad_mode(comm, chk, "distributed nonlinear_solve") and not mine:
        # the backward communicates: this rank takes part with a placeholder leaf
        leaves = tuple(t.detach().requires_grad_(True) if _differentiable(t) else t for t in leaves)
    recs: list = []
    u = _Implicit.apply(u0.detach(), F, cfg, comm, recs, slots, *leaves)
    rec = recs[0]
    info = DNonlinearInfo(method="newton", jacobian="assembled" if jacobian is not None else "matrix-free",
                          iterations=rec["iterations"], residual=rec["residual"],
                          converged=rec["status"] == Status.CONVERGED, status=rec["status"], rtol=cfg.rtol,
                          residual_history=rec["history"], linear_iterations=rec["linear_iterations"],
                          backtracks=rec["backtracks"], at_precision=rec["at_precision"], world_size=comm.size,
                          seconds=time.perf_counter() - t0)
    if not info.converged and on_nonconvergence != "ignore":
        msg = (f"distributed nonlinear_solve did not reach rtol={cfg.rtol:.3g}: {info.status.value} after "
               f"{info.iterations} Newton iterations, ||F|| / ||F(u0)|| = {info.residual:.3g}; raise maxiter, give an "
               f"assembled jacobian= or a better u0")
        if on_nonconvergence == "raise":
            raise st.NotConvergedError(msg, info)
        warnings.warn(msg, st.NotConvergedWarning, stacklevel=2)
    return (u, info) if return_info else u
