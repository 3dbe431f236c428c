"""``eigsh`` (symmetric / Hermitian, generalized too) and ``eigs`` (general), through dispatch,
with adjoint gradients (Hellmann-Feynman for eigenvalues, a projected bordered solve for
eigenvectors; left/right eigenvectors for ``eigs``)."""

from __future__ import annotations

import inspect
import time
import warnings
from dataclasses import replace
from typing import Any, Sequence

import torch

from ..autograd.spectral import EigshHandle, eigsh_function
from ..autograd.handles import PlanState
from ..errors import (BackendError, DegenerateEigenvalueError, IndefiniteMatrixError, InputError, NotConvergedError,
                      NotConvergedWarning, NotSymmetricError, SparseTorchError)
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain
from ._dispatch import make_request, obtain_plan
from ._inputs import check_finite as check_finite_values, check_matrix, describe_sparse
from .accuracy import default_rtol
from .info import SolveInfo
from .properties import detect, normalize_tags

__all__ = ["eigsh", "eigs", "eigsh_request", "eigs_request", "check_mass_matrix"]

_WHICH_SH = ("LA", "SA", "LM", "SM")
_WHICH_GE = ("LM", "SM", "LR", "SR", "LI", "SI")
_POLICIES = ("raise", "warn", "ignore")


def _check_common(A, k, which, allowed, tol, maxiter, v0, op) -> None:
    n = A.format_shape[0]
    if not isinstance(k, int) or isinstance(k, bool) or not (1 <= k <= n):
        raise InputError(f"{op}: k must be an int with 1 <= k <= n={n}, got k={k!r}")
    if which not in allowed:
        raise InputError(f"{op}: which must be one of {allowed}, got {which!r}")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise InputError(f"{op}: tol must be a non-negative number (0: the method's default), got {tol!r}")
    if maxiter is not None and (not isinstance(maxiter, int) or maxiter < 1):
        raise InputError(f"{op}: maxiter must be a positive int or None, got {maxiter!r}")
    if v0 is not None:
        if not isinstance(v0, torch.Tensor) or v0.shape[-1] != n:
            raise InputError(f"{op}: v0 must be a tensor with last dimension n={n}, got "
                             f"{tuple(v0.shape) if isinstance(v0, torch.Tensor) else type(v0).__name__}")


