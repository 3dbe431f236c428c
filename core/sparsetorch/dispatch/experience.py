"""What iterative solves measured, per pattern, and how it (and the matrix class) weighs offers.

Backends estimate iteration counts from models fitted on model problems (2-D/3-D Poisson). Two
things correct them here, in the core, for every backend alike:

- **The matrix class.** A model fitted on SPD matrices says nothing of a non-symmetric or an
  indefinite one. :func:`class_factor` scales an estimate by what the detected properties say:
  SPD: as estimated; diagonally dominant: as estimated (Jacobi-preconditioned methods contract
  by the dominance ratio); symmetric, not known definite: ``sqrt(n) / 4`` times more, and
  ``sqrt(n)`` when a zero diagonal entry proves it indefinite (MINRES on an indefinite
  spectrum converges like CG on the condition number, not its square root); non-symmetric and
  not dominant: ``n`` iterations (what GMRES needs in exact arithmetic; restarted methods may
  need more or never converge). Such matrices then go to a direct method unless they are too
  large for one, and an attempt that fails is bounded and falls back (``ops/solve.py``).
- **Measurements.** Each iterative solve records the iterations it took on its pattern (or that
  it failed, and why); the next decision on that pattern uses the measured count, scaled to the
  tolerance asked for, in place of the estimate, and a method that failed on the pattern at a
  tolerance no looser than the one asked for is declined (with the recorded reason) unless it is
  pinned. A direct method whose attempts took more than :data:`DIRECT_SLOWER` times its estimate
  (and :data:`DIRECT_MARGIN` more) twice (:data:`CONFIRMATIONS`; one stall of a loaded machine
  proves nothing)
  (fill-in models read the pattern's nonzeros per row only, and miss the fill of graphs that are
  not meshes) is priced at its measured time from then on, so the next call on the pattern
  tries the next offer. ``explain`` shows estimate and measurement side by side.

Patterns are recognized by content (:attr:`SparseTensor.pattern_fingerprint`), so a matrix
rebuilt in fresh buffers (new values read from a file, a mesh re-assembled) benefits too.

The store is bounded (LRU over patterns) and thread safe; :func:`clear_experience` empties it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Hashable

from .accuracy import default_rtol
from .lru import LRU
from .records import Decline, Measured, Offer, Request

__all__ = ["record", "measured_for", "measured_on", "clear_experience", "class_factor", "weigh", "DIRECT_SLOWER", "DIRECT_MARGIN", "CONFIRMATIONS"]

_MAX_PATTERNS = 512
#: a direct attempt is remembered when it took more than DIRECT_SLOWER times its estimate and
#: DIRECT_MARGIN seconds more (below that the core's own per-call work, not the model, dominates)
DIRECT_SLOWER = 3.0
DIRECT_MARGIN = 0.01
#: ... in this many attempts (the least time of them is used)
CONFIRMATIONS = 2
#: iterations an iterative method spends with no tolerance given, over its count at the contract's
#: rtol: the refinement to a direct method's backward error (session 20: +24 % to +31 % on 3-D
#: Poisson by CG and upwind convection-diffusion by BiCGStab)
SHARPEN_SURCHARGE = 1.3
_store: "LRU[Hashable, dict[tuple[str, str, str | None], Measured]]" = LRU("measurements", _MAX_PATTERNS)


def _key(pattern_key: Any, dtype: Any) -> Hashable:
    return (pattern_key, dtype)


def record(pattern_key: Any, dtype: Any, backend: str, method: str, preconditioner: str | None, measured: Measured) -> None:
    """Remember what ``backend/method`` (+ ``preconditioner``) did on this pattern."""
    if pattern_key is None:
        return
    k = _key(pattern_key, dtype)
    with _store.lock:
        entry = _store.peek(k)
        if entry is None:
            entry = {}
            _store.put(k, entry)
        if measured.seconds is not None:
            old = entry.get((backend, method, preconditioner))
            if old is not None and old.seconds is not None:
                measured = replace(measured, seconds=min(old.seconds, measured.seconds), samples=old.samples + 1)
            else:
                measured = replace(measured, samples=1)
        entry[(backend, method, preconditioner)] = measured
        _store.get(k)  # a use: most recent last


def measured_on(A: Any) -> tuple[tuple[tuple[str, str, str | None], Measured], ...]:
    """:func:`measured_for` A's pattern; the pattern's fingerprint (an O(nnz) read, once per
    tensor) is computed only when something was measured at all."""
    if len(_store) == 0:
        return ()
    return measured_for(A.pattern_fingerprint, A.dtype)


def measured_for(pattern_key: Any, dtype: Any) -> tuple[tuple[tuple[str, str, str | None], Measured], ...]:
    """A hashable snapshot of what was measured on this pattern (part of the request)."""
    if pattern_key is None:
        return ()
    with _store.lock:
        entry = _store.peek(_key(pattern_key, dtype))
        if not entry:
            return ()
        return tuple(sorted(entry.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")))


def clear_experience() -> None:
    """Forget every measurement."""
    _store.clear()


def class_factor(request: Request) -> tuple[float, str]:
    """How many times the backends' (SPD-fitted) iteration estimate to expect for this matrix
    class, and a note for explain."""
    props = request.properties
    n = max(int(request.A.shape[-1]), 1)
    if "spd" in props:
        return 1.0, ""
    if "diagonally_dominant" in props:
        return 1.0, "diagonally dominant"
    if "zero_diagonal" in props:
        # a symmetric matrix with a zero diagonal entry is indefinite for certain
        return max(1.0, math.sqrt(n)), "symmetric with a zero diagonal entry (indefinite): ~sqrt(n) times the SPD estimate"
    if {"symmetric", "hermitian"} & props:
        return max(1.0, math.sqrt(n) / 4), "symmetric, not known definite: ~sqrt(n) times the SPD estimate"
    return float("inf"), "non-symmetric, not diagonally dominant: ~n iterations"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _scaled(its: float, from_rtol: float, to_rtol: float) -> float:
    """An iteration count measured at ``from_rtol`` scaled to ``to_rtol`` (linear convergence)."""
    a = math.log(2.0 / max(from_rtol, 1e-300))
    b = math.log(2.0 / max(to_rtol, 1e-300))
    return its * b / a if a > 0 else its


def _difficulty(offers: list[Offer], measured: dict, factor: float, rtol: float) -> float:
    """How many times its (class-weighed) estimate an iterative method measured on this pattern
    needed, the largest over the methods measured (at least 1): for one that did not converge at
    this tolerance, a lower bound (it ran that many iterations and needed more). The matrix's
    spectrum is what the estimates misjudged, and it is the same for every Krylov method: the
    methods not yet measured are weighed by it, so that a failure of one does not make the next
    one the choice of the next call."""
    if not measured or not math.isfinite(factor):
        return 1.0
    worst = 1.0
    for o in offers:
        if o.iterations is None:
            continue
        m = measured.get((o.backend, o.method, o.preconditioner))
        if m is None or (not m.converged and m.rtol > rtol * (1 + 1e-12)):
            continue
        its = float(m.iterations) if not m.converged else _scaled(float(m.iterations), m.rtol, rtol)
        worst = max(worst, its / (o.iterations * factor))
    return worst


def _direct_difficulty(offers: list[Offer], measured: dict) -> float:
    """The least ratio of measured to estimated time among the direct offers measured (and confirmed)
    on this pattern, when every one of them took over :data:`DIRECT_DIFFICULTY_FROM` times its estimate
    (1.0 otherwise): the shared fill tables misjudged the pattern, so the unmeasured direct offers are
    priced up alike."""
    ratios = []
    for o in offers:
        if not o.direct:
            continue
        m = measured.get((o.backend, o.method, o.preconditioner))
        if m is not None and m.seconds is not None and m.samples >= CONFIRMATIONS and o.seconds > 0:
            ratios.append(m.seconds / o.seconds)
    if not ratios or min(ratios) <= DIRECT_DIFFICULTY_FROM:
        return 1.0
    return min(ratios)


#: measured direct methods must have taken more than this many times their estimate before the other
#: direct offers on the pattern are priced up by it (below: timing noise of a loaded machine)
DIRECT_DIFFICULTY_FROM = 3.0


def weigh(request: Request, offers: list[Offer]) -> tuple[list[Offer], list[Decline]]:
    """The iterative offers re-priced by the matrix class and by measurements on the pattern; a
    method that failed on this pattern at this tolerance (or a looser one) is declined unless the
    user pinned it."""
    factor, class_note = class_factor(request)
    measured = dict(request.measured)
    rtol = request.option("rtol")
    rtol = float(rtol) if isinstance(rtol, (int, float)) else 1e-6
    pinned = request.option("method") is not None
    n = max(int(request.A.shape[-1]), 1)
    maxiter = request.option("maxiter")
    out: list[Offer] = []
    declines: list[Decline] = []
    zero_diagonal = "zero_diagonal" in request.properties and request.option("preconditioner") != "jacobi"
    difficulty = _difficulty(offers, measured, factor, rtol)
    direct_ratio = _direct_difficulty(offers, measured)
    # a call with no tolerance refines an iterative answer to a direct method's backward error
    # (fallback.Route._sharpen): priced here, so that dispatch compares it with a direct method at
    # what it will cost (measured counts on the pattern include the refinement already)
    atol = request.option("atol")
    sharpen = SHARPEN_SURCHARGE if (rtol == default_rtol(request.A.dtype) and not atol) else 1.0
    for o in offers:
        if zero_diagonal and o.preconditioner == "jacobi":
            # Jacobi divides by the diagonal: the build raises on this matrix (never offer what
            # the build refuses)
            declines.append(Decline(o.backend, "the Jacobi preconditioner divides by A's diagonal, which has zero (or "
                                               "unstored) entries here; pass preconditioner='jacobi' to try it anyway",
                                    o.method))
            continue
        if o.direct:
            m = measured.get((o.backend, o.method, o.preconditioner))
            confirmed = m is not None and m.seconds is not None and m.samples >= CONFIRMATIONS
            if not confirmed and direct_ratio > 1.0:
                # the fill and flop tables every direct offer reads were off by that much on this pattern
                # (a saddle-point matrix whose LUs took 53x their estimate: its QR, priced from the same
                # tables, was tried next at 30 s a call; session 22's sweep)
                note = (f"other direct methods took {direct_ratio:.3g}x their estimate on this pattern: "
                        f"~{_ms(o.seconds * direct_ratio)} expected (backend estimated {_ms(o.seconds)})")
                o = replace(o, seconds=o.seconds * direct_ratio, setup=o.setup * direct_ratio,
                            factor=o.factor * direct_ratio, notes=f"{o.notes}; {note}" if o.notes else note)
            if confirmed and m.seconds > o.seconds:
                note = f"measured {_ms(m.seconds)} on this pattern (backend estimated {_ms(o.seconds)})"
                scale = m.seconds / max(o.seconds, 1e-300)
                o = replace(o, seconds=m.seconds, setup=min(m.seconds, o.setup * scale),
                            factor=min(m.seconds - min(m.seconds, o.setup * scale), o.factor * scale),
                            notes=f"{o.notes}; {note}" if o.notes else note)
            out.append(o)
            continue
        if o.iterations is None:
            out.append(o)
            continue
        m = measured.get((o.backend, o.method, o.preconditioner))
        if m is not None and not m.converged and m.rtol <= rtol * (1 + 1e-12) and not pinned:
            declines.append(Decline(o.backend, f"did not converge on this pattern earlier ({m.iterations} iterations, "
                                               f"rtol {m.rtol:.1e}: {m.reason or 'stopped'}); pin method= to try it again",
                                    o.method))
            continue
        if m is not None and m.converged:
            its = max(1.0, _scaled(float(m.iterations), m.rtol, rtol))
            note = (f"measured {m.iterations} iterations on this pattern at rtol {m.rtol:.0e}: ~{int(math.ceil(its))} "
                    f"expected (backend estimated {o.iterations})")
        elif factor != 1.0 or difficulty > 1.0 or sharpen != 1.0:
            its = o.iterations * factor * difficulty * sharpen if math.isfinite(factor) else float(n)
            if math.isfinite(factor):
                its = min(its, 10.0 * n)
            else:
                its = max(its, float(o.iterations))
            why = [class_note] if class_note else []
            if difficulty > 1.0:
                why.append(f"other iterative methods needed over {difficulty:.3g}x their estimate on this pattern")
            if sharpen != 1.0:
                why.append(f"refinement to a direct method's backward error (no tolerance given): "
                           f"+{round(100 * (sharpen - 1))} %")
            note = f"{'; '.join(why)}: ~{int(math.ceil(its))} expected (backend estimated {o.iterations})"
        else:
            if class_note:
                o = replace(o, notes=f"{o.notes}; {class_note}" if o.notes else class_note)
            out.append(o)
            continue
        if isinstance(maxiter, int):
            its = min(its, float(maxiter))
        ratio = its / o.iterations
        per_call = o.seconds - o.setup
        new_iterations = max(1, int(math.ceil(its)))
        out.append(replace(o, seconds=o.setup + per_call * ratio, iterations=new_iterations,
                           notes=f"{o.notes}; {note}" if o.notes else note))
    return out, declines
