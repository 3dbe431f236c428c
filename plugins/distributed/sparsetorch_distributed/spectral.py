"""Distributed ``eigsh``: thick-restarted Lanczos on a symmetric DSparseTensor, differentiable.

Forward (one matrix): a Lanczos basis ``V`` (this rank's rows, ``n_local x (ncv + 1)``) with full
reorthogonalization (classical Gram-Schmidt twice against the whole basis; the second pass carries
``||w||^2`` too, so a step costs one matvec and two all_reduces), the projected matrix ``H`` kept
on every rank (its entries are reduced scalars, identical everywhere). When the basis is full, the
Ritz pairs of ``H`` (eigendecomposed on rank 0 and broadcast, so every rank takes the same
decisions) are tested against the core's contract

    ||A v - w v|| <= tol (||A||_inf + |w|) ||v||,   tol = 0 -> sparsetorch.backend.default_rtol(dtype)

with the Lanczos estimate ``|H[m, m-1] s_m|``; the basis then restarts thick (Krylov-Schur for a
symmetric matrix): the ``l`` best Ritz vectors ``V S`` and the last Lanczos vector are kept, ``H``
becomes ``diag(theta)`` bordered by the couplings ``H[m, m-1] S[m-1, :]``. At the end the true
residuals are computed (one block matvec, one reduction); a miss continues the iteration.
Nothing global is formed: the basis is local rows, ``H`` is ``(ncv + 1) x ncv``.

Backward (the pairs ``(w_i, v_i)``, loss gradients ``gw``, ``gV``), on each rank's own slots
``k = (row, col)`` (``v_ext``: the owned rows then the halo rows of ``V``, one halo exchange):

    eigenvalues   dvalues[k] += sum_i gw_i v_i[row] v_i_ext[col]          (Hellmann-Feynman)
    eigenvectors  q_i = sum_{j != i computed} v_j (v_j . gv_i) / (w_i - w_j)  -  y_i,
                  y_i = (P (A - w_i) P)^+ P gv_i,  P = I - V V^T  (distributed MINRES)
                  dvalues[k] += sum_i q_i[row] v_i_ext[col]

the rules of the single-process ``sparsetorch.eigsh`` (docs/spectral.md), with the bordered solve
replaced by MINRES on the projected operator (each product one halo exchange and one reduction
for the projection). A gap ``|w_i - w_j| <= degenerate_tol max|w|`` with a non-zero coupling has
no eigenvector gradient: ``DegenerateEigenvalueError`` (``degenerate="raise"``), or the coupling
is dropped with a warning / silently.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import torch

import sparsetorch as st
from sparsetorch.backend import Status, default_rtol

from .comm import dtype_code
from .errors import DistributedError
from .krylov import Reducer, _Abort, minres
from .ops import GRAD_FLAGS, batch_code, grad_flags, settle_grad_mode
from .tensor import next_op_epoch

__all__ = ["eigsh", "DEigshInfo"]

_WHICH = ("LA", "SA", "LM")
_POLICIES = ("raise", "warn", "ignore")
#: A block whose Gram matrix has sigma_min >= this x sigma_max is orthonormalized in one pass
#: (loss of orthogonality ~ eps sigma_max / sigma_min); below it, a second pass (one more reduction).
WELL_CONDITIONED = 1e-2


@dataclass(frozen=True)
class DEigshInfo:
    """What ``eigsh(..., return_info=True)`` returns beside ``(w, V)`` (the same on every rank)."""

    method: str
    k: int
    which: str
    ncv: int
    matvecs: int
    restarts: int
    residual: float            # worst true relative residual ||A v - w v|| / ((||A|| + |w|) ||v||)
    converged: bool
    status: Status
    tol: float
    world_size: int = 1
    reductions: int = 0
    seconds: float = field(default=0.0, compare=False)
    backend: str = "distributed"


@dataclass
class _Config:
    k: int
    which: str
    tol: float
    ncv: int | None
    block: int
    maxiter: int | None
    v0: torch.Tensor | None
    degenerate: str
    degenerate_tol: float
    on_nonconvergence: str


def _select(theta: torch.Tensor, k: int, which: str) -> torch.Tensor:
    """Indices of the k wanted Ritz values, best first."""
    key = {"LA": -theta, "SA": theta, "LM": -theta.abs()}[which]
    return torch.argsort(key, stable=True)[:k]


def _start_vector(A, dtype, salt: int = 0) -> torch.Tensor:
    """A deterministic pseudo-random vector, a function of the global row id (the same for any
    partition; ``salt`` gives others)."""
    g = A.owned_rows().to(torch.float64)
    v = torch.frac(torch.sin(g * (12.9898 + 0.731 * salt) + 78.233 + salt) * 43758.5453) - 0.5
    return v.to(dtype=dtype, device=A.device)


def _inf_norm_local(A, values) -> torch.Tensor:
    """This rank's ``max_i sum_j |A_ij|`` over its rows, a float64 ``(1,)`` tensor (local)."""
    p = A.pattern
    v = (A.values if values is None else values).detach().abs()
    local = torch.zeros(p.n_local, dtype=torch.float64, device=v.device).index_add_(0, p.row, v.to(torch.float64))
    return torch.tensor([float(local.max()) if p.n_local else 0.0], dtype=torch.float64, device=A.comm.device)


