"""The records ``nonlinear_solve`` returns: one per attempted method, and the call's info."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..info import Status

__all__ = ["NonlinearAttempt", "NonlinearSolveInfo"]


@dataclass(frozen=True)
class NonlinearAttempt:
    """One method tried by a ``nonlinear_solve`` call, in order.

    ``chosen_by`` is "user" (``method=`` pinned it) or "library" (``method=None``: Newton, then
    Anderson, then Picard, each starting from the best iterate found so far). ``iterations`` and
    ``function_evaluations`` count this attempt only; ``start_residual`` and ``residual`` are
    ``||F||`` (absolute) where it started and at the iterate it ended with; ``status`` and
    ``reason`` say why it stopped ("" when it converged). ``trust_region_steps`` counts the
    Newton iterations whose line search failed and a dogleg trust-region step took over
    (``linear_failures`` those whose linear solve failed: singular or not converged).
    """

    method: str
    chosen_by: str
    iterations: int
    status: Status
    reason: str
    start_residual: float
    residual: float
    function_evaluations: int
    succeeded: bool = False
    trust_region_steps: int = 0
    linear_failures: int = 0

    def __str__(self) -> str:
        extra = f", {self.trust_region_steps} trust-region steps" if self.trust_region_steps else ""
        return (
            f"{self.method} ({self.chosen_by}): {'converged' if self.succeeded else 'failed'} after {self.iterations} "
            f"iterations{extra}, ||F|| {self.start_residual:.3e} -> {self.residual:.3e} ({self.status.value}"
            + (f": {self.reason}" if self.reason else "") + ")"
        )


@dataclass(frozen=True)
class NonlinearSolveInfo:
    """What ``nonlinear_solve(..., return_info=True)`` returns beside ``u``.

    ``method`` is the method that produced ``u`` (the last one tried); ``attempts`` lists every
    method tried, in order (:class:`NonlinearAttempt`: one entry when the first succeeded or was
    pinned), and ``method_pinned`` whether the caller named the method. ``iterations``,
    ``residual_history`` and ``function_evaluations`` cover all attempts together.

    ``residual`` is ``||F(u)||_2`` at the returned ``u`` (absolute), ``residual_history`` the
    norms after each iteration, starting with ``||F(u0)||``. ``jacobian`` says where ``J`` came
    from ("returned", "user", "coloring", "dense", "matrix-free", or None when no Jacobian was
    needed); ``linear_backend``/``linear_method`` the linear solver used (Newton's plan, or the
    fixed-point preconditioner's when Newton did not run), ``linear_iterations`` its iteration
    count per linear solve, ``plans_built`` how many linear plans were chosen (1 when the pattern
    stayed the same), ``plan_reused`` whether the first one came from the plan cache (an earlier
    call on the same pattern). ``extra["adjoint"]`` collects the adjoint solves'
    :class:`IterationResult` once the backward pass has run; ``extra["at_precision"]`` is True
    when the default tolerance was met at the dtype's precision (see docs/nonlinear.md).
    """

    method: str
    iterations: int
    converged: bool
    status: Status
    reason: str
    residual: float
    initial_residual: float
    residual_history: tuple[float, ...]
    function_evaluations: int
    jacobian: str | None
    jacobian_evaluations: int
    colors: int | None
    linear_backend: str | None
    linear_method: str | None
    linear_iterations: tuple[int, ...]
    plans_built: int
    plan_reused: bool = False
    attempts: tuple[NonlinearAttempt, ...] = ()
    method_pinned: bool = False
    extra: dict = field(default_factory=dict, compare=False)
