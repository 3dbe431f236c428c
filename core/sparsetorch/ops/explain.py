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
        from .solve import _options, solve_request

        A = check_matrix(operands[0], "explain", square=True)
        B = as_rhs(A, operands[1], "explain", rows=A.format_shape[0])[0] if len(operands) > 1 else None
        props = options.pop("properties", None)
        defaults = dict(backend=None, method=None, preconditioner=None, rtol=1e-6, atol=0.0, maxiter=None, restart=None,
                        block_size=None, dense_max=None, max_bytes=None, callback=None, check_every=None,
                        backend_options=None)
        unknown = set(options) - set(defaults)
        if unknown:
            raise InputError(f"explain('solve', ...) got unknown options {sorted(unknown)}")
        defaults.update(options)
        return rank(solve_request(A, B, props, _options(**defaults)))
    if op == "matmul":
        from .matmul import matmul_request

        A = check_matrix(operands[0], "explain", square=False)
        X = as_rhs(A, operands[1], "explain", rows=A.format_shape[1])[0] if len(operands) > 1 else None
        return rank(matmul_request(A, X, {"backend": options.get("backend")}))
    raise InputError(f"explain knows 'solve' and 'matmul', got {op!r}")

