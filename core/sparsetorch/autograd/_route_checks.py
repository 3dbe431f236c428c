"""Helpers of the fallback route: exact (power-of-two) scalings, equilibration, and the checks
of what a plan returned."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..dispatch.accuracy import _safe_norm
from ..dispatch.plan import PlanState
from ..dispatch.results import IterationResult
from ..errors import BackendError
from ..tensor import SparseTensor

__all__ = ["_pow2_scale", "_equilibrated", "_checked", "_one_line", "_norm2_floor", "_singular_growth", "_safe_norm"]


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
    """Row and column scalings ``r``, ``c`` (powers of two, ``(*batch, n)``) for an LU of
    ``diag(r) A diag(c)``, and those values (``values`` itself where r and c are all 1; read only).

    Candidates, each judged by Curtis and Reid's measure ``sum over stored nonzeros of
    log2(|r_i a_ij c_j|)^2`` (how far the scaled entries lie from 1 in binades; the smallest wins,
    per batch member):

    - Curtis and Reid's scaling (HSL MC29): the least-squares minimizer of that measure, by a few
      Jacobi-preconditioned CG steps on its normal equations. It is invariant under diagonal scalings:
      ``Dr A0 Dc`` gets the scaled matrix ``A0`` gets, whatever Dr and Dc are;
    - Ruiz's iteration (as MUMPS / HSL MC77 scale: rows and columns divided at once by the square roots of
      their largest entries, at most :data:`_RUIZ_PASSES` passes, until every maximum lies within 4x of 1);
    - columns then rows, and rows then columns, each divided by its largest entry (LAPACK's xGEEQU).

    Ruiz's alone (sessions 21-27) left a column-scaled ``A0 diag(c)`` (c from 1e-150 to 1e150, cond(A0) ~
    1e3) with rows spread over 1e129 and condition 1e118: an LU of the CSR buffers (which factors A^T, its
    pivots searched along A's rows) answered with a relative residual of 1e3 (session 28's sweep); the
    column scaling alone gives A0 back. The first pass of rows then columns alone, before Ruiz, left a
    symmetrically scaled ``D A0 D`` with condition 5e179 (session 21). All scalings are exact (powers of two)."""
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    m, n = A.format_shape
    mag = values.detach().abs().index_select(-1, slot)
    real = mag.dtype
    batch = values.shape[:-1]
    dev = values.device
    # xGEEQU, rows then columns (log2 of the scalings, rounded: exact powers of two), from the magnitudes: the
    # common, well-scaled case (on the path of every default LU) ends here
    def lmax(t: torch.Tensor, idx: torch.Tensor, size: int) -> torch.Tensor:
        top = torch.zeros(*batch, size, dtype=real, device=dev).scatter_reduce(-1, idx.expand(*batch, -1), t, "amax")
        return torch.where(top > 0, torch.log2(torch.where(top > 0, top, torch.ones_like(top))), torch.zeros_like(top))

    lr1 = -torch.round(lmax(mag, rows, m))
    half = torch.floor(lr1 / 2).index_select(-1, rows)  # two factors: 2^lr1 alone overflows for a subnormal row
    lc1 = -torch.round(lmax(mag * torch.exp2(half) * torch.exp2(lr1.index_select(-1, rows) - half), cols, n))
    sr, sc_ = _spread_log(lr1), _spread_log(lc1)
    if sr == 0 and sc_ == 0:
        # one scale for every row and column: nothing to equilibrate (A itself, not a copy; callers read the spread)
        ones_r = torch.ones(*batch, m, dtype=values.dtype, device=dev)
        return ones_r, torch.ones(*batch, n, dtype=values.dtype, device=dev), values
    if sr <= _WELL_SCALED and sc_ <= _WELL_SCALED:
        return _apply_scaling(A, values, slot, rows, cols, lr1, lc1, real)
    nz = mag > 0
    lg = torch.where(nz, torch.log2(torch.where(nz, mag, torch.ones_like(mag))), torch.zeros_like(mag))
    w = nz.to(real)

    def line_max(lv: torch.Tensor, idx: torch.Tensor, size: int) -> torch.Tensor:
        # the largest log-magnitude per row / column (of the nonzeros), 0 for an empty line
        top = torch.full((*batch, size), -math.inf, dtype=real, device=dev).scatter_reduce(
            -1, idx.expand(*batch, -1), torch.where(nz, lv, torch.full_like(lv, -math.inf)), "amax")
        return torch.where(torch.isfinite(top), top, torch.zeros_like(top))

    def scaled_logs(lr: torch.Tensor, lc: torch.Tensor) -> torch.Tensor:
        return lg + lr.index_select(-1, rows) + lc.index_select(-1, cols)

    def score(lr: torch.Tensor, lc: torch.Tensor) -> torch.Tensor:
        return (scaled_logs(lr, lc).square() * w).sum(-1)

    zr = torch.zeros(*batch, m, dtype=real, device=dev)
    zc = torch.zeros(*batch, n, dtype=real, device=dev)
    cands = [(lr1, lc1)]
    # xGEEQU, columns then rows
    lc2 = -torch.round(line_max(lg, cols, n))
    lr2 = -torch.round(line_max(lg + lc2.index_select(-1, cols), rows, m))
    cands.append((lr2, lc2))
    # Ruiz
    lr, lc = zr.clone(), zc.clone()
    for _ in range(_RUIZ_PASSES):
        cur = scaled_logs(lr, lc)
        rmax, cmax = line_max(cur, rows, m), line_max(cur, cols, n)
        if not (rmax.numel() and cmax.numel()) or float(torch.maximum(rmax.abs().amax(), cmax.abs().amax())) <= 2.0:
            break
        lr = lr - torch.round(rmax / 2)
        lc = lc - torch.round(cmax / 2)
    cands.append((lr, lc))
    # Curtis-Reid: minimize sum w (lg + rho_i + gamma_j)^2; normal equations [[Nr, S], [S^T, Nc]] [rho; gamma] = -[sum_j lg; sum_i lg]
    cnt_r = torch.zeros(*batch, m, dtype=real, device=dev).index_add_(-1, rows, w)
    cnt_c = torch.zeros(*batch, n, dtype=real, device=dev).index_add_(-1, cols, w)
    if m and n and bool(nz.any()):
        def op(xr: torch.Tensor, xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            yr = cnt_r * xr + torch.zeros_like(xr).index_add_(-1, rows, w * xc.index_select(-1, cols))
            yc = cnt_c * xc + torch.zeros_like(xc).index_add_(-1, cols, w * xr.index_select(-1, rows))
            return yr, yc

        inv_r = torch.where(cnt_r > 0, 1 / torch.where(cnt_r > 0, cnt_r, torch.ones_like(cnt_r)), torch.zeros_like(cnt_r))
        inv_c = torch.where(cnt_c > 0, 1 / torch.where(cnt_c > 0, cnt_c, torch.ones_like(cnt_c)), torch.zeros_like(cnt_c))
        br = -torch.zeros_like(zr).index_add_(-1, rows, lg * w)
        bc = -torch.zeros_like(zc).index_add_(-1, cols, lg * w)
        xr, xc = zr.clone(), zc.clone()
        rr, rc = br, bc
        zr_, zc_ = rr * inv_r, rc * inv_c
        pr, pc = zr_, zc_
        rz = (rr * zr_).sum(-1) + (rc * zc_).sum(-1)
        for _ in range(_CURTIS_REID_STEPS):
            qr, qc = op(pr, pc)
            pq = (pr * qr).sum(-1) + (pc * qc).sum(-1)
            alpha = torch.where(pq > 0, rz / torch.where(pq > 0, pq, torch.ones_like(pq)), torch.zeros_like(pq))
            xr, xc = xr + alpha.unsqueeze(-1) * pr, xc + alpha.unsqueeze(-1) * pc
            rr, rc = rr - alpha.unsqueeze(-1) * qr, rc - alpha.unsqueeze(-1) * qc
            zr_, zc_ = rr * inv_r, rc * inv_c
            rz_new = (rr * zr_).sum(-1) + (rc * zc_).sum(-1)
            if float(rz_new.max()) <= 1e-6 * max(1.0, float(((br * br * inv_r).sum(-1) + (bc * bc * inv_c).sum(-1)).max())):
                break
            beta = torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, torch.ones_like(rz)), torch.zeros_like(rz))
            pr, pc = zr_ + beta.unsqueeze(-1) * pr, zc_ + beta.unsqueeze(-1) * pc
            rz = rz_new
        # the scaled matrix's largest entry near 1 (the minimizer fixes rho + gamma only up to a constant)
        lr3, lc3 = torch.round(xr), torch.round(xc)
        top = torch.where(nz, scaled_logs(lr3, lc3), torch.full_like(lg, -math.inf)).amax(-1)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        cands.append((lr3 - torch.round(top).unsqueeze(-1), lc3))
    # a candidate is trusted only where its scaled entries stay within the binades the entries span already (plus
    # a margin): a Curtis-Reid step that drifted on a disconnected pattern (explicit zeros of one batch member)
    # gave scales of 2^1023 and NaN values (session 28)
    lo = torch.where(nz, lg, torch.full_like(lg, math.inf)).amin(-1)
    hi = torch.where(nz, lg, torch.full_like(lg, -math.inf)).amax(-1)
    span = torch.where(torch.isfinite(hi - lo), hi - lo, torch.zeros_like(hi)) + 8

    max_exp = _MAX_EXP_SHARE * math.log2(torch.finfo(real).max)

    def trusted_score(lr_: torch.Tensor, lc_: torch.Tensor) -> torch.Tensor:
        sl = torch.where(nz, scaled_logs(lr_, lc_), torch.zeros_like(lg))
        ok = torch.isfinite(sl).all(-1) & (sl.abs().amax(-1) <= span) & torch.isfinite(lr_).all(-1) \
            & torch.isfinite(lc_).all(-1) & (_amax0(lr_.abs()) <= max_exp) & (_amax0(lc_.abs()) <= max_exp)
        return torch.where(ok, score(lr_, lc_), torch.full_like(span, math.inf))

    best_r, best_c = zr, zc  # no scaling unless a candidate is trusted and better
    best = trusted_score(zr, zc)
    for lr_, lc_ in cands:
        sc = trusted_score(lr_, lc_)
        better = sc < best
        best = torch.where(better, sc, best)
        best_r = torch.where(better.unsqueeze(-1), lr_, best_r)
        best_c = torch.where(better.unsqueeze(-1), lc_, best_c)
    return _apply_scaling(A, values, slot, rows, cols, best_r, best_c, real)


def _spread_log(lr: torch.Tensor) -> float:
    """The spread (max - min, in binades) of log2 scalings over every batch member; 0 when empty."""
    if not lr.numel() or not lr.shape[-1]:
        return 0.0
    return float((lr.amax(-1) - lr.amin(-1)).max())


def _apply_scaling(A: SparseTensor, values: torch.Tensor, slot: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                   lr: torch.Tensor, lc: torch.Tensor, real: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(r, c, scaled values)`` of log2 scalings (exponents a normal number of the dtype can carry)."""
    top_exp = float(math.floor(math.log2(torch.finfo(real).max)) - 1)
    lr, lc = torch.clamp(lr, -top_exp, top_exp), torch.clamp(lc, -top_exp, top_exp)
    r, c = torch.exp2(lr), torch.exp2(lc)
    # each entry times 2^(lr_i + lc_j), one exact power of two (r_i c_j as a product overflowed to inf where an
    # explicit zero sits between a huge row scale and a tiny column one: 0 * inf = NaN; session 28)
    v = values.index_select(-1, slot)
    e = lr.index_select(-1, rows) + lc.index_select(-1, cols)  # from the clamped exponents: ve = diag(r) A diag(c)
    h = torch.floor(e / 2)  # two exact factors: 2^e alone may leave the dtype's range where the product does not
    ve = values.clone()
    ve[..., slot] = torch.where(v == 0, torch.zeros_like(v),
                                v * torch.exp2(h).to(values.dtype) * torch.exp2(e - h).to(values.dtype))
    return r.to(values.dtype), c.to(values.dtype), ve


