"""The operations as methods of :class:`~sparsetorch.SparseTensor`, the way torch-sla spells them:
``A.solve(b)``, ``A.matvec(x)``, ``A.eigsh(k)``, ``A.det()``, ``A.norm()``, ... Each is the function of the
same name with ``A`` first (same keywords, same dispatch, same gradients); nothing here adds behaviour.

The tensor layer sits below the ops, so the methods are bound here (as ``matmul.py`` binds ``@``).
docs/coming-from-torch-sla.md maps torch-sla's names to these.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..tensor import SparseTensor
from .logdet import det, logdet, slogdet
from .lstsq import lstsq
from .matmul import matmul, norm
from .solve import solve
from .spectral import eigs, eigsh

__all__: list[str] = []


def _solve(self: SparseTensor, b: torch.Tensor, **options: Any) -> Any:
    """``sparsetorch.solve(A, b, **options)``: ``x`` with ``A x = b``."""
    if "tol" in options:
        raise InputError(f"solve takes rtol= (and atol=), not tol=: torch-sla's tol={options['tol']!r} is rtol here")
    return solve(self, b, **options)


def _lstsq(self: SparseTensor, b: torch.Tensor, **options: Any) -> Any:
    """``sparsetorch.lstsq(A, b, **options)``: least squares (minimum norm) ``x``."""
    return lstsq(self, b, **options)


def _matvec(self: SparseTensor, x: torch.Tensor, **options: Any) -> torch.Tensor:
    """``A @ x`` (``sparsetorch.matmul(A, x, **options)``): torch-sla's name for the product."""
    return matmul(self, x, **options)


def _eigsh(self: SparseTensor, k: int = 6, which: str | None = None, **options: Any) -> Any:
    """``sparsetorch.eigsh(A, k, which=which, **options)``: ``k`` eigenpairs of a symmetric (Hermitian) A
    (``which`` may be given second, as torch-sla's ``A.eigsh(k, which)``)."""
    if which is not None:
        options["which"] = which
    return eigsh(self, k, **options)


def _eigs(self: SparseTensor, k: int = 6, which: str | None = None, **options: Any) -> Any:
    """``sparsetorch.eigs(A, k, which=which, **options)``: ``k`` eigenpairs of a general square A."""
    if which is not None:
        options["which"] = which
    return eigs(self, k, **options)


def _det(self: SparseTensor, **options: Any) -> torch.Tensor:
    """``sparsetorch.det(A, **options)`` (overflows to inf where ``slogdet`` does not)."""
    return det(self, **options)


def _slogdet(self: SparseTensor, **options: Any) -> Any:
    """``sparsetorch.slogdet(A, **options)``: ``(sign, log|det A|)``."""
    return slogdet(self, **options)


def _logdet(self: SparseTensor, **options: Any) -> torch.Tensor:
    """``sparsetorch.logdet(A, **options)``: ``log det A`` (nan where the determinant is negative)."""
    return logdet(self, **options)


def _norm(self: SparseTensor, ord: str | int | float = "fro") -> torch.Tensor:
    """``sparsetorch.norm(A, ord)``: "fro", 1, inf or "max", from the stored entries."""
    return norm(self, ord)


for _name, _fn in {"solve": _solve, "lstsq": _lstsq, "matvec": _matvec, "eigsh": _eigsh, "eigs": _eigs,
                   "det": _det, "slogdet": _slogdet, "logdet": _logdet, "norm": _norm}.items():
    _fn.__name__ = _fn.__qualname__ = _name
    setattr(SparseTensor, _name, _fn)
