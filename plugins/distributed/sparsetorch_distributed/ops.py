"""Distributed products and reductions, differentiable.

- ``matmul(A, X)``: ``A X`` (or ``A^T X``), backward ``dX = A^T dY`` (transposed exchange) and
  ``dvalues[k] = dY[row_k] . X_ext[col_k]`` on this rank's slots (the halo part of ``X`` is the one
  the forward received);
- ``dot(x, y)``, ``norm(x)``, ``global_sum(t)``: all_reduce'd scalars, the same on every rank. Their
  backward treats the replicated result as one number: each rank's local part gets the upstream
  gradient (no second reduction), which is what every rank calling ``loss.backward()`` on the
  replicated loss needs.

Autograd contract of this package: every rank runs the backward of every distributed op it ran
forward (the backward passes communicate too); the simplest way is a replicated scalar loss built
with :func:`dot`/:func:`global_sum` and ``loss.backward()`` on every rank.
"""

from __future__ import annotations

import hashlib

import math

import torch

import sparsetorch as st
from sparsetorch.backend import first_order_in, first_order_only

from .comm import Comm, dtype_code
from .errors import MismatchError
from .exchange import as_rows, from_rows
from .tensor import next_op_epoch

__all__ = ["matmul", "dot", "norm", "global_sum", "check_vector", "first_order_pair"]


def check_vector(A, X: torch.Tensor, what: str, *, batch_ok: bool = True) -> None:
    """Local shape/dtype/device checks of a vector against ``A`` (raises InputError, not agreed)."""
    if not isinstance(X, torch.Tensor):
        raise st.InputError(f"{what}: expected a torch.Tensor of this rank's {A.n_local} rows, got {type(X).__name__}")
    if X.dtype != A.dtype:
        raise st.InputError(f"{what}: the vector is {X.dtype} and the matrix {A.dtype} on rank {A.comm.rank} "
                            f"(cast with .to({A.dtype}))")
    if X.device != A.device:
        raise st.InputError(f"{what}: the vector is on {X.device} and the matrix on {A.device} (rank {A.comm.rank})")
    rowdim = 0 if X.dim() <= 2 else X.dim() - 2
    if X.dim() == 0 or X.shape[rowdim] != A.n_local:
        raise st.InputError(f"{what}: rank {A.comm.rank} owns {A.n_local} rows, the vector has shape {tuple(X.shape)} "
                            f"(pass this rank's rows only: (n_local,), (n_local, k) or (*batch, n_local, k))")
    if X.dim() > 2:
        if not A.batch_shape or tuple(X.shape[:-2]) != A.batch_shape:
            raise st.InputError(f"{what}: a vector with batch {tuple(X.shape[:-2])} needs a matrix with that value "
                                f"batch, the matrix has batch {A.batch_shape}")


class _Matmul(torch.autograd.Function):
    """Values ``(*batch, nse)`` and local ``X``: ``(n,)``/``(n, k)`` (shared by every batch member) or
    ``(*batch, n, k)`` (one block per member). Members are multiplied one after the other."""

    @staticmethod
    def forward(ctx, values, X, A, transpose: bool):
        n = A.n_local
        B = math.prod(A.batch_shape) if A.batch_shape else 1
        vflat = values.detach().reshape(B, -1)
        per_member = X.dim() > 2
        Xf = X.detach().reshape(B, n, X.shape[-1]) if per_member else X.detach()
        Ys, saved = [], []
        for i in range(B):
            X2, how = as_rows(Xf[i] if per_member else Xf, n)
            vi = None if not A.batch_shape else vflat[i]  # one matrix: the tensor's cached CSR blocks
            if transpose:
                Y2, H = A._rmv(X2, vi), None
            else:
                Y2, H = A._mv(X2, vi, keep_halo=True)
            saved.append((X2, H))
            Ys.append(from_rows(Y2, how))
        if A.batch_shape:
            Y = torch.stack(Ys).reshape(*A.batch_shape, *Ys[0].shape)
        else:
            Y = Ys[0]
        ctx.A, ctx.transpose, ctx.saved, ctx.B, ctx.per_member, ctx.xshape = A, transpose, saved, B, per_member, X.shape
        ctx.vflat = vflat
        ctx.save_for_backward(values, X)  # anchors of the first-order-only gradients (create_graph=True)
        return Y

    @staticmethod
    def backward(ctx, G):
        A, B = ctx.A, ctx.B
        p = A.pattern
        n = A.n_local
        need_v, need_x = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        Gf = G.reshape(B, *G.shape[len(A.batch_shape):]) if A.batch_shape else G[None]
        gX, gV = [], []
        for i in range(B):
            G2, how = as_rows(Gf[i].contiguous(), n)
            vi = None if not A.batch_shape else ctx.vflat[i]
            X2, H = ctx.saved[i]
            if ctx.transpose:
                # Y = A^T X: dX = A dY (the halo of dY arrives), dvalues[k] = X[row_k] . dY_ext[col_k]
                Gx, Gh = A._mv(G2, vi, keep_halo=True)
                if need_x:
                    gX.append(from_rows(Gx, how))
                if need_v:
                    gV.append((X2[p.row] * torch.cat([G2, Gh], 0)[p.col]).sum(-1))
            else:
                # Y = A X: dX = A^T dY (transposed exchange), dvalues[k] = dY[row_k] . X_ext[col_k]
                if need_x:
                    gX.append(from_rows(A._rmv(G2, vi), how))
                if need_v:
                    gV.append((G2[p.row] * torch.cat([X2, H], 0)[p.col]).sum(-1))
        dX = dV = None
        if need_x:
            dX = torch.stack(gX).reshape(ctx.xshape) if ctx.per_member else torch.stack(gX).sum(0).reshape(ctx.xshape)
        if need_v:
            dV = torch.stack(gV).reshape(*A.batch_shape, -1) if A.batch_shape else gV[0]
        # the values' gradient holds X as a constant (the mixed derivative came back None; session 24's sweep)
        dV, dX = first_order_pair(A, "matmul", "x", dV, dX, *ctx.saved_tensors, values_in_values=False)
        return dV, dX, None, None


