"""Per-system outcomes of iterative solves, combined into one IterationResult (the worst case)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from sparsetorch import IterationResult, Status

__all__ = ["Outcome", "combine"]

_PRIORITY = (Status.NOT_FINITE, Status.INDEFINITE, Status.BREAKDOWN, Status.MAX_ITERATIONS)


@dataclass
class Outcome:
    """How one system ended; ``residual`` is the true relative residual ``||b - A x|| / ||b||``."""

    iterations: int
    residual: float
    status: Status
    reason: str = ""
    history: list[float] = field(default_factory=list)
    products: int = 0

    @property
    def converged(self) -> bool:
        return self.status is Status.CONVERGED


def combine(outcomes: Sequence[Outcome], label: str) -> IterationResult:
    worst_it = max((o.iterations for o in outcomes), default=0)
    worst_res = max((o.residual for o in outcomes), default=0.0)
    failed = [o for o in outcomes if not o.converged]
    status, reason = Status.CONVERGED, ""
    for s in _PRIORITY:
        hit = next((o for o in failed if o.status is s), None)
        if hit is not None:
            status, reason = s, hit.reason
            break
    systems = len(outcomes)
    products = sum(o.products for o in outcomes)
    if not failed:
        reason = f"{label}: converged in {worst_it} iterations" + (f" (max over {systems} systems)" if systems > 1 else "")
        reason += f", {products} products with A" if products else ""
    elif systems > 1:
        reason += f" ({len(failed)} of {systems} systems did not converge)"
    lead = max(outcomes, key=lambda o: o.iterations) if outcomes else None
    history = tuple(lead.history) if lead is not None else ()
    return IterationResult(worst_it, float(worst_res), not failed, status, reason, history)
