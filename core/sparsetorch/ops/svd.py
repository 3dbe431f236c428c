"""Partial singular value decomposition and the 2-norm condition number of a sparse matrix.

``svds(A, k)`` answers through :func:`~sparsetorch.eigsh` of the Hermitian dilation

    H = [[0, A], [A^H, 0]]      ((m + n) x (m + n), the same nonzeros twice),

whose eigenvalues are ``+sigma_i``, ``-sigma_i`` (i <= min(m, n)) and ``|m - n|`` zeros, with eigenvectors
``[u_i; +-v_i] / sqrt(2)``. The dilation keeps the accuracy of the singular values (``A^H A`` would square the
condition number: a singular value near ``sqrt(u) sigma_max`` is lost there and not here) and runs on any device
and dtype eigsh takes.

The smallest singular values (``which="SM"``) of a square ``A`` come from shift-invert just below 0 on the
dilation (at ``-sqrt(u) ||A||_F``, clear of a singular A's exact zeros): the ``2k`` eigenvalues nearest it are the
pairs ``+-sigma`` (or one copy of more of them: both halves of one copy give ``u`` and ``v``), whose eigenvectors
span ``[u; 0]`` and ``[0; v]``. Where that gives fewer than ``k`` checked triplets (a null space of dimension above
``k``: eigsh may return any basis of the dilation's null space, e.g. all ``[u; 0]``) or fails, and for a non-square
``A`` (whose dilation has ``|m - n|`` zero eigenvalues that are not singular values), they come from the smaller
Gram matrix ``G = A^H A`` (or ``A A^H``, formed by :func:`~sparsetorch.spgemm`; refused where its fill would be
large): eigsh's smallest eigenvectors of ``G`` give the right subspace, the singular values are recomputed from
``A`` itself (the SVD of ``A V``, so not squared), and the zero ones get left vectors from the null space of
``A^H`` (eigsh of ``A A^H``), so that every triplet meets ``A v = s u`` and ``A^H u = s v``. (SciPy's ``svds``
takes the Gram matrix's operator throughout, and can miss a zero singular value of a tall matrix.) The largest
singular values of a strongly rectangular ``A`` (one side ``GRAM_LM_ASPECT`` times the other, the Gram matrix's fill
small) take the Gram route too: its Lanczos vectors are ``min(m, n)`` long instead of ``m + n``.

Either way the eigenvectors only give the two subspaces; a Rayleigh-Ritz step (the SVD of the small
``Q_u^H A Q_v``) turns them into orthonormal triplets with nonnegative singular values, also where singular
values repeat or vanish (an eigensolver may return any basis of such an eigenspace, or mix the two copies).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..errors import InputError, NotConvergedError, SingularMatrixError
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
    ``[u; 0]``), :class:`~sparsetorch.NotConvergedError` says so instead of a wrong triplet (and :func:`svds`
    takes the Gram route)."""
    Qu, Qv = _span(Xu), _span(Xv)
    P, S, Rh = torch.linalg.svd(Qu.mH @ (A @ Qv), full_matrices=False)
    return _checked(A, Qu @ P, Qv @ Rh.mH, S, k, "the dilation's eigenvectors nearest 0")


#: the most entries the Gram matrix of svds(which="SM") may have (its bound: the sum of the squared counts of A's
#: rows, for A^H A); past it the Gram route is refused, saying what to do instead
GRAM_MAX_ENTRIES = 50_000_000


def _gram(A: SparseTensor) -> SparseTensor:
    """``A^H A`` (``n x n``, Hermitian positive semidefinite) by :func:`~sparsetorch.spgemm`, after a bound of its
    fill (each row of A with ``c`` entries adds at most ``c^2``)."""
    from .spgemm import spgemm  # noqa: PLC0415

    bound = _gram_bound(A)
    if bound > GRAM_MAX_ENTRIES:
        m, n = A.format_shape
        raise InputError(f"svds(which='SM'): the Gram matrix A^H A of this ({m}, {n}) A may hold up to {bound:.3g} "
                         f"entries (its rows' counts squared; the limit is GRAM_MAX_ENTRIES = {GRAM_MAX_ENTRIES:.3g}); "
                         f"for a square A the dilation is used first, and for the smallest singular values of a "
                         f"non-square one with dense rows take torch.linalg.svd(A.to_dense()) or eigsh on an operator")
    return spgemm(A.mH, A)


