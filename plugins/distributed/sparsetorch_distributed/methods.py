"""The everyday methods of :class:`~sparsetorch_distributed.DSparseTensor` (``A.sum()``, ``A * s``, ``A.T``,
``A.to_dense()``, ``A.logdet()``, ...), as functions the tensor's methods call.

Conventions (the package's, see :mod:`sparsetorch_distributed.ops`):

- A *replicated* result (``sum()``, ``max()``, ``logdet()``, ``to_dense()``) is the same tensor on every rank. Its
  backward treats it as one number: each rank's own values get the gradient of its entries, with no second
  reduction; that is what every rank calling ``loss.backward()`` on a replicated loss needs.
- A *distributed* result (``sum(dim=0)``, ``sum(dim=1)``) is this rank's rows, in the order of
  :meth:`~sparsetorch_distributed.DSparseTensor.owned_rows`, like every vector of the package.
- Implicit zeros count as in the dense matrix: ``mean()`` divides by ``N * N``, ``max()`` is at least 0 where
  some entry is not stored.
- The gathered forms (``to_dense``, ``to_sparse``, ``slogdet`` / ``logdet`` / ``det``) put the whole matrix on
  every rank: ``O(nnz)`` (``O(N^2)`` for ``to_dense``) memory per rank, for matrices that fit one process
  (torch-sla's DSparseTensor gathers the same way).

Every collective here checks its per-rank input first (``Comm.checked``), so a bad input on one rank raises the
same error on every rank; every one works on ranks that own no rows.
"""

from __future__ import annotations

import math
import numbers

import torch

import sparsetorch as st

from .comm import Comm
from .errors import MismatchError
from .ops import GRAD_FLAGS, global_sum, grad_flags, settle_grad_mode
from .pattern import _Migrate, _SelfExchangePlan

__all__ = ["scale", "combine", "reduce_sum", "reduce_mean", "extreme", "transpose", "gathered_coo", "to_dense",
           "to_sparse", "slogdet", "logdet", "det", "same_pattern"]


def _members(A) -> int:
    return math.prod(A.batch_shape) if A.batch_shape else 1


# elementwise with a scalar --------------------------------------------------------------------------------------
def _scalar(s):
    """``s`` as a multiplier of the values, or None where it is not a real scalar (a 0-d real tensor or a number)."""
    if isinstance(s, torch.Tensor):
        if s.dim() != 0 or s.is_complex() or s.dtype == torch.bool:
            return None
        return s
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        return float(s)
    return None


def scale(A, s, op: str):
    """``A * s`` (``op="mul"``), ``A / s`` (``"div"``) or ``-A`` (``"neg"``, ``s`` ignored): the same pattern and
    partition, this rank's values scaled. Local (no communication); differentiable in the values and in a
    tensor ``s``. Returns ``NotImplemented`` for an ``s`` that is not a real scalar."""
    if op != "neg":
        s = _scalar(s)
        if s is None:
            return NotImplemented
    if A._deferred is not None:       # with_values' input error travels on, raised (agreed) where the result is used
        return A
    v = A.values
    if isinstance(s, torch.Tensor) and (s.device != v.device or s.dtype != v.dtype):
        s = s.to(device=v.device, dtype=v.dtype) if s.is_floating_point() else s.to(device=v.device)
    if op == "neg":
        out = -v
    elif op == "mul":
        out = v * s
    else:
        out = v / s
    if out.dtype != v.dtype:
        out = out.to(v.dtype)
    return type(A)(A.pattern, out)


def same_pattern(pa, pb) -> bool:
    """Whether two patterns are the same matrix structure on this rank: the same global shape, the same owned rows
    (in the same order) and the same slots (so slot ``k`` is the same (row, col) in both)."""
    if pa is pb:
        return True
    if (pa.shape != pb.shape or pa.n_local != pb.n_local or pa.nse != pb.nse or pa.n_halo != pb.n_halo
            or pa.interior.nnz != pb.interior.nnz or pa.boundary.nnz != pb.boundary.nnz):
        return False
    ta = [pa.rowmap.owned_ids(), pa.halo_ids, pa.interior.crow, pa.interior.col, pa.boundary.crow, pa.boundary.col]
    tb = [pb.rowmap.owned_ids(), pb.halo_ids, pb.interior.crow, pb.interior.col, pb.boundary.crow, pb.boundary.col]
    return all(a.numel() == b.numel() and torch.equal(a.cpu().to(torch.int64), b.cpu().to(torch.int64))
               for a, b in zip(ta, tb))


