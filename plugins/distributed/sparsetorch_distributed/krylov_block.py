"""Krylov kernels for a block of right-hand sides solved together: one reduction per step for
every column.

Each column runs its own recurrence (the same method as the one-column kernels of
:mod:`.krylov`), but the columns move in lockstep: one block product ``A(P)`` (one halo exchange
carrying every column) and one all_reduce of the per-column scalars where the one-column kernel
reduces one column's. A column whose residual meets its tolerance is frozen (its step length is
zero from then on); the block stops when every column has converged, or when any column breaks
down (the caller's method fallback then takes the whole block). Per-column scalars are float64
CPU tensors of shape ``(k,)``, identical on every rank (they come from reductions).

``tol`` is a ``(k,)`` tensor (``max(rtol ||b_j||, atol)``). ``M`` takes and returns ``(n, k)``.
The history records the worst column's residual over its tolerance scale (the caller divides);
``callback(it, res)`` gets the per-column residual norms ``(k,)`` (the caller's wrapper reduces them).
"""

from __future__ import annotations

import math

import torch

from sparsetorch.backend import Status

from .krylov import KrylovResult, Reducer

__all__ = ["cg_block", "bicgstab_block", "minres_block", "gmres_block", "BLOCK_METHODS"]

F64 = torch.float64