def _gram_bound(A: SparseTensor) -> float:
    """A bound of the entries of ``A^H A``: the sum over A's rows of their entry counts squared."""
    coords, _ = A.entries()
    counts = torch.bincount(coords[0].to(torch.int64), minlength=A.format_shape[0]).to(torch.float64)
    return float((counts * counts).sum())


def _gram_route(A: SparseTensor, k: int, options: dict, largest: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, V)`` of ``A``'s ``k`` smallest (or ``largest``) singular values (S descending) through the smaller Gram
    matrix (module docstring): ``V`` from eigsh of ``A^H A`` (for ``m >= n``; a wide A is handled as ``A^H``), then
    the SVD of ``A V`` gives the values and the left vectors, and the values at rounding level get left vectors from
    the null space of ``A^H`` (eigsh of ``A A^H``). Every triplet is checked to an SVD's residual (:func:`_checked`)."""
    m, n = A.format_shape
    if m < n:
        V, U = _gram_route(A.mH, k, options, largest)
        return U, V
    opts = {key: val for key, val in options.items() if key != "properties"}
    kind = "hermitian" if A.dtype.is_complex else "symmetric"
    # sqrt(u) ||A||_F^2 >= sqrt(u) ||G||: G + tau I is positive definite, well clear of rounding, and shift-invert
    # below 0 gives G's smallest eigenvalues in order
    tau = _shift(A) * float(torch.linalg.vector_norm(A.values))
    if largest:
        _, W = eigsh(_gram(A), k, which="LA", properties=kind, **opts)
    else:
        _, W = eigsh(_gram(A), k, sigma=-tau, properties=kind, **opts)
    P, S, Rh = torch.linalg.svd(A @ W, full_matrices=False)  # descending
    U, V = P, W @ Rh.mH
    tol = _residual_tol(A, S.dtype)
    zero = torch.nonzero(S <= tol).squeeze(-1)
    if zero.numel():
        # A v = 0 there: u must solve A^H u = 0, which P's columns need not (they are only orthogonal to A V)
        _, Z = eigsh(_gram(A.mH), int(zero.numel()), sigma=-tau, properties=kind, **opts)
        keep = U[:, S > tol]
        Z = Z - keep @ (keep.mH @ Z)
        Z, _ = torch.linalg.qr(Z)
        U = U.clone()
        U[:, zero] = Z
    return _checked(A, U, V, S, k, "the Gram matrix's eigenvectors")


def _shift(A: SparseTensor) -> float:
    """``sqrt(u) ||A||_F``: a shift below 0 that makes the dilation (and, squared, the Gram matrix) nonsingular
    for shift-invert without reordering the eigenvalues wanted (a singular A's exact zeros made the shift-invert
    factorization at 0 fail, and eigsh fell back to a dense eigensolver of the whole dilation)."""
    norm = float(torch.linalg.vector_norm(A.values)) if A.values.numel() else 0.0
    return torch.finfo(A.values.real.dtype if A.dtype.is_complex else A.dtype).eps ** 0.5 * max(norm, 1e-300)


def _residual_tol(A: SparseTensor, dtype: torch.dtype) -> float:
    """An SVD's residual for ``A``: ``sqrt(u) ||A||`` (with ``||A||`` bounded by its largest entry times sqrt of
    its larger side)."""
    scale = float(A.values.abs().amax()) * max(A.format_shape) ** 0.5 if A.values.numel() else 1.0
    return torch.finfo(dtype).eps ** 0.5 * max(scale, torch.finfo(dtype).tiny)


