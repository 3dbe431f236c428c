"""Checks and loops that several backend plugins need in the same form (plugins use them through
:mod:`sparsetorch.backend`).

Each helper here was written out in two to five plugins before; the reasons they return are the
ones users already saw, word for word, so moving a plugin onto the kit changes no message.

- Declines: :func:`dtype_name`, :func:`cpu_matrix_decline` (the CPU counterpart of
  :func:`~sparsetorch.dispatch.helpers.cuda_matrix_decline`), :func:`conversion_note`,
  :func:`hermitian`, :func:`spd_ok`.
- Cost models: :func:`itemsize`, :func:`index_size`, :func:`batch_size`.
- Iterative plans: :func:`trivial_system` (NaN/Inf and ``b == 0`` before iterating),
  :func:`maxiter_reason`, :func:`true_residual_solve` with :class:`Run` (restart an inner Krylov
  solver from the true residual until ``||b - A x|| <= max(rtol ||b||, atol)`` holds), and
  :func:`to_real` / :func:`from_real` / :func:`realified_matvec` (a complex Hermitian system as
  the real symmetric one of twice the size, for real-only MINRES implementations).

The array helpers take the array module as ``xp`` (NumPy, CuPy): this module imports neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .records import Request
from .results import Status

__all__ = [
    "dtype_name", "cpu_matrix_decline", "conversion_note", "hermitian", "spd_ok",
    "itemsize", "index_size", "batch_size",
    "trivial_system", "maxiter_reason", "Run", "true_residual_solve", "to_real", "from_real", "realified_matvec",
]


# --- declines ------------------------------------------------------------------------------------
def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float64`` -> ``"float64"`` (how declines name dtypes)."""
    return str(dtype).replace("torch.", "")


def cpu_matrix_decline(request: Request, dtypes: Sequence[torch.dtype], library: str, batch_levels: str, *,
                       host_copies: bool | None = None, same_device: bool = False) -> str | None:
    """The reason a CPU backend built on ``library`` cannot take ``request``'s matrix, or None.

    In this order: A not on the CPU, operands on different devices (only with ``same_device``),
    a dtype outside ``dtypes``, A not one SparseTensor, a format with BATCH levels
    (``batch_levels`` completes the sentence: what cannot hold them and what to use instead), a
    tensor that is not a (value-batched) matrix. ``host_copies``: None when the backend cannot
    copy operands to the host; False when it can but the request did not allow it (the reason
    says how to); True when it is allowed (A on another device is then no reason)."""
    A = request.A
    if A.device.type != "cpu" and host_copies is not True:
        fix = (f"use a backend for {A.device.type}, or allow host copies (backend_options={{'allow_transfer': True}}; "
               f"costed)" if host_copies is False else f"or use a backend for {A.device.type}")
        return f"runs on the CPU only ({library}); A is on {A.device}: move A and b with .cpu(), {fix}"
    if same_device:
        other = next((o for o in request.operands[1:] if o.device != A.device), None)
        if other is not None:
            return f"needs every operand on one device; A is on {A.device}, an operand on {other.device}"
    if A.dtype not in dtypes:
        return (f"supports {', '.join(dtype_name(d) for d in dtypes)}; A is {dtype_name(A.dtype)} "
                f"(cast with .to(torch.float64) or .to(torch.float32))")
    if A.kind != "sparse":
        return f"needs one SparseTensor as A, got a {A.kind} operand"
    if A.format is not None and A.format.num_batch_levels:
        return f"format {A.format.name or A.format} has BATCH levels (a pattern per batch member), {batch_levels}"
    if len(A.shape) - len(A.batch_shape) != 2:
        return f"handles matrices only; A has format shape {tuple(A.shape[len(A.batch_shape):])}"
    return None


def conversion_note(request: Request, *, per_call: str = "", name_unnamed: bool = False,
                    unknown_converts: bool = False) -> str:
    """The note an offer ends with when A's format is not CSR or CSC: ``"; converts <format> to
    CSR once per pattern (costed)"`` and ``per_call`` after it; ``""`` for CSR and CSC (read in
    place). A format without a name is "the format" (``name_unnamed``: its spelled-out form); an
    unknown format (None) reads as native unless ``unknown_converts``."""
    from ..format import CSC, CSR  # noqa: PLC0415 - format -> dispatch is the layering's direction; kept lazy as before

    fmt = request.A.format
    if fmt is None:
        return f"; converts the format to CSR once per pattern (costed){per_call}" if unknown_converts else ""
    if fmt == CSR or fmt == CSC:
        return ""
    name = fmt.name or (str(fmt) if name_unnamed else "the format")
    return f"; converts {name} to CSR once per pattern (costed){per_call}"


