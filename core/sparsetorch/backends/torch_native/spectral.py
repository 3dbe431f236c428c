"""Eigen-solvers and determinants of the torch backend (any device).

- :class:`DenseEigPlan`: ``torch.linalg.eigh`` / ``eig`` / ``slogdet`` on the dense matrix (small n;
  the generalized symmetric-definite problem through the Cholesky factor of M).
- :class:`~.lanczos.LanczosPlan` (``lanczos.py``): thick-restart Lanczos with full
  reorthogonalization, shift-invert through :class:`sparsetorch.Solver`.
- :class:`LobpcgPlan`: ``torch.lobpcg`` (extremal eigenpairs of SPD matrices, generalized too).

Also what the plans share: Ritz-value selection by ARPACK's ``which``, value-batch helpers, the
time budget of an attempt, and the certification of a mass matrix M.
"""

from __future__ import annotations

import time

import torch

from ...errors import IndefiniteMatrixError, InputError
from ...ops.info import IterationResult, Status
from ...tensor import SparseTensor

__all__ = ["DenseEigPlan", "LobpcgPlan", "select_ritz", "certify_mass"]


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.empty((), dtype=dtype).real.dtype


def select_ritz(theta: torch.Tensor, k: int, which: str) -> torch.Tensor:
    """Indices of the ``k`` wanted values of ``theta`` (real), by ARPACK's ``which``."""
    if which == "LA":
        key = -theta
    elif which == "SA":
        key = theta
    elif which == "LM":
        key = -theta.abs()
    elif which == "SM":
        key = theta.abs()
    else:  # "BE" is not offered here
        raise InputError(f"which={which!r} is not supported; use 'LA', 'SA', 'LM' or 'SM'")
    return torch.argsort(key, stable=True)[:k]