def _cs(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Per-column local dot products ``(k,)``."""
    return (X * Y).sum(0)


def _red(red: Reducer, parts: list[torch.Tensor]) -> torch.Tensor:
    """All-reduce several ``(k,)`` local vectors in one message; ``(len(parts), k)`` float64 CPU."""
    k = parts[0].numel()
    return red.vec(torch.cat([p.reshape(-1) for p in parts])).to(F64).cpu().reshape(len(parts), k)


def _dev(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(dtype=like.dtype, device=like.device)


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def cg_block(A, B, X, M, tol, maxiter, red: Reducer, callback=None):
    R = B - A(X)
    Z = M(R) if M is not None else R
    P = Z.clone()
    t = _red(red, [_cs(R, Z), _cs(R, R)] if M is not None else [_cs(R, R)])
    rz, rr = (t[0], t[1]) if M is not None else (t[0], t[0])
    res = rr.clamp_min(0).sqrt()
    hist = [res]
    active = res > tol
    if not bool(active.any()):
        return X, KrylovResult(0, Status.CONVERGED, "", hist)
    for it in range(1, maxiter + 1):
        Q = A(P)
        pq = _red(red, [_cs(P, Q)])[0]
        if not _finite(pq[active]) or not _finite(rz[active]):
            return X, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in p^T A p", hist)
        if bool((pq[active] <= 0).any()) or bool((rz[active] <= 0).any()):
            return X, KrylovResult(it, Status.INDEFINITE, "p^T A p <= 0 in some column (A or M not positive definite)",
                                   hist)
        alpha = torch.where(active, rz / torch.where(active, pq, torch.ones_like(pq)), torch.zeros_like(pq))
        a = _dev(alpha, X)
        X = X + P * a
        R = R - Q * a
        Z = M(R) if M is not None else R
        t = _red(red, [_cs(R, Z), _cs(R, R)] if M is not None else [_cs(R, R)])
        rz_new, rr = (t[0], t[1]) if M is not None else (t[0], t[0])
        res = rr.clamp_min(0).sqrt()
        hist.append(res)
        if callback is not None:
            callback(it, res)
        if not _finite(res):
            return X, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        active = res > tol
        if not bool(active.any()):
            return X, KrylovResult(it, Status.CONVERGED, "", hist)
        beta = torch.where(active, rz_new / torch.where(rz != 0, rz, torch.ones_like(rz)), torch.zeros_like(rz))
        P = Z + P * _dev(beta, P)
        rz = rz_new
    return X, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


def bicgstab_block(A, B, X, M, tol, maxiter, red: Reducer, callback=None):
    R = B - A(X)
    Rh = R.clone()
    t = _red(red, [_cs(Rh, R), _cs(R, R)])
    rho_new, rr = t[0], t[1]
    res = rr.clamp_min(0).sqrt()
    hist = [res]
    active = res > tol
    if not bool(active.any()):
        return X, KrylovResult(0, Status.CONVERGED, "", hist)
    k = B.shape[1]
    one = torch.ones(k, dtype=F64)
    rho, alpha, omega = one.clone(), one.clone(), one.clone()
    V = torch.zeros_like(B)
    P = torch.zeros_like(B)

    def safe(x):
        return torch.where(active, x, torch.ones_like(x))

    for it in range(1, maxiter + 1):
        if bool((rho_new[active] == 0).any()) or not _finite(rho_new[active]):
            return X, KrylovResult(it, Status.BREAKDOWN, "rho = rhat . r vanished in some column", hist)
        beta = torch.where(active, (rho_new / safe(rho)) * (alpha / safe(omega)), torch.zeros(k, dtype=F64))
        rho = torch.where(active, rho_new, rho)
        P = R + (P - V * _dev(omega, V)) * _dev(beta, P)
        Ph = M(P) if M is not None else P
        V = A(Ph)
        rv = _red(red, [_cs(Rh, V)])[0]
        if bool((rv[active] == 0).any()) or not _finite(rv[active]):
            return X, KrylovResult(it, Status.BREAKDOWN, "rhat . v vanished in some column", hist)
        alpha = torch.where(active, rho / safe(rv), torch.zeros(k, dtype=F64))
        S = R - V * _dev(alpha, V)
        Sh = M(S) if M is not None else S
        T = A(Sh)
        t = _red(red, [_cs(T, T), _cs(T, S), _cs(S, S)])
        tt, ts, ss = t[0], t[1], t[2]
        early = active & (ss.clamp_min(0).sqrt() <= tol)       # converged at the half step
        full = active & ~early
        if bool((tt[full] == 0).any()) or not _finite(tt[full]) or not _finite(ts[full]):
            return X, KrylovResult(it, Status.BREAKDOWN, "t . t vanished in some column", hist)
        omega = torch.where(full, ts / torch.where(full, tt, torch.ones_like(tt)), torch.where(active, 0.0 * one, omega))
        om = _dev(torch.where(full, omega, 0.0 * one), X)   # frozen and half-step columns: omega 0
        X = X + Ph * _dev(alpha, X) + Sh * om
        R = S - T * om
        t = _red(red, [_cs(R, R), _cs(Rh, R)])
        rr, rho_new = t[0], t[1]
        res = rr.clamp_min(0).sqrt()
        hist.append(res)
        if callback is not None:
            callback(it, res)
        if not _finite(res):
            return X, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        active = res > tol
        if not bool(active.any()):
            return X, KrylovResult(it, Status.CONVERGED, "", hist)
        if bool((omega[active] == 0).any()):
            return X, KrylovResult(it, Status.BREAKDOWN, "omega vanished in some column", hist)
    return X, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


def minres_block(A, B, X, M, tol, maxiter, red: Reducer, callback=None):
    """Paige-Saunders MINRES per column (symmetric A, SPD M), the columns in lockstep."""
    k = B.shape[1]
    R1 = B - A(X)
    Y = M(R1) if M is not None else R1
    t = _red(red, [_cs(R1, Y), _cs(R1, R1)])
    beta1, rr = t[0], t[1]
    if bool((beta1 < 0).any()) or not _finite(beta1) or not _finite(rr):
        return X, KrylovResult(0, Status.INDEFINITE, "the preconditioner is not positive definite", [])
    beta1 = beta1.sqrt()
    hist = [beta1]
    rn = rr.clamp_min(0).sqrt()
    active = rn > tol
    if not bool(active.any()):
        return X, KrylovResult(0, Status.CONVERGED, "", hist)
    # ``tol`` is in the 2-norm of the residual, phibar in its M^-1-norm: carried over by their ratio at the start,
    # as the one-column kernel does (compared as they were, pinned MINRES + Jacobi on 3 columns stopped early and
    # raised NotConvergedError 'inaccurate' on 11 of 20 well-conditioned SPD systems; outside sweep)
    tol = torch.where(rn > 0, tol * beta1 / torch.where(rn > 0, rn, torch.ones_like(rn)), tol)
    z = torch.zeros(k, dtype=F64)
    oldb, beta, dbar, epsln, phibar = z.clone(), beta1.clone(), z.clone(), z.clone(), beta1.clone()
    cs, sn = -torch.ones(k, dtype=F64), z.clone()
    W = torch.zeros_like(B)
    W2 = torch.zeros_like(B)
    R2 = R1
    eps = torch.finfo(B.dtype).eps
    for it in range(1, maxiter + 1):
        bsafe = torch.where(beta > 0, beta, torch.ones_like(beta))
        Vv = Y * _dev(1.0 / bsafe, Y)
        Y = A(Vv)
        if it >= 2:
            Y = Y - R1 * _dev(beta / torch.where(oldb > 0, oldb, torch.ones_like(oldb)), R1)
        alfa = _red(red, [_cs(Vv, Y)])[0]
        Y = Y - R2 * _dev(alfa / bsafe, R2)
        R1, R2 = R2, Y
        Y = M(R2) if M is not None else R2
        oldb = beta
        bb = _red(red, [_cs(R2, Y)])[0]
        if bool((bb[active] < 0).any()) or not _finite(bb[active]) or not _finite(alfa[active]):
            bad = bool((bb[active] < 0).any())
            return X, KrylovResult(it, Status.INDEFINITE if bad else Status.NOT_FINITE,
                                   "the preconditioner is not positive definite" if bad else "NaN or Inf", hist)
        beta = bb.clamp_min(0).sqrt()
        oldeps = epsln
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        gamma = torch.hypot(gbar, beta).clamp_min(eps)
        cs, sn = gbar / gamma, beta / gamma
        phi = torch.where(active, cs * phibar, z)
        phibar = torch.where(active, sn * phibar, phibar)
        W1, W2 = W2, W
        W = (Vv - W1 * _dev(oldeps, W1) - W2 * _dev(delta, W2)) * _dev(1.0 / gamma, Vv)
        X = X + torch.where(_dev(active, W).bool()[None, :], W * _dev(phi, W), torch.zeros_like(W))
        hist.append(phibar)
        if callback is not None:
            callback(it, phibar)
        active = active & (phibar > tol) & (beta > 0)
        if not bool(active.any()):
            return X, KrylovResult(it, Status.CONVERGED, "", hist)
    return X, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


def gmres_block(A, B, X, M, tol, maxiter, red: Reducer, callback=None, restart: int = 30):
    """Restarted right-preconditioned GMRES per column, classical Gram-Schmidt twice: the Arnoldi
    steps of every column share one block product and two reductions."""
    restart = max(1, min(restart, maxiter))
    k = B.shape[1]
    hist: list = []
    it = 0
    while True:
        R = B - A(X)
        beta = _red(red, [_cs(R, R)])[0].clamp_min(0).sqrt()
        hist.append(beta)
        if not _finite(beta):
            return X, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        active = beta > tol
        if not bool(active.any()):
            return X, KrylovResult(it, Status.CONVERGED, "", hist)
        if it >= maxiter:
            return X, KrylovResult(it, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)
        Vs = [R * _dev(1.0 / torch.where(active, beta, torch.ones_like(beta)), R) * _dev(active.to(F64), R)]
        Zs = []
        H = torch.zeros(k, restart + 1, restart, dtype=F64)
        cs = torch.zeros(k, restart, dtype=F64)
        sn = torch.zeros(k, restart, dtype=F64)
        g = torch.zeros(k, restart + 1, dtype=F64)
        g[:, 0] = torch.where(active, beta, torch.zeros_like(beta))
        steps = torch.zeros(k, dtype=torch.int64)     # Arnoldi steps taken per column this cycle
        live = active.clone()
        for j in range(restart):
            Zj = M(Vs[j]) if M is not None else Vs[j]
            Zs.append(Zj)
            Wb = A(Zj)
            Vm = torch.stack(Vs)                                  # (j+1, n, k)
            h = red.vec(torch.einsum("jnk,nk->jk", Vm, Wb).reshape(-1)).reshape(j + 1, k)
            Wb = Wb - torch.einsum("jnk,jk->nk", Vm, h)
            t = red.vec(torch.cat([torch.einsum("jnk,nk->jk", Vm, Wb).reshape(-1), _cs(Wb, Wb)]))
            h2, ww = t[:(j + 1) * k].reshape(j + 1, k), t[(j + 1) * k:]
            Wb = Wb - torch.einsum("jnk,jk->nk", Vm, h2)
            hn = (ww.to(F64).cpu() - (h2.to(F64).cpu() ** 2).sum(0)).clamp_min(0).sqrt()
            hh = (h + h2).to(F64).cpu()
            it += 1
            for c in range(k):
                if not bool(live[c]):
                    continue
                H[c, :j + 1, j] = hh[:, c]
                H[c, j + 1, j] = hn[c]
                for i in range(j):
                    a_, b_ = float(H[c, i, j]), float(H[c, i + 1, j])
                    H[c, i, j] = cs[c, i] * a_ + sn[c, i] * b_
                    H[c, i + 1, j] = -sn[c, i] * a_ + cs[c, i] * b_
                a_, b_ = float(H[c, j, j]), float(H[c, j + 1, j])
                den = math.hypot(a_, b_)
                if den == 0.0:
                    live[c] = False
                    continue
                cs[c, j], sn[c, j] = a_ / den, b_ / den
                H[c, j, j] = den
                H[c, j + 1, j] = 0.0
                g[c, j + 1] = -sn[c, j] * g[c, j]
                g[c, j] = cs[c, j] * g[c, j]
                steps[c] = j + 1
                if abs(float(g[c, j + 1])) <= float(tol[c]) or float(hn[c]) == 0.0:
                    live[c] = False
            est = g[torch.arange(k), steps].abs()
            hist.append(torch.where(active, est, torch.zeros_like(est)))
            if callback is not None:
                callback(it, est)
            if not bool(live.any()) or it >= maxiter:
                break
            scale = torch.where(live & (hn > 0), 1.0 / torch.where(hn > 0, hn, torch.ones_like(hn)), torch.zeros_like(hn))
            Vs.append(Wb * _dev(scale, Wb))
        if bool(((steps == 0) & active).any()):
            return X, KrylovResult(it, Status.BREAKDOWN, "the Arnoldi step produced a zero column", hist)
        Zm = torch.stack(Zs)                                      # (J, n, k)
        Y = torch.zeros(len(Zs), k, dtype=F64)
        for c in range(k):
            s = int(steps[c])
            if s:
                Y[:s, c] = torch.linalg.solve_triangular(H[c, :s, :s], g[c, :s, None], upper=True)[:, 0]
        X = X + torch.einsum("jnk,jk->nk", Zm, _dev(Y, Zm))


BLOCK_METHODS = {"cg": cg_block, "bicgstab": bicgstab_block, "gmres": gmres_block, "minres": minres_block}
