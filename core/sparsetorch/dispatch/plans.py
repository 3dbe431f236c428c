"""What a plan is: the typed protocols of the plan objects backends build, one per op.

An offer's ``build(A, request)`` returns a plan for A's *pattern* (A arrives with zero values);
the core then loads values with ``set_values`` and calls the op's method, holding the plan's
lock from the load to the end of the call (``dispatch/plan.py``), so a plan need not be thread
safe itself. Per-call options (tolerances, iteration limits, callbacks) are arguments of the call,
never attributes written onto the plan: plans are shared by every caller on a pattern.

Required methods are the protocol's; *optional capabilities* are protocols of their own that a
plan may also satisfy, and the core asks with ``isinstance`` (the protocols are
``runtime_checkable``; the core itself asks :func:`supports`, which reads the plan as it is now:
``isinstance`` against a protocol caches its answer per class): a plan that has ``inverse_entries`` answers logdet gradients without
``n`` solves, one with ``sddmm`` computes matmul's values-gradient with its own kernel, one with
``reload_cheap = True`` is reloaded without the core's snapshot comparison.

Plugins import these from :mod:`sparsetorch.backend`. Only method names and signatures are
checked at run time; the types are documentation and for static checkers.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch

from .results import IterationResult

__all__ = [
    "Plan", "SolvePlan", "MatmulPlan", "LstsqPlan", "EigshPlan", "EigsPlan", "LogdetPlan", "SolveListPlan",
    "InverseEntries", "SampledProduct", "CheapReload", "Bindable", "supports",
]


@runtime_checkable
class Plan(Protocol):
    """Every plan: built for a pattern, given values by the core."""

    def set_values(self, values: torch.Tensor) -> None:
        """The numeric phase: values ``(*batch, nslots)`` in A's value slots (a factorization,
        a pointer swap, a diagonal for a preconditioner...). May raise
        :class:`~sparsetorch.SingularMatrixError` / :class:`~sparsetorch.IndefiniteMatrixError`."""


@runtime_checkable
class SolvePlan(Plan, Protocol):
    """op ``"solve"``: ``A X = B`` (``A^H X = B`` with ``adjoint=True``)."""

    def solve(self, B: torch.Tensor, *, adjoint: bool = False,
              options: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, IterationResult]:
        """``X`` of ``B``'s shape ``(*batch, n, k)``, dtype and device, and how it ended.
        ``options`` holds the call's ``rtol``, ``atol``, ``maxiter``, ``check_every`` and
        ``callback`` (iterative methods read them; direct ones may ignore them). A direct method
        reports ``Status.DIRECT``; the core checks every answer's true residual."""


@runtime_checkable
class MatmulPlan(Plan, Protocol):
    """op ``"matmul"``: ``Y = A X`` (``A^H X`` with ``adjoint=True``)."""

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``Y`` of shape ``(*batch, m, k)`` (``(*batch, n, k)`` adjoint) for ``X`` ``(*batch, n, k)``."""


@runtime_checkable
class LstsqPlan(Plan, Protocol):
    """op ``"lstsq"``: ``min ||A X - B||`` (with ``damp``), the minimum-norm solution."""

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False,
              options: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, IterationResult]:
        """``X`` ``(*batch, n, k)`` for ``B`` ``(*batch, m, k)``; ``options`` holds ``atol``,
        ``btol``, ``conlim``, ``maxiter``, ``damp``."""


@runtime_checkable
class EigshPlan(Plan, Protocol):
    """op ``"eigsh"``: a few eigenpairs of a symmetric/Hermitian A (generalized with ``M``)."""

    def eigsh(self, k: int, *, which: str = "LM", sigma: float | None = None, M: Any = None, tol: float = 0.0,
              maxiter: int | None = None, v0: torch.Tensor | None = None) -> Any:
        """``(values, vectors)`` (and, where the backend reports it, an :class:`IterationResult`)."""


@runtime_checkable
class EigsPlan(Plan, Protocol):
    """op ``"eigs"``: a few eigenpairs of a general A."""

    def eigs(self, k: int, *, which: str = "LM", sigma: complex | None = None, tol: float = 0.0,
             maxiter: int | None = None, v0: torch.Tensor | None = None, left: bool = False) -> Any:
        """``(values, vectors)`` (complex), left vectors too with ``left=True``."""


@runtime_checkable
class LogdetPlan(Plan, Protocol):
    """op ``"logdet"``: sign and log-magnitude of ``det(A)``, and solves for its gradient."""

    def slogdet(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sign, logabsdet)``, batch-shaped."""

    def solve(self, B: torch.Tensor, *, adjoint: bool = False) -> tuple[torch.Tensor, IterationResult]:
        """Solves with the factorization the determinant came from (for the gradient)."""


