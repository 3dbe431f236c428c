"""The pattern state of a distributed matrix, and building it from global coordinates.

A rank's :class:`Pattern` holds its local CSR blocks (interior: columns it owns; boundary: halo
columns), their transposes for the backward product, the halo exchange plan and the map of its
rows, O(n_local + nnz_local + halo) plus O(p) offsets. :func:`_build_pattern` makes it from the
rank's entries in global numbering (the sorts, the unique halo columns and the exchange all run
on the entries' device); ``_migrate`` moves entries to the ranks that own their rows (a scatter
of a matrix given on one rank, or a repartition), differentiable in the values. Patterns are
cached on the identity and version of the input index tensors (:func:`pattern_cache_clear`).
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass, field

import torch

import sparsetorch as st

from .comm import Comm
from .errors import MismatchError
from .exchange import ExchangePlan
from .partition import contiguous_offsets, rcb_parts
from .rowmap import RowMap

_DTYPES = (torch.float32, torch.float64)


def _csr_tensor(crow, col, vals, shape) -> torch.Tensor:
    with warnings.catch_warnings():  # torch's "CSR support is in beta" notice
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, vals, shape, check_invariants=False)


@dataclass
class _Csr:
    """A CSR block whose values are the contiguous slot range ``values[..., offset:offset + nnz]``
    (no slot map: the tensor for one value set is a view of the values, not a copy)."""

    crow: torch.Tensor
    col: torch.Tensor
    offset: int
    nrows: int
    ncols: int

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return _csr_tensor(self.crow, self.col, values[self.offset:self.offset + self.nnz], (self.nrows, self.ncols))

    def rows(self) -> torch.Tensor:
        """The row of each entry (a temporary, O(nnz))."""
        if self.nnz == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.crow.device)
        return torch.repeat_interleave(torch.arange(self.nrows, device=self.crow.device), self.crow.diff().to(torch.int64))

    def to(self, device) -> "_Csr":
        return _Csr(self.crow.to(device), self.col.to(device), self.offset, self.nrows, self.ncols)


@dataclass
class _CsrPerm:
    """A CSR block whose values are ``values[..., slot]`` (the transposed blocks: a gathered copy)."""

    crow: torch.Tensor
    col: torch.Tensor
    slot: torch.Tensor
    nrows: int
    ncols: int

    @staticmethod
    def build(rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor, nrows: int, ncols: int) -> "_CsrPerm":
        rows, cols = rows.to(torch.int64), cols.to(torch.int64)
        order = torch.argsort(rows * max(ncols, 1) + cols, stable=True)
        crow = torch.zeros(nrows + 1, dtype=torch.int64, device=rows.device)
        crow[1:] = torch.cumsum(torch.bincount(rows, minlength=nrows), 0)
        col = cols[order]
        if rows.numel() < 2 ** 31 - 1 and ncols < 2 ** 31 - 1:
            crow, col = crow.to(torch.int32), col.to(torch.int32)
        return _CsrPerm(crow, col.contiguous(), slots[order].contiguous(), nrows, ncols)

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return _csr_tensor(self.crow, self.col, values[self.slot], (self.nrows, self.ncols))


@dataclass
class Pattern:
    """Pattern-level state of one rank (built once per pattern, shared by tensors on it).

    Slots (the entries of ``values``) are ordered interior block first, then boundary block,
    each in CSR order, so both blocks are views of the values. Stored always: the two blocks'
    ``crow``/``col``, the halo plan and halo ids, and ``entry_slot`` (input entry -> slot; not
    stored when it is the identity). Built on first use and kept (:attr:`lazy`): the per-slot
    ``row``/``col`` (gradients of the values, ``local_coo``), the transposed blocks (``A^T x``: the
    backward of a product, adjoint solves of a nonsymmetric matrix), the diagonal's slots."""

    comm: Comm
    shape: tuple[int, int]
    rowmap: RowMap
    n_local: int
    n_halo: int
    nse: int
    entry_slot: torch.Tensor | None   # (nnz_in,) slot of each input entry; None: the identity
    n_in: int                         # number of input entries
    halo_ids: torch.Tensor            # (n_halo,) global ids of the halo columns
    halo: ExchangePlan
    interior: _Csr                    # slots [0, interior.nnz), columns owned
    boundary: _Csr                    # slots [interior.nnz, nse), columns halo (local numbering - n)
    device: torch.device
    cache: dict = field(default_factory=dict)
    lazy: dict = field(default_factory=dict)
    #: built from entries moved to other ranks (``partition=``, ``scatter``): the caller's entry order is gone
    migrated: bool = False

    # per-slot coordinates (lazy) ----------------------------------------------------------------
    def slot_rows(self) -> torch.Tensor:
        """Local row of each slot, without keeping it (a temporary)."""
        if "row" in self.lazy:
            return self.lazy["row"]
        return torch.cat([self.interior.rows(), self.boundary.rows()])

    @property
    def row(self) -> torch.Tensor:
        """(nse,) local row of each slot (built on first use, then kept)."""
        if "row" not in self.lazy:
            self.lazy["row"] = self.slot_rows()
        return self.lazy["row"]

    @property
    def col(self) -> torch.Tensor:
        """(nse,) local column of each slot: owned first, then ``n_local +`` halo position."""
        if "col" not in self.lazy:
            self.lazy["col"] = torch.cat([self.interior.col.to(torch.int64), self.boundary.col.to(torch.int64) + self.n_local])
        return self.lazy["col"]

    @property
    def transposed(self) -> tuple[_CsrPerm, _CsrPerm | None]:
        """(interior^T, boundary^T or None), built on first use (A^T products only)."""
        if "t" not in self.lazy:
            it, bd = self.interior, self.boundary
            ri = it.rows()
            si = torch.arange(it.nnz, dtype=torch.int64, device=ri.device)
            itT = _CsrPerm.build(it.col, ri, si, self.n_local, self.n_local)
            bdT = None
            if bd.nnz:
                rb = bd.rows()
                sb = torch.arange(bd.offset, bd.offset + bd.nnz, dtype=torch.int64, device=rb.device)
                bdT = _CsrPerm.build(bd.col, rb, sb, self.n_halo, self.n_local)
            self.lazy["t"] = (itT, bdT)
        return self.lazy["t"]

    @property
    def diag_slot(self) -> torch.Tensor:
        """(n_local,) slot of each row's diagonal entry, -1 where none is stored (lazy)."""
        if "diag" not in self.lazy:
            it = self.interior
            r = it.rows()
            on = it.col.to(torch.int64) == r
            d = torch.full((self.n_local,), -1, dtype=torch.int64, device=r.device)
            d[r[on]] = torch.nonzero(on).reshape(-1)
            self.lazy["diag"] = d
        return self.lazy["diag"]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this pattern stores now, by name (for memory accounting)."""
        out = {"halo_ids": self.halo_ids}
        if self.entry_slot is not None:
            out["entry_slot"] = self.entry_slot
        for name in ("interior", "boundary"):
            c = getattr(self, name)
            if c.crow.numel():
                out.update({f"{name}.crow": c.crow, f"{name}.col": c.col})
        for key in ("row", "col", "diag"):
            if key in self.lazy:
                out[key] = self.lazy[key]
        if "t" in self.lazy:
            for name, c in zip(("interior_t", "boundary_t"), self.lazy["t"]):
                if c is not None:
                    out.update({f"{name}.crow": c.crow, f"{name}.col": c.col, f"{name}.slot": c.slot})
        for i, (_p, idx) in enumerate(self.halo.sends):
            out[f"halo.send[{i}]"] = idx
        if not self.rowmap.contiguous:
            out["rowmap.owned"] = self.rowmap.owned
        return out

    def stored_bytes(self) -> int:
        return _unique_bytes(self.tensors().values())


def _unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views counted once)."""
    seen, total = set(), 0
    for t in tensors:
        st_ = t.untyped_storage()
        key = (st_.data_ptr(), st_.nbytes())
        if key not in seen:
            seen.add(key)
            total += st_.nbytes()
    return total