def hermitian(request: Request) -> bool:
    """A is known or detected Hermitian (``A == A^H``): tagged or detected ``"hermitian"`` or
    ``"spd"``, or ``"symmetric"`` with a real dtype. For complex values ``"symmetric"`` alone says
    ``A == A^T`` (a complex symmetric matrix: Helmholtz, Maxwell with absorbing layers), which is
    not Hermitian: methods that assume ``A^H = A`` (Cholesky, LDL^H such as Eigen's SimplicialLDLT,
    CG, MINRES, Lanczos) give wrong answers on it without failing. (Detection tags a complex
    Hermitian matrix both ``"symmetric"`` and ``"hermitian"``.)"""
    props = request.properties
    return bool({"hermitian", "spd"} & props) or ("symmetric" in props and not request.dtype.is_complex)


def spd_ok(request: Request, method: str) -> bool:
    """The torch backend's rule for methods that need SPD (Hermitian positive definite for complex
    A): SPD detected or tagged, or ``method`` pinned on a Hermitian A (:func:`hermitian`: the user
    vouches for definiteness; the plan reports INDEFINITE)."""
    return "spd" in request.properties or (request.option("method") == method and hermitian(request))


# --- cost models ---------------------------------------------------------------------------------
def itemsize(dtype: torch.dtype) -> int:
    """Bytes per value of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


def index_size(request: Request) -> int:
    """Bytes per index of A's format: 4 for int32 indices, else 8."""
    fmt = request.A.format
    idx = getattr(fmt, "index_dtype", None) if fmt is not None else None
    return 4 if idx == torch.int32 else 8


def batch_size(request: Request) -> int:
    """Value-batch members of A (1 for a plain matrix)."""
    return max(1, math.prod(request.A.batch_shape))


# --- iterative plans -----------------------------------------------------------------------------
def trivial_system(b: Any, finite: bool, rtol: float, atol: float, *, xp: Any, dtype: Any = None
                   ) -> tuple[float, float, tuple[Any, Any] | None]:
    """The cases an iterative plan answers before iterating: NaN/Inf (in A's values, ``finite``
    False, or in ``b``) and ``b == 0``. Returns ``(||b||, threshold, None)`` to go on, or
    ``(||b||, threshold, (x, outcome))`` when the answer is already known; ``x`` has ``dtype``
    (default ``b``'s) and ``b``'s length, ``outcome`` is an :class:`~sparsetorch.dispatch.helpers.Outcome`."""
    from .helpers import Outcome  # noqa: PLC0415 - helpers imports this module's siblings only

    n = b.shape[0]
    dtype = b.dtype if dtype is None else dtype
    bnorm = float(xp.linalg.norm(b))
    thr = max(rtol * bnorm, atol)
    if not finite or not math.isfinite(bnorm):
        where = "A's values" if not finite else "the right-hand side"
        return bnorm, thr, (xp.full(n, math.nan, dtype=dtype), Outcome(0, math.nan, Status.NOT_FINITE, f"{where} hold NaN or Inf"))
    if bnorm == 0.0:
        return bnorm, thr, (xp.zeros(n, dtype=dtype), Outcome(0, 0.0, Status.CONVERGED))
    return bnorm, thr, None


def maxiter_reason(method: str, maxiter: Any, rel: float, rtol: float, atol: float, *, default: str, unit: str = "") -> str:
    """The MAX_ITERATIONS reason of a Krylov plan: ``maxiter`` (``default`` names the library's
    own limit when it is None) in ``unit`` (e.g. ``" restart cycles"``), the relative residual
    reached and the tolerance missed."""
    return (f"{method} reached maxiter ({maxiter if maxiter is not None else default}{unit}) with relative "
            f"residual {rel:.2e} above the tolerance (rtol={rtol:g}, atol={atol:g})")


@dataclass
class Run:
    """What one run of the inner solver did, as :func:`true_residual_solve`'s ``run`` returns it."""

    #: the iterate after the run: the whole solution (a plan that solves for a correction adds it)
    x: Any
    #: iterations the run made (what users are told)
    iterations: int
    #: what the run cost of the ``maxiter`` budget, in the budget's units (None: ``iterations``)
    used: int | None = None
    #: the inner solver's code: > 0 it hit its iteration limit, < 0 its recurrence broke down
    #: (a restart from ``x`` may help), 0 its own stopping test passed
    info: int = 0
    #: a status the run established itself (INDEFINITE, NOT_FINITE, BREAKDOWN), with the reason
    #: users see; ends the solve unless ``restartable``
    stop: Status | None = None
    reason: str = ""
    #: ``stop`` is a breakdown that restarting from ``x`` may get past (tried while the true
    #: residual at least halves from one restart to the next)
    restartable: bool = False
    #: the run failed for a setting it has since changed itself (a shorter restart, another
    #: start vector): run again from the same ``x``, counting an attempt; ``x`` is not read
    retry: bool = False


