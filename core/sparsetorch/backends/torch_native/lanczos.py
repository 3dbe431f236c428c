"""Thick-restart Lanczos of the torch backend (any device): :class:`LanczosPlan`.

Block Krylov-Schur form with full reorthogonalization: after a restart the kept Ritz vectors
carry a diagonal block and the residual block starts the next sweep. Products go through
:class:`TorchSpmmPlan`, so it runs wherever torch's sparse kernels do (CUDA included).
Shift-invert (``sigma``) solves ``(A - sigma I) y = x`` through :class:`sparsetorch.Solver`,
factorized once per value set, with a direct method (:func:`_direct_choice`).
"""

from __future__ import annotations

import math
import time

import torch

from ...errors import InputError, SingularMatrixError
from ...ops.info import IterationResult, Status
from ...tensor import SparseTensor
from .spectral import _OutOfBudget, _ascending, _bounded, _member_values, _real_dtype, _stack, select_ritz
from .spmm import TorchSpmmPlan

__all__ = ["LanczosPlan"]


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
            raise InputError("method='lanczos' solves the standard problem only; for A v = w M v use method='dense' or "
                             "'lobpcg' (or the scipy plugin's 'arpack')")
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
                theta, Y, res = _lanczos_copies(op, n, k, which if sigma is None else _si_which(which),
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


def _si_which(which: str) -> str:
    # Eigenvalues nearest sigma are the largest |1 / (w - sigma)|.
    return {"LM": "LM", "SM": "LM", "LA": "LA", "SA": "SA"}.get(which, which)


def _default_tol(dtype: torch.dtype) -> float:
    return 1e-5 if _real_dtype(dtype) == torch.float32 else 1e-11


def _lanczos_copies(op, n, k, which, tol, maxiter, v0, dtype, device, ncv):
    """:func:`_lanczos` with a block as wide as the answer's largest cluster needs: a block of ``b`` vectors
    finds at most ``b`` copies of a repeated eigenvalue, so an answer holding ``b`` copies of one value may
    be missing more (3 identical grid Laplacians: 4 of 5 copies returned, the 5th replaced by the next
    eigenvalue, every pair passing the residual checks; session 23's sweep). Such an answer runs again with
    a block of twice the copies (at most ``k``: ``k`` copies of one value are the answer whatever the
    multiplicity)."""
    b = None
    while True:
        theta, Y, res = _lanczos(op, n, k, which, tol, maxiter, v0, dtype, device, ncv, block=b)
        used = max(1, min(b or min(k, 4), n - k))
        if not res.converged or used >= min(k, n - k):
            return theta, Y, res
        copies = _most_copies(theta, tol)
        if copies < used:
            return theta, Y, res
        b = min(k, n - k, 2 * copies)


def _most_copies(theta: torch.Tensor, tol: float) -> int:
    """The largest number of Ritz values of ``theta`` within one cluster (neighbours within 10 tol of the
    largest magnitude)."""
    if theta.numel() < 2:
        return theta.numel()
    t = theta.sort().values
    near = (t[1:] - t[:-1]) <= 10 * (tol if tol and tol > 0 else _default_tol(t.dtype)) * max(float(t.abs().max()), 1e-300)
    best = run = 1
    for close in near.tolist():
        run = run + 1 if close else 1
        best = max(best, run)
    return best


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
