"""Questions about a matrix's structure, as torch-sla's methods ask them: ``A.is_symmetric(atol, rtol)``,
``A.is_hermitian(...)``, ``A.is_positive_definite(method)``.

The dispatcher's own detection (:mod:`.properties`, shown by ``st.explain``) decides with a fixed relative
tolerance and caches per pattern; these take the caller's tolerances and answer one question each. Symmetry is
entrywise ``allclose``: ``|A_ij - A_ji| <= atol + rtol |A_ji|`` for every (i, j) stored in A or in A^T (an
entry stored on one side only is compared with 0), duplicates of an unordered COO summed first.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import IndefiniteMatrixError, InputError, NoBackendError, SingularMatrixError
from ..tensor import SparseTensor
from .properties import detect_cached
from .solve import solve
from .spectral import eigsh

__all__ = ["is_symmetric", "is_hermitian", "is_positive_definite"]


def _square(A: Any, what: str) -> int:
    if not isinstance(A, SparseTensor):
        raise InputError(f"{what}: A must be a SparseTensor, got {type(A).__name__}")
    shape = tuple(A.format_shape)
    if len(shape) != 2:
        raise InputError(f"{what}: A must be a matrix (format shape of 2 dims), got {shape}")
    return shape[0] if shape[0] == shape[1] else -1


def _keyed(keys: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted unique keys and the values summed per key (the last dim of ``vals`` is the entries)."""
    uk, inv = torch.unique(keys, sorted=True, return_inverse=True)
    out = vals.new_zeros(*vals.shape[:-1], uk.numel()).index_add_(-1, inv, vals)
    return uk, out


def _transpose_close(A: SparseTensor, conj: bool, atol: float, rtol: float) -> bool:
    n = A.format_shape[0]
    coords, slots = A.entries()
    vals = A.values.detach().index_select(-1, slots)
    r, c = coords[0].to(torch.int64), coords[1].to(torch.int64)
    ka, va = _keyed(r * n + c, vals)
    kt, vt = _keyed(c * n + r, vals.conj() if conj else vals)
    keys = torch.unique(torch.cat([ka, kt]), sorted=True)
    full_a = vals.new_zeros(*vals.shape[:-1], keys.numel())
    full_t = torch.zeros_like(full_a)
    full_a[..., torch.searchsorted(keys, ka)] = va
    full_t[..., torch.searchsorted(keys, kt)] = vt
    return bool(((full_a - full_t).abs() <= atol + rtol * full_t.abs()).all())


def is_symmetric(A: SparseTensor, atol: float = 1e-8, rtol: float = 1e-5) -> bool:
    """Whether ``A == A^T`` entrywise within ``atol + rtol |A^T|`` (torch-sla's defaults); False for a
    non-square A. For a value batch: whether every member is."""
    if _square(A, "is_symmetric") < 0:
        return False
    return _transpose_close(A, False, atol, rtol)


def is_hermitian(A: SparseTensor, atol: float = 1e-8, rtol: float = 1e-5) -> bool:
    """Whether ``A == A^H`` entrywise within ``atol + rtol |A^H|`` (for real values: :func:`is_symmetric`)."""
    if _square(A, "is_hermitian") < 0:
        return False
    return _transpose_close(A, A.dtype.is_complex, atol, rtol)


def _smallest_eigenvalue_positive(M: SparseTensor, n: int) -> bool:
    w, _ = eigsh(M, 1, which="SA", properties="hermitian" if M.dtype.is_complex else "symmetric")
    u = torch.finfo(M.dtype).eps / 2
    return bool(w[0] > n * u * M.abs().sum(dim=0).amax())  # above n u ||A||_1


def is_positive_definite(A: SparseTensor, method: str = "auto", atol: float = 1e-8, rtol: float = 1e-5) -> bool:
    """Whether a Hermitian ``A`` is positive definite (False when it is not Hermitian within ``atol``/``rtol``).

    ``method``: "gershgorin" (a positive diagonal, weakly dominant rows and a strictly dominant row in every
    connected component: sufficient, so an SPD matrix without dominance answers False), "cholesky" (a sparse
    Cholesky factorization runs to the end: exact up to rounding, the cost of a factorization),
    "eigenvalue" (the smallest eigenvalue by ``eigsh(A, 1, which="SA")`` above ``n u ||A||_1``, u the
    dtype's unit roundoff), or "auto" (default): Gershgorin, and where it cannot tell, Cholesky. For a value
    batch: whether every member is (Cholesky / eigenvalue per member).
    """
    if method not in ("auto", "gershgorin", "cholesky", "eigenvalue"):
        raise InputError(f"is_positive_definite: method must be 'auto', 'gershgorin', 'cholesky' or 'eigenvalue', "
                         f"got {method!r}")
    n = _square(A, "is_positive_definite")
    if len(A.batch_shape) > 1:
        raise InputError(f"is_positive_definite: one batch dimension at most, got batch shape {tuple(A.batch_shape)}")
    if n < 0 or not is_hermitian(A, atol, rtol):
        return False
    if n == 0:
        return True
    if method in ("auto", "gershgorin"):
        if "spd" in detect_cached(A.detach()):
            return True
        if method == "gershgorin":
            return False
    members = [A.detach()] if not A.batch_shape else [A.detach()[i] for i in range(A.batch_shape[0])]
    for M in members:
        if method != "eigenvalue":
            try:
                solve(M, torch.ones(n, dtype=M.dtype, device=M.device), method="cholesky")
                continue
            except (IndefiniteMatrixError, SingularMatrixError):
                return False
            except NoBackendError:
                if method == "cholesky":
                    raise
                # "auto" where no backend factors this matrix by Cholesky (a device, a dtype): the eigenvalue test
        if not _smallest_eigenvalue_positive(M, n):
            return False
    return True
