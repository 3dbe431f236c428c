"""Preconditioners for the Krylov solvers: callables ``X -> M^-1 X`` on ``(*batch, n, k)``.

They take plain tensors (extracting a diagonal or diagonal blocks from a sparse matrix is the
caller's job) and do all factorisation work once, when built:

- :func:`identity` -- ``M = I``.
- :func:`jacobi` -- ``M = diag(A)``: one multiply per application.
- :func:`block_jacobi` -- ``M = blockdiag(A_11, A_22, ...)``: every block LU-factored at once
  (``torch.linalg.lu_factor_ex`` over the batch of blocks), one batched ``lu_solve`` per
  application; no Python loop over blocks.

A zero diagonal entry or a singular block raises :class:`~sparsetorch.errors.SingularMatrixError`
naming it, at construction.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ....errors import InputError, SingularMatrixError
from ._common import SUPPORTED_DTYPES

__all__ = ["Identity", "Jacobi", "BlockJacobi", "identity", "jacobi", "block_jacobi"]


def _batch_text(index: tuple[int, ...]) -> str:
    return f" of batch {index}" if index else ""


def _check_input(name: str, X: Tensor, n: int, dtype: torch.dtype, device: torch.device) -> None:
    if X.ndim < 2 or X.shape[-2] != n:
        raise InputError(
            f"{name} preconditioner was built for n = {n} but applied to shape {tuple(X.shape)}: "
            f"it takes (*batch, n, k) tensors of the system it was built for"
        )
    if torch.promote_types(dtype, X.dtype) != X.dtype or X.device != device:
        raise InputError(
            f"{name} preconditioner holds {dtype} on {device} but was applied to {X.dtype} on "
            f"{X.device}: build it from data of the solve's dtype and device"
        )


class Identity:
    """``M^-1 X = X`` (returns its input; solvers never modify it in place)."""

    name = "identity"

    def __call__(self, X: Tensor) -> Tensor:
        return X

    def __repr__(self) -> str:
        return "Identity()"


class Jacobi:
    """``M^-1 X = X / diag(A)``, the reciprocal diagonal kept as ``(*batch, n, 1)``."""

    name = "jacobi"

    def __init__(self, inverse_diagonal: Tensor) -> None:
        self.inverse = inverse_diagonal.unsqueeze(-1)

    def __call__(self, X: Tensor) -> Tensor:
        inv = self.inverse
        _check_input("jacobi", X, inv.shape[-2], inv.dtype, inv.device)
        return X * inv

    def __repr__(self) -> str:
        return f"Jacobi(n={self.inverse.shape[-2]}, dtype={self.inverse.dtype})"


class BlockJacobi:
    """``M^-1 X`` by a batched LU solve with the factors of all diagonal blocks."""

    name = "block_jacobi"

    def __init__(self, lu: Tensor, pivots: Tensor, n: int) -> None:
        self.lu = lu            # (*batch, nblocks, bs, bs)
        self.pivots = pivots    # (*batch, nblocks, bs)
        self.n = n
        self._cast: dict[torch.dtype, Tensor] = {lu.dtype: lu}

    def _factor(self, dtype: torch.dtype) -> Tensor:
        """The LU factors in ``dtype`` (real factors are cast once for complex right-hand sides)."""
        if dtype not in self._cast:
            self._cast[dtype] = self.lu.to(dtype)
        return self._cast[dtype]

    def __call__(self, X: Tensor) -> Tensor:
        _check_input("block_jacobi", X, self.n, self.lu.dtype, self.lu.device)
        nblocks, bs = self.lu.shape[-3], self.lu.shape[-1]
        *batch, n, k = X.shape
        pad = nblocks * bs - n
        Xp = F.pad(X, (0, 0, 0, pad)) if pad else X
        Y = torch.linalg.lu_solve(self._factor(X.dtype), self.pivots, Xp.reshape(*batch, nblocks, bs, k))
        Y = Y.reshape(*batch, nblocks * bs, k)
        return Y[..., :n, :] if pad else Y

    def __repr__(self) -> str:
        return f"BlockJacobi(n={self.n}, blocks={self.lu.shape[-3]}x{self.lu.shape[-1]}, dtype={self.lu.dtype})"


def identity() -> Identity:
    """The identity preconditioner (``M = I``), for callers that always pass an ``M``."""
    return Identity()


def _check_values(name: str, t: Tensor, what: str) -> None:
    if not isinstance(t, Tensor):
        raise InputError(f"{name}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise InputError(
            f"{name}: {what} has dtype {t.dtype}; supported are float32, float64, complex64, "
            f"complex128: convert it, e.g. .to(torch.float64)"
        )
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise InputError(f"{name}: {what} holds a NaN or Inf at index {where}: fix the matrix values")


def jacobi(diagonal: Tensor) -> Jacobi:
    """The Jacobi preconditioner ``M = diag(A)`` from the diagonal, shape ``(n,)`` or ``(*batch, n)``.

    Raises:
        SingularMatrixError: a diagonal entry is zero (or its reciprocal overflows); the
            message names the first such row, and ``.row`` holds it.
        InputError: the diagonal is not a floating tensor, or holds NaN/Inf.
    """
    _check_values("jacobi", diagonal, "the diagonal")
    if diagonal.ndim < 1:
        raise InputError("jacobi: the diagonal must have shape (n,) or (*batch, n), got a scalar")
    inverse = 1 / diagonal
    bad = ~torch.isfinite(inverse)
    if bool(bad.any()):
        *batch, row = (int(i) for i in bad.nonzero()[0])
        raise SingularMatrixError(
            f"jacobi: diagonal entry {row}{_batch_text(tuple(batch))} is "
            f"{diagonal[(*batch, row)].item():.1e}, so the Jacobi preconditioner would divide by "
            f"zero: use block_jacobi, another preconditioner, or M=None",
            row=row,
        )
    return Jacobi(inverse)


def block_jacobi(blocks: Tensor, n: int) -> BlockJacobi:
    """The block-Jacobi preconditioner from dense diagonal blocks of a size-``n`` matrix.

    Args:
        blocks: ``(nblocks, bs, bs)`` (or ``(*batch, nblocks, bs, bs)``): block ``i`` is
            ``A[i*bs:(i+1)*bs, i*bs:(i+1)*bs]``. ``nblocks`` must be ``ceil(n / bs)``; when ``bs``
            does not divide ``n`` the last block's rows and columns past ``n`` are ignored.
        n: the matrix size.

    Raises:
        SingularMatrixError: a block is singular to working precision (an LU pivot is at most
            ``bs * eps`` times the block's largest entry); the message names the block and its
            rows, ``.row`` is the row of the failing pivot.
        InputError: wrong shapes, dtype, or NaN/Inf values.
    """
    _check_values("block_jacobi", blocks, "blocks")
    if blocks.ndim < 3 or blocks.shape[-1] != blocks.shape[-2]:
        raise InputError(
            f"block_jacobi: blocks must have shape (nblocks, bs, bs) or (*batch, nblocks, bs, bs), "
            f"got {tuple(blocks.shape)}"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"block_jacobi: n must be a positive integer, got {n!r}")
    nblocks, bs = blocks.shape[-3], blocks.shape[-1]
    if nblocks != math.ceil(n / bs):
        raise InputError(
            f"block_jacobi: {nblocks} blocks of size {bs} do not cover n = {n}: pass "
            f"ceil(n / bs) = {math.ceil(n / bs)} blocks"
        )
    rem = n - (nblocks - 1) * bs
    if rem < bs:  # pad the last block with an identity past row n
        blocks = blocks.clone()
        last = blocks[..., -1, :, :]
        last[..., rem:, :] = 0
        last[..., :, rem:] = 0
        idx = torch.arange(rem, bs, device=blocks.device)
        last[..., idx, idx] = 1
    lu, pivots, _ = torch.linalg.lu_factor_ex(blocks)  # exact zero pivots show up below too
    pivot_abs = torch.diagonal(lu, dim1=-2, dim2=-1).abs()               # (*batch, nblocks, bs)
    scale = blocks.abs().amax(dim=(-2, -1), keepdim=False).unsqueeze(-1)  # (*batch, nblocks, 1)
    tol = bs * torch.finfo(blocks.dtype).eps
    singular = pivot_abs <= tol * scale
    if bool(singular.any()):
        *batch, block, pivot = (int(i) for i in singular.nonzero()[0])
        first, last_row = block * bs, min(n, (block + 1) * bs) - 1
        value = pivot_abs[(*batch, block, pivot)].item()
        raise SingularMatrixError(
            f"block_jacobi: diagonal block {block}{_batch_text(tuple(batch))} (rows {first}..{last_row}) "
            f"is singular to working precision (LU pivot {pivot} is {value:.1e}): use jacobi, "
            f"another block size, or M=None",
            row=first + pivot,
        )
    return BlockJacobi(lu, pivots, n)
