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


def matmul(A: SparseTensor, X: torch.Tensor, *, backend: str | None = None, cache: bool = True) -> torch.Tensor:
    """``A @ X`` for sparse ``A`` (any format) and dense ``X`` of shape ``(n,)``, ``(n, k)`` or with
    A's value batch in front. Differentiable in A's values (on the pattern) and in ``X``."""
    A = check_matrix(A, "matmul", square=False)
    Xn, vector = as_rhs(A, X, "matmul", rows=A.format_shape[1])
    request = matmul_request(A, Xn, {"backend": backend})
    state, _, _ = obtain_plan("matmul", A, request, cache=cache)
    return restore_rhs(_run(A, Xn, state), vector)


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

        with Matmul(a, b, c, beta=1.0) as mm:
            mm.plan()
            mm.execute()          # c now holds a @ b + c
            mm.reset_operands(b=b2)
            mm.execute()

    ``c`` is optional (then ``beta`` must be 0 and ``execute`` returns a new tensor). ``c`` is
    updated in place unless a gradient is being recorded (operands that require grad): then
    ``execute`` returns a new tensor and leaves ``c`` unchanged, since in-place writes would break
    autograd. ``execute`` always returns the result.
    """

    def __init__(self, a: SparseTensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
                 beta: float = 0.0, backend: str | None = None) -> None:
        self._backend = backend
        self._state: PlanState | None = None
        self._table: ExplainTable | None = None
        self._set(a, b, c, alpha, beta)

    def _set(self, a, b, c, alpha, beta) -> None:
        a = check_matrix(a, "Matmul", square=False)
        bn, vector = as_rhs(a, b, "Matmul", rows=a.format_shape[1])
        if c is None and beta != 0:
            raise InputError(f"beta={beta} needs an output operand c")
        if c is not None:
            want = tuple(bn.shape[:-2]) + (a.format_shape[0],) + (() if vector else (bn.shape[-1],))
            if tuple(c.shape) != want:
                raise InputError(f"c has shape {tuple(c.shape)}; for a {tuple(a.shape)} @ b {tuple(b.shape)} it must be {want}")
            if c.dtype != a.dtype or c.device != a.device:
                raise InputError(f"c must have A's dtype {a.dtype} and device {a.device}, got {c.dtype} on {c.device}")
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
        y = restore_rhs(_run(self.a, self._bn, self._state), self._vector)
        if self.alpha != 1:
            y = self.alpha * y
        if self.c is None:
            return y
        out = y + self.beta * self.c if self.beta != 0 else y
        if torch.is_grad_enabled() and (out.requires_grad or self.c.requires_grad):
            return out
        with torch.no_grad():
            self.c.copy_(out)
        return self.c

    def reset_operands(self, a: SparseTensor | None = None, b: torch.Tensor | None = None, c: torch.Tensor | None = None,
                       *, alpha: float | None = None, beta: float | None = None) -> None:
        """Swap operands; a new ``a`` on the same pattern keeps the plan (values reload), another
        pattern re-plans on the next ``execute``."""
        new_a = a if a is not None else self.a
        if a is not None and a.pattern_key != self.a.pattern_key:
            self._state = None
        self._set(new_a, b if b is not None else self.b, c if c is not None else self.c,
                  self.alpha if alpha is None else alpha, self.beta if beta is None else beta)

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