def _inf_norm(A, values) -> float:
    """max_i sum_j |A_ij| over the ranks (a collective all_reduce(max); :func:`eigsh` gets it from its input
    agreement instead)."""
    return float(A.comm.allreduce(_inf_norm_local(A, values), "max")[0])


def _eig_small(comm, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """eigh of the replicated projected matrix, computed on rank 0 and broadcast (one decision)."""
    m = T.shape[0]
    buf = torch.zeros(m + m * m, dtype=torch.float64)
    if comm.rank == 0:
        theta, S = torch.linalg.eigh(0.5 * (T + T.t()))
        buf[:m], buf[m:] = theta, S.reshape(-1)
    buf = comm.broadcast(buf, 0)
    return buf[:m].clone(), buf[m:].reshape(m, m).clone()


class _Block:
    """Appends a block ``W`` (``n_local x b``) to an orthonormal basis ``Vj``: three reductions.

    Classical Gram-Schmidt against ``Vj`` (1), a second pass that also carries ``W^T W`` (2); the
    block is orthonormalized from that Gram matrix (its eigendecomposition: directions with
    ``sqrt(sigma) <= tiny`` are an invariant subspace and are replaced by fresh pseudo-random
    vectors with zero coupling), then once more against ``Vj`` and itself (3, a Cholesky of a
    Gram matrix close to the identity). Returns ``(Q, C, D)`` with ``W = Vj C + Q D``."""

    def __init__(self, A, red: Reducer, tiny: float) -> None:
        self.A, self.red, self.tiny = A, red, tiny
        self.fresh = 0
        self.skipped = 0

    def _gram_pass(self, Vj, W):
        c, b = Vj.shape[1], W.shape[1]
        t = self.red.vec(torch.cat([(Vj.t() @ W).reshape(-1), (W.t() @ W).reshape(-1)]))
        h, G = t[:c * b].reshape(c, b), t[c * b:].reshape(b, b)
        return h, G

    def __call__(self, Vj: torch.Tensor, W: torch.Tensor):
        c, b = Vj.shape[1], W.shape[1]
        f64 = torch.float64
        C = torch.zeros(c, b, dtype=f64)
        if c:
            h = self.red.vec((Vj.t() @ W).reshape(-1)).reshape(c, b)
            W = W - Vj @ h
            C += h.to(f64).cpu()
        h2, G = self._gram_pass(Vj, W)
        if c:
            W = W - Vj @ h2
            C += h2.to(f64).cpu()
        G = G.to(f64).cpu() - h2.to(f64).cpu().t() @ h2.to(f64).cpu()
        sig, U = torch.linalg.eigh(0.5 * (G + G.t()))
        keep = sig.clamp_min(0).sqrt() > self.tiny
        Q = torch.empty_like(W)
        D = torch.zeros(b, b, dtype=f64)
        scale = torch.where(keep, sig.clamp_min(0).sqrt(), torch.ones_like(sig))
        Qk = W @ (U / scale).to(W.dtype).to(W.device)
        for i in range(b):
            if bool(keep[i]):
                Q[:, i] = Qk[:, i]
                D[i] = scale[i] * U[:, i]
            else:
                self.fresh += 1
                Q[:, i] = _start_vector(self.A, W.dtype, self.fresh)
        # W = Q D (fresh columns have zero rows in D). A well-conditioned block is orthonormal to working
        # precision now; otherwise (or with fresh columns) one more pass against Vj and itself.
        if bool(keep.all()) and float(sig[0]) >= WELL_CONDITIONED * float(sig[-1]):
            self.skipped += 1
            return Q, C, D
        h3, G3 = self._gram_pass(Vj, Q)
        if c:
            Q = Q - Vj @ h3
        h3c = h3.to(f64).cpu()
        G3 = G3.to(f64).cpu() - h3c.t() @ h3c
        # fresh columns still hold their component along the kept ones: orthogonalize them in the Gram
        L, bad = torch.linalg.cholesky_ex(0.5 * (G3 + G3.t()))     # G3 = R^T R, R = L^T; Q_new = Q R^-1
        if int(bad):
            raise DistributedError("distributed eigsh: the Lanczos basis cannot be extended (no new direction is "
                                   "left orthogonal to it: N is too small for ncv); lower ncv or use sparsetorch.eigsh")
        R = L.t()
        Q = torch.linalg.solve_triangular(R.to(Q.dtype).to(Q.device), Q, upper=True, left=False)
        C += h3c @ D
        D = R @ D
        return Q, C, D


def _lanczos(A, values, cfg: _Config, red: Reducer, anorm: float | None = None):
    """The k wanted pairs of one matrix: (w ascending (k,), V (n_local, k), record). ``anorm``: ``||A||_inf``
    over the ranks, if known (else one max all_reduce)."""
    comm = A.comm
    N = A.pattern.shape[0]
    dtype = A.dtype
    k, which, b = cfg.k, cfg.which, cfg.block
    m = cfg.ncv or max(2 * k + 2 * b, k + 32)
    m = min(m, N - b)
    m -= m % b
    if m < k + b:
        raise st.InputError(f"distributed eigsh: N={N} is too small for k={k} with block {b} (the basis needs "
                            f"k + 2 * block <= N); use sparsetorch.eigsh on one process")
    max_restarts = cfg.maxiter if cfg.maxiter is not None else max(100, 10 * N // max(m, 1))
    from .solve import _exp_limit, _exponent

    # the operator scaled by a power of two when ||A||_inf is far from 1 (exact; eigenvalues unscaled at the end):
    # the Gram matrices of the products overflowed / underflowed (float32 x 1e20 / x 1e-22, float64 x 1e200 raised
    # "the Lanczos basis cannot be extended"; outside sweep)
    anorm = _inf_norm(A, values) if anorm is None else anorm
    ea = _exponent(anorm, dtype)
    if abs(ea) <= _exp_limit(dtype)[1] // 4:
        ea = 0
    sa = 2.0 ** -ea
    anorm *= sa

    def mv(X: torch.Tensor) -> torch.Tensor:
        return A._mv(X, values) if ea == 0 else A._mv(X, values) * sa
    tiny = 1e3 * torch.finfo(dtype).eps * max(anorm, torch.finfo(dtype).tiny)
    blk = _Block(A, red, tiny)
    f64 = torch.float64
    V = torch.zeros(A.n_local, m + b, dtype=dtype, device=A.device)
    H = torch.zeros(m + b, m, dtype=f64)
    v = cfg.v0.to(dtype=dtype, device=A.device).clone() if cfg.v0 is not None else _start_vector(A, dtype)
    W0 = torch.stack([v] + [_start_vector(A, dtype, 1000 + i) for i in range(b - 1)], 1)
    Q, _, _ = blk(V[:, :0], W0)
    V[:, :b] = Q
    cur, matvecs, restarts = 0, 0, 0
    status = Status.MAX_ITERATIONS
    while True:
        while cur + b <= m:
            W = mv(V[:, cur:cur + b].contiguous())
            matvecs += b
            Q, C, D = blk(V[:, :cur + b], W)
            H[:cur + b, cur:cur + b] = C
            H[cur + b:cur + 2 * b, cur:cur + b] = D
            V[:, cur + b:cur + 2 * b] = Q
            cur += b
        theta, S = _eig_small(comm, H[:m, :m])
        want = _select(theta, k, which)
        Cb = H[m:m + b, m - b:m].clone()                           # the coupling to the next block
        est = torch.linalg.vector_norm(Cb @ S[m - b:m, want], dim=0)
        bound = cfg.tol * (anorm + theta[want].abs())
        done = bool((est <= bound).all())
        if done or restarts >= max_restarts:
            X = V[:, :m] @ S[:, want].to(dtype=dtype, device=A.device)
            wv = theta[want]
            AX = mv(X.contiguous())
            R = AX - X * wv.to(dtype=dtype, device=A.device)
            t = red.vec(torch.cat([(R * R).sum(0), (X * X).sum(0)])).cpu().to(f64)
            rel = t[:k].sqrt() / ((anorm + wv.abs()) * t[k:].sqrt())
            worst = float(rel.max()) if rel.numel() else 0.0
            if bool((rel <= cfg.tol).all()):
                status = Status.CONVERGED
                break
            if restarts >= max_restarts:
                break
            # the estimate said converged but the true residual did not: keep iterating
        # thick restart: keep the l best Ritz vectors and the next block
        restarts += 1
        order = _select(theta, m, which)
        l = min(m - b, k + max((m - k) // 2, b))
        l -= l % b
        l = max(l, b)
        keep = order[:l]
        Sk = S[:, keep]
        V[:, :l] = V[:, :m] @ Sk.to(dtype=dtype, device=A.device)
        V[:, l:l + b] = V[:, m:m + b]
        V[:, l + b:] = 0
        H.zero_()
        H[torch.arange(l), torch.arange(l)] = theta[keep]
        H[l:l + b, :l] = Cb @ Sk[m - b:m]
        cur = l
    order = torch.argsort(wv, stable=True)
    rec = dict(matvecs=matvecs, restarts=restarts, residual=worst, status=status, ncv=m, one_pass=blk.skipped, ea=ea)
    return (wv[order] * 2.0 ** ea).to(dtype=dtype, device=A.device), X[:, order.to(X.device)].contiguous(), rec


def _projected_pinv_solve(A, values, X: torch.Tensor, wi: float, rhs: torch.Tensor, red: Reducer, rtol: float,
                          ea: int = 0):
    """y = (P (A - wi) P)^+ rhs, P = I - X X^T, rhs orthogonal to X: distributed MINRES. Solved scaled by powers of
    two (exact): the operator by ``2**-ea`` (the forward's scale), ``rhs`` to a largest entry in [0.5, 1) (one max
    all-reduce; a loss weighted 1e-23 in float32 had ``||rhs||^2 = 0``)."""
    from .solve import _exponent, _times_pow2

    sa = 2.0 ** -ea
    wis = wi * sa

    def P(v):
        c = red.vec(X.t() @ v)
        return v - X @ c

    def op(v):
        Av = A._mv(v[:, None], values)[:, 0]
        return P((Av if ea == 0 else Av * sa) - wis * v)

    mx = rhs.abs().amax().to(torch.float64).reshape(1) if rhs.numel() else torch.zeros(1, dtype=torch.float64)
    er = _exponent(float(A.comm.allreduce(mx.to(A.comm.device), "max")[0]), rhs.dtype)
    rhs = _times_pow2(rhs, [-er])
    (bb,) = red([torch.dot(rhs, rhs)])
    if bb == 0.0:
        return torch.zeros_like(rhs)
    tol = rtol * math.sqrt(bb)
    y, res = minres(op, rhs, torch.zeros_like(rhs), None, tol, max(1000, 10 * A.pattern.shape[0]), red)
    y = P(y)
    r = rhs - op(y)
    (rr,) = red([torch.dot(r, r)])
    if math.sqrt(rr) > 100 * tol:
        raise st.NotConvergedError(f"eigsh backward: the projected solve for an eigenvector gradient reached relative "
                                   f"residual {math.sqrt(rr / bb):.3g} > {100 * rtol:.3g} after {res.iterations} "
                                   f"MINRES iterations ({res.status.value}); the eigenvalue may be close to one that "
                                   f"was not computed: ask for more eigenpairs (larger k)")
    return _times_pow2(y, [er - ea])


class _Eigsh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, A, cfg: _Config, recs: list, anorms: list | None = None):
        nb = len(A.batch_shape)
        B = math.prod(A.batch_shape) if nb else 1
        vflat = values.detach().reshape(B, -1)
        ws, Vs = [], []
        for i in range(B):
            vi = None if not A.batch_shape else vflat[i]
            red = Reducer(A.comm, A.device, torch.float64 if A.dtype == torch.float64 else torch.float32)
            try:
                w, V, rec = _lanczos(A, vi, cfg, red, None if anorms is None else anorms[i])
            except _Abort:
                A.comm.agree(red.error, "distributed eigsh")
                raise DistributedError("a rank flagged an error but none reported it") from None  # unreachable
            rec["reductions"] = red.count
            recs.append(rec)
            ws.append(w)
            Vs.append(V)
        ctx.A, ctx.cfg, ctx.vflat = A, cfg, vflat
        ctx.ws, ctx.Vs, ctx.eas = ws, Vs, [r["ea"] for r in recs[-B:]]
        if nb:
            return torch.stack(ws).reshape(*A.batch_shape, cfg.k), torch.stack(Vs).reshape(*A.batch_shape, A.n_local, cfg.k)
        return ws[0], Vs[0]

    @staticmethod
    def backward(ctx, gw, gV):
        A, cfg = ctx.A, ctx.cfg
        p = A.pattern
        comm = A.comm
        B = len(ctx.ws)
        k, n = cfg.k, A.n_local
        gw = gw.reshape(B, k) if gw is not None else None
        gV = gV.reshape(B, n, k) if gV is not None else None
        # which eigenvectors receive a gradient on any rank (a decision every rank must share)
        local = torch.zeros(B * k, dtype=torch.int64)
        if gV is not None:
            local = (gV != 0).any(1).reshape(-1).to(torch.int64).cpu()
        needs = comm.allreduce(local.to(comm.device), "max").cpu().reshape(B, k) if comm.size > 1 else local.reshape(B, k)
        out = []
        for b in range(B):
            vi = None if not A.batch_shape else ctx.vflat[b]
            w, X = ctx.ws[b], ctx.Vs[b]
            Q = torch.zeros_like(X)
            if gw is not None:
                Q = Q + X * gw[b].to(X.dtype)
            cols = [i for i in range(k) if int(needs[b, i])]
            if cols:
                red = Reducer(comm, A.device, torch.float64 if A.dtype == torch.float64 else torch.float32)
                wl = w.detach().cpu().to(torch.float64).tolist()
                scale = max(abs(x) for x in wl) or 1.0
                rtol = max(default_rtol(A.dtype) * 1e-2, 10 * torch.finfo(A.dtype).eps)
                try:
                    for i in cols:
                        g = gV[b, :, i]
                        c = red.vec(X.t() @ g)                     # v_j . gv_i, replicated
                        cl = c.cpu().to(torch.float64).tolist()
                        q = torch.zeros_like(g)
                        # the loss reads v_i and not a computed copy v_j of the same eigenvalue: the first-order test
                        # below cannot see it where the loss is constant on the eigenspace to first order (4 x 4
                        # grid Laplacian, k=3, loss (V[:, 1]^2 arange).sum(): a gradient came back, no error; the
                        # rule of the core's eigsh, commit ec42486). Raised where g_i has a part outside the
                        # cluster's computed vectors (ratio > sqrt(eps)): one float64 reduction, only then.
                        wtol = max(cfg.degenerate_tol * scale, 100 * torch.finfo(A.dtype).eps * scale)
                        near = [j for j in range(k) if j != i and abs(wl[i] - wl[j]) <= wtol]
                        unread = [j for j in near if not int(needs[b, j])]
                        if unread:
                            S = [i] + near
                            r = (g - X[:, S] @ c[S].to(X.dtype)).double()
                            t = red.vec(torch.stack([torch.dot(r, r), torch.dot(g.double(), g.double())]))
                            rr, gg = float(t[0]), float(t[1])
                            if rr > 0 and (gg == 0 or rr / gg > torch.finfo(A.dtype).eps):
                                j = unread[0]
                                msg = (f"eigsh backward: eigenvalues {i} and {j} are (nearly) repeated ({wl[i]:.12g}, "
                                       f"{wl[j]:.12g}) and the loss reads eigenvector {i} and not eigenvector {j} of the "
                                       f"same eigenspace, so it depends on which vectors are returned and its gradient "
                                       f"does not exist; use a loss of the whole eigenspace (every vector of it, e.g. a "
                                       f"projector sum_i v_i v_i^T), or degenerate='ignore' if the loss is known to "
                                       f"depend on the eigenspace only ('warn' to be told)")
                                _degenerate(cfg.degenerate, msg)
                        for j in range(k):
                            if j == i:
                                continue
                            gap = wl[i] - wl[j]
                            if abs(gap) <= cfg.degenerate_tol * scale:
                                if abs(cl[j]) > 1e3 * torch.finfo(A.dtype).eps * max(1.0, max(abs(x) for x in cl)):
                                    msg = (f"eigsh backward: eigenvalues {j} and {i} are (nearly) repeated "
                                           f"({wl[j]:.12g}, {wl[i]:.12g}; gap {abs(gap):.3g} <= degenerate_tol "
                                           f"{cfg.degenerate_tol:g} x max|w|) and the loss depends on the choice of "
                                           f"eigenvectors within their eigenspace: that gradient does not exist; use a "
                                           f"loss of the eigenspace (e.g. sum v v^T) or degenerate='warn'/'ignore' to "
                                           f"drop the coupling")
                                    _degenerate(cfg.degenerate, msg)
                                continue
                            q = q + X[:, j] * (cl[j] / gap)
                        rhs = g - X @ c
                        q = q - _projected_pinv_solve(A, vi, X, wl[i], rhs, red, rtol, ctx.eas[b])
                        Q[:, i] = Q[:, i] + q
                except _Abort:
                    comm.agree(red.error, "distributed eigsh backward")
                    raise DistributedError("a rank flagged an error but none reported it") from None  # unreachable
            ext = torch.cat([X, A._halo(X)], 0)
            if cols:
                # the symmetric part of Q V^T, as the core's eigsh (session 21): an entry's gradient equals its
                # mirror's, so gradient steps keep A symmetric (V diag(gw) V^T is symmetric already)
                qext = torch.cat([Q, A._halo(Q)], 0)
                out.append(0.5 * ((Q[p.row] * ext[p.col]).sum(-1) + (X[p.row] * qext[p.col]).sum(-1)))
            else:
                out.append((Q[p.row] * ext[p.col]).sum(-1))
        dV = torch.stack(out).reshape(*A.batch_shape, -1) if A.batch_shape else out[0]
        return dV, None, None, None, None


def eigsh(A, k: int = 6, *, which: str = "LM", sigma: float | None = None, tol: float = 0.0, maxiter: int | None = None,
          ncv: int | None = None, block: int = 2, v0: torch.Tensor | None = None, degenerate: str = "raise", degenerate_tol: float = 1e-8,
          on_nonconvergence: str = "raise", return_info: bool = False):
    """``k`` eigenpairs of a symmetric :class:`DSparseTensor` by distributed thick-restarted Lanczos.

    ``which``: "LA" / "SA" (largest / smallest algebraic) or "LM" (largest magnitude).
    ``tol=0`` is the core's contract ``||A v - w v|| <= default_rtol(dtype) (||A||_inf + |w|) ||v||``
    (1e-10 float64, 1e-5 float32), checked on the true residuals. ``ncv``: basis size (default
    ``max(2k + 1, k + 32)``, at most N); ``maxiter``: restarts (default ``max(100, 10 N / ncv)``);
    ``v0``: this rank's rows of a start vector (default: a fixed function of the global row id,
    the same for every partition). Returns ``(w, V)``: ``w`` ascending ``(*batch, k)``, the same
    on every rank; ``V`` this rank's rows ``(*batch, n_local, k)``, orthonormal over the ranks,
    each column's sign arbitrary. Differentiable in ``A.values`` (eigenvalues by
    Hellmann-Feynman, eigenvectors by one distributed MINRES each; see the module docstring).
    A :class:`DSparseTensorList` gives a list of results. Collective.

    Not built: ``sigma`` (shift-invert) and ``which="SM"`` (they need an inner distributed solve
    per Lanczos step), a mass matrix ``M``.
    """
    from .solve import _float_bits, _member_amax, is_symmetric
    from .tensor import DSparseTensor, DSparseTensorList

    if isinstance(A, DSparseTensorList):
        kw = dict(which=which, sigma=sigma, tol=tol, maxiter=maxiter, ncv=ncv, block=block, degenerate=degenerate,
                  degenerate_tol=degenerate_tol, on_nonconvergence=on_nonconvergence, return_info=return_info)
        with A.comm.checked("distributed eigsh"):
            if v0 is not None:
                raise st.InputError(f"eigsh on a DSparseTensorList takes no v0 (rank {A.comm.rank} passed one; call eigsh "
                                    f"per member to give one)")
        return [eigsh(a, k, **kw) for a in A]
    if not isinstance(A, DSparseTensor):
        raise st.InputError(f"sparsetorch_distributed.eigsh needs a DSparseTensor, got {type(A).__name__} (use "
                            f"sparsetorch.eigsh for a SparseTensor)")
    next_op_epoch()  # copies of A's values made by an earlier call are made again
    comm = A.comm
    t0 = time.perf_counter()
    N = A.pattern.shape[0]
    with comm.checked("distributed eigsh", same=("k", "which", "ncv", "block", "dtype", "maxiter", "tol", "degenerate_tol",
                                                 "degenerate", "on_nonconvergence", "A batch"), flags=GRAD_FLAGS,
                      floats=True) as chk:
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        if sigma is not None or which == "SM":
            raise st.InputError(f"distributed eigsh: {'sigma (shift-invert)' if sigma is not None else 'which=SM'} is not "
                                f"built (it needs a distributed solve per Lanczos step); use which='SA' / 'LA' / 'LM', or "
                                f"sparsetorch.eigsh on one process")
        if which not in _WHICH:
            raise st.InputError(f"distributed eigsh: which must be one of {_WHICH}, got {which!r}")
        if not isinstance(k, int) or isinstance(k, bool) or not (1 <= k <= N):
            raise st.InputError(f"distributed eigsh: k must be an int with 1 <= k <= N={N}, got {k!r}")
        if ncv is not None and (not isinstance(ncv, int) or isinstance(ncv, bool) or ncv < k + block):
            raise st.InputError(f"distributed eigsh: ncv must be an int >= k + block = {k + block}, got {ncv!r}")
        if not isinstance(block, int) or isinstance(block, bool) or block < 1:
            raise st.InputError(f"distributed eigsh: block must be an int >= 1, got {block!r}")
        if not (isinstance(tol, (int, float)) and tol >= 0):
            raise st.InputError(f"distributed eigsh: tol must be a non-negative number (0: the contract), got {tol!r}")
        if maxiter is not None and (not isinstance(maxiter, int) or maxiter < 0):
            raise st.InputError(f"distributed eigsh: maxiter (restarts) must be an int >= 0 or None, got {maxiter!r}")
        for name, val in (("degenerate", degenerate), ("on_nonconvergence", on_nonconvergence)):
            if val not in _POLICIES:
                raise st.InputError(f"distributed eigsh: {name} must be one of {_POLICIES}, got {val!r}")
        if v0 is not None and (not isinstance(v0, torch.Tensor) or tuple(v0.shape) != (A.n_local,)):
            raise st.InputError(f"distributed eigsh: v0 must be this rank's {A.n_local} rows, got "
                                f"{tuple(v0.shape) if isinstance(v0, torch.Tensor) else type(v0).__name__} on rank {comm.rank}")
        if not bool(torch.isfinite(A.values.detach()).all()):
            raise st.InputError(f"distributed eigsh: the matrix values hold NaN or Inf on rank {comm.rank}")
        # (made here: a conversion failing after the agreement raised on this rank alone)
        cfg = _Config(k, which, default_rtol(A.dtype) if tol == 0 else float(tol), ncv, block, maxiter, v0, degenerate,
                      float(degenerate_tol), on_nonconvergence)
        chk.same({"k": k, "which": _WHICH.index(which), "ncv": ncv or 0, "block": block, "dtype": dtype_code(A.dtype),
                  "maxiter": -1 if maxiter is None else maxiter, "tol": _float_bits(tol),
                  "degenerate_tol": _float_bits(cfg.degenerate_tol), "degenerate": _POLICIES.index(degenerate),
                  "on_nonconvergence": _POLICIES.index(on_nonconvergence), "A batch": batch_code(A)},
                 shown={"A batch": tuple(A.batch_shape), "which": which, "tol": tol, "degenerate_tol": degenerate_tol,
                        "degenerate": degenerate,
                        "on_nonconvergence": on_nonconvergence})
        # whether any rank records gradients, and each member's max |A| (the symmetry test's scale) and ||A||_inf
        # (the operator's), ride on the same all_reduce (more than FLOAT_SLOTS maxima: one max all_reduce more)
        grad_flags(chk, A._meta.requires_grad)
        values = A.values
        members = math.prod(A.batch_shape) if A.batch_shape else 1
        vflat = values.detach().reshape(members, -1)
        local = torch.cat([_member_amax(A, values).to(comm.device)] + [_inf_norm_local(A, vflat[i]) for i in range(members)])
        fits = chk.floats(local.tolist())
    anyone = settle_grad_mode(comm, chk, "distributed eigsh")
    m = chk.maxed_floats(local.numel()) if fits else (comm.allreduce(local, "max") if comm.size > 1 else local).cpu().tolist()
    amax, anorms = m[:members], m[members:]
    if not is_symmetric(A, _agreed=True, _amax=amax):
        raise st.NotSymmetricError("distributed eigsh needs a symmetric matrix: A z != A^T z for a random z beyond "
                                   "rounding (sparsetorch_distributed.is_symmetric); for a general matrix there is no "
                                   "distributed eigs yet")
    if anyone and not values.requires_grad:
        values = values.detach().requires_grad_(True)  # this rank takes part in the backward
    recs: list = []
    w, V = _Eigsh.apply(values, A, cfg, recs, anorms)
    worst = max(recs, key=lambda r: (r["status"] != Status.CONVERGED, r["residual"]))
    info = DEigshInfo(method="lanczos", k=k, which=which, ncv=worst["ncv"], matvecs=sum(r["matvecs"] for r in recs),
                      restarts=max(r["restarts"] for r in recs), residual=max(r["residual"] for r in recs),
                      converged=all(r["status"] == Status.CONVERGED for r in recs), status=worst["status"], tol=cfg.tol,
                      world_size=comm.size, reductions=sum(r["reductions"] for r in recs),
                      seconds=time.perf_counter() - t0)
    if not info.converged and on_nonconvergence != "ignore":
        msg = (f"distributed eigsh did not reach tol={cfg.tol:.3g}: worst relative residual {info.residual:.3g} after "
               f"{info.restarts} restarts ({info.matvecs} products, ncv={info.ncv}); raise maxiter or ncv")
        if on_nonconvergence == "raise":
            raise st.NotConvergedError(msg, info)
        warnings.warn(msg, st.NotConvergedWarning, stacklevel=2)
    return (w, V, info) if return_info else (w, V)


def _degenerate(policy: str, msg: str) -> None:
    """What ``degenerate=`` says to do where an eigenvector gradient does not exist: raise, warn, or nothing."""
    if policy == "raise":
        raise st.DegenerateEigenvalueError(msg)
    if policy == "warn":
        warnings.warn(msg, st.SparseTorchWarning, stacklevel=3)
