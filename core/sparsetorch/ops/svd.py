"""Partial singular value decomposition and the 2-norm condition number of a sparse matrix.

``svds(A, k)`` answers through :func:`~sparsetorch.eigsh` of the Hermitian dilation

    H = [[0, A], [A^H, 0]]      ((m + n) x (m + n), the same nonzeros twice),

whose eigenvalues are ``+sigma_i``, ``-sigma_i`` (i <= min(m, n)) and ``|m - n|`` zeros, with eigenvectors
``[u_i; +-v_i] / sqrt(2)``. The dilation keeps the accuracy of the singular values (``A^H A`` would square the
condition number: a singular value near ``sqrt(u) sigma_max`` is lost there and not here), runs on any device and
dtype eigsh takes, and inherits eigsh's adjoint: ``H``'s values are ``A``'s values (concatenated with their
conjugates), so the singular values and vectors are differentiable in ``A``'s values with no rule of their own.

The smallest singular values (``which="SM"``) come from shift-invert at 0 on the dilation of a square ``A``: the
``2k`` eigenvalues nearest 0 are the pairs ``+-sigma``. For a singular ``A`` the smallest singular value comes out
at rounding level (as from a dense SVD), or the shift-invert factorization meets an exact zero pivot and raises
:class:`~sparsetorch.SingularMatrixError` (:func:`cond` then returns ``inf``). For a non-square ``A`` the dilation's ``|m - n|`` zero
eigenvalues are not singular values, so "SM" is refused there with what to do instead.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError, SingularMatrixError
from ..tensor import SparseTensor
from .spectral import eigsh

__all__ = ["svds", "cond"]


def _dilation(A: SparseTensor) -> SparseTensor:
    """``[[0, A], [A^H, 0]]`` over A's values (differentiable in them), tagged for eigsh as Hermitian."""
    m, n = A.format_shape[-2:]
    (coords, slots) = A.entries()
    vals = A.values.index_select(-1, slots)
    r, c = coords[-2].to(torch.int64), coords[-1].to(torch.int64)
    rows = torch.cat([r, c + m])
    cols = torch.cat([c + m, r])
    both = torch.cat([vals, vals.conj()], -1)
    return SparseTensor.from_coo(both, rows, cols, shape=(m + n, m + n), format="CSR")


def _check(A: Any, k: int, which: str) -> tuple[int, int]:
    if not isinstance(A, SparseTensor):
        raise InputError(f"svds: A must be a SparseTensor, got {type(A).__name__}")
    if len(A.format_shape) != 2 or A.batch_shape:
        raise InputError(f"svds: A must be one 2-D matrix, got format shape {tuple(A.format_shape)} with batch shape "
                         f"{tuple(A.batch_shape)} (call it per member)")
    m, n = A.format_shape
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < min(m, n):
        raise InputError(f"svds: k must be an integer with 1 <= k < min(m, n) = {min(m, n)} for A of shape ({m}, {n}), "
                         f"got {k!r} (for all singular values use torch.linalg.svdvals(A.to_dense()))")
    if which not in ("LM", "SM"):
        raise InputError(f"svds: which must be 'LM' (largest) or 'SM' (smallest), got {which!r}")
    if which == "SM" and m != n:
        raise InputError(f"svds: which='SM' needs a square A (the dilation of a ({m}, {n}) matrix has {abs(m - n)} zero "
                         f"eigenvalues that are not singular values); for the smallest ones take eigsh(G, k, sigma=0) of the "
                         f"smaller Gram matrix G (A^H A or A A^H; it squares the condition number)")
    return m, n


def svds(A: SparseTensor, k: int = 6, *, which: str = "LM", return_singular_vectors: bool = True,
         **options: Any) -> Any:
    """``k`` singular triplets of a sparse ``A`` (``m`` x ``n``), SciPy's ``svds`` (torch-sla's ``A.svd(k)``).

    ``which``: "LM" the largest singular values, "SM" the smallest (square ``A`` only: shift-invert at 0; a
    singular ``A`` gives a value at rounding level or raises :class:`~sparsetorch.SingularMatrixError`). Returns ``(U, S, Vh)`` with ``S``
    descending (``(k,)``), ``U`` ``(m, k)``, ``Vh`` ``(k, n)`` so that ``A ~ U diag(S) Vh`` on those triplets, or
    ``S`` alone with ``return_singular_vectors=False``. ``options`` go to :func:`~sparsetorch.eigsh` (``tol``,
    ``maxiter``, ``backend``, ``method``, ``degenerate``, ...). Differentiable in A's values (through eigsh's
    adjoint on the dilation; vectors of repeated singular values follow eigsh's ``degenerate`` rule).
    """
    m, n = _check(A, k, which)
    H = _dilation(A)
    options.setdefault("properties", "hermitian" if A.dtype.is_complex else "symmetric")
    if which == "LM":
        w, V = eigsh(H, k, which="LA", **options)  # the k largest of +-sigma: the top sigmas, ascending
        S, X = w.flip(-1), V.flip(-1)
    else:
        w, V = eigsh(H, 2 * k, sigma=0.0, **options)  # +-sigma nearest 0, ascending: the positive half
        S, X = w[k:].flip(-1), V[:, k:].flip(-1)
    if not return_singular_vectors:
        return S
    scale = X.new_tensor(2.0).sqrt()
    U = X[:m] * scale
    Vv = X[m:] * scale
    return U, S, Vv.mH


def cond(A: SparseTensor, p: Any = 2, **options: Any) -> torch.Tensor:
    """The 2-norm condition number ``sigma_max / sigma_min`` of a square sparse ``A`` (torch-sla's
    ``A.condition_number()``), from :func:`svds` ("LM" and "SM", one singular value each); for a singular
    ``A`` about ``1 / u`` or more (as ``torch.linalg.cond`` of the dense matrix), ``inf`` where the factorization
    meets an exact zero pivot. Differentiable in A's values where finite. Only ``p=2`` (the 1- and inf-norm condition
    numbers need the inverse's norm: ``st.solve``'s ``return_info=True`` reports an estimate)."""
    if p not in (2, None):
        raise InputError(f"cond: only p=2 is computed here, got p={p!r}")
    if not isinstance(A, SparseTensor) or len(A.format_shape) != 2 or A.format_shape[0] != A.format_shape[1]:
        shape = tuple(A.format_shape) if isinstance(A, SparseTensor) else type(A).__name__
        raise InputError(f"cond: A must be a square 2-D SparseTensor, got {shape}")
    n = A.format_shape[0]
    if n < 3:  # svds needs k < n: the dense matrix is tiny
        return torch.linalg.cond(A.to_dense())
    big = svds(A, 1, which="LM", return_singular_vectors=False, **options)[0]
    try:
        small = svds(A, 1, which="SM", return_singular_vectors=False, **options)[0]
    except SingularMatrixError:
        return big.new_tensor(float("inf"))
    return big / small
