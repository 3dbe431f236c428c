"""Partial singular value decomposition and the 2-norm condition number of a sparse matrix.

``svds(A, k)`` answers through :func:`~sparsetorch.eigsh` of the Hermitian dilation

    H = [[0, A], [A^H, 0]]      ((m + n) x (m + n), the same nonzeros twice),

whose eigenvalues are ``+sigma_i``, ``-sigma_i`` (i <= min(m, n)) and ``|m - n|`` zeros, with eigenvectors
``[u_i; +-v_i] / sqrt(2)``. The dilation keeps the accuracy of the singular values (``A^H A`` would square the
condition number: a singular value near ``sqrt(u) sigma_max`` is lost there and not here) and runs on any device
and dtype eigsh takes.

The smallest singular values (``which="SM"``) come from shift-invert at 0 on the dilation of a square ``A``:
the ``2k`` eigenvalues nearest 0 are the pairs ``+-sigma``, whose eigenvectors span ``[u; 0]`` and ``[0; v]``.
For a singular ``A`` the smallest singular value comes out at rounding level (as from a dense SVD), or the
shift-invert factorization meets an exact zero pivot and raises :class:`~sparsetorch.SingularMatrixError`
(:func:`cond` then returns ``inf``). For a non-square ``A`` the dilation's ``|m - n|`` zero eigenvalues are not
singular values, so "SM" is refused there with what to do instead.

Either way the eigenvectors only give the two subspaces; a Rayleigh-Ritz step (the SVD of the small
``Q_u^H A Q_v``) turns them into orthonormal triplets with nonnegative singular values, also where singular
values repeat or vanish (an eigensolver may return any basis of such an eigenspace, or mix the two copies).
"""

from __future__ import annotations

import numbers
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


