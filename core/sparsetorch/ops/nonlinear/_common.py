"""What the iterations of ``nonlinear_solve`` share: their constants, scaled norms, the record of
the attempt in progress and how an attempt that ran to ``maxiter`` ends."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..info import Status
from ._methods import Anderson, Newton, Picard
from ._records import NonlinearAttempt

__all__ = ["MAXITER", "vector_norm"]

#: each method's default iteration limit (its record's ``maxiter=None``)
MAXITER = {spec.name: spec.default_maxiter for spec in (Newton, Anderson, Picard)}
_ARMIJO = 1e-4
#: an attempt stalls when ``_STALL`` iterations in a row bring ||F|| no lower than ``_PROGRESS``
#: times the smallest ||F|| before them (a cycle, or a crawl that would need ~1e4 iterations a digit)
_STALL = 20
_PROGRESS = 1 - 1e-3
#: Newton's window: in its region of convergence it gains digits every step, so 10 steps without
#: 0.1 % progress (backtracking crawling towards a local minimum of ||F||, or full steps cycling)
#: say it will not get there
_STALL_NEWTON = 10
#: ||F|| above this many times the attempt's starting ||F||: the iteration diverges
_DIVERGED = 1e6
#: trust-region radius reductions tried per Newton iteration before giving up
_TR_TRIES = 30
#: a trust-region step is accepted when (actual decrease) >= _TR_ETA (decrease the model predicts)
_TR_ETA = 1e-4
#: ||F|| <= _NOISE * eps * || |J| |u| || is the rounding level of F (see Iterations._at_noise)
_NOISE = 64.0
#: a step of at most this many units of roundoff of u (infinity norms) leaves u unchanged
_PRECISION_ULPS = 4.0


def vector_norm(v: torch.Tensor) -> float:
    """``||v||_2`` without underflow or overflow of the squares; ``inf`` for NaN or Inf entries."""
    if v.numel() == 0:
        return 0.0
    m = float(v.detach().abs().max())
    if not math.isfinite(m):
        return math.inf
    if m == 0.0:
        return 0.0
    return m * float(torch.linalg.vector_norm(v.detach() / m))


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _at_precision(step: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``x + step`` is ``x`` to the dtype's precision (a few units of roundoff of ``x``)."""
    eps = float(torch.finfo(x.dtype).eps)
    return float(step.abs().max()) <= _PRECISION_ULPS * eps * float(x.abs().max())


@dataclass
class _Attempt:
    """The mutable record of the attempt in progress (frozen into a NonlinearAttempt at its end)."""

    method: str
    chosen_by: str
    start_iteration: int
    start_fevals: int
    start_residual: float
    status: Status = Status.MAX_ITERATIONS
    reason: str = ""
    trust_region_steps: int = 0
    linear_failures: int = 0

    def freeze(self, iterations: int, fevals: int, residual: float) -> NonlinearAttempt:
        ok = self.status is Status.CONVERGED
        return NonlinearAttempt(
            method=self.method, chosen_by=self.chosen_by, iterations=iterations - self.start_iteration,
            status=self.status, reason="" if ok else self.reason, start_residual=self.start_residual,
            residual=residual, function_evaluations=fevals - self.start_fevals, succeeded=ok,
            trust_region_steps=self.trust_region_steps, linear_failures=self.linear_failures,
        )


def _finish(att, x: torch.Tensor, norm: float, target: float, maxiter: int, hint: str = "") -> None:
    """The status of an attempt that ran to ``maxiter``: converged if the last iterate meets the
    target (and is finite), else MAX_ITERATIONS with the reason (and ``hint``)."""
    if norm <= target and _finite(x):
        att.status = Status.CONVERGED
    else:
        att.status = Status.MAX_ITERATIONS
        att.reason = f"maxiter ({maxiter}) reached with ||F|| = {norm:.3e} above the target {target:.3e}{hint}"