def _spmm(M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """CSR @ (n, m) dense; one column goes through the vector kernel (faster than a 1-column SpMM)."""
    if X.shape[1] == 1:
        return (M @ X[:, 0])[:, None]
    return M @ X


# The pattern cache: keyed on the identity and version of the input index tensors ---------------
_PATTERNS: dict[tuple, tuple[weakref.ref, weakref.ref, Pattern]] = {}


def pattern_cache_clear() -> None:
    _PATTERNS.clear()


def version_of(t: torch.Tensor) -> int:
    """``t._version``, or -1 for an inference tensor, which keeps no version counter (reading it raised "Inference
    tensors do not track version counter" in every cache key made of one: ``solve`` under ``torch.inference_mode()``;
    session 29's sweep). As in the core (``sparsetorch.tensor.pattern.version_of``), a key holding -1 does not see an
    in-place write made inside inference mode (the only place such a tensor can be written): a cache keyed by it
    must hold views of the tensor (which see the write), last one op call (:func:`~.tensor.op_epoch`), or not
    cache an inference tensor at all."""
    try:
        return t._version
    except RuntimeError:
        return -1


def _key(rows: torch.Tensor, cols: torch.Tensor, shape, owned_key, comm: Comm) -> tuple | None:
    """The pattern cache's key, or None (not cached) for index tensors made in inference mode: with no version
    counter, a write into them (inside inference mode) would leave the old pattern in use, silently."""
    if owned_key is None or rows.is_inference() or cols.is_inference():
        return None
    return (rows.data_ptr(), rows._version, rows.numel(), cols.data_ptr(), cols._version, cols.numel(), tuple(shape),
            owned_key, comm.rank, comm.size, id(comm.group), str(rows.device))


def _check_index(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise st.InputError(f"{name} must be a torch.Tensor of global indices, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise st.InputError(f"{name} must be int32 or int64 global indices, got {t.dtype}")
    if t.dim() != 1:
        raise st.InputError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def _owned_text(rowmap: RowMap) -> str:
    if rowmap.contiguous:
        return f"rows {rowmap.start}..{rowmap.stop - 1}"
    return f"{rowmap.n_local} rows given by owned="


def _owned_key(rowmap: RowMap):
    if rowmap.contiguous:
        return ("range", rowmap.start, rowmap.stop)
    if rowmap.owned.is_inference():
        return None  # no version counter: not cached (see _key)
    return ("ids", rowmap.owned.data_ptr(), rowmap.owned._version, rowmap.n_local)


def _rowmap(comm: Comm, N: int, owned, device) -> RowMap:
    # every rank takes the same path (its own collectives): the kind of owned= first, then its checks
    # agreed before any gather (a rank raising alone left the others in all_gather until the timeout;
    # session 21's sweep)
    kind = 0 if owned is None else 1 if isinstance(owned, (tuple, list, range)) else 2
    comm.check_same("owned rows", {"owned": kind}, shown={"owned": ("None", "(start, stop)", "row ids")[kind]})
    if owned is None:
        return RowMap(comm, N, offsets=contiguous_offsets(N, comm.size))
    if kind == 1:
        pair = (0, 0)
        with comm.checked("owned rows"):
            if isinstance(owned, range):
                owned = (owned.start, owned.stop)
            try:
                if len(owned) != 2:
                    raise TypeError("not a pair")
                pair = (int(owned[0]), int(owned[1]))
            except (TypeError, ValueError) as exc:
                raise st.InputError(f"owned=(start, stop) expected on rank {comm.rank}, got {owned!r} ({exc})") from exc
        everyone = comm.allgather_object(pair)
        offsets = [everyone[0][0]] + [e[1] for e in everyone]
        ok = everyone[0][0] == 0 and everyone[-1][1] == N and all(everyone[r][1] == everyone[r + 1][0]
                                                                 for r in range(comm.size - 1))
        ok = ok and all(a <= b for a, b in everyone)
        if not ok:
            raise MismatchError(f"the owned=(start, stop) ranges {everyone} (by rank) do not tile 0..{N} in rank order")
        return RowMap(comm, N, offsets=offsets)
    with comm.checked("owned rows"):
        ids = _check_index(owned, "owned").cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= N):
            raise st.InputError(f"owned holds row {int(ids[(ids < 0) | (ids >= N)][0])} outside 0..{N - 1} on rank {comm.rank}")
        if torch.unique(ids).numel() != ids.numel():
            raise st.InputError(f"owned lists a row twice on rank {comm.rank}")
    total = comm.sum_int([ids.numel()])[0]
    if total != N:
        raise MismatchError(f"the ranks own {total} rows in all for a matrix of {N} rows; owned= must partition 0..{N - 1}")
    return RowMap(comm, N, owned=ids)


def _build_pattern(comm: Comm, shape, rowmap: RowMap, rows: torch.Tensor, cols: torch.Tensor) -> Pattern:
    """The local pattern, interior/boundary CSR blocks and halo plan, computed on the entries'
    device (the sorts and the unique over nnz entries run on the GPU when the entries are there;
    only the halo ids, O(halo), visit the CPU for the owner lookup)."""
    device = rows.device
    rows_c, cols_c = rows, cols
    n = rowmap.n_local
    lr = rowmap.local_of_mine(rows_c)
    lc_own = rowmap.local_of_mine(cols_c)
    is_halo = lc_own < 0
    halo_g = torch.unique(cols_c[is_halo])                          # sorted global ids
    owner, their_local = (t.to(device) for t in rowmap.lookup(halo_g))   # collective for general maps
    order = torch.argsort(owner * (shape[0] + 1) + their_local, stable=True)  # group by owner
    halo_g, owner, their_local = halo_g[order], owner[order], their_local[order]
    n_halo = int(halo_g.numel())
    # local column of each entry: owned -> local row index, halo -> n + position in halo order
    lc = lc_own                                                       # (lc_own is not used again)
    if n_halo:
        pos_sorted, perm = torch.sort(halo_g)
        where = torch.searchsorted(pos_sorted, cols_c[is_halo])
        lc[is_halo] = n + perm[where]
        del pos_sorted, perm, where
    del is_halo
    n_ext = n + n_halo
    key = lr * n_ext + lc
    if key.numel() < 2 or bool((key[1:] > key[:-1]).all()):
        row, col, inverse = lr, lc, None                             # already row-major, no duplicates: no sort
        del key
    else:
        del lr, lc
        uniq, inverse = torch.unique(key, return_inverse=True)       # sorted row-major
        del key
        row, col = uniq // max(n_ext, 1), uniq % max(n_ext, 1)
        del uniq
    nse = int(row.numel())
    inner = col < n
    n_int = int(inner.sum())
    # slots: the interior entries (row-major) first, then the boundary entries (row-major)
    if inverse is None and n_int == nse:
        entry_slot = None                # row-major input, no halo columns: slots are the input order
    else:
        slot_of = torch.empty(nse, dtype=torch.int64, device=device)
        slot_of[inner] = torch.arange(n_int, dtype=torch.int64, device=device)
        slot_of[~inner] = torch.arange(n_int, nse, dtype=torch.int64, device=device)
        entry_slot = slot_of if inverse is None else slot_of[inverse.reshape(-1)]
        del slot_of, inverse
        if entry_slot.numel() == nse and bool((entry_slot == torch.arange(nse, device=device)).all()):
            entry_slot = None                                        # input already in slot order
        elif nse < 2 ** 31:
            entry_slot = entry_slot.to(torch.int32)
    if n_int == nse:                     # no halo columns: the whole pattern is the interior block
        del inner
        interior = _csr_of(row, col, n, n, 0)
        boundary = _csr_of(row[:0], col[:0], n, n_halo, n_int, skip_empty=True)
    else:
        interior = _csr_of(row[inner], col[inner], n, n, 0)
        boundary = _csr_of(row[~inner], col[~inner] - n, n, n_halo, n_int, skip_empty=True)
    del row, col
    # halo plan: receives grouped by owner; tell each owner which of its rows we need
    recvs = []
    counts = torch.bincount(owner, minlength=comm.size).tolist() if n_halo else [0] * comm.size
    start = 0
    for peer, c in enumerate(counts):
        if c:
            recvs.append((peer, start, start + c))
            start += c
    requests = list(torch.split(their_local, counts)) if n_halo else \
        [torch.zeros(0, dtype=torch.int64, device=device)] * comm.size
    asked = comm.alltoallv(requests)
    sends = [(peer, a.cpu()) for peer, a in enumerate(asked) if peer != comm.rank and a.numel()]
    plan = ExchangePlan(comm, n, n_halo, sends, recvs)
    pat = Pattern(comm, tuple(shape), rowmap, n, n_halo, nse, entry_slot, int(rows.numel()), halo_g, plan,
                  interior, boundary, device)
    if device.type != "cpu":
        pat = _pattern_to(pat, device)
    return pat


def _csr_of(rows: torch.Tensor, cols: torch.Tensor, nrows: int, ncols: int, offset: int, *,
            skip_empty: bool = False) -> _Csr:
    """CSR of entries already in row-major order; int32 indices when they fit (torch's CPU kernel
    runs faster with them, and they take half the memory)."""
    if skip_empty and rows.numel() == 0:   # an empty boundary block (no halo columns): nothing stored
        z = torch.zeros(0, dtype=torch.int32, device=rows.device)
        return _Csr(z, z.clone(), offset, nrows, ncols)
    crow = torch.zeros(nrows + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=nrows), 0)
    if rows.numel() < 2 ** 31 - 1 and ncols < 2 ** 31 - 1:
        return _Csr(crow.to(torch.int32), cols.to(torch.int32).contiguous(), offset, nrows, ncols)
    return _Csr(crow, cols.contiguous(), offset, nrows, ncols)


def _pattern_to(p: Pattern, device) -> Pattern:
    return Pattern(p.comm, p.shape, p.rowmap, p.n_local, p.n_halo, p.nse,
                   None if p.entry_slot is None else p.entry_slot.to(device), p.n_in, p.halo_ids.to(device),
                   p.halo.to(device), p.interior.to(device), p.boundary.to(device), torch.device(device))


def _to_slots(values: torch.Tensor, pattern: Pattern) -> torch.Tensor:
    """Input-entry values ``(*batch, nnz_in)`` summed into the pattern's slots (differentiable).
    When the input is already in slot order the values are used as they are (no copy)."""
    if pattern.entry_slot is None:
        return values
    out = values.new_zeros(*values.shape[:-1], pattern.nse)
    return out.index_add(-1, pattern.entry_slot.to(values.device), values)


class _Migrate(torch.autograd.Function):
    """Values of entries moved to other ranks (forward), their gradients moved back (backward)."""

    @staticmethod
    def forward(ctx, values, plan: ExchangePlan, self_idx, self_count):
        ctx.plan, ctx.n_in = plan, values.shape[-1]
        ctx.lead = values.shape[:-1]
        ctx.B = math.prod(ctx.lead)
        V = values.detach().reshape(ctx.B, values.shape[-1]).t().contiguous()   # (nnz_in, B)
        return plan.forward(V).t().reshape(*ctx.lead, plan.n_recv)

    @staticmethod
    def backward(ctx, G):
        G2 = G.reshape(ctx.B, G.shape[-1]).t().contiguous()
        back = ctx.plan.reverse(G2)
        return back.t().reshape(*ctx.lead, ctx.n_in), None, None, None


def _migrate(comm: Comm, rowmap: RowMap, rows, cols, values, partition, coords):
    """Send every owned row (and its entries) to its new owner; returns the moved entries and the
    new (general) row map."""
    device = rows.device
    with comm.checked("repartitioning rows"):
        if isinstance(partition, str):
            if partition != "rcb":
                raise st.InputError(f"from_local_rows(partition=...) takes 'rcb' (with coords) or a tensor of new "
                                    f"owners, got {partition!r}; graph partitioners run in scatter()")
            if coords is None or coords.shape[0] != rowmap.n_local:
                raise st.InputError(f"partition='rcb' needs coords with one row per owned row ({rowmap.n_local} on "
                                    f"rank {comm.rank}), got {None if coords is None else tuple(coords.shape)}")
        else:
            newowner = _check_index(partition, "partition").cpu()
            if newowner.numel() != rowmap.n_local:
                raise st.InputError(f"partition must give a new owner for each of the {rowmap.n_local} owned rows on "
                                    f"rank {comm.rank}, got {newowner.numel()}")
            if newowner.numel() and (int(newowner.min()) < 0 or int(newowner.max()) >= comm.size):
                raise st.InputError(f"partition names rank {int(newowner.max())} (there are {comm.size})")
    if isinstance(partition, str):
        newowner = rcb_parts(coords.cpu(), comm.size, reduce=lambda t, op: comm.allreduce(t.to(comm.device), op).cpu())
    ids = rowmap.owned_ids()
    # rows themselves (so rows without entries move too)
    order_r = torch.argsort(newowner, stable=True)
    cnt_r = torch.bincount(newowner, minlength=comm.size).tolist()
    got_rows = comm.alltoallv(list(torch.split(ids[order_r], cnt_r)))
    new_ids = torch.cat([g.cpu() for g in got_rows])
    # entries
    lr = rowmap.local_of_mine(rows.cpu())
    dest = newowner[lr] if lr.numel() else torch.zeros(0, dtype=torch.int64)
    order = torch.argsort(dest, stable=True)
    cnt = torch.bincount(dest, minlength=comm.size).tolist()
    rc = torch.stack([rows.cpu()[order], cols.cpu()[order]], 1).reshape(-1)
    got = comm.alltoallv(list(torch.split(rc, [2 * c for c in cnt])))
    moved = torch.cat([g.cpu() for g in got]).reshape(-1, 2)
    # the values, differentiably: an exchange plan from the local entries to the received ones
    sends, recvs, start = [], [], 0
    in_counts = [g.numel() // 2 for g in got]
    pos = 0
    for peer, c in enumerate(cnt):
        if c and peer != comm.rank:
            sends.append((peer, order[pos:pos + c].to(device)))
        pos += c
    self_idx = order[sum(cnt[:comm.rank]):sum(cnt[:comm.rank + 1])]
    for peer, c in enumerate(in_counts):
        if c and peer != comm.rank:
            recvs.append((peer, start, start + c))
        start += c
    # the receive buffer holds every rank's block in rank order, own block included (copied locally)
    plan = _SelfExchangePlan(comm, values.shape[-1], start, sends, recvs, self_idx.to(device),
                             sum(in_counts[:comm.rank]))
    moved_vals = _Migrate.apply(values, plan, None, None)
    newmap = RowMap(comm, rowmap.n, owned=torch.sort(new_ids).values)
    total = comm.sum_int([newmap.n_local])[0]
    if total != rowmap.n:
        raise MismatchError(f"after repartitioning the ranks own {total} rows for {rowmap.n}")
    return moved[:, 0].to(device), moved[:, 1].to(device), moved_vals, newmap


class _SelfExchangePlan(ExchangePlan):
    """An exchange plan whose receive buffer also holds this rank's own block (a local copy)."""

    def __init__(self, comm, n_send_rows, n_recv, sends, recvs, self_idx, self_start):
        super().__init__(comm, n_send_rows, n_recv, sends, recvs)
        self.self_idx, self.self_start = self_idx, self_start

    def forward(self, X):
        works, out, bufs = self.start(X)
        k = self.self_idx.numel()
        out[self.self_start:self.self_start + k] = X.index_select(0, self.self_idx)
        return self.finish((works, out, bufs))

    def reverse(self, G):
        out = G.new_zeros(self.n_send_rows, G.shape[1])
        handle = self.start_reverse(G)
        k = self.self_idx.numel()
        out.index_add_(0, self.self_idx, G[self.self_start:self.self_start + k])
        return self.finish_reverse(handle, out)
