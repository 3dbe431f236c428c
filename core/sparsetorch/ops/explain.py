"""``explain(op, *operands, **options)``: the ranked backend table for a call, without running it."""

from __future__ import annotations

from typing import Any, Callable

from ..dispatch.records import Request
from ..dispatch.select import ExplainTable, rank
from ..errors import InputError
from ..dispatch.plan import with_expected_calls
from ._inputs import as_rhs, check_matrix

__all__ = ["explain"]


def _solve(operands: tuple, options: dict) -> Request:
    from .solve import options_from_kwargs, solve_request

    A = check_matrix(operands[0], "explain", square=True)
    B = as_rhs(A, operands[1], "explain", rows=A.format_shape[0])[0] if len(operands) > 1 else None
    props = options.pop("properties", None)
    request = solve_request(A, B, props, options_from_kwargs("explain('solve', ...)", options))
    # what the next solve on this pattern would see: one-time setups spread over the calls seen
    # so far (when no repeat= is given)
    return with_expected_calls("solve", A, request, None, count=False) or request


def _matmul(operands: tuple, options: dict) -> Request:
    from .matmul import matmul_request

    A = check_matrix(operands[0], "explain", square=False)
    X = as_rhs(A, operands[1], "explain", rows=A.format_shape[1])[0] if len(operands) > 1 else None
    return matmul_request(A, X, {"backend": options.get("backend")})


def _spectral(op: str) -> Callable[[tuple, dict], Request]:
    def build(operands: tuple, options: dict) -> Request:
        from .spectral import eigs_request, eigsh_request

        A = check_matrix(operands[0], "explain", square=True)
        k = operands[1] if len(operands) > 1 else options.pop("k", 6)
        get = options.get
        if op == "eigsh":
            return eigsh_request(A, get("M"), k, get("which", "LM"), get("sigma"), get("tol", 0.0), get("maxiter"),
                                 get("backend"), get("method"), get("properties"), get("dense_max"))
        return eigs_request(A, k, get("which", "LM"), get("sigma"), get("tol", 0.0), get("maxiter"), get("backend"),
                            get("method"), get("dense_max"))

    return build


def _logdet(operands: tuple, options: dict) -> Request:
    from .logdet import logdet_request

    A = check_matrix(operands[0], "explain", square=True)
    return logdet_request(A, options.get("backend"), options.get("method"), options.get("properties"))


def _lstsq(operands: tuple, options: dict) -> Request:
    from .lstsq import _options, lstsq_request

    from .lstsq import widened

    A = check_matrix(operands[0], "explain", square=False)
    B = as_rhs(A, operands[1], "explain", rows=A.format_shape[0])[0] if len(operands) > 1 else None
    wide = widened(A, B, options)
    if wide is not None:  # what a default single-precision call runs: the double-precision problem
        A, B = A.to(wide), None if B is None else B.to(wide)
    return lstsq_request(A, B, _options(A.dtype, **options))


#: op -> the request the op itself would build for these operands and options (each entry calls
#: the op module's own request builder: solve_request, matmul_request, eigsh_request, ...)
REQUESTS: dict[str, Callable[[tuple, dict], Request]] = {
    "solve": _solve, "matmul": _matmul, "eigsh": _spectral("eigsh"), "eigs": _spectral("eigs"),
    "logdet": _logdet, "slogdet": _logdet, "det": _logdet, "lstsq": _lstsq,
}


def explain(op: str, *operands: Any, **options: Any) -> ExplainTable:
    """What dispatch would do for ``op(*operands, **options)``: every backend's offer (method,
    estimated seconds and peak bytes, notes) best first, the chosen one marked, and every
    decline with its reason. ``print(sparsetorch.explain("solve", A, b))``."""
    build = REQUESTS.get(op) if isinstance(op, str) else None
    if build is None:
        raise InputError(f"explain knows {', '.join(repr(k) for k in REQUESTS)}, got {op!r}")
    return rank(build(operands, options))