def _ascending(w: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(w, stable=True)
    return w[..., order], V[..., order]


def _member_values(values: torch.Tensor, batch_shape: tuple[int, ...]):
    flat = values.reshape(-1, values.shape[-1]) if batch_shape else values.unsqueeze(0)
    return flat


def _stack(outs, batch_shape):
    w = torch.stack([o[0] for o in outs]).reshape(*batch_shape, -1) if batch_shape else outs[0][0]
    V = torch.stack([o[1] for o in outs]).reshape(*batch_shape, *outs[0][1].shape) if batch_shape else outs[0][1]
    return w, V


class DenseEigPlan:
    """Dense eigen-decomposition / determinant (exact to rounding; O(n^3))."""

    backend = "torch"
    method = "dense"
    preconditioner = None

    def __init__(self, A: SparseTensor) -> None:
        self._A = A
        self._dense: torch.Tensor | None = None
        self._lu = None

    def set_values(self, values: torch.Tensor) -> None:
        self._dense = self._A.with_values(values.detach()).to_dense()
        self._lu = None

    # eigsh -----------------------------------------------------------------------------------------
    def eigsh(self, k, *, which="LM", sigma=None, M=None, tol=0.0, maxiter=None, v0=None):
        A = self._dense
        n = A.shape[-1]
        if M is not None:
            Md = M.to_dense()
            L, info = torch.linalg.cholesky_ex(Md)
            if bool((info != 0).any()):
                raise IndefiniteMatrixError(_mass_refusal("dense", info))
            Li_A = torch.linalg.solve_triangular(L, A, upper=False)
            C = torch.linalg.solve_triangular(L, Li_A.mH, upper=False).mH  # L^-1 A L^-H
            w_all, Y = torch.linalg.eigh(C)
            V_all = torch.linalg.solve_triangular(L.mH, Y, upper=True)  # V = L^-H Y: V^H M V = I
        else:
            w_all, V_all = torch.linalg.eigh(A)
        if sigma is not None and which == "LM":
            idx = _nearest(w_all, float(sigma), k)
        else:
            key = w_all if sigma is None else 1.0 / (w_all - sigma)
            flat_w = key.reshape(-1, n)
            idx = torch.stack([select_ritz(row, k, which) for row in flat_w]).reshape(*key.shape[:-1], k)
        w = torch.gather(w_all, -1, idx)
        V = torch.gather(V_all, -1, idx.unsqueeze(-2).expand(*V_all.shape[:-1], k))
        w, order = torch.sort(w, dim=-1, stable=True)
        V = torch.gather(V, -1, order.unsqueeze(-2).expand_as(V))
        return w, V, IterationResult(0, float("nan"), True, Status.DIRECT, "dense eigh")

    # eigs ------------------------------------------------------------------------------------------
    def eigs(self, k, *, which="LM", sigma=None, tol=0.0, maxiter=None, v0=None, left=False):
        A = self._dense
        n = A.shape[-1]
        w_all, V_all = torch.linalg.eig(A)
        key = w_all if sigma is None else 1.0 / (w_all - sigma)
        flat = key.reshape(-1, n)
        idx = torch.stack([_select_complex(row, k, which) for row in flat]).reshape(*key.shape[:-1], k)
        w = torch.gather(w_all, -1, idx)
        V = torch.gather(V_all, -1, idx.unsqueeze(-2).expand(*V_all.shape[:-1], k))
        U = None
        if left:
            # Left eigenvectors are the rows of V_all^-1 (conjugated): u_i^H A = w_i u_i^H.
            Vinv = torch.linalg.inv(V_all)
            U_all = Vinv.mH
            U = torch.gather(U_all, -1, idx.unsqueeze(-2).expand(*U_all.shape[:-1], k))
            U = U / torch.linalg.vector_norm(U, dim=-2, keepdim=True)
        return w, V, U, IterationResult(0, float("nan"), True, Status.DIRECT, "dense eig")

    # logdet ----------------------------------------------------------------------------------------
    def slogdet(self):
        return torch.linalg.slogdet(self._dense)

    def solve(self, B, *, adjoint=False):
        if self._lu is None:
            self._lu = torch.linalg.lu_factor(self._dense)
        LU, piv = self._lu
        X = torch.linalg.lu_solve(LU, piv, B, adjoint=adjoint)
        return X, IterationResult(0, float("nan"), True, Status.DIRECT, "dense LU")

    def inverse_entries(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        inv = torch.linalg.inv(self._dense)
        return inv[..., rows, cols]


def _select_complex(w: torch.Tensor, k: int, which: str) -> torch.Tensor:
    keys = {"LM": -w.abs(), "SM": w.abs(), "LR": -w.real, "SR": w.real, "LI": -w.imag, "SI": w.imag}
    if which not in keys:
        raise InputError(f"which={which!r} is not supported for eigs; use one of {sorted(keys)}")
    return torch.argsort(keys[which], stable=True)[:k]


class _OutOfBudget(Exception):
    """An attempt's time budget is spent (raised from inside its operator)."""


def _bounded(op, deadline: float):
    def apply(X):
        if time.perf_counter() > deadline:
            raise _OutOfBudget
        return op(X)

    return apply


def _mass_refusal(method: str, info: torch.Tensor) -> str:
    from ...ops.spectral import MASS_FIX

    order = int(info.reshape(-1)[(info.reshape(-1) != 0).nonzero()[0, 0]])
    return (f"torch/{method}: M is not positive definite: its Cholesky factorization failed (the leading minor of "
            f"order {order} is not positive definite). {MASS_FIX}")


def certify_mass(M: SparseTensor, method: str) -> None:
    """Raise :class:`IndefiniteMatrixError` unless M (every value-batch member) has a Cholesky
    factorization: dense for n up to ``MASS_DENSE_MAX``, else a sparse Cholesky through
    :class:`sparsetorch.Solver` when a backend offers one (none: M is taken as given, and the
    core's residual check still refuses pairs that are not eigenpairs)."""
    n = M.format_shape[0]
    if n <= MASS_DENSE_MAX:
        _, info = torch.linalg.cholesky_ex(M.to_dense())
        if bool((info != 0).any()):
            raise IndefiniteMatrixError(_mass_refusal(method, info))
        return
    from ...errors import NoBackendError, SparseTorchError
    from ...ops.solve import Solver

    try:
        Solver(M, properties="spd", method="cholesky", cache=True).factorize()
    except NoBackendError:
        return
    except SparseTorchError as exc:
        from ...ops.spectral import MASS_FIX

        raise IndefiniteMatrixError(f"torch/{method}: M is not positive definite: its sparse Cholesky failed "
                                    f"({type(exc).__name__}: {exc}). {MASS_FIX}") from exc


#: Up to this n the mass matrix is certified by a dense Cholesky (n^3 / 3 flops: ~0.1 s at 1000).
MASS_DENSE_MAX = 1024


class LobpcgPlan:
    """``torch.lobpcg``: extremal eigenpairs of a symmetric positive definite matrix."""

    backend = "torch"
    method = "lobpcg"
    preconditioner = None

    def __init__(self, A: SparseTensor) -> None:
        self._batch = tuple(A.batch_shape)
        slots = A.values.shape[-1]
        self._single = A.with_values(torch.zeros(slots, dtype=A.dtype, device=A.device))
        self._values = None

    def set_values(self, values: torch.Tensor) -> None:
        self._values = values.detach()

    def eigsh(self, k, *, which="LM", sigma=None, M=None, tol=0.0, maxiter=None, v0=None, budget=None):
        if sigma is not None or which not in ("LA", "SA"):
            raise InputError("method='lobpcg' finds the largest ('LA') or smallest ('SA') eigenvalues without a shift")
        n = self._single.format_shape[0]
        if M is not None:
            certify_mass(M, "lobpcg")
        flat = _member_values(self._values, self._batch)
        Mt = None if M is None else _torch_coo(M)
        outs, worst = [], 0.0
        for b in range(flat.shape[0]):
            At = _torch_coo(self._single.with_values(flat[b]))
            g = torch.Generator(device="cpu").manual_seed(4321 + b)
            X = torch.randn(n, k, generator=g, dtype=flat.dtype).to(flat.device)
            tol_b = tol if tol and tol > 0 else (1e-6 if flat.dtype == torch.float32 else 1e-11)
            tracker = None
            if budget is not None:
                deadline = time.perf_counter() + float(budget)

                def tracker(_state, deadline=deadline):
                    if time.perf_counter() > deadline:
                        raise _OutOfBudget
            try:
                w, V = torch.lobpcg(At, k=k, B=Mt, X=X, niter=maxiter or 1000, tol=tol_b, largest=(which == "LA"),
                                    tracker=tracker)
            except _OutOfBudget:
                nan = torch.full((k,), float("nan"), dtype=flat.dtype, device=flat.device)
                Vn = torch.full((n, k), float("nan"), dtype=flat.dtype, device=flat.device)
                return (nan.expand(*self._batch, k).clone(), Vn.expand(*self._batch, n, k).clone(),
                        IterationResult(0, float("inf"), False, Status.MAX_ITERATIONS,
                                        f"torch.lobpcg stopped when its budget of {budget:.3g} s was spent"))
            # torch.lobpcg's residual check is loose; report the true relative residual.
            AV = torch.sparse.mm(At, V)
            MV = V if Mt is None else torch.sparse.mm(Mt, V)
            r = torch.linalg.vector_norm(AV - MV * w, dim=0) / w.abs().clamp_min(1e-300)
            worst = max(worst, float(r.max()))
            outs.append(_ascending(w, V))
        w, V = _stack(outs, self._batch)
        ok = worst <= 1e-4 if flat.dtype == torch.float32 else worst <= 1e-6
        status = Status.CONVERGED if ok else Status.MAX_ITERATIONS
        return w, V, IterationResult(0, worst, ok, status, "" if ok else "torch.lobpcg residual above tolerance")


def _torch_coo(A: SparseTensor) -> torch.Tensor:
    coords, vals = A.coordinates()
    n = A.format_shape
    # the coordinates come from a validated pattern: torch's invariant checks add nothing, and their
    # "implicitly disabled" warning reached users of eigsh(method="lobpcg")
    return torch.sparse_coo_tensor(coords, vals, n, check_invariants=False).coalesce()


def _nearest(w_all: torch.Tensor, sigma: float, k: int) -> torch.Tensor:
    """Indices of the ``k`` eigenvalues nearest ``sigma`` (real ``w_all``, ``(*batch, n)``). Distances
    that round to the same number (a ``sigma`` far outside the spectrum: ``1e300 - w`` is ``1e300`` for
    every ``w``) are told apart by the order they have exactly: below ``sigma`` the larger ``w`` is
    nearer, above it the smaller (``1 / (w - sigma)``, the shift-invert key, ties the same way)."""
    dist = (w_all - sigma).abs()
    tie = torch.where(w_all < sigma, -w_all, w_all)
    first = torch.argsort(tie, dim=-1, stable=True)
    second = torch.argsort(dist.gather(-1, first), dim=-1, stable=True)
    return first.gather(-1, second)[..., :k]
