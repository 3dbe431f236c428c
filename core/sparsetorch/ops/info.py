"""What an op returns beside its result (``SolveInfo``), with the contract's result records
(``Status``, ``IterationResult``, ``Attempt``: ``dispatch/results.py``) re-exported."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dispatch.results import Attempt, IterationResult, Status

__all__ = ["Status", "IterationResult", "SolveInfo", "Attempt"]


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
