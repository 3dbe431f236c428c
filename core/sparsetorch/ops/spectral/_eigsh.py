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
from ..properties import detect_cached, normalize_tags, semidefinite
from ._attempts import _Attempts
from ._bordered import BorderedSystem
from ._checks import _POLICIES, _WHICH_SH, _check_common, check_mass_matrix, magnitude_scale, empty_batch

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
    gradient costs one bordered solve. Eigenvector gradients at repeated eigenvalues exist only
    for losses of the whole eigenspace (a copy outside the k computed, or one computed and not
    read, makes the loss depend on which vectors were returned): otherwise ``degenerate="raise"``
    (default) raises :class:`DegenerateEigenvalueError`, ``"warn"``/``"ignore"`` drop the
    coupling between the close pair (or to the missing copy).

    Methods (``method=``): "dense" (torch, small n), "lanczos" (torch, any device), "lobpcg"
    (torch, SPD), "arpack" (scipy plugin). Without ``method=`` the capable methods are tried in
    turn; "dense" is offered up to ``dense_max`` unknowns (2048 by default) and, with no
    ``dense_max`` given, still answers up to ``DENSE_LAST_RESORT_MAX`` (4096) when every other
    method failed (docs/spectral.md). Symmetry is checked (detected) unless ``properties``
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
    nothing = empty_batch(A, k, False, return_info)
    if nothing is not None:
        return nothing
    if M is not None:
        if check_finite and is_plain(M.values):
            check_finite_values(M, None, "eigsh (M)")
        check_mass_matrix(M, "eigsh")
    sa, sm = magnitude_scale(A), magnitude_scale(M)
    if sa != 1.0 or sm != 1.0:
        # entries past the range where squared norms are safe: solve (s_a A) v = w' (s_m M) v, exact
        # powers of four, then w = w' s_m / s_a and V = V' sqrt(s_m) (differentiable through both)
        out = eigsh(A.with_values(A.values * sa), k, M=None if M is None else M.with_values(M.values * sm),
                    which=which, sigma=None if sigma is None else sigma * sa / sm, tol=tol, maxiter=maxiter, v0=v0,
                    backend=backend, method=method, properties=properties, degenerate=degenerate,
                    degenerate_tol=degenerate_tol, on_nonconvergence=on_nonconvergence, check_finite=False,
                    dense_max=dense_max, return_info=return_info, cache=cache)
        w, V = out[0] * (sm / sa), (out[1] * math.sqrt(sm) if sm != 1.0 else out[1])
        return (w, V, out[2]) if return_info else (w, V)
    if which == "SM" and sigma is None and M is None:
        # for a positive semidefinite A the smallest magnitudes are the smallest algebraic eigenvalues; SM
        # goes through shift-invert at 0, which a singular PSD matrix (a graph Laplacian) cannot factor:
        # it raised "pass sigma", and sigma=0 raised singular (session 20's sweep)
        tags = normalize_tags(properties)
        if ("spd" in tags) if tags is not None else semidefinite(A):  # detected spd, or semi-definite by dominance
            which = "SA"
    if M is None and (sigma is None or which == "LM"):
        empty = _empty_lines(A)
        if empty is not None:
            return _deflated(A, empty, k, which, sigma, dict(
                tol=tol, maxiter=maxiter, backend=backend, method=method, properties=properties, degenerate=degenerate,
                degenerate_tol=degenerate_tol, on_nonconvergence=on_nonconvergence, check_finite=False,
                dense_max=dense_max, return_info=return_info, cache=cache), v0)
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
    props = tags if tags is not None else detect_cached(A)
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


def _empty_lines(A: SparseTensor) -> torch.Tensor | None:
    """The unknowns whose row and column store nothing (isolated nodes of a graph), as a bool mask,
    or None when there are none (or when every line is empty: the zero matrix, answered as it is).
    Pattern-only: kept in the pattern's derived cache (one scan per pattern, not per call)."""
    cache = A._cache
    key = ("eigsh", "empty_lines")
    if key in cache:
        return cache[key]
    n = A.format_shape[0]
    coords, _slot = A.entries()
    used = torch.zeros(n, dtype=torch.bool, device=coords.device)
    if coords.shape[-1]:
        used[coords[0]] = True
        used[coords[1]] = True
    empty = None if bool(used.all()) or not bool(used.any()) else ~used
    cache[key] = empty
    return empty


def _deflated(A: SparseTensor, empty: torch.Tensor, k: int, which: str, sigma: float | None, kw: dict,
              v0: torch.Tensor | None):
    """``eigsh`` of a symmetric A with structurally empty lines: each empty line ``i`` is an exact
    eigenpair ``(0, e_i)``, decoupled from the rest. Single-vector Krylov methods find a repeated
    eigenvalue once: on a graph Laplacian with isolated nodes ARPACK's ``which="SA"`` returned one 0
    where there were four (session 20's sweep). So the eigenpairs come from the matrix without those
    lines (the k wanted ones of it) and the ``(0, e_i)``, merged by ``which``: the k wanted of the union
    are among them whatever the order. Differentiable in A's values (the reduced matrix is made from
    them; the structural zeros have no gradient: ``e_i^T dA e_i`` is 0 on the pattern)."""
    n = A.format_shape[0]
    keep = ~empty
    z = int(empty.sum())
    n_r = n - z
    new = torch.cumsum(keep.to(torch.int64), 0) - 1
    coords, slot = A.entries()
    vals = A.values.index_select(-1, slot)
    Ar = SparseTensor.from_coo(vals, new[coords[0]], new[coords[1]], shape=(n_r, n_r))
    k_r = min(k, n_r)
    v0_r = None if v0 is None else v0[..., keep]
    out = eigsh(Ar, k_r, which=which, sigma=sigma, v0=v0_r, **kw)
    w_r, V_r = out[0], out[1]
    batch = tuple(w_r.shape[:-1])
    Vf = V_r.new_zeros(*batch, n, k_r).index_copy(-2, keep.nonzero().squeeze(-1), V_r)
    E = torch.zeros(n, z, dtype=V_r.dtype, device=V_r.device)
    E[empty.nonzero().squeeze(-1), torch.arange(z, device=V_r.device)] = 1
    W = torch.cat([w_r, w_r.new_zeros(*batch, z)], -1)
    V = torch.cat([Vf, E.expand(*batch, n, z)], -1)
    with torch.no_grad():
        if sigma is not None:
            key = (W - sigma).abs()
        else:
            key = {"LA": -W, "SA": W, "LM": -W.abs(), "SM": W.abs()}[which]
        pick = torch.argsort(key, dim=-1, stable=True)[..., :k]
        order = torch.argsort(W.gather(-1, pick), dim=-1, stable=True)
        pick = pick.gather(-1, order)
    w = W.gather(-1, pick)
    V = V.gather(-1, pick.unsqueeze(-2).expand(*batch, n, pick.shape[-1]))
    if kw.get("return_info"):
        info = out[2]
        note = (f"{z} structurally empty rows and columns (eigenvalue 0, eigenvector e_i each) deflated; the other "
                f"eigenpairs from the {n_r} x {n_r} rest")
        try:
            info.extra["deflated"] = note  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            pass
        return w, V, info
    return w, V