def _checked(A: SparseTensor, U: torch.Tensor, V: torch.Tensor, S: torch.Tensor, k: int,
             source: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest of the triplets ``(U, S, V)`` (S descending) whose residuals ``||A v - s u||`` and
    ``||A^H u - s v||`` are an SVD's; :class:`~sparsetorch.NotConvergedError` where fewer than ``k`` are."""
    r1 = torch.linalg.vector_norm(A @ V - U * S, dim=0)
    r2 = torch.linalg.vector_norm(A.mH @ U - V * S, dim=0)
    idx = torch.nonzero(torch.maximum(r1, r2) <= _residual_tol(A, S.dtype)).squeeze(-1)
    if idx.numel() < k:
        raise NotConvergedError(f"svds: of {U.shape[1]} candidates from {source}, {idx.numel()} give "
                                f"singular triplets (residual within sqrt(u) ||A||), fewer than k={k}; take the dense "
                                f"torch.linalg.svd(A.to_dense()) if A is small enough")
    keep = idx[-k:]
    return U[:, keep], V[:, keep]


def _largest(A: SparseTensor, k: int, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, V)`` of the ``k`` largest singular values (S descending) from the dilation's ``k`` largest eigenpairs
    (the top ``+sigma``), by a Rayleigh-Ritz step on the halves' leading directions."""
    m = A.format_shape[0]
    _, X = eigsh(_dilation(A), k, which="LA", **options)
    Qu, Qv = _directions(X[:m], k), _directions(X[m:], k)
    P, _, Rh = torch.linalg.svd(Qu.mH @ (A @ Qv))  # descending
    return Qu @ P, Qv @ Rh.mH


#: svds(which="LM") of a matrix with one side at least this many times the other goes through the Gram matrix of the
#: smaller side (where its fill is small): Lanczos vectors of min(m, n) instead of m + n, and the squared spectrum's
#: wider gaps at the top (20000 x 3000, 0.1 %: 0.12 s against the dilation's 0.61 s; SciPy's svds 0.11 s)
GRAM_LM_ASPECT = 4
#: ... and the Gram matrix's fill bound (:func:`_gram`) within this many times A's entries
GRAM_LM_FILL = 8


def _gram_first(A: SparseTensor) -> bool:
    m, n = A.format_shape
    if max(m, n) < GRAM_LM_ASPECT * min(m, n):
        return False
    return _gram_bound(A if m >= n else A.mH) <= GRAM_LM_FILL * max(int(A.entries()[1].numel()), 1)


def svds(A: SparseTensor, k: int = 6, *, which: str = "LM", return_singular_vectors: bool = True,
         **options: Any) -> Any:
    """``k`` singular triplets of a sparse ``A`` (``m`` x ``n``), SciPy's ``svds`` (torch-sla's ``A.svd(k)``).

    ``which``: "LM" the largest singular values, "SM" the smallest (a square ``A`` by shift-invert at 0 on the
    dilation, a non-square one, a null space above ``k`` or an exact zero pivot through the smaller Gram matrix:
    module docstring; zero singular values come with vectors from the null spaces; every "SM" triplet is checked to
    an SVD's residual, else :class:`~sparsetorch.NotConvergedError` says to use the dense SVD). Returns
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
    options.setdefault("properties", "hermitian" if A.dtype.is_complex else "symmetric")
    with torch.no_grad():
        if which == "LM" and _gram_first(plain):
            try:
                U, V = _gram_route(plain, k, options, largest=True)
            except NotConvergedError:
                U, V = _largest(plain, k, options)
        elif which == "LM":
            U, V = _largest(plain, k, options)
        elif m == n:
            try:
                # +-sigma nearest -tau: both copies of the k smallest, or one copy of each (both halves of one copy
                # give u and v); tau keeps the factorization of a singular A's dilation away from its exact zeros
                _, X = eigsh(_dilation(plain), 2 * k, sigma=-_shift(plain), **options)
                U, V = _smallest(plain, X[:m], X[m:], k)
            except (NotConvergedError, SingularMatrixError):  # a null space above k, an exact zero pivot
                U, V = _gram_route(plain, k, options)
        else:
            U, V = _gram_route(plain, k, options)
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