@runtime_checkable
class SolveListPlan(Protocol):
    """op ``"solve_list"``: a list of matrices (different patterns) solved together."""

    def set_values(self, values: Sequence[torch.Tensor]) -> None:
        """The values of every member, in order."""

    def solve(self, Bs: Sequence[torch.Tensor], *,
              adjoint: bool = False) -> tuple[Sequence[torch.Tensor], IterationResult]:
        """One solution per member."""


# Optional capabilities ----------------------------------------------------------------------------
@runtime_checkable
class InverseEntries(Protocol):
    """A plan that computes selected entries of ``A^-1`` (a selected inversion): logdet's
    gradient without ``n`` solves."""

    def inverse_entries(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``(A^-1)[rows[i], cols[i]]`` for every i, batch in front."""


@runtime_checkable
class SampledProduct(Protocol):
    """A product plan with its own sampled dense-dense product: matmul's values-gradient
    ``sum_c P[row, c] Q[col, c]`` at every stored entry, in A's value slots (padding slots zero).
    Used for real dtypes in a first-order backward; the core's own (differentiable) kernel
    serves double backward and complex values."""

    def sddmm(self, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        """``(*batch, nslots)`` for ``P`` ``(*batch, m, k)`` and ``Q`` ``(*batch, n, k)``."""


@runtime_checkable
class CheapReload(Protocol):
    """A plan for which loading values is a pointer swap (Krylov plans: the values and a
    diagonal): with ``reload_cheap = True`` the core reloads on every call instead of keeping an
    nnz-sized snapshot to compare with."""

    reload_cheap: bool


@runtime_checkable
class Bindable(Protocol):
    """A product plan that can record ``Y = A X`` as one launch bound to fixed operands, for
    ``Matmul.execute``'s per-call path (no dispatch, no autograd node, no value reload per call).
    ``bind(values, X)`` gets A's value slots (1-D, read where they lie at each call) and a
    right-hand side laid out as ``X`` ((n, k), contiguous); it returns None where it cannot (the
    core then takes the general path), else a callable ``bound(X, Y) -> bool`` that writes ``A X``
    into the contiguous ``(m, k)`` output ``Y`` and returns False, without launching, when ``X``
    or the values no longer lie where they were bound (the core binds again). The plan's index
    buffers are its own, validated when it was built; the core re-checks A's index buffers'
    version counters before every bound call."""

    def bind(self, values: torch.Tensor, X: torch.Tensor) -> Any:
        """A bound product ``bound(X, Y) -> bool``, or None."""


#: the members each capability needs (what :func:`supports` looks for)
_MEMBERS: dict[type, tuple[str, ...]] = {
    InverseEntries: ("inverse_entries",),
    SampledProduct: ("sddmm",),
    CheapReload: ("reload_cheap",),
    Bindable: ("bind",),
}


def supports(plan: Any, capability: type) -> bool:
    """Whether ``plan`` has ``capability`` (one of the capability protocols) now: its methods are
    callable (``reload_cheap`` must be ``True``). Unlike ``isinstance`` against a protocol, whose
    answer Python caches per class, this sees a method added or removed later."""
    members = _MEMBERS.get(capability)
    if members is None:
        raise TypeError(f"{capability!r} is not a plan capability (one of {[c.__name__ for c in _MEMBERS]})")
    if capability is CheapReload:
        return getattr(plan, "reload_cheap", False) is True
    return all(callable(getattr(plan, m, None)) for m in members)
