"""``eigsh`` (symmetric / Hermitian, generalized too) and ``eigs`` (general), through dispatch,
with adjoint gradients (Hellmann-Feynman for eigenvalues, a projected bordered solve for
eigenvectors; left/right eigenvectors for ``eigs``)."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from ..autograd.eigen import EigshHandle, eigsh_function
from ..autograd.handles import PlanState
from ..errors import InputError, NotConvergedError, NotConvergedWarning, NotSymmetricError
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain
from ._dispatch import make_request, obtain_plan
from ._inputs import check_finite as check_finite_values, check_matrix, describe_sparse
from .info import SolveInfo
from .properties import detect, normalize_tags

__all__ = ["eigsh", "eigs", "eigsh_request", "eigs_request"]

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


def _checker(policy: str, op: str):
    def check(res, plan) -> None:
        if res.converged:
            return
        msg = (f"{op} ({plan.backend}/{plan.method}) did not converge: residual {res.residual:.3g} after "
               f"{res.iterations} iterations ({res.reason or res.status.value}). Raise maxiter, loosen tol, "
               f"ask for fewer eigenpairs, use sigma (shift-invert) for interior or smallest eigenvalues, or "
               f"pass on_nonconvergence='warn'")
        if policy == "warn":
            warnings.warn(msg, NotConvergedWarning, stacklevel=5)
        elif policy == "raise":
            raise NotConvergedError(msg, res)
    return check


def _info(state: PlanState, offer, results) -> SolveInfo:
    res = results[-1]
    return SolveInfo(
        backend=offer.backend, method=offer.method, iterations=res.iterations, residual=res.residual,
        converged=res.converged, status=res.status, reason=res.reason, plan_reused=state.reused,
        extra={"estimated_seconds": offer.seconds, "estimated_bytes": offer.bytes},
    )


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
    request = eigsh_request(A, M, k, which, sigma, tol, maxiter, backend, method, properties, dense_max)
    state, offer, _ = obtain_plan("eigsh", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach().to(dtype=A.dtype, device=A.device)}
    handle = EigshHandle(state, A.detach(), None if M is None else M.detach(), call, degenerate, degenerate_tol,
                         _checker(on_nonconvergence, "eigsh"))
    mvalues = M.values if M is not None else A.values.new_zeros(0)
    w, V = eigsh_function(A.values, mvalues, handle)
    if return_info:
        return w, V, _info(state, offer, handle.results)
    return w, V


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
        handle["state"].load(values)
        with torch.no_grad():
            w, V, U, res = handle["state"].plan.eigs(left=handle["left"], **handle["call"])
        handle["results"].append(res)
        handle["check"](res, handle["state"].plan)
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
    state, offer, _ = obtain_plan("eigs", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach()}
    handle = {"state": state, "call": call, "left": A.requires_grad and torch.is_grad_enabled(), "results": [],
              "check": _checker(on_nonconvergence, "eigs"), "A": A.detach(), "complex": A.dtype.is_complex}
    w, V = _Eigs.apply(A.values, handle)
    if return_info:
        return w, V, _info(state, offer, handle["results"])
    return w, V
