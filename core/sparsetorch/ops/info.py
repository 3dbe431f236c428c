"""Result records of solvers: a status enum and the info a solve returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Status", "IterationResult", "SolveInfo", "Attempt"]


class Status(enum.Enum):
    """Why a solver stopped."""

    CONVERGED = "converged"            #: residual below max(rtol * ||b||, atol)
    MAX_ITERATIONS = "max_iterations"  #: maxiter reached first
    BREAKDOWN = "breakdown"            #: a Krylov recurrence divided by (near) zero
    INDEFINITE = "indefinite"          #: CG met a direction with p^T A p <= 0 (A not SPD)
    NOT_FINITE = "not_finite"          #: NaN or Inf appeared in the iteration
    DIRECT = "direct"                  #: a direct method (no iteration)
    INACCURATE = "inaccurate"          #: the answer's true residual misses the tolerance

    @property
    def ok(self) -> bool:
        return self in (Status.CONVERGED, Status.DIRECT)


@dataclass(frozen=True)
class IterationResult:
    """What an iterative kernel reports (per right-hand side when there are several).

    ``residual`` is the final relative residual ``||b - A x|| / ||b||`` (the worst over the
    right-hand sides), ``history`` the relative residuals seen at each convergence check.
    """

    iterations: int
    residual: float
    converged: bool
    status: Status
    reason: str = ""
    history: tuple[float, ...] = ()


@dataclass(frozen=True)
class Attempt:
    """One method dispatch tried for a call: what it did and why it stopped. A solve lists
    every attempt in order; the last one that succeeded produced the answer."""

    backend: str
    method: str
    preconditioner: str | None
    iterations: int
    status: Status
    residual: float
    reason: str = ""
    succeeded: bool = False
    seconds: float = 0.0

    def __str__(self) -> str:
        pre = f"+{self.preconditioner}" if self.preconditioner else ""
        return (f"{self.backend}/{self.method}{pre}: {'ok' if self.succeeded else 'failed'} after {self.iterations} "
                f"iterations, relative residual {self.residual:.3g} ({self.status.value}"
                + (f": {self.reason}" if self.reason else "") + ")")


@dataclass(frozen=True)
class SolveInfo:
    """What ``solve(..., return_info=True)`` returns beside ``x``."""

    backend: str
    method: str
    iterations: int
    residual: float
    converged: bool
    status: Status
    reason: str = ""
    residual_history: tuple[float, ...] = ()
    preconditioner: str | None = None
    plan_reused: bool = False
    extra: dict = field(default_factory=dict, compare=False)
    #: every method tried, in order (one entry when the first choice succeeded)
    attempts: tuple[Attempt, ...] = ()
