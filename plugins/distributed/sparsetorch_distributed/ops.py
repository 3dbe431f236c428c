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
from .errors import DistributedError, MismatchError
from .exchange import as_rows, from_rows
from .tensor import next_op_epoch

__all__ = ["matmul", "dot", "norm", "matrix_norm", "global_sum", "check_vector", "first_order_pair"]


def check_vector(A, X: torch.Tensor, what: str, *, batch_ok: bool = True) -> tuple[bool, bool]:
    """Local shape/dtype/device checks of a vector against ``A`` (raises InputError, not agreed). Returns which of
    the two readings of a 2-D ``X`` for a matrix with one batch dimension fit this rank: ``(per_member,
    shared)`` (``(B, n_local)``, one vector per member, and ``(n_local, k)``, columns shared by the members);
    :func:`vector_flags` and :func:`vector_reading` settle the reading over the ranks. Other shapes read one way
    only: ``(False, False)`` for them."""
    if not isinstance(X, torch.Tensor):
        raise st.InputError(f"{what}: expected a torch.Tensor of this rank's {A.n_local} rows, got {type(X).__name__}")
    if X.dtype != A.dtype:
        raise st.InputError(f"{what}: the vector is {X.dtype} and the matrix {A.dtype} on rank {A.comm.rank} "
                            f"(cast with .to({A.dtype}))")
    if X.device != A.device:
        raise st.InputError(f"{what}: the vector is on {X.device} and the matrix on {A.device} (rank {A.comm.rank})")
    n, vb = A.n_local, tuple(A.batch_shape)
    nb = len(vb)
    forms = "(n_local,), (n_local, k)" + (f", {vb + ('n_local',)} or {vb + ('n_local', 'k')}" if nb else "")
    if X.dim() == 0:
        raise st.InputError(f"{what}: rank {A.comm.rank} owns {n} rows, the vector is a 0-d tensor (pass this rank's "
                            f"rows only: {forms})")
    if nb == 1 and X.dim() == 2:
        per_member = X.shape[0] == vb[0] and X.shape[1] == n
        shared = X.shape[0] == n
        if not (per_member or shared):
            raise st.InputError(f"{what}: rank {A.comm.rank} owns {n} rows, the vector has shape {tuple(X.shape)} "
                                f"(pass this rank's rows only: {forms}; a 2-D right-hand side of a matrix with value "
                                f"batch {vb} is one vector per member, ({vb[0]}, {n}) here, or columns shared by the "
                                f"members, ({n}, k))")
        return per_member, shared
    if X.dim() > 2:
        rowdim = X.dim() - 1 if nb and X.dim() == nb + 1 else X.dim() - 2   # (*batch, n_local) or (*batch, n_local, k)
        lead = tuple(X.shape[:rowdim])
        if not nb or lead != vb:
            raise st.InputError(f"{what}: a vector with batch {lead} needs a matrix with that value batch, the matrix "
                                f"has batch {vb} (rank {A.comm.rank}; shapes: {forms})")
        if X.shape[rowdim] != n:
            raise st.InputError(f"{what}: rank {A.comm.rank} owns {n} rows, the vector has shape {tuple(X.shape)} "
                                f"(pass this rank's rows only: {forms})")
        return False, False
    if X.shape[0] != n:
        raise st.InputError(f"{what}: rank {A.comm.rank} owns {n} rows, the vector has shape {tuple(X.shape)} "
                            f"(pass this rank's rows only: {forms})")
    return False, False


#: the flags :func:`vector_flags` sets in an entry point's ``comm.checked(..., flags=...)`` (the reading of a 2-D
#: right-hand side of a matrix with one batch dimension: which ranks it does not fit either way, its column counts)
VECTOR_FLAGS = ("rhs not per-member", "rhs not shared", "rhs columns hi", "rhs columns lo")


def ambiguous(A, X: torch.Tensor) -> bool:
    """Whether ``X``'s shape reads two ways for ``A`` (a 2-D ``X``, a matrix with one batch dimension): the same on
    every rank once the agreement compared the vector's dimensions and A's batch."""
    return len(A.batch_shape) == 1 and X.dim() == 2


def vector_flags(chk, A, X: torch.Tensor, fits: tuple[bool, bool]) -> int:
    """Inside an entry point's ``comm.checked``: the reading flags (:data:`VECTOR_FLAGS`) of this rank's ``X`` and the
    ``columns`` field every rank must share (returned; 0 for an ambiguous shape, whose column count is compared
    after the reading is settled)."""
    if ambiguous(A, X):
        chk.flag({"rhs not per-member": int(not fits[0]), "rhs not shared": int(not fits[1]),
                  "rhs columns hi": X.shape[1], "rhs columns lo": -X.shape[1]})
        return 0
    if len(A.batch_shape) > 1 and X.dim() == len(A.batch_shape) + 1:
        return 1    # one vector per member
    return X.shape[-1] if X.dim() > 1 else 1


