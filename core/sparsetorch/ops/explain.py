"""``explain(op, *operands, **options)``: the ranked backend table for a call, without running it."""

from __future__ import annotations

from typing import Any

from ..dispatch.select import ExplainTable, rank
from ..errors import InputError
from ._inputs import as_rhs, check_matrix

__all__ = ["explain"]


def explain(op: str, *operands: Any, **options: Any) -> ExplainTable:
    """What dispatch would do for ``op(*operands, **options)``: every backend's offer (method,
    estimated seconds and peak bytes, notes) best first, the chosen one marked, and every
    decline with its reason. ``print(sparsetorch.explain("solve", A, b))``."""
    if op == "solve":
        from .solve import options_from_kwargs, solve_request

        A = check_matrix(operands[0], "explain", square=True)
        B = as_rhs(A, operands[1], "explain", rows=A.format_shape[0])[0] if len(operands) > 1 else None
        props = options.pop("properties", None)
        return rank(solve_request(A, B, props, options_from_kwargs("explain('solve', ...)", options)))
    if op == "matmul":
        from .matmul import matmul_request

        A = check_matrix(operands[0], "explain", square=False)
        X = as_rhs(A, operands[1], "explain", rows=A.format_shape[1])[0] if len(operands) > 1 else None
        return rank(matmul_request(A, X, {"backend": options.get("backend")}))
    raise InputError(f"explain knows 'solve' and 'matmul', got {op!r}")

