"""The accuracy contract: what an op returns when the caller gives no tolerance.

With no ``rtol``/``tol`` given, every op that has one answers as accurately as a backward-stable
direct method would in the operands' dtype: a relative residual ``||b - A x|| / ||b||`` of at
most :func:`default_rtol` (1e-10 in float64/complex128, 1e-5 in float32/complex64), and for
``solve`` the normwise backward error of such a method (:func:`backward_error_bound`), reached by
refinement on the same plan where an answer (an iterative method's, at ~1e-11 in float64) meets the
residual but not that (``autograd/fallback.py``, ``Route._sharpen``). An explicit tolerance keeps
its meaning. Dispatch prices iterative methods at the tolerance asked for, so a
default call in float64 sees iterative methods at their 1e-10 price, not at a loose one.

Direct methods on ill-conditioned matrices may miss a relative residual of 1e-10 while being as
accurate as any method can be (the residual of a backward-stable solve is about
``eps * ||A|| * ||x||``, which exceeds ``1e-10 * ||b||`` when ``||A|| ||x|| >> ||b||``); the
normwise backward error (:func:`backward_error`) is what such an answer is judged by.
"""

from __future__ import annotations

import torch

__all__ = ["default_rtol", "unit_roundoff", "backward_error_bound", "resolve_rtol"]

_DOUBLE = (torch.float64, torch.complex128)
_SINGLE = (torch.float32, torch.complex64)


def _safe_norm(t: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """``torch.linalg.vector_norm(t, dim=dim)`` without overflow or underflow of the squares (torch and NumPy square
    unscaled: a vector of 1e+160 entries, or of 1e+20 in float32, has an infinite norm), in float64: data of a
    narrower dtype summed in float64 (every square of theirs fits), float64 data divided by its largest magnitude
    first. For the paths where a norm overflowed, or where the entries span the exponent range (session 29)."""
    real = t.real.dtype if t.is_complex() else t.dtype
    out: torch.Tensor
    if real != torch.float64:
        out = torch.linalg.vector_norm(t, dim=dim, dtype=torch.complex128 if t.is_complex() else torch.float64)
    elif not t.shape[dim]:
        out = torch.linalg.vector_norm(t, dim=dim)
    else:
        s = t.abs().amax(dim=dim, keepdim=True)
        s = torch.where((s > 0) & torch.isfinite(s), s, torch.ones_like(s))
        out = torch.linalg.vector_norm(t / s, dim=dim) * s.squeeze(dim)
    return out


def default_rtol(dtype: torch.dtype) -> float:
    """The relative residual a call with no tolerance must reach in ``dtype``."""
    if dtype in _DOUBLE:
        return 1e-10
    if dtype in _SINGLE:
        return 1e-5
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    return 1e-10


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``'s real type."""
    real = torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype
    return float(torch.finfo(real).eps) / 2


def backward_error_bound(dtype: torch.dtype, n: int) -> float:
    """The normwise backward error ``||r|| / (||A|| ||x|| + ||b||)`` a backward-stable direct
    solve stays under in practice (a generous ``max(16, sqrt(n))`` times the unit roundoff, far
    below the worst-case ``n * u`` bound and far above what LU with partial pivoting gives on
    ordinary matrices)."""
    return float(max(16.0, float(n) ** 0.5) * 8 * unit_roundoff(dtype))


def normwise_backward_error(values: torch.Tensor, X: torch.Tensor, rn: torch.Tensor,
                            bn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per right-hand side, ``(eta, ||A|| ||x||)`` with ``eta = ||r|| / (||A||_F ||x|| + ||b||)``:
    ``values`` A's stored values (``(*batch, nnz)``; their 2-norm is ``||A||_F``), ``X`` the answer
    ``(*batch, n, k)``, ``rn`` / ``bn`` the residual's and b's column norms ``(*batch, k)``. A zero
    denominator (A x = b = 0) reads as 1 (eta = ||r||). The one formula of the solve's acceptance
    test (``fallback.Route``) and of the determinant's check of unpivoted factors (``ops.logdet``)."""
    anorm = torch.linalg.vector_norm(values, dim=-1)
    xn = torch.linalg.vector_norm(X, dim=-2)
    if not (bool(torch.isfinite(anorm).all()) and bool(torch.isfinite(xn).all())):
        # squares past the dtype's range (entries beyond ~1e154, ~1e19 in float32; session 29): without overflow,
        # in float64, and eta as a ratio in units of t = max(||x||, ||b||) (||A|| ||x|| itself may overflow)
        anorm, xn = _safe_norm(values, dim=-1), _safe_norm(X)
        rn, bn = rn.to(torch.float64), bn.to(torch.float64)
    while anorm.dim() < rn.dim():
        anorm = anorm.unsqueeze(-1)
    t = torch.maximum(xn, bn)
    t = torch.where(t > 0, t, torch.ones_like(t))
    den = anorm * (xn / t) + bn / t
    return rn / t / torch.where(den > 0, den, torch.ones_like(den)), anorm * xn


def resolve_rtol(rtol: float | None, dtype: torch.dtype) -> float:
    """``rtol`` if the caller gave one, else the contract's tolerance for ``dtype``."""
    return default_rtol(dtype) if rtol is None else float(rtol)