def combine(A, B, sign: int):
    """``A + B`` (``sign=1``) or ``A - B`` (``sign=-1``) of two DSparseTensors on the same partition and pattern
    (the same owned rows and the same stored entries on every rank): the values add. Anything else raises
    ``MismatchError`` on every rank (this takes one all_reduce, to agree on that). Differentiable in both
    values. Collective."""
    from .tensor import DSparseTensor

    if not isinstance(B, DSparseTensor):
        return NotImplemented
    comm = A.comm
    what = "DSparseTensor " + ("+" if sign > 0 else "-")
    with comm.checked(what):
        A._check_writes()
        B._check_writes()
        if B.comm.size != comm.size or B.comm.group is not comm.group:
            raise MismatchError(f"{what}: the two matrices live on different process groups (rank {comm.rank})")
        if not same_pattern(A.pattern, B.pattern):
            pa, pb = A.pattern, B.pattern
            raise MismatchError(
                f"{what}: the two matrices differ in partition or pattern on rank {comm.rank} (shape {pa.shape} vs "
                f"{pb.shape}, owned rows {pa.n_local} vs {pb.n_local}, stored entries {pa.nse} vs {pb.nse}); the "
                f"values of two DSparseTensors add only where both have the same rows on every rank and the same "
                f"stored entries (build both on one pattern: B = A.with_values(v))")
        if A.dtype != B.dtype or A.device != B.device:
            raise st.InputError(f"{what}: the matrices are {A.dtype} on {A.device} and {B.dtype} on {B.device} on rank "
                                f"{comm.rank}; cast one (A.with_values(A.values.to(...)))")
        va, vb = A.values, B.values
        out = va + vb if sign > 0 else va - vb     # (value batches broadcast as torch does)
    return DSparseTensor(A.pattern, out)


# reductions -----------------------------------------------------------------------------------------------------
def _check_dim(dim, what: str, rank: int):
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (0, 1, -1, -2):
        raise st.InputError(f"{what}: dim must be None (every entry), 0 (column sums) or 1 (row sums), got {dim!r} on "
                            f"rank {rank}")
    return dim % 2


def reduce_sum(A, dim=None):
    """``dim=None``: the sum of every entry (per member of a value batch), replicated (one all_reduce).
    ``dim=1`` (or -1): the row sums, this rank's rows ``(*batch, n_local)`` (local: no communication).
    ``dim=0`` (or -2): the column sums, distributed like a vector (column ``j``'s sum on the owner of row ``j``):
    ``A^T 1``, one transposed exchange. Differentiable in the values. Collective but for ``dim=1``."""
    comm = A.comm
    what = "DSparseTensor.sum"
    if isinstance(dim, int) and not isinstance(dim, bool) and dim in (1, -1):
        A._check_writes()
        v = A.values
        rows = A.pattern.slot_rows().to(v.device)
        return v.new_zeros(*v.shape[:-1], A.n_local).index_add(-1, rows, v)
    with comm.checked(what, same=("dim",)) as chk:   # the collective forms (a bad dim too): agreed input check
        d = _check_dim(dim, what, comm.rank)
        A._check_writes()
        chk.same({"dim": -1 if d is None else d})
    if d is None:
        return global_sum(A.values.sum(-1), comm)
    return A.rmatmul(torch.ones(A.n_local, dtype=A.dtype, device=A.device))


def reduce_mean(A, dim=None):
    """:func:`reduce_sum` divided by the number of entries it summed in the dense matrix (implicit zeros count):
    ``N * N`` for ``dim=None``, ``N`` per row or column."""
    N = A.pattern.shape[0]
    s = reduce_sum(A, dim)
    return s / (N * N if dim is None else N)