class _Attempts:
    """The offers an eigen call may try, in the explain table's order, and what each did.

    The accuracy contract and the fallback rule (docs/spectral.md): the chosen offer runs first; if
    it does not converge, breaks down, fails in its plugin, or returns pairs whose residual
    misses the contract, the next capable offer of the table runs, and so on. A method the
    user pinned (``method=``) is the only candidate. An attempt that a dense offer later in the
    table could replace is bounded by that offer's estimated seconds (``budget``, for plans
    whose ``eigsh``/``eigs`` take it): a failed attempt costs about what the dense call it
    delayed does. Plans for later offers are obtained (and cached) only when needed.
    """

    def __init__(self, op: str, A: SparseTensor, request, state: PlanState, offer, table, *, cache: bool,
                 policy: str, contract: float | None) -> None:
        self.op, self.A, self.request, self.cache, self.policy = op, A, request, cache, policy
        self.contract = contract  # relative residual the pairs must meet (None: an explicit tol)
        self.pinned = request.option("method") is not None
        self.offers = [offer]
        if not self.pinned:
            self.offers += [r.offer for r in table.offers
                            if r.offer is not None and (r.offer.backend, r.offer.method) != (offer.backend, offer.method)]
        self.states: dict[int, PlanState] = {0: state}
        self.records: list[dict] = []
        self.state, self.offer, self.result = state, offer, None
        self.norms: dict = {}

    def _state(self, i: int) -> PlanState:
        if i not in self.states:
            opts = {**self.request.options, "backend": self.offers[i].backend, "method": self.offers[i].method}
            self.states[i] = obtain_plan(self.op, self.A, replace(self.request, options=opts), cache=self.cache)[0]
        return self.states[i]

    def budget(self, i: int) -> float | None:
        """Seconds attempt ``i`` may take: the estimate of the cheapest dense offer after it
        (None: nothing direct to hand over to, or the last candidate)."""
        later = [o.seconds for o in self.offers[i + 1:] if o.method in _DIRECT_METHODS]
        if not later:
            return None
        return max(MIN_BUDGET, min(later))

    def run(self, values: torch.Tensor, call, verify):
        """``call(plan, budget) -> (outputs, IterationResult)``; ``verify(outputs) -> (ok, residual, why)``.
        Loads ``values`` into each plan tried; returns the outputs of the first attempt that
        converged and passed ``verify``."""
        last_exc: BaseException | None = None
        last_out, last_res = None, None
        self.records.clear()
        for i, offer in enumerate(self.offers):
            label = f"{offer.backend}/{offer.method}"
            final = i == len(self.offers) - 1
            budget = None if final else self.budget(i)
            t0 = time.perf_counter()
            phase = "build"
            try:
                state = self._state(i)
                with state.lock:  # values and the call belong together: another thread may share the plan
                    phase = "set_values"
                    state.load(values)
                    phase = self.op
                    out, res = call(state.plan, budget)
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure of a plan is recorded, then handed over
                if not isinstance(exc, SparseTorchError):
                    exc = _wrap(exc, label, phase)
                self.records.append(_record(offer, None, False, f"raised {type(exc).__name__}: {exc}",
                                            time.perf_counter() - t0, budget))
                last_exc = exc
                if self.pinned or final:
                    raise _with_attempts(exc, self.records, final and not self.pinned) from exc.__cause__
                continue
            ok, resid, why = (False, float("nan"), res.reason or res.status.value)
            if res.converged:
                ok, resid, why = verify(out)
            self.records.append(_record(offer, res, ok, "" if ok else why, time.perf_counter() - t0, budget, resid))
            if ok:
                self.state, self.offer, self.result = state, offer, res
                return out
            last_out, last_res, last_exc = out, res, None
            if self.pinned:
                break
        if last_out is None:  # pragma: no cover - the loop raises before
            raise last_exc  # type: ignore[misc]
        self.state, self.result = self.states[len(self.records) - 1], last_res
        self.offer = self.offers[len(self.records) - 1]
        self._fail(last_res)
        return last_out

    def _fail(self, res) -> None:
        tried = "; ".join(f"{r['backend']}/{r['method']}: {r['why']}" for r in self.records)
        if self.pinned:
            others = [f"'{o.method}'" for o in _capable(self.op, self.A, self.request) if o.method != self.offers[0].method]
            advice = (f"method={self.offers[0].method!r} was pinned, so no other method was tried; try "
                      + (f"method={' or '.join(others)}, or " if others else "")
                      + "drop method= to let dispatch fall back, raise maxiter, use sigma (shift-invert) for interior "
                        "or smallest eigenvalues, or pass on_nonconvergence='warn'")
        else:
            advice = ("every capable method was tried (in the order of explain()); raise maxiter, give tol=, use sigma "
                      "(shift-invert) near the wanted eigenvalues, raise dense_max= to allow the dense method, or pass "
                      "on_nonconvergence='warn'")
        msg = f"{self.op} did not converge: {tried}. {advice}"
        if self.policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=6)
        elif self.policy == "raise":
            raise NotConvergedError(msg, res)

    def info(self) -> SolveInfo:
        res = self.result
        rec = self.records[-1] if self.records else {}
        resid = rec.get("verified_residual", float("nan"))
        return SolveInfo(
            backend=self.offer.backend, method=self.offer.method, iterations=res.iterations,
            residual=resid if resid == resid else res.residual, converged=bool(rec.get("accepted", res.converged)),
            status=res.status, reason=res.reason, plan_reused=self.states[0].reused,
            extra={"estimated_seconds": self.offer.seconds, "estimated_bytes": self.offer.bytes,
                   "attempts": [dict(r) for r in self.records], "contract_rtol": self.contract},
        )


