"""What the Krylov solvers share: reductions, input checks, per-column bookkeeping, the loop.

Shapes. Every solver works on tensors of shape ``(*batch, n, k)``; each ``(batch, column)`` pair
is an independent system. Reductions (inner products, norms) run over ``dim=-2`` only, so the
per-system scalars have shape ``(*batch, k)``.

Synchronisation. Inside the iteration nothing leaves the device: columns that converge or fail
are frozen with ``torch.where`` on per-column masks, and failures are recorded in per-column
code tensors. The host looks at the device once every ``check_every`` iterations (one small
``tolist()``), once before the loop, and a bounded number of times when the loop stops (the
true-residual verification and the final report).

Gradients. The iteration runs under ``torch.no_grad()``: solvers are differentiated by the
adjoint rule (one more solve), never through their iterations.

Convergence. A column has converged when ``||b - A x|| <= max(rtol * ||b||, atol)`` (SciPy's
rule). The loop watches each solver's cheap residual estimate; when every column has stopped,
the true residual is computed once; a column whose estimate passed but whose true residual does
not is restarted from the true residual (at most ``MAX_REFRESH`` times). The reported residual
and ``converged`` always come from the true residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from ....errors import InputError
from ....dispatch.results import Status

__all__ = [
    "Operator", "Callback", "Event", "Book", "Problem", "Iteration", "Start",
    "RUNNING", "CONVERGED", "NOT_FINITE", "MAX_ITER", "STAGNATED", "FIRST_SOLVER_CODE",
    "SUPPORTED_DTYPES", "MAX_REFRESH", "SINGULAR_FACTOR",
    "dot", "norm", "col", "safe", "finite", "real_dtype", "prepare",
]

#: ``A @ X`` (or ``M^{-1} @ X``) on a ``(*batch, n, k)`` tensor.
Operator = Callable[[Tensor], Tensor]
#: ``callback(iteration, worst_relative_residual)``, called at each convergence check.
Callback = Callable[[int, float], None]

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)

# Per-column codes, an int8 tensor on the device. Solvers number their own from FIRST_SOLVER_CODE.
RUNNING = 0      #: still iterating
CONVERGED = 1    #: the residual estimate met the tolerance
NOT_FINITE = 2   #: a NaN or Inf appeared
MAX_ITER = 3     #: (set at the end) still running when maxiter was reached
STAGNATED = 4    #: (set at the end) the estimate met the tolerance, the true residual never did
FIRST_SOLVER_CODE = 8

#: How many times columns whose estimate passed but whose true residual failed are restarted.
MAX_REFRESH = 3

#: A pivot of the projected (Hessenberg / tridiagonal) problem at most ``SINGULAR_FACTOR * eps``
#: times the running estimate of ``||A||`` is zero to working precision (rounding leaves some
#: ten eps there when the true pivot is 0). Pivots are bounded below by ``sigma_min(A)``, so only
#: matrices with ``cond(A) >~ 1 / (SINGULAR_FACTOR * eps)`` can trip it.
SINGULAR_FACTOR = 100.0

# Which failure wins the overall status when columns fail differently (first listed wins).
_PRIORITY = (Status.NOT_FINITE, Status.INDEFINITE, Status.BREAKDOWN, Status.MAX_ITERATIONS)


def dot(x: Tensor, y: Tensor) -> Tensor:
    """Per-column inner products ``x^H y`` over dim -2: ``(*batch, n, k) -> (*batch, k)``."""
    if x.shape[-1] == 1:  # one column: a BLAS dot through matmul is about twice as fast on CPU
        return (x.mH @ y)[..., 0, :]
    return torch.linalg.vecdot(x, y, dim=-2)


def norm(x: Tensor) -> Tensor:
    """Per-column 2-norms over dim -2 (real dtype): ``(*batch, n, k) -> (*batch, k)``."""
    if x.is_complex():  # as (re, im) pairs: many times faster than the complex kernel on CPU
        return torch.linalg.vector_norm(torch.view_as_real(x), dim=(-3, -1))
    return torch.linalg.vector_norm(x, dim=-2)


def col(s: Tensor) -> Tensor:
    """Per-column scalars ``(*batch, k)`` shaped to scale vectors: ``(*batch, 1, k)``."""
    return s.unsqueeze(-2)


def safe(d: Tensor, ok: Tensor) -> Tensor:
    """``d`` where ``ok``, else 1: a denominator that cannot be zero on masked-out columns."""
    return torch.where(ok, d, torch.ones_like(d))


def finite(v: Tensor) -> Tensor:
    """``torch.isfinite`` for real tensors in two kernels instead of four (inf - inf is NaN)."""
    return (v - v) == 0


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of the same precision (float32 for complex64, float64 for complex128)."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


@dataclass(frozen=True)
class Event:
    """A solver-specific way for a column to stop: its status and the reason template.

    The template is formatted with ``name`` (the solver), ``it`` (the iteration), ``value`` (the
    offending scalar, a float) and ``where`` (which column, empty for a single system).
    """

    status: Status
    template: str


_COMMON_EVENTS: dict[int, Event] = {
    NOT_FINITE: Event(
        Status.NOT_FINITE,
        "{name} met a NaN or Inf at iteration {it}{where}: check b, x0, the operator and the "
        "preconditioner for NaN/Inf values or overflow",
    ),
    MAX_ITER: Event(
        Status.MAX_ITERATIONS,
        "{name} reached maxiter ({maxiter}) with relative residual {rel:.2e}{where} above the "
        "tolerance (rtol={rtol:g}, atol={atol:g}): raise maxiter, pass "
        "a preconditioner M, or loosen rtol/atol",
    ),
    STAGNATED: Event(
        Status.MAX_ITERATIONS,
        "{name}'s recurrence met the tolerance but the true relative residual ||b - A x||/||b|| = "
        "{rel:.2e}{where} did not ({refreshes} restart(s) from the true residual): the tolerance "
        "(rtol={rtol:g}, atol={atol:g}) is below what this dtype and conditioning allow; loosen "
        "rtol/atol or solve in float64",
    ),
}


class Book:
    """Per-column bookkeeping on the device: status codes, residual estimates, stop events.

    ``code`` holds one of the codes above per column and ``act`` whether it is still running;
    ``est`` the latest residual-norm estimate (frozen once the column stops); ``event_it`` /
    ``event_val`` the iteration and value (offending scalar, or the estimate on convergence) at
    which a column stopped.
    """

    def __init__(self, bnorm: Tensor, target: Tensor) -> None:
        self.bnorm = bnorm
        self.scale = torch.where(bnorm > 0, bnorm, torch.ones_like(bnorm))
        self.target = target
        self.code = torch.zeros(bnorm.shape, dtype=torch.int8, device=bnorm.device)
        self.act = torch.ones(bnorm.shape, dtype=torch.bool, device=bnorm.device)
        self.est = torch.zeros_like(bnorm)
        self.event_it = torch.zeros(bnorm.shape, dtype=torch.int64, device=bnorm.device)
        self.event_val = torch.zeros_like(bnorm)

    def active(self) -> Tensor:
        """Columns still iterating (bool, ``(*batch, k)``)."""
        return self.act

    # Updates are in place: a CUDA graph of iterations (cg.py) reads ``act`` at a fixed address.
    def _stop(self, mask: Tensor, code: Tensor | int, it: int, value: Tensor) -> None:
        if isinstance(code, Tensor):
            torch.where(mask, code, self.code, out=self.code)
        else:
            self.code.masked_fill_(mask, code)
        self.act &= ~mask
        self.event_it.masked_fill_(mask, it)
        torch.where(mask, value, self.event_val, out=self.event_val)

    def fail(self, it: int, value: Tensor, *conditions: tuple[Tensor, int]) -> None:
        """Stop running columns whose ``value`` is NaN/Inf (NOT_FINITE), else where a condition holds.

        ``conditions`` are ``(mask, code)`` pairs; the first that holds wins. ``value`` (the
        per-column scalar the conditions test; its modulus if complex) is kept for the message.
        """
        if value.is_complex():
            value = value.abs()
        code = torch.zeros_like(self.code)
        for mask, c in reversed(conditions):
            code = torch.where(mask, c, code)
        code = torch.where(finite(value), code, NOT_FINITE)
        self._stop(self.act & (code != RUNNING), code, it, value.to(self.event_val.dtype))

    def record(self, it: int, est: Tensor) -> None:
        """Take a new residual-norm estimate for the running columns; converge or fail them."""
        ok = finite(est)
        torch.where(self.act & ok, est, self.est, out=self.est)
        code = torch.where(ok, torch.where(est <= self.target, CONVERGED, self.code), NOT_FINITE)
        self._stop(self.act & (code != RUNNING), code, it, est)

    def restart(self, mask: Tensor, est: Tensor) -> None:
        """Set the columns in ``mask`` running again, from the residual norm ``est``."""
        self.code.masked_fill_(mask, RUNNING)
        self.act |= mask
        torch.where(mask, est, self.est, out=self.est)

    def snapshot(self) -> tuple[float, int]:
        """(worst finite relative estimate, number of running columns): the one host sync."""
        return self.snapshot_async()()

    def snapshot_async(self) -> Callable[[], tuple[float, int]]:
        """Start :meth:`snapshot`'s copy to the host; the returned function waits for it. On a
        GPU the copy goes to a pinned buffer behind an event, so work queued in between (the
        next block of iterations) runs while the host waits."""
        rel = self.est / self.scale
        worst = torch.where(torch.isfinite(rel), rel, torch.zeros_like(rel)).amax()
        running = self.act.sum().to(worst.dtype)
        both = torch.stack([worst, running])
        if not both.is_cuda:
            w, r = both.tolist()
            return lambda: (w, int(r))
        if getattr(self, "_pinned", None) is None or self._pinned.dtype != both.dtype:
            self._pinned = torch.empty(2, dtype=both.dtype, pin_memory=True)
        host = self._pinned
        host.copy_(both, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def wait() -> tuple[float, int]:
            done.synchronize()
            w, r = host.tolist()
            return w, int(r)

        return wait


@dataclass
class Problem:
    """A validated solve: operators, right-hand side, tolerances, and the bookkeeping."""

    name: str
    matvec: Operator
    M: Operator | None
    b: Tensor
    x: Tensor          #: initial guess (zero on b == 0 columns)
    r: Tensor          #: its residual b - A x
    rtol: float
    atol: float
    maxiter: int       #: iteration (inner step) limit
    maxiter_text: str  #: maxiter as the user gave it, for messages
    check_every: int
    callback: Callback | None
    book: Book
    restart: int = 0   #: GMRES cycle length (0 for the other methods)
    #: the operators may be captured in a CUDA graph (see _graph.py); solvers that support it
    #: replay blocks of check_every iterations
    cuda_graph: bool = False

    def precond(self, v: Tensor) -> Tensor:
        """``M^{-1} v`` (``v`` itself without a preconditioner)."""
        return v if self.M is None else self.M(v)


class Iteration(Protocol):
    """One solver's state between iterations."""

    x: Tensor

    def step(self, it: int) -> None:
        """Do iteration ``it`` (1-based): update x and the book, on the device only."""

    def flush(self) -> None:
        """Bring ``x`` up to date (GMRES applies its pending least-squares update)."""


