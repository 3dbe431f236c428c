"""Where the autograd layer gets a product plan for a pattern without importing the ops above it.

The checks of the fallback route (true residuals) and the tangent of a solve (forward mode) need
``A X`` through a product plan of the plan cache. Choosing that plan is dispatch, which the ops
layer owns; the ops register their chooser here when they are imported (dependency inversion:
this layer names what it needs, the layer above provides it).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..dispatch.plan import PlanState
from ..tensor import SparseTensor

__all__ = ["register", "product_state", "combine"]

_provider: Callable[[SparseTensor, torch.Tensor], PlanState] | None = None


def register(provider: Callable[[SparseTensor, torch.Tensor], PlanState]) -> None:
    """Set the function that returns the product plan (a :class:`PlanState`) for ``A @ X``."""
    global _provider
    _provider = provider


def product_state(A: SparseTensor, X: torch.Tensor) -> PlanState:
    """The product plan for ``A @ X`` (the ops' dispatch, through the plan cache)."""
    if _provider is None:  # pragma: no cover - sparsetorch.ops registers on import
        raise RuntimeError("no product provider registered: import sparsetorch (the ops register one)")
    return _provider(A, X)


def combine(y: torch.Tensor, c: torch.Tensor | None, alpha, beta) -> torch.Tensor:
    """``alpha * y + beta * c`` (nvmath's matmul epilogue), into ``c`` unless a gradient is being
    recorded; the eager ``matmul`` and its compiled twin both end with it."""
    if alpha != 1:
        y = alpha * y
    if c is None:
        return y
    out = y + beta * c if beta != 0 else y
    if torch.is_grad_enabled() and (out.requires_grad or c.requires_grad):
        return out
    with torch.no_grad():
        c.copy_(out)
    return c