def vector_reading(comm: Comm, chk, A, X: torch.Tensor, what: str) -> bool:
    """After the agreement: whether ``X`` is one vector per batch member, ``(*batch, n_local)`` (the caller then
    passes ``X.unsqueeze(-1)`` to the kernels and squeezes the result). A 2-D ``X`` of a matrix with one batch
    dimension of ``B`` members reads ``(B, n_local)`` (one vector per member) when it has that shape on every
    rank, which wins where ``(n_local, k)`` fits too (the core's rule: the batched reading wins), else
    ``(n_local, k)``, columns shared by the members, when it has that shape on every rank. The reading is decided
    from every rank's shape (flags of the agreement), so no rank's ``n_local`` alone decides it; a shape with no
    common reading raises ``InputError``, shared columns that differ between the ranks ``MismatchError``, on
    every rank (both from the same reduced flags)."""
    if not ambiguous(A, X):
        return len(A.batch_shape) >= 1 and X.dim() == len(A.batch_shape) + 1
    m = chk.maxed
    if not m["rhs not per-member"]:
        return True
    if not m["rhs not shared"]:
        hi, lo = m["rhs columns hi"], -m["rhs columns lo"]
        if hi != lo:
            everyone = comm.allgather_object(tuple(X.shape))
            raise MismatchError(f"{what}: the ranks disagree on columns (the right-hand side read as columns shared "
                                f"by the batch members, (n_local, k): " + ", ".join(f"rank {r}={s}" for r, s in
                                                                                   enumerate(everyone))
                                + "); every rank must pass the same k")
        return False
    everyone = comm.allgather_object(tuple(X.shape))
    B = A.batch_shape[0]
    raise st.InputError(f"{what}: the 2-D right-hand side reads neither as one vector per batch member ({B}, n_local) "
                        f"on every rank nor as columns shared by the members (n_local, k) on every rank (shapes: "
                        + ", ".join(f"rank {r}={s}" for r, s in enumerate(everyone))
                        + "); pass one form on every rank (a shared block may also be expanded over the batch: "
                          f"X.expand({B}, n_local, k))")


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
    """``A @ X`` (``A^T @ X`` with ``transpose``) for a DSparseTensor ``A`` and local ``X``: ``(n_local,)``,
    ``(n_local, k)`` (shared by the members of a value batch), or for a value batch ``(*batch, n_local)`` (one
    vector per member) and ``(*batch, n_local, k)``; a 2-D ``X`` of a one-dimensional batch of ``B`` reads
    ``(B, n_local)`` where it has that shape on every rank (:func:`vector_reading`). Collective."""
    next_op_epoch()  # copies of A's values made by an earlier call are made again
    comm = A.comm
    what = "DSparseTensor matmul"
    with comm.checked(what, same=("columns", "vector dims", "dtype", "A batch"), flags=GRAD_FLAGS + VECTOR_FLAGS) as chk:
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        forms = check_vector(A, X, "matmul")
        chk.same({"columns": vector_flags(chk, A, X, forms), "vector dims": X.dim(), "dtype": dtype_code(X.dtype),
                  "A batch": batch_code(A)}, shown={"A batch": tuple(A.batch_shape)})
        grad_flags(chk, A._meta.requires_grad or X.requires_grad)   # (the same all_reduce: no collective of its own)
    anyone = settle_grad_mode(comm, chk, what)
    per_member_vector = vector_reading(comm, chk, A, X, what)
    values = A.values
    X = leaf_if_needed(anyone, values, X)
    if per_member_vector:   # (*batch, n_local): one column per member
        return _Matmul.apply(values, X.unsqueeze(-1), A, transpose).squeeze(-1)
    return _Matmul.apply(values, X, A, transpose)


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


def norm(x, comm: Comm | None = None) -> torch.Tensor:
    """Global 2-norm of a distributed vector; replicated; differentiable (gradient ``x / ||x||``, 0 at ``x = 0`` as
    ``torch.linalg.vector_norm``). For a :class:`DSparseTensor` the Frobenius norm of the matrix (per member of
    a value batch, shape ``A.batch_shape``; see :func:`matrix_norm`); ``comm`` defaults to the matrix's (a
    vector's: the default group). One all_reduce of one float64: each rank's sum of squares, taken of its part
    scaled by a power of two from its own largest entry and unscaled in float64 (exact: powers of two), so that no
    square under- or overflows (float32 entries of 1e20 gave inf, of 1e-25 gave 0; the gradient at 0 was NaN;
    outside sweep). Only float64 parts whose largest entry is beyond 2**480 or below 2**-450 (and NaN / Inf) do
    not fit float64 that way: such a rank sends NaN and every rank then sends (exponent, scaled sum) in its two
    slots of a ``2 p`` float64 vector, one more all_reduce that gathers every pair exactly, combined alike on every
    rank relative to the largest exponent. (A max all_reduce of the scale first made every call two; the review.)
    Integer and bool tensors give ``sqrt(sum x^2)`` in the default float dtype, as before the scaled norm (which
    raised TypeError for them for a while); half precision sums in float32. Collective."""
    from .comm import get_comm
    from .tensor import DSparseTensor

    if isinstance(x, DSparseTensor):
        return matrix_norm(x, "fro", comm)
    if not isinstance(x, torch.Tensor):
        raise st.InputError(f"norm takes a distributed vector (this rank's rows, a torch.Tensor) or a DSparseTensor "
                            f"(its Frobenius norm), got {type(x).__name__}")
    comm = get_comm(comm)
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