#: Direct methods of the eigen ops: an attempt that one of these could replace is bounded by it.
_DIRECT_METHODS = ("dense",)
#: The least an iterative attempt is allowed before handing over (seconds): below it a budget
#: would only measure Python's overheads.
MIN_BUDGET = 0.05
#: Errors that no other method would avoid (the operands are wrong): raised at once.
_PASS_THROUGH = (IndefiniteMatrixError, NotSymmetricError, DegenerateEigenvalueError)


def _capable(op, A, request):
    from ..dispatch.select import rank

    opts = {**request.options, "method": None}
    return [r.offer for r in rank(replace(request, options=opts)).offers]


def _wrap(exc: BaseException, label: str, phase: str) -> BackendError:
    err = BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label, phase)
    err.__cause__ = exc
    return err


def _with_attempts(exc: BaseException, records: list[dict], annotate: bool) -> BaseException:
    if annotate and len(records) > 1 and hasattr(exc, "add_note"):
        exc.add_note("attempts: " + "; ".join(f"{r['backend']}/{r['method']}: {r['why']}" for r in records))
    return exc


def _record(offer, res, ok: bool, why: str, seconds: float, budget, resid: float = float("nan")) -> dict:
    return {"backend": offer.backend, "method": offer.method,
            "iterations": None if res is None else res.iterations,
            "plan_residual": None if res is None else res.residual,
            "verified_residual": resid, "converged": None if res is None else res.converged,
            "accepted": ok, "status": None if res is None else res.status.value, "why": why or "accepted",
            "seconds": seconds, "budget": budget}


def _call_kwargs(plan, budget) -> dict:
    """``budget=`` for plans whose eigen call takes it (an attempt bounded in seconds)."""
    if budget is None:
        return {}
    meth = getattr(plan, "eigsh", None) or getattr(plan, "eigs", None)
    cls = type(plan)
    if cls not in _TAKES_BUDGET:
        try:
            params = inspect.signature(meth).parameters
            _TAKES_BUDGET[cls] = "budget" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            _TAKES_BUDGET[cls] = False
    return {"budget": budget} if _TAKES_BUDGET[cls] else {}


_TAKES_BUDGET: dict = {}


def _inf_norm(T: SparseTensor) -> torch.Tensor:
    """max_i sum_j |T_ij| per value-batch member (>= the spectral norm of a Hermitian T)."""
    coords, slot = T.entries()
    vals = T.values.detach()[..., slot].abs()
    n = T.format_shape[0]
    return vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0], vals).amax(-1)


def _product(T: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``T @ X`` for every member of T's value batch (X with the same batch in front)."""
    coords, slot = T.entries()
    vals = T.values.detach()[..., slot]
    rows, cols = coords[0], coords[1]
    contrib = vals.unsqueeze(-1) * X[..., cols, :]
    out = X.new_zeros(*contrib.shape[:-2], X.shape[-2], X.shape[-1])
    return out.index_add(-2, rows, contrib)


def _check_outputs(w, V, batch, n, k) -> str | None:
    """What is wrong with a plan's eigenpairs (None: shape, dtype and finiteness are right)."""
    want_w = (*batch, k)
    want_V = (*batch, n, k)
    if not isinstance(w, torch.Tensor) or not isinstance(V, torch.Tensor):
        return f"returned {type(w).__name__}/{type(V).__name__}, not tensors"
    if tuple(w.shape) != want_w or tuple(V.shape) != want_V:
        return f"returned w {tuple(w.shape)} and V {tuple(V.shape)}; expected {want_w} and {want_V}"
    if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(V).all()):
        return "returned NaN or Inf in the eigenpairs"
    return None


def _verify_pairs(A: SparseTensor, M: SparseTensor | None, w: torch.Tensor, V: torch.Tensor, rtol: float | None):
    """(ok, worst relative residual, why): ``||A v - w M v|| <= rtol (||A|| ||v|| + |w| ||M|| ||v||)``,
    norms the inf-norm per member; ``rtol=None`` (an explicit tol) checks finiteness only."""
    AV = _product(A, V)
    MV = V if M is None else _product(M, V)
    R = AV - MV * w.to(V.dtype).unsqueeze(-2)
    vn = torch.linalg.vector_norm(V, dim=-2)
    an = _inf_norm(A).unsqueeze(-1)
    mn = torch.ones_like(an) if M is None else _inf_norm(M).unsqueeze(-1)
    scale = (an * vn + w.abs() * mn * vn).clamp_min(torch.finfo(vn.dtype).tiny)
    rel = torch.linalg.vector_norm(R, dim=-2) / scale
    worst = float(rel.max()) if rel.numel() else 0.0
    if rtol is None or worst <= rtol:
        return True, worst, ""
    return False, worst, (f"returned pairs with relative residual {worst:.3g} > {rtol:g} (the accuracy contract "
                          f"||A v - w M v|| <= {rtol:g} (||A|| + |w| ||M||) ||v||)")


