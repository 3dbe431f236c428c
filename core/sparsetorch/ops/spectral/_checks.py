"""The checks of the spectral ops (eigsh, eigs): their inputs (``k``, ``which``, ``tol``, ``maxiter``, ``v0``; a mass
matrix ``M`` that must be symmetric positive definite) and the eigenpairs a plan returns (shapes,
finiteness, and the residual of the accuracy contract, computed here from the stored entries)."""

from __future__ import annotations

import math

import torch

from ...errors import IndefiniteMatrixError, InputError, NotSymmetricError
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import vmapped
from ..properties import detect

__all__ = ["check_mass_matrix", "MASS_FIX"]

_WHICH_SH = ("LA", "SA", "LM", "SM")
_WHICH_GE = ("LM", "SM", "LR", "SR", "LI", "SI")
_POLICIES = ("raise", "warn", "ignore")


def _check_common(A, k, which, allowed, tol, maxiter, v0, op) -> None:
    n = A.format_shape[0]
    if vmapped(A.values):
        raise InputError(f"{op} under torch.func.vmap over A's values is not supported (its method choice and "
                         f"certificates read the values); give the members as a value batch instead: "
                         f"{op}(A.with_values(V), k) with V of shape (batch, {A.values.shape[-1]}) returns "
                         f"(batch, k) eigenvalues, and torch.func.grad / jacrev work on it")
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

def _inf_norm(T: SparseTensor) -> torch.Tensor:
    """max_i sum_j |T_ij| per value-batch member (>= the spectral norm of a Hermitian T)."""
    coords, slot = T.entries()
    vals = T.values.detach().index_select(-1, slot).abs()
    n = T.format_shape[0]
    return vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0], vals).amax(-1)


def _product(T: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``T @ X`` for every member of T's value batch (X with the same batch in front)."""
    # index_select, not advanced indexing: torch opens a parallel region for the latter even on small
    # inputs, which stalls on a busy machine (10-30 ms per call measured under load, session 22)
    coords, slot = T.entries()
    vals = T.values.detach().index_select(-1, slot)
    rows, cols = coords[0], coords[1]
    contrib = vals.unsqueeze(-1) * X.index_select(-2, cols)
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


def _ascending(w: torch.Tensor, V: torch.Tensor) -> str | None:
    """Put eigsh's pairs in ascending order of ``w`` per member, in place (the plan contract says
    ascending, docs/backend-authors.md; a plugin returned them descending and the caller got them
    so): ``w`` sorted, ``V``'s columns moved with their values. O(k log k) to test and sort, plus one
    copy of V where the order was wrong. Returns why it could not (the tensors cannot be written in
    place: an inference tensor, overlapping memory), else None."""
    if w.shape[-1] < 2 or bool((w[..., 1:] >= w[..., :-1]).all()):
        return None
    order = torch.sort(w, dim=-1, stable=True).indices
    try:
        with torch.no_grad():
            V.copy_(V.gather(-1, order.unsqueeze(-2).expand(V.shape)))
            w.copy_(w.gather(-1, order))
    except RuntimeError as exc:
        return (f"returned eigenvalues not in ascending order (the plan contract) in tensors the core cannot reorder "
                f"in place ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return None


def _verify_pairs(A: SparseTensor, M: SparseTensor | None, w: torch.Tensor, V: torch.Tensor, rtol: float | None):
    """(ok, worst relative residual, why): ``||A v - w M v|| <= rtol (||A|| ||v|| + |w| ||M|| ||v||)``,
    norms the inf-norm per member; ``rtol=None`` (an explicit tol) checks finiteness only. eigsh's
    pairs (real ``w``; eigs' are complex and keep their order) are first put in ascending order, in
    place (:func:`_ascending`)."""
    if not w.is_complex():
        why = _ascending(w, V)
        if why is not None:
            return False, float("nan"), why
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


def magnitude_scale(A: SparseTensor | None) -> float:
    """A power of four (exact, and its square root too) that brings A's largest stored magnitude
    near 1 when it lies outside the range where squared norms are safe (a quarter of the exponent
    range either way), else 1. eigsh / eigs of a finite float64 matrix with entries >= 1e170 failed
    (ARPACK's and the checks' residual norms overflowed; session 21's sweep)."""
    if A is None or A.values.numel() == 0:
        return 1.0
    from ...autograd._route_checks import _pow2_scale  # noqa: PLC0415 - one helper of the solve's scaling

    vmax = float(A.values.detach().abs().amax())
    s = _pow2_scale(vmax, A.dtype)
    if s == 1.0:
        return 1.0
    e = round(math.log2(s))
    return math.ldexp(1.0, e - (e % 2))


def empty_batch(A: SparseTensor, k: int, eigs: bool, return_info: bool) -> tuple | None:
    """The answer for a value batch of no members (``A.values`` of shape ``(..., 0, ..., slots)``): ``w`` of shape
    ``(*batch, k)`` and ``V`` ``(*batch, n, k)``, empty, with gradients linked to A's values (eigsh / eigs raised a
    backend's internal error on it, where solve / logdet / norm answer an empty batch; session 26's sweep); None
    for a batch with members."""
    batch = tuple(A.batch_shape)
    if not batch or math.prod(batch) != 0:
        return None
    from ...dispatch.results import Status  # noqa: PLC0415
    from ..info import SolveInfo  # noqa: PLC0415

    n = A.format_shape[0]
    real = A.values.real.dtype if A.dtype.is_complex else A.dtype
    wdtype = (torch.complex128 if real == torch.float64 else torch.complex64) if eigs else real
    vdtype = wdtype if eigs else A.dtype
    w = A.values.new_zeros(*batch, k, dtype=wdtype)
    V = A.values.new_zeros(*batch, n, k, dtype=vdtype)
    if A.values.requires_grad and torch.is_grad_enabled():  # (empty) gradients flow back to the values
        z = A.values.sum() * 0
        w = w + (z.real if z.is_complex() and not w.is_complex() else z).to(w.dtype)
        V = V + z.to(V.dtype)
    if not return_info:
        return w, V
    return w, V, SolveInfo(backend="none", method="none", iterations=0, residual=0.0, converged=True,
                           status=Status.DIRECT, reason="a batch of no members: nothing to solve")
