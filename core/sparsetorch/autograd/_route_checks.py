"""Helpers of the fallback route: exact (power-of-two) scalings, equilibration, and the checks
of what a plan returned."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..dispatch.plan import PlanState
from ..dispatch.results import IterationResult
from ..errors import BackendError
from ..tensor import SparseTensor

__all__ = ["_pow2_scale", "_equilibrated", "_checked", "_one_line"]


def _pow2_scale(amax: float, dtype: torch.dtype) -> float:
    """A power of two that brings ``amax`` near 1 when it lies outside the range where squared
    norms are safe (a quarter of the exponent range either way), else 1."""
    if amax == 0 or not math.isfinite(amax):
        return 1.0
    low, high, top = _safe_range(dtype)  # top: the scale itself must be a normal number of the dtype
    if low <= amax <= high:
        return 1.0
    return math.ldexp(1.0, max(-top, min(top, -round(math.log2(amax)))))


def _safe_range(dtype: torch.dtype) -> tuple[float, float, int]:
    """``(low, high, top)`` of ``dtype``'s real type: magnitudes whose squares neither underflow nor overflow lie in
    ``[low, high]`` (a quarter of the exponent range either way), and ``2^top`` is the largest power of two a
    scale may be (a normal number)."""
    real = torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype
    fi = torch.finfo(real)
    emax = math.log2(fi.max) / 4
    return 2.0 ** -emax, 2.0 ** emax, int(math.log2(fi.max)) - 1


def _pow2_clamped(t: torch.Tensor, top: int) -> torch.Tensor:
    """``1 / t`` rounded to a power of two, its exponent within ``[-top, top]``; 1 where ``t`` is 0."""
    safe = torch.where(t > 0, t, torch.ones_like(t))
    return torch.exp2(torch.clamp(-torch.round(torch.log2(safe)), -top, top))


def safe_column_scales(B: torch.Tensor) -> torch.Tensor | None:
    """Per column of ``B`` (``(*batch, n, k)``; per batch member too), ``(*batch, 1, k)``: the power of two that
    brings the column's largest entry near 1 where that entry lies outside the range of safe squared norms, 1 for
    the other columns; None when every column is in range (one host read)."""
    if not B.numel():
        return None
    cm = B.detach().abs().amax(dim=-2, keepdim=True)
    low, high, top = _safe_range(B.dtype)
    out = (cm > high) | ((cm < low) & (cm > 0))
    if not bool(out.any()):
        return None
    return torch.where(out, _pow2_clamped(cm, top), torch.ones_like(cm)).to(B.dtype)


def safe_value_scales(values: torch.Tensor) -> torch.Tensor | None:
    """Per value set of ``values`` (``(*batch, slots)``), ``(*batch,)``: the power of two that brings its largest
    entry near 1 where that entry lies outside the range of safe squared norms and the scaled smallest nonzero
    entry stays inside it (a matrix whose entries span more than the range keeps its scale: its columns are a
    column scaling's business), 1 elsewhere; None when no set is scaled (one host read)."""
    if not values.numel():
        return None
    mag = values.detach().abs()
    vmax = mag.amax(dim=-1)
    vmin = torch.where(mag > 0, mag, torch.full_like(mag, math.inf)).amin(dim=-1)
    low, high, top = _safe_range(values.dtype)
    s = _pow2_clamped(vmax, top)
    want = ((vmax > high) | ((vmax < low) & (vmax > 0))) & (vmin * s >= low) & (vmax * s <= high)
    if not bool(want.any()):
        return None
    return torch.where(want, s, torch.ones_like(s)).to(mag.dtype)


def _pow2(t: torch.Tensor) -> torch.Tensor:
    """``1 / t`` rounded to a power of two (exact scaling), 1 where ``t`` is 0."""
    safe = torch.where(t > 0, t, torch.ones_like(t))
    return torch.exp2(-torch.round(torch.log2(safe)))


def _equilibrated(A: SparseTensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and column scalings ``r``, ``c`` (powers of two, ``(*batch, n)``) that bring every row's and
    every column's largest entry of ``diag(r) A diag(c)`` near 1, and those values.

    Ruiz's iteration (as MUMPS / HSL MC77 scale): each pass divides rows and columns at once by the
    square roots of their largest entries, halving the imbalance in binades, until every row and
    column maximum lies within a factor of 4 of 1 (at most :data:`_RUIZ_PASSES`). One pass of rows
    then columns, the earlier scaling, left a symmetrically scaled ``D A0 D`` (D from 1e-100 to 1e100,
    cond(A0) ~ 9) with condition 5e179 (an LU met an exact zero pivot; session 21's sweep)."""
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    m, n = A.format_shape
    mag = values.abs().index_select(-1, slot)
    real = mag.dtype
    batch = values.shape[:-1]
    r = torch.ones(*batch, m, dtype=real, device=values.device)
    c = torch.ones(*batch, n, dtype=real, device=values.device)
    for _ in range(_RUIZ_PASSES):
        cur = mag * r.index_select(-1, rows) * c.index_select(-1, cols)
        rmax = torch.zeros(*batch, m, dtype=real, device=values.device).scatter_reduce(
            -1, rows.expand(*batch, -1), cur, "amax")
        cmax = torch.zeros(*batch, n, dtype=real, device=values.device).scatter_reduce(
            -1, cols.expand(*batch, -1), cur, "amax")
        lr = torch.log2(torch.where(rmax > 0, rmax, torch.ones_like(rmax)))
        lc = torch.log2(torch.where(cmax > 0, cmax, torch.ones_like(cmax)))
        if float(torch.maximum(lr.abs().amax(), lc.abs().amax())) <= 2.0:
            break
        r = r * torch.exp2(-torch.round(lr / 2))
        c = c * torch.exp2(-torch.round(lc / 2))
    ve = values.clone()
    ve[..., slot] = values.index_select(-1, slot) * (r.index_select(-1, rows) * c.index_select(-1, cols))
    return r.to(values.dtype), c.to(values.dtype), ve


#: passes of Ruiz's equilibration at most (each halves the imbalance in binades: 2^1000 in ~10)
_RUIZ_PASSES = 40


def _checked(state: PlanState, out: Any, B: torch.Tensor) -> tuple[torch.Tensor, IterationResult]:
    """A plan's ``(X, IterationResult)`` checked against ``B`` (shape, dtype, device)."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)
            and isinstance(out[1], IterationResult)):
        raise BackendError(f"{state.label} returned {type(out).__name__} from solve, expected (X, IterationResult) "
                           f"(plugin bug)", label=state.label, phase="result")
    X, res = out
    if tuple(X.shape) != tuple(B.shape) or X.dtype != B.dtype or X.device != B.device:
        raise BackendError(f"{state.label} returned X of shape {tuple(X.shape)}, {X.dtype} on {X.device}; expected "
                           f"{tuple(B.shape)}, {B.dtype} on {B.device} (plugin bug)", label=state.label, phase="result")
    return X, res


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]