#: Builds a solver state from ``(problem, x, r = b - A x, iteration)``.
Start = Callable[[Problem, Tensor, Tensor, int], Iteration]


def _checked(op: Operator, what: str, shape: torch.Size, dtype: torch.dtype) -> Operator:
    """Wrap ``op`` so a wrong output shape or dtype raises at once (Python-side check, no sync)."""

    def apply(v: Tensor) -> Tensor:
        out = op(v)
        if not isinstance(out, Tensor) or out.shape != shape or out.dtype != dtype:
            got = (f"{type(out).__name__}" if not isinstance(out, Tensor)
                   else f"shape {tuple(out.shape)}, dtype {out.dtype}")
            raise InputError(
                f"{what} returned {got} for an input of shape {tuple(shape)}, dtype {dtype}: it must "
                f"return a tensor of the input's shape and dtype (every (batch, column) pair is an "
                f"independent vector)"
            )
        return out

    return apply


def _check_tol(name: str, label: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {label} must be a real number, got {value!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise InputError(f"{name}: {label} must be finite and >= 0, got {value!r}")
    return v


@torch.no_grad()
def prepare(
    name: str,
    matvec: Operator,
    b: Tensor,
    *,
    x0: Tensor | None,
    rtol: float,
    atol: float,
    maxiter: int | None,
    M: Operator | None,
    check_every: int,
    callback: Callback | None,
    restart: int | None = None,
    cuda_graph: bool = False,
) -> Problem:
    """Check the arguments of a solver call and set up the problem and its bookkeeping.

    ``maxiter`` counts iterations, except with ``restart`` (GMRES) where it counts restart cycles
    of ``min(restart, n)`` inner iterations. Default: 10 * n iterations in all.
    """
    if not callable(matvec):
        raise InputError(f"{name}: matvec must be a callable X -> A @ X, got {type(matvec).__name__}")
    if not isinstance(b, Tensor):
        raise InputError(f"{name}: b must be a torch.Tensor of shape (*batch, n, k), got {type(b).__name__}")
    if b.dtype not in SUPPORTED_DTYPES:
        raise InputError(
            f"{name}: b has dtype {b.dtype}; supported are float32, float64, complex64, complex128: "
            f"convert it, e.g. b.to(torch.float64)"
        )
    if b.ndim < 2:
        raise InputError(
            f"{name}: b has shape {tuple(b.shape)}; it must be (*batch, n, k) with one system per "
            f"column: use b.unsqueeze(-1) for a single vector"
        )
    if x0 is not None:
        if not isinstance(x0, Tensor):
            raise InputError(f"{name}: x0 must be None or a torch.Tensor, got {type(x0).__name__}")
        if x0.shape != b.shape or x0.dtype != b.dtype or x0.device != b.device:
            raise InputError(
                f"{name}: x0 (shape {tuple(x0.shape)}, {x0.dtype}, {x0.device}) must match b (shape "
                f"{tuple(b.shape)}, {b.dtype}, {b.device}): pass x0 of b's shape, dtype and device"
            )
    if M is not None and not callable(M):
        raise InputError(f"{name}: M must be None or a callable X -> M^-1 X, got {type(M).__name__}")
    if callback is not None and not callable(callback):
        raise InputError(f"{name}: callback must be None or callable(iteration, residual)")
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
        raise InputError(f"{name}: check_every must be an integer >= 1, got {check_every!r}")
    if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 0):
        raise InputError(f"{name}: maxiter must be None or an integer >= 0, got {maxiter!r}")
    rtol = _check_tol(name, "rtol", rtol)
    atol = _check_tol(name, "atol", atol)

    n = b.shape[-2]
    if restart is not None:
        if isinstance(restart, bool) or not isinstance(restart, int) or restart < 1:
            raise InputError(f"{name}: restart must be an integer >= 1, got {restart!r}")
        m = max(1, min(restart, n))
        cycles = max(1, (10 * n) // m) if maxiter is None else maxiter
        steps, text = cycles * m, f"{cycles} restart cycles of {m}"
    else:
        m = 0
        steps = 10 * n if maxiter is None else maxiter
        text = f"{steps} iterations"

    shape, dtype = b.shape, b.dtype
    A = _checked(matvec, f"{name}: matvec", shape, dtype)
    P = None if M is None else _checked(M, f"{name}: the preconditioner M", shape, dtype)

    bnorm = norm(b)
    target = torch.clamp(rtol * bnorm, min=atol)
    book = Book(bnorm, target)
    zero_b = col(bnorm == 0)
    if x0 is None:
        x = torch.zeros_like(b)
        r = b
    else:
        x = torch.where(zero_b, torch.zeros_like(x0), x0)
        r = b - A(x)
    book.fail(0, bnorm)
    book.record(0, norm(r))
    return Problem(
        name=name, matvec=A, M=P, b=b, x=x, r=r, rtol=rtol, atol=atol, maxiter=steps,
        maxiter_text=text, check_every=check_every, callback=callback, book=book, restart=m,
        cuda_graph=bool(cuda_graph),
    )