def _amax0(t: torch.Tensor) -> torch.Tensor:
    """``t.amax(-1)``, 0 for an empty last dimension."""
    return t.amax(-1) if t.shape[-1] else t.new_zeros(t.shape[:-1])


#: binades within which xGEEQU's row and column scalings count as "well scaled" (Ruiz and Curtis-Reid not tried):
#: 2^4, the route's _EQUILIBRATE_SPREAD
_WELL_SCALED = 4.0
#: passes of Ruiz's equilibration at most (each halves the imbalance in binades: 2^1000 in ~10)
_RUIZ_PASSES = 40
#: the largest exponent a trusted scaling may hold, as a share of the dtype's largest (r b and c x must not
#: overflow for b, x of ordinary size): 2^870 in float64, 2^108 in float32
_MAX_EXP_SHARE = 0.85
#: CG steps of Curtis and Reid's scaling at most (the scalings are rounded to whole binades: a rough minimizer will do)
_CURTIS_REID_STEPS = 50


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





#: A is singular to working precision when a lower bound of its 2-norm condition number reaches
#: ``1 / (_SINGULAR_MARGIN u)``: past it a backward-stable answer may have no correct digit (forward
#: error up to ``cond * eta``), and the factors of an exactly singular matrix look like those of one
#: of condition ~1 / u (their near-zero pivot is a rounding error of the factorization: a float32
#: Neumann Laplacian's gave a condition estimate of 0.4 / u at 40,000 unknowns)
_SINGULAR_MARGIN = 8.0


