"""Eigen-solvers and determinants of the torch backend (any device).

- :class:`DenseEigPlan`: ``torch.linalg.eigh`` / ``eig`` / ``slogdet`` on the dense matrix (small n;
  the generalized symmetric-definite problem through the Cholesky factor of M).
- :class:`LanczosPlan`: thick-restart Lanczos with full reorthogonalization (Krylov-Schur form:
  after a restart the kept Ritz vectors carry a diagonal block and the residual vector starts
  the next sweep). Products go through :class:`TorchSpmmPlan`, so it runs wherever torch's sparse
  kernels do (CUDA included). Shift-invert (``sigma``) solves ``(A - sigma I) y = x`` through
  :class:`sparsetorch.Solver`, factorized once per value set.
- :class:`LobpcgPlan`: ``torch.lobpcg`` (extremal eigenpairs of SPD matrices, generalized too).
"""

from __future__ import annotations

import math

import torch

import time

from ...errors import IndefiniteMatrixError, InputError, SingularMatrixError
from ...ops.info import IterationResult, Status
from ...tensor import SparseTensor
from .spmm import TorchSpmmPlan

__all__ = ["DenseEigPlan", "LanczosPlan", "LobpcgPlan", "select_ritz"]


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


class LanczosPlan:
    """Thick-restart Lanczos for a few eigenpairs of a symmetric (Hermitian) sparse matrix."""

    backend = "torch"
    method = "lanczos"
    preconditioner = None

    def __init__(self, A: SparseTensor, ncv: int | None = None) -> None:
        self._batch = tuple(A.batch_shape)
        slots = A.values.shape[-1]
        self._single = A.with_values(torch.zeros(slots, dtype=A.dtype, device=A.device))
        self._spmm = TorchSpmmPlan(self._single)
        self._ncv = ncv
        self._values: torch.Tensor | None = None
        self._shift = None

    def set_values(self, values: torch.Tensor) -> None:
        self._values = values.detach()

    def eigsh(self, k, *, which="LM", sigma=None, M=None, tol=0.0, maxiter=None, v0=None, budget=None):
        if M is not None:
            raise InputError("method='lanczos' solves the standard problem only; for A v = w M v use method='dense' or 'lobpcg' (or the scipy plugin's 'arpack')")
        outs, results = [], []
        flat = _member_values(self._values, self._batch)
        deadline = None if budget is None else time.perf_counter() + float(budget)
        n = self._single.format_shape[0]
        for b in range(flat.shape[0]):
            self._spmm.set_values(flat[b])
            if sigma is None:
                inner = lambda X: self._spmm.apply(X)  # noqa: E731
            else:
                inner = self._shift_invert(flat[b], float(sigma))
            op = inner if deadline is None else _bounded(inner, deadline)
            start = None if v0 is None else (v0.reshape(-1, v0.shape[-1])[b] if v0.dim() > 1 else v0)
            try:
                theta, Y, res = _lanczos(op, n, k, which if sigma is None else _si_which(which),
                                         tol, maxiter, start, self._values.dtype, self._values.device, self._ncv)
            except _OutOfBudget:
                rdt = _real_dtype(self._values.dtype)
                theta = torch.full((k,), float("nan"), dtype=rdt, device=self._values.device)
                Y = torch.full((n, k), float("nan"), dtype=self._values.dtype, device=self._values.device)
                res = IterationResult(0, float("inf"), False, Status.MAX_ITERATIONS,
                                      f"lanczos stopped when its budget of {budget:.3g} s (the estimate of the direct "
                                      f"method it delays) was spent")
                outs.append((theta, Y))
                results.append(res)
                continue
            if sigma is not None:
                theta = sigma + 1.0 / theta
            outs.append(_ascending(theta, Y))
            results.append(res)
        w, V = _stack(outs, self._batch)
        worst = max(results, key=lambda r: (r.converged is False, r.residual))
        return w, V, worst

    def _shift_invert(self, values: torch.Tensor, sigma: float):
        from ...ops._assemble import CooAssembler
        from ...ops.solve import Solver

        n = self._single.format_shape[0]
        if self._shift is None:
            coords, slot = self._single.entries()
            diag = torch.arange(n, device=values.device, dtype=torch.int64)
            self._shift = (CooAssembler(torch.cat([coords[0], diag]), torch.cat([coords[1], diag]), (n, n), values.dtype), slot)
        asm, slot = self._shift
        shifted = asm.tensor(torch.cat([values[slot], torch.full((n,), -sigma, dtype=values.dtype, device=values.device)]))
        solver = Solver(shifted, properties="symmetric", cache=True, **_direct_choice(shifted))
        try:
            solver.factorize()
        except SingularMatrixError as exc:
            raise SingularMatrixError(f"A - sigma*I is singular for sigma={sigma} (sigma is an eigenvalue?): {exc}") from exc
        return solver.solve


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


