"""``eigsh``: a few eigenpairs of a symmetric (Hermitian) sparse matrix, generalized ``A v = w M v``
too, through dispatch and the fallback driver, differentiable by the adjoint rules of
``autograd/spectral.py``."""

from __future__ import annotations

import math

from typing import Sequence

import torch

from ...autograd.spectral import EigshHandle, eigsh_function
from ...errors import InputError, NotSymmetricError
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import is_plain
from ...dispatch.options import SpectralOptions
from ...dispatch.plan import make_request, obtain_plan
from .._inputs import check_finite as check_finite_values, check_matrix, describe_sparse
from ..accuracy import default_rtol
from ..properties import detect, normalize_tags
from ._attempts import _Attempts
from ._bordered import BorderedSystem
from ._checks import _POLICIES, _WHICH_SH, _check_common, check_mass_matrix

__all__ = ["eigsh", "eigsh_request"]


def eigsh(
    A: SparseTensor,
    k: int = 6,
    *,
    M: SparseTensor | None = None,
    which: str = "LM",
    sigma: float | None = None,
    tol: float = 0.0,
    maxiter: int | None = None,
    v0: torch.Tensor | None = None,
    backend: str | None = None,
    method: str | None = None,
    properties: str | Sequence[str] | None = None,
    degenerate: str = "raise",
    degenerate_tol: float = 1e-8,
    on_nonconvergence: str = "raise",
    check_finite: bool = True,
    dense_max: int | None = None,
    return_info: bool = False,
    cache: bool = True,
):
    """``k`` eigenpairs of a symmetric (Hermitian) sparse ``A``: ``A v = w v``, or ``A v = w M v``
    with ``M`` symmetric positive definite on A's device.

    ``which``: "LA"/"SA" (largest/smallest algebraic), "LM"/"SM" (magnitude); with ``sigma`` the
    eigenvalues nearest ``sigma`` (shift-invert). Returns ``(w, V)``: ``w`` ascending, real,
    shape ``(*batch, k)``; ``V`` ``(*batch, n, k)`` with ``V^H M V = I``. Differentiable in A's
    (and M's) values: eigenvalue gradients cost nothing extra, each eigenvector that receives a
    gradient costs one bordered solve. Eigenvector gradients at repeated eigenvalues do not
    exist: ``degenerate="raise"`` (default) raises :class:`DegenerateEigenvalueError`,
    ``"warn"``/``"ignore"`` drop the coupling between the close pair.

    Methods (``method=``): "dense" (torch, small n), "lanczos" (torch, any device), "lobpcg"
    (torch, SPD), "arpack" (scipy plugin). Symmetry is checked (detected) unless ``properties``
    says so; a non-symmetric A raises :class:`NotSymmetricError` (use :func:`eigs`).
    """
    A = check_matrix(A, "eigsh", square=True)
    _check_common(A, k, which, _WHICH_SH, tol, maxiter, v0, "eigsh")
    for name, val, allowed in (("degenerate", degenerate, _POLICIES), ("on_nonconvergence", on_nonconvergence, _POLICIES)):
        if val not in allowed:
            raise InputError(f"eigsh: {name} must be one of {allowed}, got {val!r}")
    if sigma is not None and (not isinstance(sigma, (int, float)) or isinstance(sigma, bool)):
        raise InputError(f"eigsh: sigma must be a real number or None, got {sigma!r}")
    if sigma is not None and not math.isfinite(sigma):
        raise InputError(f"eigsh: sigma must be finite (the eigenvalues nearest it are wanted), got {sigma!r}")
    if M is not None:
        M = check_matrix(M, "eigsh (M)", square=True)
        if tuple(M.format_shape) != tuple(A.format_shape) or M.dtype != A.dtype or M.device != A.device:
            raise InputError(f"eigsh: M must match A in shape, dtype and device; A is {tuple(A.format_shape)} {A.dtype} "
                             f"on {A.device}, M is {tuple(M.format_shape)} {M.dtype} on {M.device}")
        if M.batch_shape and tuple(M.batch_shape) != tuple(A.batch_shape):
            raise InputError(f"eigsh: M's value batch {tuple(M.batch_shape)} must match A's {tuple(A.batch_shape)} or be empty")
    if check_finite and is_plain(A.values):
        check_finite_values(A, None, "eigsh")
    if M is not None:
        if check_finite and is_plain(M.values):
            check_finite_values(M, None, "eigsh (M)")
        check_mass_matrix(M, "eigsh")
    request = eigsh_request(A, M, k, which, sigma, tol, maxiter, backend, method, properties, dense_max)
    state, offer, table = obtain_plan("eigsh", A, request, cache=cache)
    call = {"k": k, "which": which, "sigma": sigma, "tol": float(tol), "maxiter": maxiter,
            "v0": None if v0 is None else v0.detach().to(dtype=A.dtype, device=A.device)}
    attempts = _Attempts("eigsh", A, request, state, offer, table, cache=cache, policy=on_nonconvergence,
                         contract=default_rtol(A.dtype) if tol == 0 else None)
    handle = EigshHandle(state, A.detach(), None if M is None else M.detach(), call, degenerate, degenerate_tol,
                         attempts=attempts, bordered=BorderedSystem)
    mvalues = M.values if M is not None else A.values.new_zeros(0)
    w, V = eigsh_function(A.values, mvalues, handle)
    if return_info:
        return w, V, attempts.info()
    return w, V

def eigsh_request(A, M, k, which, sigma, tol, maxiter, backend, method, properties, dense_max):
    tags = normalize_tags(properties)
    props = tags if tags is not None else detect(A)
    if "nonsymmetric" in props:
        raise NotSymmetricError(
            "eigsh needs a symmetric (Hermitian) matrix and A is not symmetric (entries differ from the transpose "
            "beyond 1e-12 relative); use sparsetorch.eigs for general matrices, or pass properties='symmetric' "
            "if the asymmetry is rounding you want ignored"
        )
    options = SpectralOptions(backend=backend, method=method, k=k, which=which, sigma=sigma, tol=tol, maxiter=maxiter,
                              dense_max=dense_max, generalized=M is not None)
    operands = (describe_sparse(A),) + ((describe_sparse(M),) if M is not None else ())
    return make_request("eigsh", operands, props, options)
