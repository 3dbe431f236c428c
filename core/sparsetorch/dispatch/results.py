"""What plans report and what a call tried: the contract's result records (``Status``,
``IterationResult``) and one fallback attempt (``Attempt``). Plugins use these through
``sparsetorch.backend``; ``SolveInfo`` (what an op returns) builds on them in ``ops/info.py``."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Status", "IterationResult", "Attempt"]


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