def _si_which(which: str) -> str:
    # Eigenvalues nearest sigma are the largest |1 / (w - sigma)|.
    return {"LM": "LM", "SM": "LM", "LA": "LA", "SA": "SA"}.get(which, which)


def _default_tol(dtype: torch.dtype) -> float:
    return 1e-5 if _real_dtype(dtype) == torch.float32 else 1e-11


def _lanczos(op, n, k, which, tol, maxiter, v0, dtype, device, ncv, block=None):
    """Block Krylov-Schur (thick-restart block Lanczos) with full, twice-applied reorthogonalization.

    A block of ``b = min(k, 4)`` start vectors finds eigenvalues of multiplicity up to ``b`` (one
    start vector sees one copy of a repeated eigenvalue); before accepting, a fresh random block
    is added to the converged Ritz vectors and the wanted eigenvalues must stay the same. The
    projected matrix is assembled from the reorthogonalization coefficients, so it is the exact
    Rayleigh quotient of the basis. Returns the ``k`` wanted Ritz values and vectors and an
    :class:`IterationResult` whose residual is the largest ``||A y - theta y|| / ||A||_est``.
    """
    rdt = _real_dtype(dtype)
    b = max(1, min(block or min(k, 4), n - k))
    m = ncv or max(2 * k + 2 * b, k + 64)  # clustered spectra (grid Laplacians) need room: measured
    m = b * math.ceil(m / b)
    m = min(m, b * ((n - b) // b))
    if m <= k:
        raise InputError(f"lanczos needs n well above k (n={n}, k={k}); use method='dense'")
    keep = min(m - b, b * math.ceil((k + (m - k) // 2) / b))
    tol = tol if tol and tol > 0 else _default_tol(dtype)
    maxiter = maxiter or max(100, 10 * n // max(m, 1))
    g = torch.Generator(device="cpu").manual_seed(1234)

    def randn(cols):
        return torch.randn(n, cols, generator=g, dtype=rdt).to(dtype=dtype, device=device)

    def orthonormal_block(W, basis):
        """W orthogonalized against ``basis`` (twice) and orthonormalized; rank-deficient columns
        (an invariant subspace was reached) are replaced by random directions, coupling 0."""
        before = torch.linalg.vector_norm(W, dim=0)
        C = basis.mH @ W
        W = W - basis @ C
        if bool((torch.linalg.vector_norm(W, dim=0) < 0.7 * before).any()):  # DGKS: cancellation, so again
            c = basis.mH @ W
            W = W - basis @ c
            C = C + c
        Q, R = torch.linalg.qr(W)
        small = R.diagonal().abs() <= 1e-12 * max(float(R.abs().max()) if R.numel() else 0.0, anorm, 1e-300)
        if bool(small.any()):
            R[small, :] = 0
            fill = randn(int(small.sum()))
            full = torch.cat([basis, Q[:, ~small]], dim=1)
            for _ in range(2):
                fill = fill - full @ (full.mH @ fill)
            Q[:, small] = torch.linalg.qr(fill)[0]
        return Q, R, C

    V = torch.zeros(n, m + b, dtype=dtype, device=device)
    H = torch.zeros(m, m, dtype=dtype, device=device)
    X0 = randn(b)
    if v0 is not None:
        X0[:, 0] = v0.to(dtype=dtype, device=device)
    anorm = 0.0
    V[:, :b] = torch.linalg.qr(X0)[0]
    start, restarts, checked = 0, 0, None
    Rlast = torch.zeros(b, b, dtype=dtype, device=device)
    while True:
        for j in range(start, m, b):
            W = op(V[:, j:j + b])
            Q, R, C = orthonormal_block(W, V[:, : j + b])
            H[: j + b, j:j + b] = C
            H[j:j + b, : j + b] = C.mH
            if j + b < m:
                H[j + b:j + 2 * b, j:j + b] = R
                H[j:j + b, j + b:j + 2 * b] = R.mH
            else:
                Rlast = R
            V[:, j + b:j + 2 * b] = Q
        theta, S = torch.linalg.eigh(0.5 * (H + H.mH))
        anorm = max(anorm, float(theta.abs().max()))
        sel = select_ritz(theta, k, which)
        resid = torch.linalg.vector_norm(Rlast @ S[m - b:m, sel], dim=0)
        scale = max(anorm, torch.finfo(rdt).tiny)
        worst = float(resid.max()) / scale
        restarts += 1
        done = worst <= tol
        if done and checked is not None and not _same(checked, theta[sel], tol * scale * 10):
            done = False  # the fresh block found an eigenvalue the previous pass had missed
        if done and checked is None:
            checked = theta[sel].clone()
            Y = V[:, :m] @ S[:, sel]
            kk = b * math.ceil(k / b)
            order = select_ritz(theta, kk, which)
            Yk = V[:, :m] @ S[:, order]
            V.zero_()
            H.zero_()
            V[:, :kk] = Yk
            H[:kk, :kk] = torch.diag(theta[order].to(dtype))
            V[:, kk:kk + b] = orthonormal_block(randn(b), Yk)[0]
            start = kk
            continue
        if done or restarts >= maxiter:
            Y = V[:, :m] @ S[:, sel]
            status = Status.CONVERGED if done else Status.MAX_ITERATIONS
            reason = "" if done else f"{restarts} restarts of {m} vectors (blocks of {b}) did not reach tol={tol:g}"
            return theta[sel], Y, IterationResult(restarts, worst, done, status, reason)
        checked = None
        # Thick restart: keep the `keep` best Ritz pairs; the residual block continues the basis.
        # Their coupling to it (Rlast times the Ritz vectors' last rows) is recomputed exactly
        # by the next block's reorthogonalization coefficients.
        order = select_ritz(theta, keep, which)
        Vk = V[:, :m] @ S[:, order]
        H.zero_()
        H[:keep, :keep] = torch.diag(theta[order].to(dtype))
        V[:, keep:keep + b] = V[:, m:m + b].clone()
        V[:, :keep] = Vk
        V[:, keep + b:] = 0
        start = keep


def _same(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    return bool(((a.sort().values - b.sort().values).abs() <= atol).all())


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
    return torch.sparse_coo_tensor(coords, vals, n).coalesce()


#: Shift-invert Lanczos needs (A - sigma I)^-1 to working precision: an iterative solve to its
#: default rtol (1e-6) stalls the Lanczos residual near 1e-9 (seen when a Krylov offer came out
#: a few percent cheaper than the dense LU on a 50x50 matrix).
_DIRECT = ("lu", "ldlt", "cholesky", "qr", "dense")


def _direct_choice(shifted: SparseTensor) -> dict:
    """The cheapest direct (backend, method) for solves with ``shifted``; without one (a large
    matrix on a GPU with no direct solver installed), the default choice at rtol 1e-12."""
    from ...ops.explain import explain

    probe = torch.zeros(shifted.shape[-1], 1, dtype=shifted.dtype, device=shifted.device)
    table = explain("solve", shifted, probe, properties="symmetric")
    for row in table.rows:
        if row.seconds is not None and row.method in _DIRECT:
            return {"backend": row.backend, "method": row.method}
    return {"rtol": 1e-12}
