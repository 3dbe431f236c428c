"""Sparse @ dense: ``matmul``, the stateful ``Matmul`` (UST form), ``norm`` and ``transpose``."""

from __future__ import annotations

from typing import Any

import torch

from ..autograd.handles import MatmulHandle
from ..dispatch.plan import PlanState
from ..autograd.matmul import matmul_function
from ..dispatch.select import ExplainTable
from ..errors import InputError
from ..tensor import SparseTensor
from ._dispatch import make_request, obtain_plan
from ._inputs import as_rhs, check_matrix, describe_dense, describe_sparse, restore_rhs

__all__ = ["matmul", "Matmul", "norm", "transpose", "matmul_request"]


def matmul_request(A: SparseTensor, X: torch.Tensor | None, options: dict[str, Any]):
    operands = (describe_sparse(A),) + ((describe_dense(X),) if X is not None else ())
    return make_request("matmul", operands, frozenset(), options)


def _run(A: SparseTensor, Xn: torch.Tensor, state: PlanState, adjoint: bool = False) -> torch.Tensor:
    return matmul_function(A.values, Xn, MatmulHandle(state, A.detach(), adjoint))


def matmul(A: SparseTensor, X: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float | complex | None = None,
           beta: float | complex | None = None, backend: str | None = None, cache: bool = True) -> torch.Tensor:
    """``A @ X`` for sparse ``A`` (any format) and dense ``X`` of shape ``(n,)``, ``(n, k)`` or with
    A's value batch in front. Differentiable in A's values (on the pattern) and in ``X``.

    With ``c`` (or ``alpha``/``beta``) it is the one-shot form of :class:`Matmul`, nvmath-python's
    ``matmul(a, b, c, alpha=, beta=)``: ``alpha * A @ X + beta * c`` with ``alpha`` 1 and ``beta``
    1 by default (nvmath's defaults), written into ``c`` in place and returned, unless a gradient
    is being recorded (then a new tensor is returned and ``c`` is left alone; see :class:`Matmul`).
    ``c`` must have the result's shape, A's dtype and device. Unlike :class:`Matmul` it uses the
    plan cache, so repeated one-shot calls on one pattern plan once."""
    A = check_matrix(A, "matmul", square=False)
    Xn, vector = as_rhs(A, X, "matmul", rows=A.format_shape[1])
    alpha, beta = _scalars(A, Xn, vector, c, alpha, beta, "matmul")
    request = matmul_request(A, Xn, {"backend": backend})
    state, _, _ = obtain_plan("matmul", A, request, cache=cache)
    return _combine(restore_rhs(_run(A, Xn, state), vector), c, alpha, beta)


def _scalars(a: SparseTensor, bn: torch.Tensor, vector: bool, c: torch.Tensor | None, alpha, beta,
             what: str) -> tuple[Any, Any]:
    """nvmath's defaults (alpha 1; beta 1 with c) after checking c against the product."""
    if c is None and beta is not None and beta != 0:
        raise InputError(f"{what}: beta={beta} needs an output operand c (pass c=, or leave beta out)")
    if c is not None:
        if not isinstance(c, torch.Tensor) or c.layout != torch.strided:
            raise InputError(f"{what}: c must be a dense (strided) torch.Tensor, got "
                             f"{getattr(c, 'layout', type(c).__name__)}")
        want = tuple(bn.shape[:-2]) + (a.format_shape[0],) + (() if vector else (bn.shape[-1],))
        if tuple(c.shape) != want:
            raise InputError(f"{what}: c has shape {tuple(c.shape)}; for a {tuple(a.shape)} @ b "
                             f"{tuple(bn.shape[:-1]) if vector else tuple(bn.shape)} it must be {want}")
        if c.dtype != a.dtype or c.device != a.device:
            raise InputError(f"{what}: c must have A's dtype {a.dtype} and device {a.device}, got {c.dtype} on {c.device}")
    alpha = 1.0 if alpha is None else alpha
    beta = (1.0 if c is not None else 0.0) if beta is None else beta
    return alpha, beta


def _combine(y: torch.Tensor, c: torch.Tensor | None, alpha, beta) -> torch.Tensor:
    """``alpha * y + beta * c``, into ``c`` unless a gradient is being recorded."""
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


def transpose(A: SparseTensor) -> SparseTensor:
    """``A.T``: a view with the same buffers (CSR becomes CSC)."""
    return A.T


def norm(A: SparseTensor, ord: str | int | float = "fro") -> torch.Tensor:
    """Matrix norms from the stored entries: "fro", 1 (max column sum), inf (max row sum),
    "max" (largest magnitude). Differentiable in the values. Batched over A's value batch."""
    A = check_matrix(A, "norm", square=False)
    coords, vals = A.coordinates()
    mag = vals.abs()
    m, n = A.format_shape
    if ord == "fro":
        return torch.linalg.vector_norm(vals, dim=-1)
    if ord == "max":
        return mag.amax(-1) if mag.shape[-1] else mag.new_zeros(mag.shape[:-1])
    if ord in (1, float("inf"), "inf"):
        idx, size = (coords[1], n) if ord == 1 else (coords[0], m)
        sums = mag.new_zeros(*mag.shape[:-1], size).index_add(-1, idx, mag)
        return sums.amax(-1) if size else sums.new_zeros(sums.shape[:-1])
    raise InputError(f"norm ord must be 'fro', 1, inf or 'max', got {ord!r}")