def first_order_pair(A, op: str, name: str, dV, dY, values, Y, *, values_in_values: bool):
    """The gradients ``(dV, dY)`` of an op's values and vector input ``Y``, made to raise where differentiating
    them again (create_graph=True) would read constants: both are recorded as functions of the incoming gradient
    only. On several ranks the backward's halo exchanges are not recorded at all (every second derivative
    raises); on one, ``dY`` held the values constant and ``dV`` held ``Y`` (and, ``values_in_values``, the
    values: a solve's x) constant."""
    if not torch.is_grad_enabled():
        return dV, dY
    if A.comm.size > 1:
        what = f"distributed {op} on several ranks"
        return first_order_only(dV, what, values, Y), first_order_only(dY, what, values, Y)
    anchors = (values, Y) if values_in_values else (Y,)
    return (first_order_in(dV, f"distributed {op} (gradient of the values)", *anchors),
            first_order_in(dY, f"distributed {op} (gradient of {name}, in the values)", values))


def matmul(A, X: torch.Tensor, *, transpose: bool = False) -> torch.Tensor:
    """``A @ X`` (``A^T @ X`` with ``transpose``) for a DSparseTensor ``A`` and local ``X``. Collective."""
    next_op_epoch()  # copies of A's values made by an earlier call are made again
    comm = A.comm
    what = "DSparseTensor matmul"
    with comm.checked(what, same=("columns", "vector dims", "dtype", "A batch"), flags=GRAD_FLAGS) as chk:
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        check_vector(A, X, "matmul")
        chk.same({"columns": X.shape[-1] if X.dim() > 1 else 1, "vector dims": X.dim(), "dtype": dtype_code(X.dtype),
                  "A batch": batch_code(A)}, shown={"A batch": tuple(A.batch_shape)})
        grad_flags(chk, A._meta.requires_grad or X.requires_grad)   # (the same all_reduce: no collective of its own)
    anyone = settle_grad_mode(comm, chk, what)
    values = A.values
    return _Matmul.apply(values, leaf_if_needed(anyone, values, X), A, transpose)


def batch_code(A) -> int:
    """A's value batch as one integer the ranks compare (a batch on one rank only left the others in the halo
    exchange): 0 for none, else a 56-bit hash of the batch shape (so (2, 3) and (3, 2) differ)."""
    if not A.batch_shape:
        return 0
    return 1 + int.from_bytes(hashlib.blake2b(repr(tuple(A.batch_shape)).encode(), digest_size=7).digest(), "little")


#: the flags :func:`grad_flags` sets in an entry point's ``comm.checked(..., flags=GRAD_FLAGS)``
GRAD_FLAGS = ("grad recorded", "grad off")


def grad_flags(chk, mine: bool) -> None:
    """Inside an entry point's ``comm.checked(..., flags=GRAD_FLAGS)``: this rank's grad mode and whether it records
    gradients (``mine``: its inputs require grad), carried by the agreement's all_reduce (no collective of its own;
    :func:`settle_grad_mode` reads them after the block)."""
    on = torch.is_grad_enabled()
    chk.flag({"grad recorded": int(on and mine), "grad off": int(not on)})