def _norm2_floor(A: SparseTensor, values: torch.Tensor) -> torch.Tensor:
    """A lower bound of ``||A||_2`` that does not grow with n: the largest 2-norm of a row or a column
    of A (``||A||_2 >= ||A e_j||_2`` and ``>= ||A^H e_i||_2``), ``(*batch,)``, in float64. (The
    Frobenius norm, ~sqrt(n) times ``||A||_2`` on a mesh matrix, made ``||A||_F ||x|| / ||b||`` overstate
    the condition by that factor: session 29.)"""
    coords, slot = A.entries()
    mag = values.abs().index_select(-1, slot)
    batch = values.shape[:-1]
    # in float64 (session 29: the squares of float32 entries of 1e19 overflowed to inf, and an infinite norm called
    # a matrix with blocks of 1e-19 and 1e19 singular); float64 entries divided by their largest first
    # (again, divided by the largest, where the float64 squares overflowed or underflowed: no extra pass otherwise)
    mag = mag.to(torch.float64)

    def floor(sq: torch.Tensor) -> torch.Tensor:
        top = torch.zeros(batch, dtype=sq.dtype, device=values.device)
        for lines, n in ((coords[0], A.format_shape[0]), (coords[1], A.format_shape[1])):
            if n and sq.shape[-1]:
                sums = torch.zeros(*batch, n, dtype=sq.dtype, device=values.device).index_add_(-1, lines, sq)
                top = torch.maximum(top, sums.amax(dim=-1).sqrt())
        return top

    top = floor(mag * mag)
    if values.dtype in (torch.float64, torch.complex128) and mag.shape[-1] and \
            not bool((torch.isfinite(top) & (top >= 2.0 ** -480)).all()):
        scale = mag.amax(dim=-1, keepdim=True)
        scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        mag = mag / scale
        top = floor(mag * mag) * scale.squeeze(-1)
    return top


def _singular_growth(kappa: float, dtype: torch.dtype) -> bool:
    """Whether ``kappa``, a lower bound of A's condition number (``||A||_2 ||x|| / ||b||`` with
    :func:`_norm2_floor`'s norm, sharpened by one step of inverse iteration where the factors are at
    hand), says A is singular to working precision: ``kappa * 8 u >= 1`` (:data:`_SINGULAR_MARGIN`).
    Until session 29 the test was ``||A||_F ||x|| / ||b|| * sqrt(n) u >= 1``, which counted sqrt(n)
    twice on a mesh matrix (the Frobenius norm grows like sqrt(n)): a float32 2-D Poisson matrix of
    10^4 unknowns, condition 6e3, whose Cholesky answer had a backward error of 3e-10, was called
    singular. (Until session 19 the margin was n.)"""
    real = torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype
    return not kappa * _SINGULAR_MARGIN * float(torch.finfo(real).eps) / 2 < 1
