"""``explain(op, *operands, **options)``: the ranked backend table for a call, without running it."""

from __future__ import annotations

from typing import Any

from ..dispatch.select import ExplainTable, rank
from ..errors import InputError
from ._dispatch import with_expected_calls
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
        request = solve_request(A, B, props, options_from_kwargs("explain('solve', ...)", options))
        # what the next solve on this pattern would see: one-time setups spread over the calls
        # seen so far (when no repeat= is given)
        return rank(with_expected_calls("solve", A, request, None, count=False) or request)
    if op == "matmul":
        from .matmul import matmul_request

        A = check_matrix(operands[0], "explain", square=False)
        X = as_rhs(A, operands[1], "explain", rows=A.format_shape[1])[0] if len(operands) > 1 else None
        return rank(matmul_request(A, X, {"backend": options.get("backend")}))
    if op in ("eigsh", "eigs"):
        from .spectral import eigs_request, eigsh_request

        A = check_matrix(operands[0], "explain", square=True)
        k = operands[1] if len(operands) > 1 else options.pop("k", 6)
        get = options.get
        if op == "eigsh":
            return rank(eigsh_request(A, get("M"), k, get("which", "LM"), get("sigma"), get("tol", 0.0), get("maxiter"),
                                      get("backend"), get("method"), get("properties"), get("dense_max")))
        return rank(eigs_request(A, k, get("which", "LM"), get("sigma"), get("tol", 0.0), get("maxiter"), get("backend"),
                                 get("method"), get("dense_max")))
    if op in ("logdet", "slogdet", "det"):
        from .logdet import logdet_request

        A = check_matrix(operands[0], "explain", square=True)
        return rank(logdet_request(A, options.get("backend"), options.get("method"), options.get("properties")))
    if op == "lstsq":
        from .lstsq import _options, lstsq_request

        A = check_matrix(operands[0], "explain", square=False)
        B = as_rhs(A, operands[1], "explain", rows=A.format_shape[0])[0] if len(operands) > 1 else None
        return rank(lstsq_request(A, B, _options(A.dtype, **options)))
    raise InputError(f"explain knows 'solve', 'matmul', 'eigsh', 'eigs', 'logdet' and 'lstsq', got {op!r}")

