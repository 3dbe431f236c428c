"""``eigs``: a few eigenpairs of a general square sparse matrix, through dispatch and the fallback
driver, with eigenvalue gradients (the rule is in ``autograd/spectral.py``)."""

from __future__ import annotations

import cmath

import torch

from ...autograd.spectral import EigsHandle, eigs_function
from ...errors import InputError
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import is_plain
from ...dispatch.options import SpectralOptions
from ...dispatch.plan import make_request, obtain_plan
from .._inputs import check_finite as check_finite_values, check_matrix, describe_sparse
from ..accuracy import default_rtol
from ._attempts import _Attempts
from ._checks import _POLICIES, _WHICH_GE, _check_common, magnitude_scale, empty_batch

__all__ = ["eigs", "eigs_request"]


def eigs_request(A, k, which, sigma, tol, maxiter, backend, method, dense_max):
    options = SpectralOptions(backend=backend, method=method, k=k, which=which, sigma=sigma, tol=tol, maxiter=maxiter,
                              dense_max=dense_max)
    return make_request("eigs", (describe_sparse(A),), frozenset(), options)


def eigs(
    A: SparseTensor,
    k: int = 6,
    *,
    which: str = "LM",
    sigma: complex | None = None,
    tol: float = 0.0,
    maxiter: int | None = None,
    v0: torch.Tensor | None = None,
    backend: str | None = None,
    method: str | None = None,
    on_nonconvergence: str = "raise",
    check_finite: bool = True,
    dense_max: int | None = None,
    return_info: bool = False,
    cache: bool = True,
):
    """``k`` eigenpairs of a general square sparse ``A``: ``A v = w v`` (complex ``w``, ``V``).

    ``which``: "LM", "SM", "LR", "SR", "LI", "SI" (ARPACK's). Returns ``(w, V)`` with ``w`` of
    shape ``(*batch, k)`` and unit-norm right eigenvectors ``V`` ``(*batch, n, k)``, complex.
    Differentiable in A's values through the eigenvalues (left and right eigenvectors:
    ``dw = u^H dA v / u^H v``); eigenvector gradients raise. Methods: "dense" (torch), "arpack"
    (scipy plugin).
    """
    A = check_matrix(A, "eigs", square=True)
    _check_common(A, k, which, _WHICH_GE, tol, maxiter, v0, "eigs")
    if on_nonconvergence not in _POLICIES:
        raise InputError(f"eigs: on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
    if sigma is not None and (isinstance(sigma, bool) or not isinstance(sigma, (int, float, complex))
                              or not cmath.isfinite(sigma)):
        raise InputError(f"eigs: sigma must be a finite number or None (the eigenvalues nearest it are wanted), "
                         f"got {sigma!r}")
    if check_finite and is_plain(A.values):
        check_finite_values(A, None, "eigs")
    nothing = empty_batch(A, k, True, return_info)
    if nothing is not None:
        return nothing
    sa = magnitude_scale(A)
    if sa != 1.0:
        # entries past the range where squared norms are safe: the eigenvalues of s A (an exact power
        # of four), divided by s; unit eigenvectors unchanged
        out = eigs(A.with_values(A.values * sa), k, which=which, sigma=None if sigma is None else sigma * sa, tol=tol,
                   maxiter=maxiter, v0=v0, backend=backend, method=method, on_nonconvergence=on_nonconvergence,
                   check_finite=False, dense_max=dense_max, return_info=return_info, cache=cache)
        w = out[0] / sa
        return (w, out[1], out[2]) if return_info else (w, out[1])
    request = eigs_request(A, k, which, sigma, tol, maxiter, backend, method, dense_max)
    state, offer, table = obtain_plan("eigs", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach()}
    attempts = _Attempts("eigs", A, request, state, offer, table, cache=cache, policy=on_nonconvergence,
                         contract=default_rtol(A.dtype) if tol == 0 else None)
    handle = EigsHandle(attempts, call, left=A.requires_grad and torch.is_grad_enabled(), A=A.detach())
    w, V = eigs_function(A.values, handle)
    if return_info:
        return w, V, attempts.info()
    return w, V