def true_residual_solve(run: Callable[..., Run], residual: Callable[[Any], float], *, method: str, x: Any, bnorm: float,
                        thr: float, budget: int | None, refreshes: int, maxiter_reason: Callable[[float], str],
                        tighten: Callable[[float, float], float], exhausted_hint: str,
                        breakdown_reason: Callable[[int, int, float], str] | None = None, res: float = math.inf,
                        stall_restarts: bool = False, no_progress: bool = False) -> tuple[Any, int, float, Status, str]:
    """Run an inner Krylov solver until the *true* residual meets the threshold.

    Inner solvers stop on what they can see cheaply (a recursive residual, MINRES's
    ``||r|| / (||A|| ||x||)``, a preconditioned residual), which rounding or a weaker test can
    make pass while ``||b - A x|| > thr``. This loop calls ``run(x, tol=, remaining=,
    iterations=, attempt=, residual=)`` (``tol``: the absolute threshold to hand the inner
    solver; ``remaining``: what is left of ``budget``, None for no limit; ``iterations``: the
    count so far; ``residual``: the last true residual, ``res`` before the first run), measures
    ``residual(x)`` (the absolute ``||b - A x||``) after each run and decides, in this order:

    1. ``budget`` spent: MAX_ITERATIONS with ``maxiter_reason(res / bnorm)``;
    2. the run asked to be ``retry``-ed: again, from the same ``x``;
    3. the run stopped with a status: restart from ``x`` if ``restartable`` and the true
       residual halved since the last such restart, else that status and reason;
    4. a NaN/Inf residual: NOT_FINITE;
    5. ``residual <= thr``: CONVERGED;
    6. (``stall_restarts``, no budget) the run hit its own limit but the residual improved on the
       last stall: restart from ``x`` at ``tol = thr``;
    7. the run hit its own limit (``info > 0``): MAX_ITERATIONS;
    8. the run broke down (``info < 0``): restart while the residual halves, else BREAKDOWN with
       ``breakdown_reason(info, iterations, relative residual)``;
    9. (``no_progress``) a restart that made no iteration: BREAKDOWN;
    10. otherwise the inner test passed and the true residual missed: run again with
        ``tol = tighten(tol, residual)``.

    After ``refreshes`` restarts it gives up with MAX_ITERATIONS and ``exhausted_hint`` as the
    advice. Returns ``(x, iterations, residual, status, reason)``; ``x`` is the initial one when
    nothing ran."""
    total = used = 0
    tol = thr
    last_breakdown = math.inf
    last_stall = math.inf
    status, reason = Status.MAX_ITERATIONS, ""
    for attempt in range(refreshes + 1):
        remaining = None if budget is None else budget - used
        if remaining is not None and remaining <= 0:
            status, reason = Status.MAX_ITERATIONS, maxiter_reason(res / bnorm)
            break
        step = run(x, tol=tol, remaining=remaining, iterations=total, attempt=attempt, residual=res)
        total += step.iterations
        used += step.iterations if step.used is None else step.used
        if step.retry:
            continue
        x = step.x
        res = residual(x)
        if step.stop is not None:
            if step.restartable and attempt < refreshes and math.isfinite(res) and res < 0.5 * last_breakdown:
                last_breakdown = res
                continue
            status, reason = step.stop, step.reason
            break
        if not math.isfinite(res):
            status, reason = Status.NOT_FINITE, f"{method}: the residual became NaN or Inf after {total} iterations"
            break
        if res <= thr:
            status, reason = Status.CONVERGED, ""
            break
        if step.info > 0 and stall_restarts and budget is None and res < last_stall:
            last_stall = res
            tol = thr
            continue
        if step.info > 0:
            status, reason = Status.MAX_ITERATIONS, maxiter_reason(res / bnorm)
            break
        if step.info < 0:
            if attempt < refreshes and res < 0.5 * last_breakdown:
                last_breakdown = res
                continue
            status = Status.BREAKDOWN
            reason = (breakdown_reason(step.info, total, res / bnorm) if breakdown_reason is not None
                      else f"{method} broke down (info={step.info}) after {total} iterations")
            break
        if no_progress and step.iterations == 0 and attempt:
            status = Status.BREAKDOWN
            reason = f"{method} made no progress from relative residual {res / bnorm:.2e}; try gmres or a preconditioner"
            break
        tol = tighten(tol, res)
    else:
        status = Status.MAX_ITERATIONS
        reason = (f"{method}'s recurrence met the tolerance but the true relative residual {res / bnorm:.2e} did not "
                  f"({refreshes} restarts from the true residual): {exhausted_hint}")
    return x, total, res, status, reason


def to_real(v: Any, xp: Any) -> Any:
    """``[Re v; Im v]``: a complex vector of length n as a real one of length 2n."""
    return xp.concatenate([v.real, v.imag])


def from_real(v: Any) -> Any:
    """The inverse of :func:`to_real`."""
    n = v.shape[0] // 2
    return v[:n] + 1j * v[n:]


def realified_matvec(matvec: Callable[[Any], Any], n: int, xp: Any, *, real: Any = None) -> Callable[[Any], Any]:
    """The product of the real 2n x 2n operator ``[Re A, -Im A; Im A, Re A]`` from the complex
    ``matvec`` of an n x n ``A`` (a Hermitian A gives a symmetric one, so a real-only MINRES can
    solve the complex system). ``real``: cast the result to this dtype (no copy when it has it)."""

    def mv(v: Any) -> Any:
        v = v.reshape(-1)
        y = matvec(v[:n] + 1j * v[n:])
        out = xp.concatenate([y.real, y.imag])
        return out if real is None else out.astype(real, copy=False)

    return mv