def settle_grad_mode(comm: Comm, chk, what: str) -> bool:
    """Whether any rank records gradients, from the flags :func:`grad_flags` put in the agreement (``chk``: its
    :class:`~.comm.Check`). The backward pass communicates, so a rank with grad mode off while another records
    gradients would leave that one waiting in its backward; then every rank raises :class:`MismatchError` naming
    the ranks (every rank reaches this, whatever its grad mode: the check used to be skipped under
    ``torch.no_grad()``, leaving the other ranks in its all_reduce until the timeout; outside sweep)."""
    anyone, anyone_off = chk.maxed.get("grad recorded", 0), chk.maxed.get("grad off", 0)
    if anyone and anyone_off and comm.size > 1:
        everyone = comm.allgather_object(torch.is_grad_enabled())
        off = ", ".join(f"rank {r}" for r, e in enumerate(everyone) if not e)
        on_ = ", ".join(f"rank {r}" for r, e in enumerate(everyone) if e)
        raise MismatchError(f"{what}: grad mode differs between the ranks: torch.is_grad_enabled() is False on {off} "
                            f"while {on_} record gradients (inputs that require grad); the backward pass communicates, "
                            f"so every rank must record it or none (use the same torch.no_grad() context on every rank)")
    return bool(anyone)


def agree_grad_mode(comm: Comm, mine: bool, what: str) -> bool:
    """:func:`grad_flags` and :func:`settle_grad_mode` with an all_reduce of their own, for a caller with no
    agreement to carry them (the entry points carry them in their ``comm.checked``). Collective in every grad mode."""
    from .comm import Check

    chk = Check((), GRAD_FLAGS)
    grad_flags(chk, mine)
    chk.maxed = comm.agree(None, what, flags=chk.flags) if comm.size > 1 else dict(chk.flags)
    return settle_grad_mode(comm, chk, what)