def eigsh(
    A: SparseTensor,
    k: int = 6,
    *,
    M: SparseTensor | None = None,
    which: str = "LM",
    sigma: float | None = None,
    tol: float = 0.0,
    maxiter: int | None = None,
    v0: torch.Tensor | None = None,
    backend: str | None = None,
    method: str | None = None,
    properties: str | Sequence[str] | None = None,
    degenerate: str = "raise",
    degenerate_tol: float = 1e-8,
    on_nonconvergence: str = "raise",
    check_finite: bool = True,
    dense_max: int | None = None,
    return_info: bool = False,
    cache: bool = True,
):
    """``k`` eigenpairs of a symmetric (Hermitian) sparse ``A``: ``A v = w v``, or ``A v = w M v``
    with ``M`` symmetric positive definite on A's device.

    ``which``: "LA"/"SA" (largest/smallest algebraic), "LM"/"SM" (magnitude); with ``sigma`` the
    eigenvalues nearest ``sigma`` (shift-invert). Returns ``(w, V)``: ``w`` ascending, real,
    shape ``(*batch, k)``; ``V`` ``(*batch, n, k)`` with ``V^H M V = I``. Differentiable in A's
    (and M's) values: eigenvalue gradients cost nothing extra, each eigenvector that receives a
    gradient costs one bordered solve. Eigenvector gradients at repeated eigenvalues do not
    exist: ``degenerate="raise"`` (default) raises :class:`DegenerateEigenvalueError`,
    ``"warn"``/``"ignore"`` drop the coupling between the close pair.

    Methods (``method=``): "dense" (torch, small n), "lanczos" (torch, any device), "lobpcg"
    (torch, SPD), "arpack" (scipy plugin). Symmetry is checked (detected) unless ``properties``
    says so; a non-symmetric A raises :class:`NotSymmetricError` (use :func:`eigs`).
    """
    A = check_matrix(A, "eigsh", square=True)
    _check_common(A, k, which, _WHICH_SH, tol, maxiter, v0, "eigsh")
    for name, val, allowed in (("degenerate", degenerate, _POLICIES), ("on_nonconvergence", on_nonconvergence, _POLICIES)):
        if val not in allowed:
            raise InputError(f"eigsh: {name} must be one of {allowed}, got {val!r}")
    if sigma is not None and not isinstance(sigma, (int, float)):
        raise InputError(f"eigsh: sigma must be a real number or None, got {sigma!r}")
    if M is not None:
        M = check_matrix(M, "eigsh (M)", square=True)
        if tuple(M.format_shape) != tuple(A.format_shape) or M.dtype != A.dtype or M.device != A.device:
            raise InputError(f"eigsh: M must match A in shape, dtype and device; A is {tuple(A.format_shape)} {A.dtype} "
                             f"on {A.device}, M is {tuple(M.format_shape)} {M.dtype} on {M.device}")
        if M.batch_shape and tuple(M.batch_shape) != tuple(A.batch_shape):
            raise InputError(f"eigsh: M's value batch {tuple(M.batch_shape)} must match A's {tuple(A.batch_shape)} or be empty")
    if check_finite and is_plain(A.values):
        check_finite_values(A, None, "eigsh")
    if M is not None:
        if check_finite and is_plain(M.values):
            check_finite_values(M, None, "eigsh (M)")
        check_mass_matrix(M, "eigsh")
    request = eigsh_request(A, M, k, which, sigma, tol, maxiter, backend, method, properties, dense_max)
    state, offer, table = obtain_plan("eigsh", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach().to(dtype=A.dtype, device=A.device)}
    attempts = _Attempts("eigsh", A, request, state, offer, table, cache=cache, policy=on_nonconvergence,
                         contract=default_rtol(A.dtype) if tol == 0 else None)
    handle = EigshHandle(state, A.detach(), None if M is None else M.detach(), call, degenerate, degenerate_tol,
                         attempts=attempts)
    mvalues = M.values if M is not None else A.values.new_zeros(0)
    w, V = eigsh_function(A.values, mvalues, handle)
    if return_info:
        return w, V, attempts.info()
    return w, V


