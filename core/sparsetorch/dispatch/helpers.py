"""Helpers shared by backend plugins: cost-model pieces and iterative-solve bookkeeping.

- :func:`sparsity_dimension`: the effective grid dimension (1..3) of A's sparsity, from nonzeros per
  row (``(nse / n - 1) / 2``: a 5-point stencil gives 2, a 7-point one 2.9) or from
  ``backend_options["dimension"]``; fill-in models of direct solvers interpolate between the
  2-D and 3-D fits with it.
- :func:`loglog_interp`: ``c n^a`` fits per dimension, interpolated in log space.
- :class:`Outcome` / :func:`combine`: per-system results of solvers that take one right-hand side
  at a time, reported as one :class:`IterationResult` (the worst case).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..ops.info import IterationResult, Status
from .records import Request

__all__ = ["sparsity_dimension", "loglog_interp", "Outcome", "combine"]


def sparsity_dimension(request: Request) -> float:
    """Effective grid dimension of A's sparsity (1..3): ``backend_options["dimension"]`` or
    ``(nse / n - 1) / 2`` clamped."""
    bo = request.option("backend_options") or {}
    if bo.get("dimension") is not None:
        return min(3.0, max(1.0, float(bo["dimension"])))
    n = max(1, request.A.shape[-1])
    per_row = (request.A.nse or n) / n
    return min(3.0, max(1.0, (per_row - 1.0) / 2.0))


def loglog_interp(table: Mapping[int, tuple[float, float]], d: float, n: int) -> float:
    """``c n^a`` with ``(c, a) = table[dimension]``, interpolated in log space between the
    integer dimensions around ``d``."""
    lo, hi = int(math.floor(d)), int(math.ceil(d))
    n = max(n, 2)

    def at(k: int) -> float:
        c, a = table[k]
        return math.log(c) + a * math.log(n)

    w = d - lo
    return math.exp((1 - w) * at(lo) + w * at(hi))


_PRIORITY = (Status.NOT_FINITE, Status.INDEFINITE, Status.BREAKDOWN, Status.MAX_ITERATIONS)


@dataclass
class Outcome:
    """How one system ended. ``residual`` is the true relative residual ``||b - A x|| / ||b||``."""

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
    """One IterationResult for all systems: the largest iteration count and residual,
    ``converged`` only if all converged, the first failure by priority (non-finite, indefinite,
    breakdown, maxiter); ``label`` names the solver."""
    worst_it = max((o.iterations for o in outcomes), default=0)
    worst_res = max((o.residual for o in outcomes), default=0.0)
    failed = [o for o in outcomes if not o.converged]
    status, reason = Status.CONVERGED, ""
    for s in _PRIORITY:
        hit = next((o for o in failed if o.status is s), None)
        if hit is not None:
            status, reason = s, hit.reason
            break
    products = sum(o.products for o in outcomes)
    systems = len(outcomes)
    if not failed:
        reason = f"{label}: converged in {worst_it} iterations" + (f" (max over {systems} systems)" if systems > 1 else "")
        reason += f", {products} products with A" if products else ""
    elif systems > 1:
        reason += f" ({len(failed)} of {systems} systems did not converge)"
    lead = max(outcomes, key=lambda o: o.iterations) if outcomes else None
    history = tuple(lead.history) if lead is not None else ()
    return IterationResult(worst_it, float(worst_res), not failed, status, reason, history)
