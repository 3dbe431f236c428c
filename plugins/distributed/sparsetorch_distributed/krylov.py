"""Distributed Krylov kernels on local vectors: CG/PCG, BiCGStab, restarted GMRES, MINRES.

Each kernel works on one right-hand side (a 1-D local vector) with ``A(x)`` (collective matvec),
``M(r)`` (local preconditioner, or None) and ``red(values) -> values`` (all_reduce of a few local
scalars in one message). Every decision is taken on reduced scalars, so all ranks take the same
branch. A local failure (a preconditioner raising on one rank) does not leave the others waiting:
the rank keeps taking part with a zero vector and sets an error flag that travels with the next
reduction, where every rank stops (``_Abort``); the caller turns that into the agreed error.

Stopping rule (the core's): ``||r|| <= max(rtol ||b||, atol)`` on the recurrence residual; the
caller checks the true residual afterwards and restarts when it misses (finite precision drift).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from sparsetorch.backend import Status

__all__ = ["KrylovResult", "Reducer", "cg", "bicgstab", "gmres", "minres", "METHODS"]


class _Abort(Exception):
    """Some rank flagged a local error; every rank stops at the same reduction."""


@dataclass
class KrylovResult:
    iterations: int
    status: Status
    reason: str = ""
    history: list = field(default_factory=list)


class Reducer:
    """One all_reduce of a few local scalars plus the error flag of this rank."""

    def __init__(self, comm, device, dtype) -> None:
        self.comm, self.device, self.dtype = comm, device, dtype
        self.error: BaseException | None = None
        self.count = 0

    def __call__(self, values: list[torch.Tensor]) -> list[float]:
        if self.comm.size == 1:                       # nothing to reduce: skip building the message
            self.count += 1
            if self.error is not None:
                raise _Abort()
            return [float(v) for v in values]
        flag = torch.ones((), dtype=self.dtype, device=self.device) if self.error is not None else \
            torch.zeros((), dtype=self.dtype, device=self.device)
        t = torch.stack([v.reshape(()).to(self.dtype) for v in values] + [flag])
        self.count += 1
        out = self.comm.allreduce(t, "sum").tolist()
        if out[-1] != 0:
            raise _Abort()
        return out[:-1]

    def vec(self, v: torch.Tensor) -> torch.Tensor:
        """All-reduce a vector of local partial sums (and the flag)."""
        flag = torch.full((1,), 1.0 if self.error is not None else 0.0, dtype=v.dtype, device=v.device)
        t = torch.cat([v.reshape(-1), flag])
        self.count += 1
        self.comm.allreduce(t, "sum")
        if float(t[-1]) != 0:
            raise _Abort()
        return t[:-1]

    def guard(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """``fn`` made failure-tolerant: on a local exception, record it and return zeros."""
        def wrapped(r: torch.Tensor) -> torch.Tensor:
            if self.error is not None:
                return torch.zeros_like(r)
            try:
                z = fn(r)
                if z.shape != r.shape:
                    raise ValueError(f"the preconditioner returned shape {tuple(z.shape)} for {tuple(r.shape)}")
                return z
            except Exception as exc:  # noqa: BLE001 - travels to every rank with the next reduction
                self.error = exc
                return torch.zeros_like(r)
        return wrapped


def _finite(*vals: float) -> bool:
    return all(math.isfinite(v) for v in vals)


def cg(A, b, x, M, tol: float, maxiter: int, red: Reducer, callback=None) -> tuple[torch.Tensor, KrylovResult]:
    """(Preconditioned) conjugate gradients; ``M`` must be symmetric positive definite. Vectors are
    updated in place (``x`` is copied first); without ``M``, ``r . z`` is ``r . r`` (one dot)."""
    x = x.clone()
    r = b - A(x)
    z = M(r) if M is not None else r
    p = z.clone()
    if M is not None:
        rz, rr = red([torch.dot(r, z), torch.dot(r, r)])
    else:
        (rr,) = red([torch.dot(r, r)])
        rz = rr
    hist = [math.sqrt(max(rr, 0.0))]
    if math.sqrt(max(rr, 0.0)) <= tol:
        return x, KrylovResult(0, Status.CONVERGED, "", hist)
    for it in range(1, maxiter + 1):
        q = A(p)
        (pq,) = red([torch.dot(p, q)])
        if not _finite(pq, rz):
            return x, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in p^T A p", hist)
        if pq <= 0 or rz <= 0:
            return x, KrylovResult(it, Status.INDEFINITE, f"p^T A p = {pq:.3g} (A or M not positive definite)", hist)
        alpha = rz / pq
        x.add_(p, alpha=alpha)
        r.sub_(q, alpha=alpha)
        if M is not None:
            z = M(r)
            rz_new, rr = red([torch.dot(r, z), torch.dot(r, r)])
        else:
            z = r
            (rr,) = red([torch.dot(r, r)])
            rz_new = rr
        res = math.sqrt(max(rr, 0.0))
        hist.append(res)
        if callback is not None:
            callback(it, res)
        if not math.isfinite(res):
            return x, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        if res <= tol:
            return x, KrylovResult(it, Status.CONVERGED, "", hist)
        p.mul_(rz_new / rz).add_(z)
        rz = rz_new
    return x, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


def bicgstab(A, b, x, M, tol: float, maxiter: int, red: Reducer, callback=None) -> tuple[torch.Tensor, KrylovResult]:
    """BiCGStab (van der Vorst) with right preconditioning."""
    r = b - A(x)
    rhat = r.clone()
    rho_new, rr = red([torch.dot(rhat, r), torch.dot(r, r)])
    hist = [math.sqrt(max(rr, 0.0))]
    if hist[0] <= tol:
        return x, KrylovResult(0, Status.CONVERGED, "", hist)
    rho = alpha = omega = 1.0
    v = torch.zeros_like(b)
    p = torch.zeros_like(b)
    for it in range(1, maxiter + 1):
        if rho_new == 0.0 or not _finite(rho_new):
            return x, KrylovResult(it, Status.BREAKDOWN, "rho = rhat . r vanished", hist)
        beta = (rho_new / rho) * (alpha / omega)
        rho = rho_new
        p = r + beta * (p - omega * v)
        phat = M(p) if M is not None else p
        v = A(phat)
        (rv,) = red([torch.dot(rhat, v)])
        if rv == 0.0 or not _finite(rv):
            return x, KrylovResult(it, Status.BREAKDOWN, "rhat . v vanished", hist)
        alpha = rho / rv
        s = r - alpha * v
        (ss,) = red([torch.dot(s, s)])
        if math.sqrt(max(ss, 0.0)) <= tol:
            x = x + alpha * phat
            hist.append(math.sqrt(max(ss, 0.0)))
            return x, KrylovResult(it, Status.CONVERGED, "", hist)
        shat = M(s) if M is not None else s
        t = A(shat)
        tt, ts = red([torch.dot(t, t), torch.dot(t, s)])
        if tt == 0.0 or not _finite(tt, ts):
            return x, KrylovResult(it, Status.BREAKDOWN, "t . t vanished", hist)
        omega = ts / tt
        x = x + alpha * phat + omega * shat
        r = s - omega * t
        rr, rho_new = red([torch.dot(r, r), torch.dot(rhat, r)])
        res = math.sqrt(max(rr, 0.0))
        hist.append(res)
        if callback is not None:
            callback(it, res)
        if not math.isfinite(res):
            return x, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        if res <= tol:
            return x, KrylovResult(it, Status.CONVERGED, "", hist)
        if omega == 0.0:
            return x, KrylovResult(it, Status.BREAKDOWN, "omega vanished", hist)
    return x, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


def gmres(A, b, x, M, tol: float, maxiter: int, red: Reducer, callback=None, restart: int = 30) -> tuple[torch.Tensor, KrylovResult]:
    """Restarted GMRES, right-preconditioned (flexible: the preconditioned vectors are kept),
    classical Gram-Schmidt applied twice (two reductions per step instead of one per basis vector; the
    second carries ``||w||^2``, so the new norm needs no third)."""
    restart = max(1, min(restart, maxiter))
    hist: list[float] = []
    it = 0
    dtype = b.dtype
    while True:
        r = b - A(x)
        (rr,) = red([torch.dot(r, r)])
        beta = math.sqrt(max(rr, 0.0))
        hist.append(beta)
        if not math.isfinite(beta):
            return x, KrylovResult(it, Status.NOT_FINITE, "NaN or Inf in the residual", hist)
        if beta <= tol:
            return x, KrylovResult(it, Status.CONVERGED, "", hist)
        if it >= maxiter:
            return x, KrylovResult(it, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)
        V = [r / beta]
        Z = []
        H = torch.zeros(restart + 1, restart, dtype=torch.float64)
        cs = torch.zeros(restart, dtype=torch.float64)
        sn = torch.zeros(restart, dtype=torch.float64)
        g = torch.zeros(restart + 1, dtype=torch.float64)
        g[0] = beta
        j_done = 0
        for j in range(restart):
            z = M(V[j]) if M is not None else V[j]
            Z.append(z)
            w = A(z)
            Vm = torch.stack(V)
            h = red.vec(Vm @ w)
            w = w - h @ Vm
            t = red.vec(torch.cat([Vm @ w, torch.dot(w, w)[None]]))   # second pass, and ||w||^2 with it
            h2, ww = t[:-1], float(t[-1])
            w = w - h2 @ Vm
            hn = math.sqrt(max(ww - float(torch.dot(h2, h2)), 0.0))    # ||w - V h2||^2 = ||w||^2 - ||h2||^2
            h = (h + h2).to(torch.float64).cpu()
            H[: j + 1, j] = h
            H[j + 1, j] = hn
            for i in range(j):  # apply earlier rotations
                a_, b_ = H[i, j].item(), H[i + 1, j].item()
                H[i, j] = cs[i] * a_ + sn[i] * b_
                H[i + 1, j] = -sn[i] * a_ + cs[i] * b_
            a_, b_ = H[j, j].item(), H[j + 1, j].item()
            den = math.hypot(a_, b_)
            if den == 0.0:
                j_done = j
                break
            cs[j], sn[j] = a_ / den, b_ / den
            H[j, j] = den
            H[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            it += 1
            j_done = j + 1
            est = abs(g[j + 1].item())
            hist.append(est)
            if callback is not None:
                callback(it, est)
            if est <= tol or it >= maxiter or hn == 0.0:
                break
            V.append(w / hn)
        if j_done == 0:
            return x, KrylovResult(it, Status.BREAKDOWN, "the Arnoldi step produced a zero column", hist)
        y = torch.linalg.solve_triangular(H[:j_done, :j_done], g[:j_done, None], upper=True)[:, 0]
        x = x + y.to(dtype=dtype, device=b.device) @ torch.stack(Z[:j_done])


def minres(A, b, x, M, tol: float, maxiter: int, red: Reducer, callback=None) -> tuple[torch.Tensor, KrylovResult]:
    """MINRES (Paige-Saunders) for symmetric A; ``M`` symmetric positive definite. The recurrence
    tracks the M^-1-norm of the residual; the caller's true-residual check decides."""
    r1 = b - A(x)
    y = M(r1) if M is not None else r1
    beta1, rr = red([torch.dot(r1, y), torch.dot(r1, r1)])
    if beta1 < 0 or not _finite(beta1, rr):
        return x, KrylovResult(0, Status.INDEFINITE, "the preconditioner is not positive definite", [])
    beta1 = math.sqrt(beta1)
    hist = [beta1]
    rn = math.sqrt(rr)
    if rn <= tol:
        return x, KrylovResult(0, Status.CONVERGED, "", hist)
    # ``tol`` is in the 2-norm of the residual, the recurrence's phibar in its M^-1-norm: the tolerance is
    # carried over by their ratio at the start (compared as they were, a restart from an x whose M^-1-norm
    # residual was below tol returned at once, and the caller's true-residual check called it
    # inaccurate: MINRES + block Jacobi failed on 9 of 20 Poisson systems; session 21's sweep)
    tol = tol * beta1 / rn if rn > 0 else tol
    oldb, beta, dbar, epsln, phibar = 0.0, beta1, 0.0, 0.0, beta1
    cs, sn = -1.0, 0.0
    w = torch.zeros_like(b)
    w2 = torch.zeros_like(b)
    r2 = r1
    eps = torch.finfo(b.dtype).eps
    for it in range(1, maxiter + 1):
        v = y / beta
        y = A(v)
        if it >= 2:
            y = y - (beta / oldb) * r1
        (alfa,) = red([torch.dot(v, y)])
        y = y - (alfa / beta) * r2
        r1, r2 = r2, y
        y = M(r2) if M is not None else r2
        oldb = beta
        (bb,) = red([torch.dot(r2, y)])
        if bb < 0 or not _finite(bb, alfa):
            return x, KrylovResult(it, Status.INDEFINITE if bb < 0 else Status.NOT_FINITE,
                                   "the preconditioner is not positive definite" if bb < 0 else "NaN or Inf", hist)
        beta = math.sqrt(bb)
        oldeps = epsln
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        gamma = max(math.hypot(gbar, beta), eps)
        cs, sn = gbar / gamma, beta / gamma
        phi = cs * phibar
        phibar = sn * phibar
        w1, w2 = w2, w
        w = (v - oldeps * w1 - delta * w2) / gamma
        x = x + phi * w
        hist.append(phibar)
        if callback is not None:
            callback(it, phibar)
        if phibar <= tol:
            return x, KrylovResult(it, Status.CONVERGED, "", hist)
        if beta == 0.0:
            return x, KrylovResult(it, Status.CONVERGED, "the Krylov space is exhausted", hist)
    return x, KrylovResult(maxiter, Status.MAX_ITERATIONS, f"{maxiter} iterations", hist)


METHODS = {"cg": cg, "bicgstab": bicgstab, "gmres": gmres, "minres": minres}