def check_mass_matrix(M: SparseTensor, op: str) -> bool:
    """Refuse an ``M`` that is not symmetric positive definite, as far as cheap tests can tell:
    symmetry (detected), a real positive diagonal (necessary). Returns True when definiteness is
    proven (detected SPD: symmetric, positive diagonal, diagonally dominant); otherwise each plan
    certifies it with the factorization it makes (a Cholesky, or an LU with diagonal pivots whose
    signs give M's inertia) and raises :class:`IndefiniteMatrixError` when that fails."""
    tags = detect(M)
    if "nonsymmetric" in tags:
        raise NotSymmetricError(f"{op}: M is not symmetric (Hermitian): entries differ from the transpose beyond "
                                f"1e-12 relative. {MASS_FIX}")
    if "spd" in tags:
        return True
    coords, slot = M.entries()
    on = coords[0] == coords[1]
    n = M.format_shape[0]
    vals = M.values.detach()[..., slot]
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0][on], vals[..., on])
    dre = diag.real if diag.is_complex() else diag
    bad = ~(dre > 0)
    if bool(bad.any()):
        flat = torch.nonzero(bad.reshape(-1, n))[0]
        member, i = int(flat[0]), int(flat[1])
        where = f" (value-batch member {member})" if diag.dim() > 1 else ""
        raise IndefiniteMatrixError(
            f"{op}: M is not positive definite: its diagonal entry M[{i}, {i}] = "
            f"{float(dre.reshape(-1, n)[member, i]):.6g}{where} is not positive ({int(bad.sum())} of {n * max(1, diag.numel() // n)} "
            f"diagonal entries are <= 0). {MASS_FIX}")
    return False


#: What to do about an M that is not SPD (every refusal says it).
MASS_FIX = ("A generalized symmetric eigenproblem A v = w M v needs M symmetric positive definite (a mass or Gram "
            "matrix); with an indefinite M the problem's eigenvalues need not be real and ARPACK/LOBPCG return numbers "
            "that are not eigenvalues. If A is SPD and M is not, solve M v = mu A v (mu = 1/w) with A as the mass "
            "matrix; otherwise use sparsetorch.eigs on M^-1 A (a general eigenproblem)")


def eigsh_request(A, M, k, which, sigma, tol, maxiter, backend, method, properties, dense_max):
    tags = normalize_tags(properties)
    props = tags if tags is not None else detect(A)
    if "nonsymmetric" in props:
        raise NotSymmetricError(
            "eigsh needs a symmetric (Hermitian) matrix and A is not symmetric (entries differ from the transpose "
            "beyond 1e-12 relative); use sparsetorch.eigs for general matrices, or pass properties='symmetric' "
            "if the asymmetry is rounding you want ignored"
        )
    options: dict[str, Any] = {
        "backend": backend, "method": method, "k": k, "which": which, "sigma": sigma, "tol": float(tol),
        "maxiter": maxiter, "dense_max": dense_max, "generalized": M is not None,
    }
    operands = (describe_sparse(A),) + ((describe_sparse(M),) if M is not None else ())
    return make_request("eigsh", operands, props, options)


def eigs_request(A, k, which, sigma, tol, maxiter, backend, method, dense_max):
    options = {"backend": backend, "method": method, "k": k, "which": which, "sigma": sigma, "tol": float(tol),
               "maxiter": maxiter, "dense_max": dense_max}
    return make_request("eigs", (describe_sparse(A),), frozenset(), options)


# --- eigs (general A) -------------------------------------------------------------------------------