class Matmul:
    """Stateful ``c := alpha * a @ b + beta * c`` (the UST form), planned once, executed many times.

    ::

        with Matmul(a, b, c) as mm:   # alpha = beta = 1: c := a @ b + c
            mm.plan()
            mm.execute()
            mm.reset_operands(b=b2)
            mm.execute()

    Defaults follow nvmath-python's ``sparse.Matmul``: ``alpha`` is 1; ``beta`` is 1 when ``c`` is
    given (accumulate into ``c``; pass ``beta=0`` to overwrite it) and 0 without ``c``.
    Deliberate differences: ``c`` is optional (nvmath requires it for now): without it
    ``execute`` returns a new tensor, and a nonzero ``beta`` without ``c`` raises (nvmath warns and
    ignores it). ``c`` is updated in place unless a gradient is being recorded (operands that
    require grad): then ``execute`` returns a new tensor and leaves ``c`` unchanged, since
    in-place writes would break autograd. ``execute`` always returns the result.
    """

    def __init__(self, a: SparseTensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
                 alpha: float | complex | None = None, beta: float | complex | None = None,
                 backend: str | None = None) -> None:
        self._backend = backend
        self._state: PlanState | None = None
        self._table: ExplainTable | None = None
        self._set(a, b, c, alpha, beta)

    def _set(self, a, b, c, alpha, beta) -> None:
        a = check_matrix(a, "Matmul", square=False)
        bn, vector = as_rhs(a, b, "Matmul", rows=a.format_shape[1])
        alpha, beta = _scalars(a, bn, vector, c, alpha, beta, "Matmul")
        self.a, self.b, self.c, self.alpha, self.beta = a, b, c, alpha, beta
        self._bn, self._vector = bn, vector

    def plan(self) -> ExplainTable:
        request = matmul_request(self.a, self._bn, {"backend": self._backend})
        self._state, _, self._table = obtain_plan("matmul", self.a, request, cache=False)
        self._state.build()
        return self._table

    def execute(self) -> torch.Tensor:
        if self._state is None:
            self.plan()
        return _combine(restore_rhs(_run(self.a, self._bn, self._state), self._vector), self.c, self.alpha, self.beta)

    def reset_operands(self, a: SparseTensor | None = None, b: torch.Tensor | None = None, c: torch.Tensor | None = None,
                       *, alpha: float | complex | None = None, beta: float | complex | None = None) -> None:
        """Swap operands (checked like the constructor's); those not given keep their values. A
        new ``a`` on the same pattern keeps the plan (values reload), another pattern re-plans on
        the next ``execute`` (nvmath requires the same format, shape and nnz; we allow more)."""
        if a is None and b is None and c is None and alpha is None and beta is None:
            raise InputError("reset_operands() with no argument changes nothing; pass a=, b=, c=, alpha= or beta=")
        new_a = a if a is not None else self.a
        if a is not None and a.pattern_key != self.a.pattern_key:
            self._state = None
        self._set(new_a, b if b is not None else self.b, c if c is not None else self.c,
                  self.alpha if alpha is None else alpha, self.beta if beta is None else beta)

    def reset_operands_unchecked(self, *, a: SparseTensor | None = None, b: torch.Tensor | None = None,
                                 c: torch.Tensor | None = None, alpha: float | complex | None = None,
                                 beta: float | complex | None = None) -> None:
        """:meth:`reset_operands` without the operand checks (nvmath's fast path for loops that
        swap operands every step): no type, shape, dtype or device checks and no re-validation of
        ``a``'s index buffers. The caller guarantees the new operands match the old ones in
        shape, dtype and device, and that ``c`` is given when ``beta`` is nonzero; a mismatch is
        undefined behaviour (a wrong result or an error from the backend). A new ``a`` on another
        pattern still re-plans (one identity comparison), since a stale plan would compute with
        the old pattern."""
        if a is not None:
            if a.pattern_key != self.a.pattern_key:
                self._state = None
            self.a = a
        if b is not None:
            self.b = b
            self._bn = b.unsqueeze(-1) if self._vector else b
        if c is not None:
            self.c = c
        if alpha is not None:
            self.alpha = alpha
        if beta is not None:
            self.beta = beta

    def free(self) -> None:
        self._state = None

    def __enter__(self) -> "Matmul":
        return self

    def __exit__(self, *exc) -> None:
        self.free()


def _matmul_operator(self: SparseTensor, other: torch.Tensor) -> torch.Tensor:
    """``A @ X`` through :func:`sparsetorch.matmul` (dispatch, plan cache, gradients)."""
    return matmul(self, other)


def _rmatmul_operator(self: SparseTensor, other: torch.Tensor) -> torch.Tensor:
    """``X @ A`` as ``(A^T @ X^T)^T`` (A^T is a view)."""
    if not isinstance(other, torch.Tensor):
        return NotImplemented
    if other.dim() == 1:
        return matmul(self.T, other)
    return matmul(self.T, other.transpose(-2, -1)).transpose(-2, -1)


# The tensor layer sits below dispatch: its operators are bound here, where matmul lives.
SparseTensor.__matmul__ = _matmul_operator  # type: ignore[method-assign]
SparseTensor.__rmatmul__ = _rmatmul_operator  # type: ignore[method-assign]