def matrix_norm(A, ord: str = "fro", comm: Comm | None = None) -> torch.Tensor:
    """Frobenius norm of a :class:`DSparseTensor` (``ord="fro"``, the only one built): ``sqrt`` of the sum over the
    ranks of their slot values' squares (every stored entry lives on one rank, its row's owner; repeated input
    entries are summed into their slot first, as the matrix reads them). A value batch gives one norm per member,
    shape ``A.batch_shape``. Replicated, differentiable in ``A.values`` (and so in the entry values it was built
    from; gradient ``values / ||A||``, 0 at ``A = 0``). One all_reduce (sum) of ``members + 1`` float64: each
    rank's sum of squares per member, scaled by a power of two from its own largest entry and unscaled in float64
    (exact), and an error flag, so that a rank whose matrix cannot be read (a deferred :meth:`with_values` error, a
    bad ``ord``) raises the same error on every rank (one agreement more, on that path only). A float64 member
    whose largest entry on some rank is beyond ``2**480`` or below ``2**-450`` is taken again by :func:`norm`
    (one all_reduce more each, as a vector's). Collective."""
    from .comm import get_comm

    comm = A.comm if comm is None else get_comm(comm)
    what = "distributed norm"
    members = math.prod(A.batch_shape) if A.batch_shape else 1
    error: BaseException | None = None
    t = flat = None
    try:
        if ord != "fro":
            raise st.InputError(f"norm of a DSparseTensor: ord must be 'fro' (the Frobenius norm; the only one "
                                f"built), got {ord!r} on rank {comm.rank}")
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        flat = A.values.reshape(members, A.nse_local)
        t = _member_sumsq(flat)
    except st.SparseTorchError as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - this rank's matrix: agreed below, raised on every rank
        error = st.InputError(f"{what}: rank {comm.rank}'s input raised {type(exc).__name__}: {exc}")
        error.__cause__ = exc
    if t is None:
        t = torch.zeros(members, dtype=torch.float64, device=A.device)
    flag = t.new_full((1,), 1.0 if error is not None else 0.0).detach()
    ss = global_sum(torch.cat([t, flag]), comm)
    if float(ss[-1].detach()):
        comm.agree(error, what)   # every rank sees the flag: the failing rank's error, raised on every rank
        raise DistributedError(f"{what}: a rank flagged an error but none reported it")  # unreachable
    ss = ss[:-1]
    assert flat is not None
    if not bool(torch.isfinite(ss.detach()).all()):
        # some rank's member does not fit float64 unscaled (or holds NaN / Inf): norm's exact slots, per member
        out = torch.stack([norm(flat[i], comm) for i in range(members)])
    else:
        pos = ss > 0    # a zero member: value 0, gradient 2 y = 0 (sqrt's was 0 * inf = NaN)
        out = torch.where(pos, torch.sqrt(torch.where(pos, ss, torch.ones_like(ss))), ss).to(A.dtype)
    return out.reshape(A.batch_shape) if A.batch_shape else out[0]


def _member_sumsq(flat: torch.Tensor) -> torch.Tensor:
    """Per row of ``flat`` ``(members, nse)``: this rank's sum of squares in float64, computed scaled by a power of
    two from the row's largest entry (exact) and unscaled; NaN where that does not fit float64 (a float64 row whose
    largest entry is beyond ``2**480`` or below ``2**-450``, as :func:`norm`'s; NaN / Inf entries too)."""
    members = flat.shape[0]
    if flat.shape[1] == 0:
        return torch.zeros(members, dtype=torch.float64, device=flat.device) + 0.0 * flat.sum(-1).to(torch.float64)
    m = flat.detach().abs().amax(-1).to(torch.float64).cpu().tolist()
    fi = torch.finfo(flat.dtype)
    lo, hi = math.frexp(fi.tiny)[1] + 2, math.frexp(fi.max)[1] - 2
    exps = [min(max(math.frexp(v)[1], lo), hi) if v > 0 and math.isfinite(v) else 0 for v in m]
    down = torch.tensor([2.0 ** -e for e in exps], dtype=torch.float64, device=flat.device)
    y = flat.to(torch.float64) * down[:, None]      # exact (powers of two); e piecewise constant: no gradient
    s = (y * y).sum(-1)
    wide = flat.dtype == torch.float64
    fast = [not wide or v == 0.0 or _NORM_FAST_EXP[0] <= e <= _NORM_FAST_EXP[1] for v, e in zip(m, exps)]
    up = torch.tensor([4.0 ** e if ok else math.nan for e, ok in zip(exps, fast)], dtype=torch.float64,
                      device=flat.device)
    return s * up
