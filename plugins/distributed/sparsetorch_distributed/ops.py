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
    with comm.checked("DSparseTensor matmul", same=("columns", "vector dims", "dtype", "A batch")) as chk:
        A._check_writes()  # with_values' deferred input error, or a write into summed values that would be dropped
        check_vector(A, X, "matmul")
        chk.same({"columns": X.shape[-1] if X.dim() > 1 else 1, "vector dims": X.dim(), "dtype": dtype_code(X.dtype),
                  "A batch": batch_code(A)}, shown={"A batch": tuple(A.batch_shape)})
    values, X = agree_grad(comm, A.values, X, "DSparseTensor matmul")
    return _Matmul.apply(values, X, A, transpose)


def batch_code(A) -> int:
    """A's value batch as one integer the ranks compare (a batch on one rank only left the others in the halo
    exchange): 0 for none, else a 56-bit hash of the batch shape (so (2, 3) and (3, 2) differ)."""
    if not A.batch_shape:
        return 0
    return 1 + int.from_bytes(hashlib.blake2b(repr(tuple(A.batch_shape)).encode(), digest_size=7).digest(), "little")


def agree_grad_mode(comm: Comm, mine: bool, what: str) -> bool:
    """Whether any rank records gradients through a collective op (``mine``: this rank's inputs require grad); one
    small all_reduce on every rank, whatever its grad mode. The backward pass communicates, so a rank with grad
    mode off while another records gradients would leave that one waiting in its backward, and the check itself
    was skipped under ``torch.no_grad()`` (the other ranks waited in its all_reduce until the timeout; outside
    sweep): then every rank raises :class:`MismatchError` naming the ranks."""
    if comm.size == 1:
        return mine and torch.is_grad_enabled()
    on = torch.is_grad_enabled()
    anyone, anyone_off = comm.max_int([1 if (on and mine) else 0, 0 if on else 1])
    if anyone and anyone_off:
        everyone = comm.allgather_object(on)
        off = ", ".join(f"rank {r}" for r, e in enumerate(everyone) if not e)
        on_ = ", ".join(f"rank {r}" for r, e in enumerate(everyone) if e)
        raise MismatchError(f"{what}: grad mode differs between the ranks: torch.is_grad_enabled() is False on {off} "
                            f"while {on_} record gradients (inputs that require grad); the backward pass communicates, "
                            f"so every rank must record it or none (use the same torch.no_grad() context on every rank)")
    return bool(anyone)


def agree_grad(comm: Comm, values: torch.Tensor, X: torch.Tensor, what: str = "distributed op") -> tuple[torch.Tensor, torch.Tensor]:
    """When any rank's inputs require grad, every rank's output must (its backward communicates):
    a rank whose inputs do not gets ``X`` as a fresh leaf that does (its gradient is dropped). Collective in
    every grad mode (:func:`agree_grad_mode`)."""
    if comm.size == 1:
        return values, X
    mine = values.requires_grad or X.requires_grad
    anyone = agree_grad_mode(comm, mine, what)
    if anyone and not mine:
        X = X.detach().requires_grad_(True)
    return values, X


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


def norm(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Global 2-norm of a distributed vector; replicated; differentiable (gradient ``x / ||x||``, 0 at ``x = 0`` as
    ``torch.linalg.vector_norm``). The sum of squares is taken of ``x`` scaled by a power of two (its largest entry
    over the ranks, one more max all-reduce) and the norm unscaled: float32 entries of 1e20 gave inf, of 1e-25 gave 0
    (squares out of range), and the gradient at 0 was NaN (outside sweep). Collective."""
    mx = x.detach().abs().amax().to(torch.float64).reshape(1) if x.numel() else torch.zeros(1, dtype=torch.float64)
    m = float(comm.allreduce(mx.to(comm.device), "max")[0]) if comm.size > 1 else float(mx[0])
    e = 0
    if m > 0 and math.isfinite(m):
        fi = torch.finfo(x.dtype)
        e = min(max(math.frexp(m)[1], math.frexp(fi.tiny)[1] + 2), math.frexp(fi.max)[1] - 2)
    y = x * 2.0 ** -e if e else x       # exact (a power of two); e is piecewise constant in x: no gradient
    sq = (y * y.conj()).real if y.is_complex() else y * y
    ss = global_sum(sq.sum(), comm)
    if float(ss.detach()) == 0.0:       # x = 0 on every rank: value 0, gradient 2 y = 0 (sqrt's was 0 * inf = NaN)
        return ss
    out = torch.sqrt(ss)
    return out * 2.0 ** e if e else out