def leaf_if_needed(anyone: bool, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """When any rank records gradients (``anyone``, from :func:`settle_grad_mode`), every rank's output must
    require grad (its backward communicates): a rank whose inputs do not gets ``X`` as a fresh leaf that does (its
    gradient is dropped)."""
    if anyone and not (values.requires_grad or X.requires_grad):
        return X.detach().requires_grad_(True)
    return X


def agree_grad(comm: Comm, values: torch.Tensor, X: torch.Tensor, what: str = "distributed op") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`leaf_if_needed` after :func:`agree_grad_mode` (an all_reduce of its own, in every grad mode)."""
    if comm.size == 1:
        return values, X
    anyone = agree_grad_mode(comm, values.requires_grad or X.requires_grad, what)
    return values, leaf_if_needed(anyone, values, X)


# reductions ---------------------------------------------------------------------------------------
class _GlobalSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, comm: Comm):
        out = t.detach().clone()
        return comm.allreduce(out, "sum")

    @staticmethod
    def backward(ctx, g):
        return g, None


def global_sum(t: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Sum of ``t`` over the ranks (elementwise), replicated; differentiable (see module doc)."""
    return _GlobalSum.apply(t, comm)


def dot(x: torch.Tensor, y: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Global ``x . y`` of distributed vectors (summed over rows, and columns for blocks); replicated."""
    # every rank raises, or none: a rank raising alone left the others in the all-reduce until the
    # timeout (session 21's sweep)
    with comm.checked("dot"):
        for name, t in (("x", x), ("y", y)):
            if not isinstance(t, torch.Tensor):
                raise st.InputError(f"dot: {name} is a {type(t).__name__} on rank {comm.rank}, not a torch.Tensor")
        if x.shape != y.shape:
            raise st.InputError(f"dot: local shapes differ on rank {comm.rank} ({tuple(x.shape)} vs {tuple(y.shape)})")
    return global_sum((x * y).sum(), comm)


#: float64 exponents of a rank's largest entry between which its unscaled sum of squares is exact enough to add to
#: the others' as is (no overflow below 2**480, even over 2**60 entries; above 2**-450 every entry that matters
#: against the largest squares to a normal float64)
_NORM_FAST_EXP = (-450, 480)


def norm(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Global 2-norm of a distributed vector; replicated; differentiable (gradient ``x / ||x||``, 0 at ``x = 0`` as
    ``torch.linalg.vector_norm``). One all_reduce of one float64: each rank's sum of squares, taken of its part
    scaled by a power of two from its own largest entry and unscaled in float64 (exact: powers of two), so that no
    square under- or overflows (float32 entries of 1e20 gave inf, of 1e-25 gave 0; the gradient at 0 was NaN;
    outside sweep). Only float64 parts whose largest entry is beyond 2**480 or below 2**-450 (and NaN / Inf) do
    not fit float64 that way: such a rank sends NaN and every rank then sends (exponent, scaled sum) in its two
    slots of a ``2 p`` float64 vector, one more all_reduce that gathers every pair exactly, combined alike on every
    rank relative to the largest exponent. (A max all_reduce of the scale first made every call two; the review.)
    Integer and bool tensors give ``sqrt(sum x^2)`` in the default float dtype, as before the scaled norm (which
    raised TypeError for them for a while); half precision sums in float32. Collective."""
    if not x.is_floating_point() and not x.is_complex():
        x = x.to(torch.float64)
        out_dtype = torch.get_default_dtype()
    else:
        out_dtype = x.real.dtype
    wide = x.dtype in (torch.float64, torch.complex128)
    acc = torch.float64 if wide else torch.float32
    m = float(x.detach().abs().amax()) if x.numel() else 0.0
    e = 0
    if m > 0 and math.isfinite(m):
        fi = torch.finfo(x.dtype)   # 2**-e must be representable in x's dtype
        e = min(max(math.frexp(m)[1], math.frexp(fi.tiny)[1] + 2), math.frexp(fi.max)[1] - 2)
    y = x * 2.0 ** -e if e else x       # exact (a power of two); e is piecewise constant in x: no gradient
    if y.is_complex():
        y = torch.view_as_real(y)
    y = y.to(acc) if y.dtype != acc else y
    s = (y * y).sum().to(torch.float64)
    if not wide or m == 0.0 or _NORM_FAST_EXP[0] <= e <= _NORM_FAST_EXP[1]:
        t = s * 2.0 ** (2 * e) if e else s  # float32 parts always fit: squares of 2**+-150 are normal float64
    else:
        t = torch.full_like(s, math.nan)    # this rank's sum does not fit float64 unscaled: the slots below
    ss = global_sum(t.reshape(1), comm)[0]
    total = float(ss.detach())
    if math.isfinite(total):
        if total == 0.0:                # x = 0 on every rank: value 0, gradient 2 y = 0 (sqrt's was 0 * inf = NaN)
            return ss.to(out_dtype)
        return torch.sqrt(ss).to(out_dtype)
    return _norm_slots(x, acc, s.detach(), e, comm).to(out_dtype)


def _norm_slots(x: torch.Tensor, acc: torch.dtype, s: torch.Tensor, e: int, comm: Comm) -> torch.Tensor:
    """:func:`norm` where some rank's sum of squares does not fit float64 unscaled: rank ``r``'s pair (``e``, its
    scaled sum ``s``) in slots ``2r``, ``2r + 1`` of a ``2 p`` float64 vector, summed over the ranks (exact: the
    other slots are zeros), then ``sqrt(sum_r s_r 2**(2 (e_r - top))) 2**top`` alike on every rank. The gradient
    comes from this rank's sum of squares of ``x 2**-top`` (its value may underflow where it is negligible, its
    gradient ``2 x 2**(-2 top)`` does not; through a coefficient ``2**(2 (e - top))`` it did, to 0)."""
    r, p = comm.rank, comm.size
    slots = torch.zeros(2 * p, dtype=torch.float64, device=s.device)
    slots[2 * r] = float(e)
    slots[2 * r + 1] = s
    host = comm.allreduce(slots, "sum").cpu().reshape(p, 2).tolist()
    vals = [v for _, v in host]
    live = [int(ex) for ex, v in host if v != 0.0]
    top = max(live) if live else 0
    if any(math.isnan(v) for v in vals):
        total = math.nan
    elif any(math.isinf(v) for v in vals):
        total = math.inf
    else:   # every rank's sum relative to 2**(2 top) (those far below underflow to 0: negligible against the top's)
        total = sum(v * 2.0 ** (2 * (int(ex) - top)) for ex, v in host)
    y = x * 2.0 ** -top if top else x
    if y.is_complex():
        y = torch.view_as_real(y)
    y = y.to(acc) if y.dtype != acc else y
    mine = (y * y).sum().to(torch.float64)
    mine = torch.where(torch.isfinite(mine), mine, torch.zeros_like(mine))
    ss = (mine - mine.detach()) + total     # the value: total; the gradient: this rank's part
    if not live:
        return ss
    h = top // 2
    return torch.sqrt(ss) * 2.0 ** h * 2.0 ** (top - h)
