"""What the compiled path (:mod:`.compiled`) needs from the ops layer, registered from above.

The eager kernel of ``sparsetorch::spsolve`` runs ``sparsetorch.solve`` (property detection,
dispatch, the finiteness check, the checked fallback route), which the ops layer owns; this layer
may not import it, so the ops register it here. A module of its own, so that ``import
sparsetorch`` does not define the custom ops of :mod:`.compiled` (they are defined, with their
``torch.library`` registrations, the first time a compiled region uses them).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["register_solver", "solver"]

_solver: Callable | None = None


def register_solver(fn: Callable) -> None:
    """Set the function the eager kernel of ``sparsetorch::spsolve`` calls:
    ``fn(A, B, **options) -> X`` (``sparsetorch.solve``)."""
    global _solver
    _solver = fn


def solver() -> Callable | None:
    """The registered solve (None before the ops layer registered one)."""
    return _solver