class _Extreme(torch.autograd.Function):
    """Replicated max (``sign=1``) or min (``sign=-1``) per member, implicit zeros included; backward: the
    gradient shared evenly by the entries equal to the result (as torch's ``max()``), on each rank its own."""

    @staticmethod
    def forward(ctx, values, comm: Comm, sign: int, n_total: int):
        B = values.shape[0]
        v = values.detach() * sign
        local = v.amax(-1) if v.shape[-1] else v.new_full((B,), -math.inf)
        top = comm.allreduce(local.to(torch.float64).clone(), "max").to(v.dtype)
        hit = v == top[:, None]
        counts = torch.cat([hit.sum(-1), torch.tensor([v.shape[-1]], dtype=torch.int64, device=v.device)])
        counts = comm.allreduce(counts.to(torch.int64), "sum").tolist()
        stored, ties = counts[-1], counts[:-1]
        implicit = n_total - stored          # the zeros a dense matrix holds where nothing is stored
        res, share = [], []
        for i in range(B):
            t = float(top[i])
            if implicit > 0 and t < 0:       # an implicit zero is the extreme: no stored entry gets a gradient
                res.append(0.0)
                share.append(0.0)
            else:
                n = ties[i] + (implicit if (implicit > 0 and t == 0) else 0)
                res.append(t)
                share.append(1.0 / n if n else 0.0)
        ctx.save_for_backward(hit)
        ctx.share = share
        return torch.tensor(res, dtype=values.dtype, device=values.device) * sign

    @staticmethod
    def backward(ctx, G):
        (hit,) = ctx.saved_tensors
        share = torch.tensor(ctx.share, dtype=G.dtype, device=G.device)
        return (G * share)[:, None] * hit.to(G.dtype), None, None, None


def extreme(A, sign: int):
    """``A.max()`` (``sign=1``) / ``A.min()`` (``sign=-1``): over every entry of the dense matrix (an implicit zero
    counts where some entry is not stored), per member of a value batch; replicated. Two all_reduces.
    Differentiable in the values (the gradient goes to the stored entries equal to the result, shared evenly
    among the ties as torch's ``max()`` shares it; none when the result is an implicit zero). Collective."""
    comm = A.comm
    what = "DSparseTensor." + ("max" if sign > 0 else "min")
    with comm.checked(what):
        A._check_writes()
        v = A.values
        if A.batch_shape and math.prod(A.batch_shape) == 0:
            raise st.InputError(f"{what}: the value batch {A.batch_shape} is empty")
    N = A.pattern.shape[0]
    out = _Extreme.apply(v.reshape(_members(A), A.nse_local), comm, sign, N * N)
    return out.reshape(A.batch_shape) if A.batch_shape else out[0]