class _VectorsWithoutGradient(torch.autograd.Function):
    """The singular vectors, tied to A's values so that a loss reading them raises in its backward pass instead of
    getting a silently zero gradient."""

    @staticmethod
    def forward(t: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        return t.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        raise InputError("svds: gradients through the singular vectors are not computed (only through the singular "
                         "values S); for a loss of the vectors use torch.linalg.svd of A.to_dense(), or eigsh of the "
                         "dilation [[0, A], [A^H, 0]] (differentiable eigenvectors)")


def _directions(X: torch.Tensor, k: int) -> torch.Tensor:
    """``k`` orthonormal columns spanning the leading part of ``X``'s column space (X's top left singular vectors)."""
    Q, _, _ = torch.linalg.svd(X, full_matrices=False)
    return Q[:, :k]


def _span(X: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of the numerically significant part of X's column space (singular values above
    ``sqrt(u)`` of the largest: the eigenvectors' halves are ``[u; v] / sqrt(2)``, so a half that belongs to no pair
    has only rounding there)."""
    Q, sv, _ = torch.linalg.svd(X, full_matrices=False)
    tol = float(sv[0]) * torch.finfo(sv.dtype).eps ** 0.5 if sv.numel() else 0.0
    return Q[:, : int((sv > tol).sum())]


def _smallest(A: SparseTensor, Xu: torch.Tensor, Xv: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, V)`` of the ``k`` smallest singular values from the halves of the dilation's eigenvectors nearest 0.

    A Galerkin step (the SVD of ``Q_u^H A Q_v``) may give spurious small values here: a ``v`` whose ``A v`` is
    orthogonal to ``Q_u`` (diag(1..5, 0 x 95): ``S = 0`` with ``v = e_1 .. e_5``, residuals 1..5; session 31's
    sweep). So the step runs on the whole spans of both halves and keeps only the triplets whose residuals
    ``||A v - s u||``, ``||A^H u - s v||`` are an SVD's (``sqrt(u) ||A||``); where fewer than ``k`` remain (a
    zero singular value of high multiplicity: eigsh may return any basis of the dilation's null space, all
    ``[u; 0]``), :class:`~sparsetorch.NotConvergedError` says so instead of a wrong triplet."""
    from ..errors import NotConvergedError  # noqa: PLC0415

    Qu, Qv = _span(Xu), _span(Xv)
    P, S, Rh = torch.linalg.svd(Qu.mH @ (A @ Qv), full_matrices=False)
    U, V = Qu @ P, Qv @ Rh.mH
    scale = float(A.values.abs().amax()) * max(A.format_shape) ** 0.5 if A.values.numel() else 1.0
    r1 = torch.linalg.vector_norm(A @ V - U * S, dim=0)
    r2 = torch.linalg.vector_norm(A.mH @ U - V * S, dim=0)
    good = torch.maximum(r1, r2) <= torch.finfo(S.dtype).eps ** 0.5 * max(scale, torch.finfo(S.dtype).tiny)
    idx = torch.nonzero(good).squeeze(-1)
    if idx.numel() < k:
        raise NotConvergedError(f"svds(which='SM'): of the dilation's eigenvectors nearest 0 ({Xu.shape[1]}), "
                                f"{idx.numel()} give singular triplets (residual within sqrt(u) ||A||), fewer than k={k}: "
                                f"a singular value repeated more often than k (e.g. a null space of dimension > k), where "
                                f"eigsh may return any basis of the dilation's null space; take the dense "
                                f"torch.linalg.svd(A.to_dense()), or eigsh(A^H A, k, sigma=0) and eigsh(A A^H, k, sigma=0)")
    keep = idx[-k:]  # S descending: the k smallest valid ones
    return U[:, keep], V[:, keep]


def svds(A: SparseTensor, k: int = 6, *, which: str = "LM", return_singular_vectors: bool = True,
         **options: Any) -> Any:
    """``k`` singular triplets of a sparse ``A`` (``m`` x ``n``), SciPy's ``svds`` (torch-sla's ``A.svd(k)``).

    ``which``: "LM" the largest singular values, "SM" the smallest (square ``A`` only: shift-invert at 0; a
    singular ``A`` gives a value at rounding level or raises :class:`~sparsetorch.SingularMatrixError`; every "SM"
    triplet is checked to an SVD's residual, and a singular value repeated more often than ``k``, e.g. a null space
    of dimension above ``k``, can raise :class:`~sparsetorch.NotConvergedError` saying to use the dense SVD). Returns
    ``(U, S, Vh)`` with ``S`` descending (``(k,)``, nonnegative), ``U`` ``(m, k)`` and ``Vh`` ``(k, n)`` with
    orthonormal columns / rows so that ``A ~ U diag(S) Vh`` on those triplets, or ``S`` alone with
    ``return_singular_vectors=False``. ``options`` go to :func:`~sparsetorch.eigsh` (``tol``, ``maxiter``,
    ``backend``, ``method``, ...).

    The eigenvectors of the dilation give the two subspaces; a Rayleigh-Ritz step (the SVD of the small
    ``Q_u^H A Q_v``) then gives orthonormal triplets also where singular values repeat or vanish (an eigensolver
    may return any basis of such an eigenspace, or mix the ``+sigma`` and ``-sigma`` copies). ``S`` is
    differentiable in A's values (``dS_i = Re(u_i^H dA v_i)``: exact for a simple singular value, the sum over a
    repeated one); the vectors carry no gradient (a loss that reads them raises in its backward pass).
    """
    if isinstance(k, torch.Tensor) and k.dim() == 0 and not (k.is_floating_point() or k.is_complex()):
        k = int(k)
    elif isinstance(k, numbers.Integral) and not isinstance(k, bool):
        k = int(k)
    if "return_info" in options:
        raise InputError("svds: return_info is not taken (svds returns (U, S, Vh) or S); for the eigensolver's report "
                         "call eigsh on the dilation [[0, A], [A^H, 0]] with return_info=True")
    m, n = _check(A, k, which)
    plain = A.detach()
    H = _dilation(plain)
    options.setdefault("properties", "hermitian" if A.dtype.is_complex else "symmetric")
    with torch.no_grad():
        if which == "LM":
            _, X = eigsh(H, k, which="LA", **options)  # the k largest of +-sigma: the top sigmas
            Qu, Qv = _directions(X[:m], k), _directions(X[m:], k)
            P, _, Rh = torch.linalg.svd(Qu.mH @ (plain @ Qv))  # descending
            U, V = Qu @ P, Qv @ Rh.mH
        else:
            _, X = eigsh(H, 2 * k, sigma=0.0, **options)  # +-sigma nearest 0: both copies of the k smallest
            U, V = _smallest(plain, X[:m], X[m:], k)
    coords, slots = A.entries()
    vals = A.values.index_select(-1, slots)
    r, c = coords[0].long(), coords[1].long()
    S = (U.index_select(0, r).conj() * vals.unsqueeze(-1) * V.index_select(0, c)).sum(0)
    S = (S.real if S.is_complex() else S).clamp(min=0)  # a vanishing sigma's u^H A v can round below 0
    if not return_singular_vectors:
        return S
    if A.values.requires_grad and torch.is_grad_enabled():
        U = _VectorsWithoutGradient.apply(U, A.values)
        V = _VectorsWithoutGradient.apply(V, A.values)
    return U, S, V.mH


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
