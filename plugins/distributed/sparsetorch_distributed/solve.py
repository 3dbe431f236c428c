"""Distributed ``solve`` (and the info it returns), differentiable by the adjoint method.

Forward: agreement on the inputs (local checks, then the ranks compare shapes and dtypes), the
preconditioner set up under an agreement (a singular local block on one rank is a
SingularMatrixError on all), the Krylov method, the true residual ``||b - A x|| / ||b||`` checked
at the end (restarts from the current ``x`` when the recurrence drifted), NotConvergedError on
every rank when it misses.

Backward (``x = A^-1 b``, loss cotangent ``g``): one distributed solve ``A^T lam = g`` with the same
method and the transposed preconditioner (``A^T`` products are the transposed halo exchange; a
symmetric ``A`` reuses the forward operator), then ``db = lam`` and, on each rank's own slots,
``dvalues[k] = -lam[row_k] x_ext[col_k]`` (one halo exchange of ``x``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

import sparsetorch as st
from sparsetorch.backend import Status, backward_error_bound, default_rtol

from .comm import dtype_code
from .errors import DistributedError
from .exchange import as_rows, from_rows
from .krylov import METHODS, Reducer, _Abort
from .krylov_block import BLOCK_METHODS, _cs, _red
from .ops import (GRAD_FLAGS, VECTOR_FLAGS, ambiguous, batch_code, check_vector, first_order_pair, grad_flags,
                  leaf_if_needed, settle_grad_mode, vector_flags, vector_reading)
from .precond import A_SINGULAR, make_preconditioner
from .tensor import next_op_epoch

__all__ = ["solve", "DSolveInfo", "is_symmetric"]

_POLICIES = ("raise", "warn", "ignore")
#: True-residual restarts after the recurrence claimed convergence.
MAX_RESTARTS = 4


@dataclass(frozen=True)
class DSolveInfo:
    """What ``solve(..., return_info=True)`` returns beside ``x`` (the same on every rank but ``seconds`` and
    ``halo``, this rank's wall time and halo volume; both compare=False)."""

    method: str
    preconditioner: str | None
    iterations: int
    residual: float              # true relative residual ||b - A x|| / ||b||, worst column / member
    converged: bool
    status: Status
    reason: str = ""
    residual_history: tuple[float, ...] = ()
    rtol: float = 0.0
    world_size: int = 1
    reductions: int = 0
    seconds: float = field(default=0.0, compare=False)   # this rank's wall time
    attempts: tuple[str, ...] = ()
    halo: dict = field(default_factory=dict, compare=False)
    backend: str = "distributed"


def _member_amax(A, values: torch.Tensor) -> torch.Tensor:
    """``max |values|`` of each member of a value batch (``(*batch, nse_local)``), float64 ``(members,)``, local."""
    members = math.prod(A.batch_shape) if A.batch_shape else 1
    v = values.detach().reshape(members, -1)
    if v.shape[1] == 0:
        return torch.zeros(members, dtype=torch.float64, device=v.device)
    return v.abs().amax(1).to(torch.float64)


def is_symmetric(A, values=None, *, seed: int = 1234, probes: int = 4, _agreed: bool = False,
                 _amax: list[float] | None = None) -> bool:
    """Probabilistic symmetry test with forward products only (no transposed blocks are built).

    For random ``Z`` (``probes`` columns) the Gram matrix ``G = Z^T A Z`` is symmetric exactly when
    ``z_i^T (A - A^T) z_j = 0``; with random vectors that holds (with probability one) only for a
    symmetric ``A``. One product of a block of ``probes`` columns per member and one reduction (the Gram
    entries and norms of the products, scaled by a power of two from ``max |A|``: a test independent of A's
    scale); ``|G_ij - G_ji| <= 1e3 eps ||z_i|| ||A z_j||`` (the rounding of the dot products) passes.
    Collective: A's deferred input error (:meth:`DSparseTensor.with_values`) and its value batch are agreed
    first, in one small all_reduce that also carries each member's ``max |A|`` (more than 8 members: one max
    all_reduce more). solve and eigsh, which agreed already, pass those maxima (``_amax``)."""
    comm = A.comm
    if _amax is None:
        fits = False
        if not _agreed and values is None:
            with comm.checked("is_symmetric", same=("A batch",), floats=True) as chk:
                A._check_writes()
                chk.same({"A batch": batch_code(A)}, shown={"A batch": tuple(A.batch_shape)})
                local = _member_amax(A, A.values)
                fits = chk.floats(local.tolist())
            if fits:
                _amax = chk.maxed_floats(local.numel())
        if _amax is None:
            local = _member_amax(A, A.values)
            _amax = (comm.allreduce(local, "max") if comm.size > 1 else local).cpu().tolist()
    g = torch.Generator().manual_seed(seed + A.comm.rank)
    Z = torch.randn(A.n_local, probes, generator=g, dtype=torch.float64).to(device=A.device, dtype=A.dtype)
    members = [None] if not A.batch_shape else list(A.values.detach().reshape(math.prod(A.batch_shape), A.nse_local))
    parts = []
    for v, m in zip(members, _amax):
        # each member's products scaled by the power of two putting max |A| in [0.5, 1) (|A z| is then at most a
        # few times the row's entry count), so that ||A z||^2 neither overflows (float32 entries of 1e20: the bound
        # became inf and a nonsymmetric A passed, the adjoint then reused A for A^T, b.grad 13 % off) nor underflows
        # (float64 x 1e-200: bound 0, NotSymmetricError on a symmetric A); outside sweep. (The products' own
        # maximum took one more max all_reduce per call; the review.)
        AZ = _times_pow2(A._mv(Z, v), [-_exponent(m, A.dtype)] * probes)
        parts += [(Z.t() @ AZ).reshape(-1), (Z * Z).sum(0), (AZ * AZ).sum(0)]
    red = A.comm.allreduce(torch.cat(parts).to(torch.float64), "sum").cpu()
    eps = torch.finfo(A.dtype).eps
    step = probes * probes + 2 * probes
    for i in range(len(members)):
        chunk = red[i * step:(i + 1) * step]
        G = chunk[:probes * probes].reshape(probes, probes)
        zn, azn = chunk[probes * probes:probes * probes + probes].sqrt(), chunk[probes * probes + probes:].sqrt()
        bound = 1e3 * eps * torch.outer(zn, azn).maximum(torch.outer(azn, zn))
        if bool(((G - G.t()).abs() > bound).any()):
            return False
    return True


@dataclass
class _Config:
    method: str | None
    preconditioner: object
    rtol: float
    atol: float
    maxiter: int | None
    restart: int
    on_nonconvergence: str
    local_options: dict | None
    symmetric: bool | None
    callback: object = None
    block: bool = True
    #: no tolerance given: a converged answer is refined to a direct method's backward error (the core's
    #: contract, docs/dispatch.md), by continuing the method from x with the tolerance that needs
    sharpen: bool = False


#: continued runs toward a direct method's backward error, at most (each from the current x)
SHARPEN_RUNS = 2


def _inf_backward_error(A, values, R: torch.Tensor, X: torch.Tensor, B: torch.Tensor, use_t: bool,
                        ascale: float = 1.0) -> torch.Tensor:
    """Per column, ``||r||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` over every rank (``||A^T||_inf`` when
    ``use_t``), float64 on the host; ``R``, ``X``, ``B`` this rank's rows, ``(n_local, k)``, of the system
    scaled by ``ascale`` (a power of two: the operator is ``ascale A``). Collective (one max all-reduce; the
    row sums of ``|A|`` by one product of ``|values|`` with ones)."""
    comm = A.comm
    k = R.shape[1]
    vals = A.values if values is None else values
    mag = vals.detach().abs().to(vals.dtype)
    ones = torch.ones(R.shape[0], 1, dtype=vals.dtype, device=R.device)
    sums = (A._rmv(ones, mag) if use_t else A._mv(ones, mag))[:, 0].abs()
    if R.shape[0]:
        parts = [sums.amax().reshape(1).double(), R.abs().amax(0).double(), X.abs().amax(0).double(), B.abs().amax(0).double()]
    else:
        z = torch.zeros(k, dtype=torch.float64, device=R.device)
        parts = [torch.zeros(1, dtype=torch.float64, device=R.device), z, z, z]
    t = torch.cat(parts)
    if comm.size > 1:
        t = comm.allreduce(t, "max")
    t = t.cpu()
    anorm, r, x, b = t[0] * ascale, t[1:1 + k], t[1 + k:1 + 2 * k], t[1 + 2 * k:]
    den = anorm * x + b
    return torch.where(den > 0, r / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(r))


def _order(cfg: _Config, symmetric: bool) -> list[str]:
    if cfg.method is not None:
        return [cfg.method]
    return ["cg", "minres", "gmres"] if symmetric else ["bicgstab", "gmres"]


def _exp_limit(dtype: torch.dtype) -> tuple[int, int]:
    """The binary exponents ``e`` for which ``2**e`` and ``2**-e`` are normal numbers of ``dtype`` (with a margin)."""
    fi = torch.finfo(dtype)
    return math.frexp(fi.tiny)[1] + 2, math.frexp(fi.max)[1] - 2


def _exponent(m: float, dtype: torch.dtype) -> int:
    """``e`` with ``m = f 2**e``, ``0.5 <= f < 1`` (0 for ``m == 0``), clamped to :func:`_exp_limit`."""
    if not m > 0 or not math.isfinite(m):
        return 0
    lo, hi = _exp_limit(dtype)
    return min(max(math.frexp(m)[1], lo), hi)


def _scale_maxes(vals: torch.Tensor, B2: torch.Tensor) -> torch.Tensor:
    """This rank's ``[max |vals|, max |B2[:, j]| for each column j]`` (float64, ``1 + k``): what
    :func:`_scale_exponents` reduces."""
    k = B2.shape[1]
    t = torch.zeros(1 + k, dtype=torch.float64, device=B2.device)
    if vals.numel():
        t[0] = vals.detach().abs().amax().to(torch.float64)
    if B2.shape[0]:
        t[1:] = B2.detach().abs().amax(0).to(torch.float64)
    return t


def _exponents(m: list[float], dtype: torch.dtype) -> tuple[int, list[int]]:
    """``(ea, eb)`` of :func:`_scale_exponents` from the reduced maxima ``[max |A|, max |B[:, j]|...]``."""
    ea = _exponent(m[0], dtype)
    if abs(ea) <= _exp_limit(dtype)[1] // 4:
        ea = 0
    return ea, [_exponent(x, dtype) for x in m[1:]]


def _scale_exponents(A, values, B2: torch.Tensor) -> tuple[int, list[int]]:
    """The powers of two a solve scales by (one max all-reduce; a forward solve gets them from :func:`solve`, where
    they ride on another reduction): ``(ea, eb)``, the operator divided by ``2**ea``
    (0 unless ``max |A|`` is far from 1: beyond a quarter of the exponent range, where squared norms of products
    overflow or underflow) and column ``j`` of ``B`` divided by ``2**eb[j]`` (its largest entry over the ranks then
    in ``[0.5, 1)``). Exact in floating point (powers of two), so the iteration is the one of the unscaled system
    wherever that neither underflows nor overflows: float32 ``b`` of 1e-25 had ``||b||^2 = 0`` ("b = 0", x = 0), of
    1e-21 a residual norm that underflowed (relative error 1.7e-2, reported 0), of 1e21 ``||b||^2 = inf``
    (NotConvergedError "not_finite after 0 iterations"); float64 likewise at 1e-170 / 1e160 (an outside sweep)."""
    t = _scale_maxes(A.values if values is None else values, B2)
    if A.comm.size > 1:
        t = A.comm.allreduce(t, "max")
    return _exponents(t.cpu().tolist(), A.dtype)


def _forward_scale_maxes(A, values: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """This rank's :func:`_scale_maxes` of every member of a forward solve (``values`` ``(*batch, nse)``, ``B`` as
    :class:`_Solve` takes it), concatenated: ``members * (1 + k)`` entries, the same count on every rank once the
    agreement passed (A's batch, B's dims and columns)."""
    n = A.n_local
    Bsz = math.prod(A.batch_shape) if A.batch_shape else 1
    vflat = values.detach().reshape(Bsz, -1)
    per_member = B.dim() > 2
    Bf = B.detach().reshape(Bsz, n, B.shape[-1]) if per_member else B.detach()
    return torch.cat([_scale_maxes(vflat[i], as_rows(Bf[i] if per_member else Bf, n)[0]) for i in range(Bsz)])


def _as_kernel_rhs(A, B: torch.Tensor) -> torch.Tensor:
    """``B`` as :class:`_Solve` takes it, for a shape that reads one way only: ``(*batch, n_local)`` (one vector
    per member of a batch of two or more dimensions) as ``(*batch, n_local, 1)``."""
    nb = len(A.batch_shape)
    return B.unsqueeze(-1) if nb > 1 and B.dim() == nb + 1 else B


def _times_pow2(X: torch.Tensor, d: list[int]) -> torch.Tensor:
    """``X * 2**d[j]`` per column (``X`` 1-D: one exponent), in steps whose factors are representable."""
    lim = _exp_limit(X.dtype)[1]
    d = list(d)
    while any(d):
        step = [max(-lim, min(lim, e)) for e in d]
        f = torch.tensor([2.0 ** e for e in step], dtype=X.dtype, device=X.device)
        X = X * (f if X.dim() > 1 else f[0])
        d = [e - s_ for e, s_ in zip(d, step)]
    return X


def _scaled_precond(M, ea: int):
    """The preconditioner of the operator scaled by ``2**-ea`` (an approximate inverse: times ``2**ea``)."""
    if M is None or ea == 0:
        return M
    f = 2.0 ** ea
    return lambda r: M(r) * f


def _guarded_callback(callback, red: Reducer, unscale):
    """The user's ``callback(iteration, residual)`` as the kernels call it: the residual in the caller's units
    (``unscale``: the right-hand side's scale, a float, or per column a ``(k,)`` tensor for the block kernels, whose
    residuals arrive per column; the worst is passed), and failure-tolerant as a preconditioner (Reducer.guard): an
    exception on one rank is recorded (a DistributedError naming it), travels with the next reduction and every
    rank raises it. A callback that raised on one rank used to leave the others in the next reduction until the
    collective timeout (outside sweep)."""
    if callback is None:
        return None

    def wrapped(it: int, res) -> None:
        if red.error is not None:
            return
        try:
            val = float((res * unscale).max()) if isinstance(res, torch.Tensor) else float(res) * float(unscale)
            callback(it, val)
        except Exception as exc:  # noqa: BLE001 - travels to every rank with the next reduction
            err = DistributedError(f"the solve callback raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            red.error = err
    return wrapped


def _one_solve(A, values, b1: torch.Tensor, cfg: _Config, *, transpose: bool, symmetric: bool, ea: int = 0, eb: int = 0):
    """Solve one right-hand side (1-D local) for one matrix; returns (x, info record). The system is solved scaled
    (:func:`_scale_exponents`): the operator by ``2**-ea``, ``b1`` by ``2**-eb``; ``x`` is unscaled at the end."""
    comm = A.comm
    red = Reducer(comm, A.device, torch.float64 if A.dtype == torch.float64 else torch.float32)
    use_t = transpose and not symmetric
    base = (lambda v: A._rmv(v[:, None], values)[:, 0]) if use_t else (lambda v: A._mv(v[:, None], values)[:, 0])
    sa = 2.0 ** -ea
    op = base if ea == 0 else (lambda v: base(v) * sa)
    b1 = _times_pow2(b1, [-eb])
    callback = _guarded_callback(cfg.callback, red, 2.0 ** eb)
    (bb,) = red([torch.dot(b1, b1)])
    bnorm = math.sqrt(bb)
    tol = max(cfg.rtol * bnorm, cfg.atol * 2.0 ** -eb)
    n_glob = A.pattern.shape[0]
    maxiter = cfg.maxiter if cfg.maxiter is not None else max(1000, 10 * n_glob)
    attempts: list[str] = []
    x = torch.zeros_like(b1)
    if bnorm == 0.0:
        return x, dict(method=_order(cfg, symmetric)[0], iterations=0, residual=0.0, status=Status.CONVERGED, reason="b = 0",
                       history=(), reductions=red.count, attempts=())
    last = None
    bound = backward_error_bound(A.dtype, 1)
    order, no_pre = list(_order(cfg, symmetric)), None
    while order:
        method = order.pop(0)
        if method not in METHODS:
            raise st.InputError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
        pre, M = (no_pre, None) if no_pre is not None else _preconditioner(A, values, cfg, method, last, use_t, comm)
        M = _scaled_precond(M, ea)
        M = red.guard(M) if M is not None else None
        kernel = METHODS[method]
        kw = {"restart": cfg.restart} if method == "gmres" else {}
        x = torch.zeros_like(b1)
        its, hist = 0, []
        status, reason = Status.MAX_ITERATIONS, ""
        goal, sharp, kept = tol, 0, None
        try:
            for _restart in range(MAX_RESTARTS + 1):
                x, res = kernel(op, b1, x, M, goal, maxiter - its, red, callback, **kw)
                its += res.iterations
                hist += res.history
                status, reason = res.status, res.reason
                r = b1 - op(x)
                (rr,) = red([torch.dot(r, r)])
                true = math.sqrt(max(rr, 0.0))
                if kept is not None and not true <= goal:
                    # a continued run short of its tighter goal: the better of the two answers (both met tol)
                    if not true < kept[1]:
                        x, true = kept
                    status, reason = Status.CONVERGED, f"{reason}; refinement toward a direct method's backward error stopped"
                    break
                if true <= goal:
                    status = Status.CONVERGED
                    if cfg.sharpen and sharp < SHARPEN_RUNS and its < maxiter:
                        eta = float(_inf_backward_error(A, values, r[:, None], x[:, None], b1[:, None], use_t, sa)[0])
                        if eta > bound:
                            kept, sharp = (x, true), sharp + 1
                            goal = true * min(0.5, 0.25 * bound / eta)
                            continue
                    break
                if status == Status.CONVERGED:
                    status, reason = Status.INACCURATE, f"true residual {true / bnorm:.3g} after the recurrence converged"
                    if its >= maxiter:
                        break
                    continue  # restart from x
                break
        except _Abort:
            no_pre = _preconditioner_failed(comm, red, method, pre, M, attempts)
            order.insert(0, method)  # the same method again, without the preconditioner
            continue
        if not math.isfinite(true):
            status = Status.NOT_FINITE
        rel = true / bnorm
        attempts.append(f"{method}+{pre}: {status.value} after {its} iterations, relative residual {rel:.3g}")
        last = dict(method=method, preconditioner=pre if isinstance(pre, str) or pre is None else "callable",
                    iterations=its, residual=rel, status=status, reason=reason, history=tuple(h / bnorm for h in hist),
                    reductions=red.count)
        if status == Status.CONVERGED:
            break
    last["attempts"] = tuple(attempts)
    return _times_pow2(x, [eb - ea]), last


def _preconditioner_failed(comm, red, what: str, pre, M, attempts: list) -> str:
    """After a rank flagged an error inside the Krylov loop: the agreed error is raised, unless it is the
    preconditioner's local solve finding its block singular or indefinite (jagmesh7 on 2 contiguous ranks: rank
    1's block has rank 567 of 569, and its LU says so only when applied; session 24's sweep). Then the attempt
    is recorded and the label of the preconditioner-free retry returned."""
    try:
        comm.agree(red.error, f"distributed {what}")
    except (st.SingularMatrixError, st.IndefiniteMatrixError) as exc:
        if M is None:
            raise
        red.error = None
        attempts.append(f"{what}+{pre}: the preconditioner failed when applied ({str(exc)[:160]})")
        return f"none ({pre} failed when applied)"
    raise DistributedError("a rank flagged an error but none reported it")  # unreachable: agree raised


def _block_precond(M, kind):
    """A preconditioner of 1-D local vectors applied to an ``(n, k)`` block: the built-in ones take
    blocks as they are (block Jacobi's local Solver solves every column at once), a callable is
    applied column by column."""
    if M is None:
        return None
    if callable(kind):
        return lambda R: torch.stack([M(R[:, j]) for j in range(R.shape[1])], 1)
    return M


def _block_solve(A, values, B2: torch.Tensor, cfg: _Config, *, transpose: bool, symmetric: bool, ea: int = 0,
                 eb: list[int] | None = None):
    """Every column of ``B2`` ``(n, k)`` in one block iteration (one reduction per step for all
    columns; see :mod:`.krylov_block`); returns (X, [info record]). Scaled as :func:`_one_solve` (``eb`` per
    column)."""
    comm = A.comm
    k = B2.shape[1]
    eb = [0] * k if eb is None else eb
    red = Reducer(comm, A.device, torch.float64 if A.dtype == torch.float64 else torch.float32)
    use_t = transpose and not symmetric
    base = (lambda V: A._rmv(V.contiguous(), values)) if use_t else (lambda V: A._mv(V.contiguous(), values))
    sa = 2.0 ** -ea
    op = base if ea == 0 else (lambda V: base(V) * sa)
    B2 = _times_pow2(B2, [-e for e in eb])
    callback = _guarded_callback(cfg.callback, red, torch.tensor([2.0 ** e for e in eb], dtype=torch.float64))
    bnorm = _red(red, [_cs(B2, B2)])[0].clamp_min(0).sqrt()
    tol = torch.maximum(cfg.rtol * bnorm, cfg.atol * torch.tensor([2.0 ** -e for e in eb], dtype=torch.float64))
    bsafe = torch.where(bnorm > 0, bnorm, torch.ones_like(bnorm))
    n_glob = A.pattern.shape[0]
    maxiter = cfg.maxiter if cfg.maxiter is not None else max(1000, 10 * n_glob)
    if not bool((bnorm > 0).any()):
        return torch.zeros_like(B2), [dict(method=_order(cfg, symmetric)[0], iterations=0, residual=0.0,
                                           status=Status.CONVERGED, reason="B = 0", history=(), reductions=red.count,
                                           attempts=(), columns=k)]
    attempts: list[str] = []
    last = None
    bound = backward_error_bound(A.dtype, 1)
    order, no_pre = list(_order(cfg, symmetric)), None
    while order:
        method = order.pop(0)
        pre, M = (no_pre, None) if no_pre is not None else _preconditioner(A, values, cfg, method, last, use_t, comm)
        M = _scaled_precond(_block_precond(M, pre), ea)
        M = red.guard(M) if M is not None else None
        kernel = BLOCK_METHODS[method]
        kw = {"restart": cfg.restart} if method == "gmres" else {}
        X = torch.zeros_like(B2)
        its, hist = 0, []
        status, reason = Status.MAX_ITERATIONS, ""
        goal, sharp, kept = tol, 0, None
        try:
            for _restart in range(MAX_RESTARTS + 1):
                X, res = kernel(op, B2, X, M, goal, maxiter - its, red, callback, **kw)
                its += res.iterations
                hist += res.history
                status, reason = res.status, res.reason
                R = B2 - op(X)
                true = _red(red, [_cs(R, R)])[0].clamp_min(0).sqrt()
                if kept is not None and not bool((true <= goal).all()):
                    # a continued run short of its tighter goal: per column, the better of the two answers
                    better = true < kept[1]
                    X = torch.where(better.to(X.device), X, kept[0])
                    true = torch.where(better, true, kept[1])
                    status, reason = Status.CONVERGED, f"{reason}; refinement toward a direct method's backward error stopped"
                    break
                if bool((true <= goal).all()):
                    status = Status.CONVERGED
                    if cfg.sharpen and sharp < SHARPEN_RUNS and its < maxiter:
                        eta = _inf_backward_error(A, values, R, X, B2, use_t, sa).to(true.device, true.dtype)
                        if bool((eta > bound).any()):
                            kept, sharp = (X, true), sharp + 1
                            # only the columns short of the bound tighten; the others keep their goal
                            goal = torch.where(eta > bound, true * torch.clamp(0.25 * bound / eta, max=0.5), goal)
                            continue
                    break
                if status == Status.CONVERGED:
                    status, reason = Status.INACCURATE, "true residual above the tolerance after the recurrence converged"
                    if its >= maxiter:
                        break
                    continue
                break
        except _Abort:
            no_pre = _preconditioner_failed(comm, red, f"block {method}", pre, M, attempts)
            order.insert(0, method)  # the same method again, without the preconditioner
            continue
        if not _finite_all(true):
            status = Status.NOT_FINITE
        rel = float((true / bsafe).max())
        attempts.append(f"{method}+{pre} ({k} columns together): {status.value} after {its} iterations, worst "
                        f"relative residual {rel:.3g}")
        last = dict(method=method, preconditioner=pre if isinstance(pre, str) or pre is None else "callable",
                    iterations=its, residual=rel, status=status, reason=reason,
                    history=tuple(float((h / bsafe).max()) for h in hist), reductions=red.count, columns=k)
        if status == Status.CONVERGED:
            break
    last["attempts"] = tuple(attempts)
    return _times_pow2(X, [e - ea for e in eb]), [last]


def _finite_all(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


#: a default solve (no method given) whose Krylov attempts all fail gathers A and B on every rank and solves them
#: there by the core's direct route when A has at most this many rows (the allgather moves every entry)
GATHERED_DIRECT_MAX = 100_000


def _solve_columns(A, values, B2: torch.Tensor, cfg: _Config, *, transpose: bool, symmetric: bool,
                   scales: tuple[int, list[int]] | None = None):
    if B2.shape[1] == 0:  # no right-hand sides (an (n, 0) B): nothing to solve, as matmul does
        return B2.clone(), [dict(method=_order(cfg, symmetric)[0], preconditioner=None, iterations=0, residual=0.0,
                                 status=Status.CONVERGED, reason="no right-hand sides", history=(), reductions=0,
                                 attempts=())]
    ea, eb = scales if scales is not None else _scale_exponents(A, values, B2)
    if B2.shape[1] > 1 and cfg.block:
        X, infos = _block_solve(A, values, B2, cfg, transpose=transpose, symmetric=symmetric, ea=ea, eb=eb)
    else:
        cols, infos = [], []
        for j in range(B2.shape[1]):
            xj, info = _one_solve(A, values, B2[:, j].contiguous(), cfg, transpose=transpose, symmetric=symmetric,
                                  ea=ea, eb=eb[j])
            cols.append(xj)
            infos.append(info)
        X = torch.stack(cols, 1) if cols else B2.clone()
    # (the statuses come from globally reduced residuals: every rank takes the same branch)
    if cfg.method is None and A.pattern.shape[0] <= GATHERED_DIRECT_MAX and \
            any(i["status"] != Status.CONVERGED for i in infos):
        return _gathered_direct(A, values, B2, transpose, infos)
    return X, infos


def _gathered_direct(A, values, B2: torch.Tensor, transpose: bool, infos: list):
    """Every rank gathers A's entries and B's rows, solves ``A X = B`` (``A^T``) with ``sparsetorch.solve``'s
    default (a direct method, the accuracy contract, a named error for a singular A) and keeps its own rows.
    The last resort of a default solve on a matrix the Krylov methods with block Jacobi do not solve (west0067,
    condition 1.3e2, 2 ranks: BiCGStab broke down, GMRES(30) stalled at 0.85; session 24's sweep). Collective."""
    comm = A.comm
    N = A.pattern.shape[0]
    with comm.agreement("distributed solve (gathered direct fallback)"):
        rows, cols = A.local_coo()
        vals = (A.values if values is None else values).detach()
        ids = A.owned_rows()
        parts = comm.allgather_object((rows.cpu(), cols.cpu(), vals.cpu(), ids.cpu(), B2.detach().cpu()))
        R = torch.cat([q[0] for q in parts])
        C = torch.cat([q[1] for q in parts])
        V = torch.cat([q[2] for q in parts])
        Bg = torch.zeros(N, B2.shape[1], dtype=B2.dtype)
        for q in parts:
            Bg[q[3]] = q[4]
        M = st.SparseTensor.from_coo(V, C, R, shape=(N, N)) if transpose else st.SparseTensor.from_coo(V, R, C, shape=(N, N))
        Xg, info = st.solve(M, Bg, return_info=True)
    X = Xg[ids.cpu()].to(B2.device)
    tried = [a for i in infos for a in i.get("attempts", ())]
    note = f"gathered on every rank: {info.backend}/{info.method} (the Krylov attempts failed)"
    rec = dict(method="direct", preconditioner=None, iterations=0, residual=float(info.residual),
               status=Status.CONVERGED, reason=note, history=(), reductions=sum(i["reductions"] for i in infos),
               attempts=tuple(tried) + (f"direct ({note}): converged, relative residual {info.residual:.3g}",))
    if "columns" in infos[0]:
        rec["columns"] = B2.shape[1]
    return X, [rec]


class _Solve(torch.autograd.Function):
    """Values ``(*batch, nse)``; ``B`` ``(n,)``/``(n, k)`` shared by the members, or ``(*batch, n, k)``."""

    @staticmethod
    def forward(ctx, values, B, A, cfg: _Config, symmetric: bool, infos: list, scales: list | None = None):
        n = A.n_local
        nb = len(A.batch_shape)
        Bsz = math.prod(A.batch_shape) if nb else 1
        vflat = values.detach().reshape(Bsz, -1)
        per_member = B.dim() > 2
        Bf = B.detach().reshape(Bsz, n, B.shape[-1]) if per_member else B.detach()
        Xs, outs = [], []
        for i in range(Bsz):
            B2, how = as_rows(Bf[i] if per_member else Bf, n)
            vi = None if not A.batch_shape else vflat[i]
            X2, inf = _solve_columns(A, vi, B2, cfg, transpose=False, symmetric=symmetric,
                                     scales=None if scales is None else scales[i])
            infos.extend(inf)
            Xs.append(X2)
            outs.append(from_rows(X2, how))
        ctx.A, ctx.cfg, ctx.symmetric, ctx.vflat, ctx.per_member = A, cfg, symmetric, vflat, per_member
        ctx.bshape, ctx.Xs = B.shape, Xs
        ctx.save_for_backward(values, B)  # anchors of the first-order-only gradients (create_graph=True)
        if nb:
            return torch.stack(outs).reshape(B.shape) if per_member else torch.stack(outs).reshape(*A.batch_shape, *B.shape)
        return outs[0]

    @staticmethod
    def backward(ctx, G):
        A, cfg = ctx.A, ctx.cfg
        p = A.pattern
        n = A.n_local
        nb = len(A.batch_shape)
        Bsz = math.prod(A.batch_shape) if nb else 1
        if ctx.per_member:
            Gf = G.reshape(Bsz, n, G.shape[-1])
        elif nb:
            Gf = G.reshape(Bsz, *ctx.bshape)
        else:
            Gf = G[None]
        gB, gV = [], []
        for i in range(Bsz):
            vi = None if not A.batch_shape else ctx.vflat[i]
            G2, how = as_rows(Gf[i].contiguous(), n)
            L2, _ = _solve_columns(A, vi, G2.contiguous(), cfg, transpose=True, symmetric=ctx.symmetric)
            gB.append(from_rows(L2, how))
            X2 = ctx.Xs[i]
            ext = torch.cat([X2, A._halo(X2)], 0)
            gV.append(-(L2[p.row] * ext[p.col]).sum(-1))
        dV = dB = None
        if ctx.needs_input_grad[0]:
            dV = torch.stack(gV).reshape(*A.batch_shape, -1) if nb else gV[0]
        if ctx.needs_input_grad[1]:
            dB = torch.stack(gB).reshape(ctx.bshape) if (ctx.per_member or not nb) else torch.stack(gB).sum(0)
        # both hold the values (and X, so B) constant (a Hessian-vector product came back 6 % off; session 24's sweep)
        dV, dB = first_order_pair(A, "solve", "B", dV, dB, *ctx.saved_tensors, values_in_values=True)
        return dV, dB, None, None, None, None, None


#: ``preconditioner`` as an integer for the ranks' agreement (a callable: 3, its own per rank)
_PRECONDITIONER_CODES = {None: 0, "jacobi": 1, "block_jacobi": 2}


def _float_bits(x) -> int:
    """A float option as the integer of its bits (None: -1), so that ranks compare it exactly."""
    if x is None:
        return -1
    import struct

    try:
        # -0.0 as 0.0: its bits are -2^63, which the agreement's negation overflows (and the same option)
        return int.from_bytes(struct.pack("<d", float(x) + 0.0), "little", signed=True)
    except (TypeError, ValueError):
        return -2


def solve(A, B: torch.Tensor, *, method: str | None = None, preconditioner="block_jacobi", rtol: float | None = None,
          atol: float = 0.0, maxiter: int | None = None, restart: int = 30, return_info: bool = False,
          on_nonconvergence: str = "raise", symmetric: bool | None = None, local_options: dict | None = None,
          callback=None, block: bool = True):
    """Solve ``A X = B`` for a :class:`DSparseTensor` (or a :class:`DSparseTensorList` with a list
    of right-hand sides); differentiable in ``A.values`` and ``B``. Collective.

    ``B`` is this rank's rows: ``(n_local,)``, ``(n_local, k)`` (shared by the members of a value
    batch), or for a value batch ``(*batch, n_local)`` (one vector per member) and
    ``(*batch, n_local, k)``; a 2-D ``B`` of a batch ``(B,)`` is one vector per member where it has
    shape ``(B, n_local)`` on every rank (the batched reading wins, as in ``sparsetorch.solve``), else
    ``(n_local, k)``: the reading is settled over the ranks, never by one rank's ``n_local``.
    ``method``: "cg", "minres" (symmetric A), "bicgstab", "gmres" (any A); default: CG then MINRES
    then GMRES for a symmetric A (tested with one random product each way), BiCGStab then GMRES
    otherwise, the next one taking over when one fails. ``preconditioner``:
    "block_jacobi" (each rank's diagonal block solved through ``sparsetorch.Solver`` dispatch;
    ``local_options`` are its options), "jacobi", None, or a callable on local vectors.
    ``rtol=None`` is the core's accuracy contract (1e-10 float64, 1e-5 float32), on the true
    residual ``||b - A x|| <= max(rtol ||b||, atol)`` per column. Returns ``X`` (or ``(X, info)``,
    a :class:`DSolveInfo` identical on every rank but ``seconds`` and ``halo``, this rank's own).
    """
    from .tensor import DSparseTensor, DSparseTensorList

    if isinstance(A, DSparseTensorList):
        with A.comm.checked("distributed solve"):
            Bs = list(B)
            if len(Bs) != len(A):
                raise st.InputError(f"a DSparseTensorList of {len(A)} matrices needs {len(A)} right-hand sides, got "
                                    f"{len(Bs)} on rank {A.comm.rank}")
        kw = dict(method=method, preconditioner=preconditioner, rtol=rtol, atol=atol, maxiter=maxiter, restart=restart,
                  return_info=return_info, on_nonconvergence=on_nonconvergence, symmetric=symmetric,
                  local_options=local_options, callback=callback, block=block)
        outs = [solve(a, b, **kw) for a, b in zip(A, Bs)]
        return ([o[0] for o in outs], [o[1] for o in outs]) if return_info else outs
    if not isinstance(A, DSparseTensor):
        raise st.InputError(f"sparsetorch_distributed.solve needs a DSparseTensor, got {type(A).__name__} (use "
                            f"sparsetorch.solve for a SparseTensor)")
    next_op_epoch()  # copies of A's values made by an earlier call are made again
    comm = A.comm
    t0 = time.perf_counter()
    same = ("dtype", "B dims", "columns", "method", "maxiter", "block", "rtol", "atol", "restart", "preconditioner",
            "symmetric", "on_nonconvergence", "A batch")
    with comm.checked("distributed solve", same=same, flags=GRAD_FLAGS + VECTOR_FLAGS, floats=True) as chk:
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        if on_nonconvergence not in _POLICIES:
            raise st.InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
        if method is not None and method not in METHODS:
            raise st.InputError(f"unknown method {method!r}; choose one of {sorted(METHODS)} or None")
        forms = check_vector(A, B, "solve")
        if not bool(torch.isfinite(B.detach()).all()):
            raise st.InputError(f"the right-hand side holds NaN or Inf on rank {comm.rank}")
        if not bool(torch.isfinite(A.values.detach()).all()):
            raise st.InputError(f"the matrix values hold NaN or Inf on rank {comm.rank}")
        if rtol is not None and not (isinstance(rtol, (int, float)) and rtol >= 0 and math.isfinite(rtol)):
            raise st.InputError(f"rtol must be a finite number >= 0 or None, got {rtol!r}")
        if not (isinstance(atol, (int, float)) and atol >= 0 and math.isfinite(atol)):
            raise st.InputError(f"atol must be a finite number >= 0, got {atol!r}")
        if maxiter is not None and (not isinstance(maxiter, int) or isinstance(maxiter, bool) or maxiter < 1):
            raise st.InputError(f"maxiter must be a positive int or None, got {maxiter!r}")
        if not isinstance(restart, int) or isinstance(restart, bool) or restart < 1:
            raise st.InputError(f"restart (GMRES's Krylov space per cycle) must be a positive int, got {restart!r}")
        chk.same({"dtype": dtype_code(B.dtype), "B dims": B.dim(), "columns": vector_flags(chk, A, B, forms),
                  "method": sorted(METHODS).index(method) + 1 if method else 0,
                  "maxiter": maxiter if maxiter is not None else -1, "block": int(bool(block)),
                  # options that steer the iteration: ranks that disagree on one
                  # waited in a collective until the timeout (session 21's sweep)
                  "rtol": _float_bits(rtol), "atol": _float_bits(atol),
                  "restart": int(restart) if isinstance(restart, int) else -2,
                  "preconditioner": _PRECONDITIONER_CODES.get(preconditioner, 3) if not callable(preconditioner) else 3,
                  "symmetric": -1 if symmetric is None else int(bool(symmetric)),
                  "on_nonconvergence": _POLICIES.index(on_nonconvergence), "A batch": batch_code(A)},
                 shown={"A batch": tuple(A.batch_shape), "dtype": str(B.dtype), "method": method, "rtol": rtol, "atol": atol,
                        "preconditioner": preconditioner if not callable(preconditioner) else "a callable",
                        "symmetric": symmetric, "on_nonconvergence": on_nonconvergence})
        # what the ranks must also know of each other rides on the same all_reduce: whether any records gradients,
        # and the maxima of |A| and of each column of B (the powers of two the solve scales by, _scale_exponents;
        # more than FLOAT_SLOTS of them: one max all_reduce more). Each took an all_reduce of its own (the review)
        grad_flags(chk, A._meta.requires_grad or B.requires_grad)
        values = A.values
        # a 2-D B of a one-dimensional batch: its reading (so the maxima's count) is settled by the agreement, and
        # its maxima take one max all_reduce of their own below
        local = None if ambiguous(A, B) else _forward_scale_maxes(A, values, _as_kernel_rhs(A, B))
        fits = local is not None and chk.floats(local.tolist())       # False beyond FLOAT_SLOTS maxima
    cfg = _Config(method, preconditioner, default_rtol(A.dtype) if rtol is None else float(rtol), float(atol), maxiter,
                  int(restart), on_nonconvergence, local_options, symmetric, callback, bool(block),
                  sharpen=rtol is None and not atol)
    anyone = settle_grad_mode(comm, chk, "distributed solve")
    per_member_vector = vector_reading(comm, chk, A, B, "distributed solve")
    B = leaf_if_needed(anyone, values, B)
    if per_member_vector:   # (*batch, n_local): one column per member (the result squeezed back below)
        B = B.unsqueeze(-1)
    if local is None:
        local = _forward_scale_maxes(A, values, B)
    if fits:
        m = chk.maxed_floats(local.numel())
    else:
        m = (comm.allreduce(local, "max") if comm.size > 1 else local).cpu().tolist()
    k1 = 1 + (B.shape[-1] if B.dim() > 1 else 1)
    groups = [m[i * k1:(i + 1) * k1] for i in range(len(m) // k1)]
    scales = [_exponents(grp, A.dtype) for grp in groups]
    sym = symmetric if symmetric is not None else is_symmetric(A, _agreed=True, _amax=[grp[0] for grp in groups])
    infos: list = []
    X = _Solve.apply(values, B, A, cfg, sym, infos, scales)
    if per_member_vector:
        X = X.squeeze(-1)
    worst = max(infos, key=lambda i: (i["status"] != Status.CONVERGED, i["residual"]))
    info = DSolveInfo(method=worst["method"], preconditioner=worst.get("preconditioner"),
                      iterations=max(i["iterations"] for i in infos), residual=max(i["residual"] for i in infos),
                      converged=all(i["status"] == Status.CONVERGED for i in infos), status=worst["status"],
                      reason=worst["reason"], residual_history=worst["history"], rtol=cfg.rtol, world_size=comm.size,
                      reductions=sum(i["reductions"] for i in infos), seconds=time.perf_counter() - t0,
                      attempts=worst.get("attempts", ()), halo=A.halo_volume())
    if not info.converged and on_nonconvergence != "ignore":
        msg = (f"distributed solve did not reach rtol={cfg.rtol:.3g}: {info.status.value} after {info.iterations} "
               f"iterations, true relative residual {info.residual:.3g} (attempts: {'; '.join(info.attempts)}); "
               + ("raise maxiter or try a stronger preconditioner" if cfg.method == "gmres" else
                  "raise maxiter, try method='gmres' or a stronger preconditioner"))
        if on_nonconvergence == "raise":
            raise st.NotConvergedError(msg, info)
        import warnings

        warnings.warn(msg, st.NotConvergedWarning, stacklevel=2)
    return (X, info) if return_info else X


def _preconditioner(A, values, cfg, method: str, last, use_t: bool, comm):
    """The preconditioner of one attempt (single- and multi-column solves alike): ``(name, M)``.
    An indefinite A makes an indefinite block-Jacobi block, and MINRES needs an SPD
    preconditioner: after an attempt that met indefiniteness, MINRES (chosen, not pinned) runs
    without it."""
    pre = cfg.preconditioner
    if method == "minres" and pre == "block_jacobi" and cfg.method is None and last is not None and \
            last["status"] == Status.INDEFINITE:
        pre = None
    try:
        with comm.agreement("setting up the preconditioner"):
            M = make_preconditioner(A, values if values is not None else A.values.detach(), pre,
                                    transpose=use_t, local_options=cfg.local_options)
    except st.SingularMatrixError as exc:
        if A_SINGULAR in str(exc):
            raise
        # (agreed: every rank is here) a singular diagonal block or a zero diagonal entry says nothing of A
        # itself: west0067 (condition 1.3e2) raised "the system has no solution" from rank 0's block on 2
        # ranks (session 24's sweep). The attempt runs without a preconditioner and says why.
        return f"none ({pre} could not be set up: {str(exc)[:160]})", None
    return pre, M