# transpose ------------------------------------------------------------------------------------------------------
def transpose(A):
    """``A^T`` as a new DSparseTensor on the same row partition (rank ``r`` owns the same rows, now of ``A^T``):
    each stored entry ``(i, j)`` moves to the owner of row ``j`` (one all-to-all of the coordinates, one of the
    values). Differentiable in the values (the gradient is sent back by the transposed move). The values are
    read now: a later write into ``A``'s values does not reach the transpose. Collective."""
    from .tensor import DSparseTensor

    comm = A.comm
    what = "DSparseTensor.T"
    with comm.checked(what, flags=GRAD_FLAGS) as chk:
        A._check_writes()
        values = A.values
        rows, cols = A.local_coo()
        grad_flags(chk, values.requires_grad)
    if settle_grad_mode(comm, chk, what) and not values.requires_grad:
        values = values.detach().requires_grad_(True)   # the move's backward communicates: every rank takes part
    p = comm.size
    device = values.device
    rowmap = A.pattern.rowmap
    owner, _ = rowmap.lookup(cols.cpu())         # the new owner of each entry: its column's (collective if general)
    order = torch.argsort(owner, stable=True)
    cnt = torch.bincount(owner, minlength=p).tolist()
    rc = torch.stack([cols.cpu()[order], rows.cpu()[order]], 1).reshape(-1)   # (new row, new col) = (col, row)
    got = comm.alltoallv(list(torch.split(rc, [2 * c for c in cnt])))
    moved = torch.cat([g.cpu() for g in got]).reshape(-1, 2)
    in_counts = [g.numel() // 2 for g in got]
    sends, recvs = [], []
    pos = start = 0
    for peer, c in enumerate(cnt):
        if c and peer != comm.rank:
            sends.append((peer, order[pos:pos + c].to(device)))
        pos += c
    for peer, c in enumerate(in_counts):
        if c and peer != comm.rank:
            recvs.append((peer, start, start + c))
        start += c
    self_idx = order[sum(cnt[:comm.rank]):sum(cnt[:comm.rank + 1])]
    plan = _SelfExchangePlan(comm, values.shape[-1], start, sends, recvs, self_idx.to(device),
                             sum(in_counts[:comm.rank]))
    moved_vals = _Migrate.apply(values, plan, None, None)
    owned = (rowmap.start, rowmap.stop) if rowmap.contiguous else rowmap.owned_ids().clone()
    return DSparseTensor.from_local_rows(moved[:, 0].to(device), moved[:, 1].to(device), moved_vals, A.pattern.shape,
                                         owned=owned, comm=comm, cache=False)


# gathered forms -------------------------------------------------------------------------------------------------
class _GatherValues(torch.autograd.Function):
    """Every rank's slot values ``(B, nse_r)`` concatenated in rank order ``(B, sum nse_r)``, replicated; backward:
    this rank's columns of the incoming gradient (no communication: the replicated-result convention)."""

    @staticmethod
    def forward(ctx, values, comm: Comm, counts: list, offset: int):
        ctx.offset, ctx.n = offset, values.shape[-1]
        parts = comm.allgather_rows(values.detach().t().contiguous(), counts)
        return torch.cat(parts, 0).t().contiguous()

    @staticmethod
    def backward(ctx, G):
        return G[:, ctx.offset:ctx.offset + ctx.n], None, None, None


def gathered_coo(A, what: str):
    """``(rows, cols, values)`` of the whole matrix on every rank (global indices; values ``(*batch, nse)``,
    differentiable: each rank's own entries get their gradient). The ranks' entries in rank order, each rank's in
    slot order. Collective (an all_reduce of the counts and two all_gathers)."""
    comm = A.comm
    with comm.checked(what):
        A._check_writes()
        values = A.values
        rows, cols = A.local_coo()
    parts = comm.allgather_rows(torch.stack([rows, cols], 1).to(torch.int64))
    counts = [int(q.shape[0]) for q in parts]
    rc = torch.cat(parts, 0).to(values.device)
    flat = values.reshape(_members(A), A.nse_local)
    V = _GatherValues.apply(flat, comm, counts, sum(counts[:comm.rank]))
    return rc[:, 0], rc[:, 1], V.reshape(*A.batch_shape, V.shape[-1])


def to_dense(A):
    """The global dense matrix ``(*batch, N, N)`` on every rank (gathered: ``O(N^2)`` memory per rank);
    differentiable in each rank's own values. Collective."""
    R, C, V = gathered_coo(A, "DSparseTensor.to_dense")
    N = A.pattern.shape[0]
    flat = V.reshape(_members(A), V.shape[-1])
    D = flat.new_zeros(flat.shape[0], N * N).index_add(1, R * N + C, flat)
    return D.reshape(*A.batch_shape, N, N)


def to_sparse(A, what: str = "DSparseTensor.to_sparse") -> st.SparseTensor:
    """The global matrix as a :class:`sparsetorch.SparseTensor` (COO, entries sorted by row then column, value batch
    kept) on every rank; differentiable in each rank's own values. Collective."""
    R, C, V = gathered_coo(A, what)
    N = A.pattern.shape[0]
    order = torch.argsort(R * N + C)
    return st.SparseTensor.from_coo(V[..., order], R[order], C[order], shape=(N, N))


def slogdet(A, **options):
    """``(sign, logabsdet)`` of the global matrix, computed on every rank by ``sparsetorch.slogdet`` (``options``
    passed on) after gathering the matrix (:func:`to_sparse`); replicated, differentiable in each rank's own
    values (the gradient of its entries is the single-process one). Collective."""
    S = to_sparse(A, "DSparseTensor.slogdet")
    out = None
    with A.comm.agreement("DSparseTensor.slogdet"):
        out = st.slogdet(S, **options)
    return out


def logdet(A, **options):
    """``log det A`` (gathered, as :func:`slogdet`): ``nan`` for a negative determinant, ``-inf`` for a singular A
    (``sparsetorch.logdet``'s rule)."""
    sign, logabs = slogdet(A, **options)
    return torch.where(sign > 0, logabs, torch.where(sign == 0, torch.full_like(logabs, -math.inf),
                                                     torch.full_like(logabs, math.nan)))


def det(A, **options):
    """``det A = sign * exp(logabsdet)`` (gathered, as :func:`slogdet`)."""
    sign, logabs = slogdet(A, **options)
    return sign * torch.exp(logabs)