class _Eigs(torch.autograd.Function):
    """Eigenvalue gradients of a general A: dw_i = u_i^H dA v_i / (u_i^H v_i)."""

    @staticmethod
    def forward(values, handle):
        attempts: _Attempts = handle["attempts"]
        A = handle["A"]
        n, k = A.format_shape[0], handle["call"]["k"]
        batch = tuple(A.batch_shape)
        Av = A.with_values(values.detach())

        def call(plan, budget):
            with torch.no_grad():
                w, V, U, res = plan.eigs(left=handle["left"], **handle["call"], **_call_kwargs(plan, budget))
            return (w, V, U), res

        def verify(out):
            w, V, U = out
            why = _check_outputs(w, V, batch, n, k)
            if why is None and handle["left"] and (U is None or tuple(U.shape) != tuple(V.shape)):
                why = "returned no left eigenvectors (asked for, for the gradient)"
            if why is not None:
                return False, float("nan"), why
            return _verify_pairs(Av, None, w, V, attempts.contract)

        w, V, U = attempts.run(values, call, verify)
        handle["U"] = U
        return w, V

    @staticmethod
    def setup_context(ctx, inputs, output):
        values, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(*output)

    @staticmethod
    def backward(ctx, gw, gV):
        from ..autograd.handles import sddmm

        w, V = ctx.saved_tensors
        h = ctx.handle
        if gV is not None and bool((gV != 0).any()):
            raise InputError("eigs: gradients through the eigenvectors of a non-symmetric matrix are not supported; "
                             "differentiate the eigenvalues (or use eigsh for symmetric matrices)")
        if gw is None or h["U"] is None:
            return None, None
        U = h["U"]
        denom = (U.conj() * V).sum(-2)  # u_i^H v_i
        tiny = denom.abs() <= 1e-12
        if bool(tiny.any()):
            raise InputError("eigs: an eigenvalue is defective (u^H v ~ 0 for its left/right eigenvectors): its "
                             "derivative does not exist")
        P = U * (gw / denom.conj()).unsqueeze(-2)
        d = sddmm(h["A"], P, V)
        return (d if h["complex"] else d.real), None


def eigs(
    A: SparseTensor,
    k: int = 6,
    *,
    which: str = "LM",
    sigma: complex | None = None,
    tol: float = 0.0,
    maxiter: int | None = None,
    v0: torch.Tensor | None = None,
    backend: str | None = None,
    method: str | None = None,
    on_nonconvergence: str = "raise",
    check_finite: bool = True,
    dense_max: int | None = None,
    return_info: bool = False,
    cache: bool = True,
):
    """``k`` eigenpairs of a general square sparse ``A``: ``A v = w v`` (complex ``w``, ``V``).

    ``which``: "LM", "SM", "LR", "SR", "LI", "SI" (ARPACK's). Returns ``(w, V)`` with ``w`` of
    shape ``(*batch, k)`` and unit-norm right eigenvectors ``V`` ``(*batch, n, k)``, complex.
    Differentiable in A's values through the eigenvalues (left and right eigenvectors:
    ``dw = u^H dA v / u^H v``); eigenvector gradients raise. Methods: "dense" (torch), "arpack"
    (scipy plugin).
    """
    A = check_matrix(A, "eigs", square=True)
    _check_common(A, k, which, _WHICH_GE, tol, maxiter, v0, "eigs")
    if on_nonconvergence not in _POLICIES:
        raise InputError(f"eigs: on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
    if check_finite and is_plain(A.values):
        check_finite_values(A, None, "eigs")
    request = eigs_request(A, k, which, sigma, tol, maxiter, backend, method, dense_max)
    state, offer, table = obtain_plan("eigs", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach()}
    attempts = _Attempts("eigs", A, request, state, offer, table, cache=cache, policy=on_nonconvergence,
                         contract=default_rtol(A.dtype) if tol == 0 else None)
    handle = {"attempts": attempts, "call": call, "left": A.requires_grad and torch.is_grad_enabled(),
              "A": A.detach(), "complex": A.dtype.is_complex}
    w, V = _Eigs.apply(A.values, handle)
    if return_info:
        return w, V, attempts.info()
    return w, V
