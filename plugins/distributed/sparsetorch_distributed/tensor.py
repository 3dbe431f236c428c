"""DSparseTensor (one matrix, or a batch of values on one pattern) and DSparseTensorList.

Row-block domain decomposition: rank ``r`` owns a set of rows (and the same indices of every
vector); its local matrix is ``A[owned rows, owned + halo columns]`` in local numbering, owned
columns first (in the order of the owned rows), then the halo columns grouped by owner. Nothing
global is stored: the pattern state of a rank (:class:`Pattern`) is O(n_local + nnz_local + halo)
plus O(p) offsets.

A SpMV posts the halo transfers, multiplies the interior block (columns this rank owns) while they
travel, then adds the boundary block times the halo. Its backward is the transposed product: the
boundary block's transpose first, its rows sent back to their owners (non-blocking) while the
interior transpose runs, then summed in.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch

import sparsetorch as st

from .comm import Comm, dtype_code, get_comm
from .errors import MismatchError
from .exchange import ExchangePlan
from .partition import contiguous_offsets, rcb_parts, graph_parts
from .rowmap import RowMap

__all__ = ["DSparseTensor", "DSparseTensorList", "Pattern", "pattern_cache_clear"]

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


def _key(rows: torch.Tensor, cols: torch.Tensor, shape, owned_key, comm: Comm) -> tuple:
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


class DSparseTensor:
    """A square sparse matrix partitioned by rows over the ranks of a :class:`Comm`.

    Build with :meth:`from_local_rows` (each rank passes its own rows: nothing global exists
    anywhere) or :meth:`scatter` (one rank holds the matrix and sends each rank its rows). Vectors
    are local tensors of ``n_local`` rows in the order of :meth:`owned_rows`; ``A @ x`` is the
    distributed product (differentiable in ``x`` and in :attr:`values`). ``values`` has shape
    ``(*batch, nse_local)``: a batch is several matrices on one pattern.
    """

    def __init__(self, pattern: Pattern, values: torch.Tensor) -> None:
        self.pattern = pattern
        self.values = values
        self._csr_key = None
        self._csr = None
        self._csrt_key = None
        self._csrt = None

    # construction ------------------------------------------------------------------------------
    @classmethod
    def from_local_rows(cls, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: Sequence[int], *,
                        owned=None, partition=None, coords: torch.Tensor | None = None,
                        comm: Comm | None = None, cache: bool = True) -> "DSparseTensor":
        """Each rank's own entries (global row/column indices; duplicates are summed).

        ``owned``: the rows this rank owns: ``None`` (contiguous blocks of ``N // p`` rows in rank
        order), a ``(start, stop)`` pair (contiguous, the ranks' ranges in rank order must tile
        ``0..N``), or a 1-D tensor of global ids (any partition; local order = this order). Every
        entry's row must be owned by the calling rank. ``partition``: move rows to a new
        partition first: ``"rcb"`` (recursive coordinate bisection of ``coords``, one row of
        coordinates per owned row, computed in parallel) or a tensor giving each owned row's new
        rank. Values (``(*batch, nnz)``) keep their gradient through every move.

        Collective: every rank calls it. Bad input on any rank raises the same error on all.
        """
        comm = get_comm(comm)
        err = None
        try:
            rows = _check_index(rows, "rows")
            cols = _check_index(cols, "cols")
            if not isinstance(values, torch.Tensor) or values.dtype not in _DTYPES:
                raise st.InputError(f"values must be a float32 or float64 tensor, got "
                                    f"{getattr(values, 'dtype', type(values).__name__)}")
            if values.dim() < 1 or values.shape[-1] != rows.numel() or cols.numel() != rows.numel():
                raise st.InputError(f"rows ({rows.numel()}), cols ({cols.numel()}) and the last dimension of values "
                                    f"({tuple(values.shape)}) must have the same length on rank {comm.rank}")
            shape = tuple(int(s) for s in shape)
            if len(shape) != 2 or shape[0] != shape[1]:
                raise st.InputError(f"shape must be square (N, N), got {shape}")
            N = shape[0]
            for name, t in (("rows", rows), ("cols", cols)):
                if t.numel() and (int(t.min()) < 0 or int(t.max()) >= N):
                    bad = t[(t < 0) | (t >= N)][0]
                    raise st.InputError(f"{name} holds index {int(bad)} outside 0..{N - 1} on rank {comm.rank}")
            if not bool(torch.isfinite(values.detach()).all()):
                raise st.InputError(f"values hold NaN or Inf on rank {comm.rank}")
        except st.SparseTorchError as exc:
            err = exc
        comm.agree(err, "DSparseTensor.from_local_rows")
        comm.check_same("DSparseTensor.from_local_rows",
                        {"N": shape[0], "dtype": dtype_code(values.dtype), "batch dims": values.dim() - 1,
                         "batch size": math.prod(values.shape[:-1]),
                         "partition given": 0 if partition is None else (1 if isinstance(partition, str) else 2),
                         "owned kind": 0 if owned is None else (1 if isinstance(owned, (tuple, list, range)) else 2)})
        rowmap = _rowmap(comm, shape[0], owned, rows.device)
        err = None
        try:
            if rowmap.contiguous:      # a range check: no O(nnz) temporaries
                outside = rows.numel() and (int(rows.min()) < rowmap.start or int(rows.max()) >= rowmap.stop)
                lr = None
            else:
                lr = rowmap.local_of_mine(rows)
                outside = rows.numel() and bool((lr < 0).any())
            if outside:
                lr = rowmap.local_of_mine(rows) if lr is None else lr
                bad = int(rows[lr < 0][0])
                raise st.InputError(f"rank {comm.rank} passed an entry in row {bad}, which it does not own "
                                    f"(owned: {_owned_text(rowmap)}); pass each row's entries on its owner")
        except st.SparseTorchError as exc:
            err = exc
        comm.agree(err, "DSparseTensor.from_local_rows")
        if partition is not None:
            rows, cols, values, rowmap = _migrate(comm, rowmap, rows, cols, values, partition, coords)
        pattern = None
        key = _key(rows, cols, shape, _owned_key(rowmap), comm) if cache else None
        hit = False
        if key is not None and key in _PATTERNS:
            rref, cref, pat = _PATTERNS[key]
            hit = rref() is rows and cref() is cols
        if cache and comm.size > 1:
            hit = bool(comm.max_int([0 if hit else 1])[0] == 0)  # a hit only when every rank hits
        if hit:
            pattern = _PATTERNS[key][2]
        else:
            pattern = _build_pattern(comm, shape, rowmap, rows, cols)
            if key is not None:
                if len(_PATTERNS) > 64:
                    _PATTERNS.clear()
                _PATTERNS[key] = (weakref.ref(rows), weakref.ref(cols), pattern)
        local = _to_slots(values, pattern)
        return cls(pattern, local)

    @classmethod
    def scatter(cls, A: "st.SparseTensor | None", *, src: int = 0, partition: str | torch.Tensor = "contiguous",
                coords: torch.Tensor | None = None, comm: Comm | None = None, device=None) -> "DSparseTensor":
        """Rank ``src`` holds ``A`` (a square :class:`sparsetorch.SparseTensor`, values batch allowed);
        the others pass ``None``. Rows are sent to their owners by ``partition``: "contiguous",
        "rcb" (``coords`` on ``src``), "spectral", "metis" (pymetis, else spectral), "graph"
        (pymetis if importable, else RCB with coords, else spectral), or an owner tensor on
        ``src``. Gradients of the result's values flow back to ``A.values`` on ``src``."""
        comm = get_comm(comm)
        err = None
        owners = None
        rows = cols = vals = None
        N = 0
        try:
            if comm.rank == src:
                if not isinstance(A, st.SparseTensor):
                    raise st.InputError(f"scatter: rank {src} (src) must pass a sparsetorch.SparseTensor, got "
                                        f"{type(A).__name__}")
                m, n = A.format_shape
                if m != n:
                    raise st.InputError(f"scatter: A must be square, got {m}x{n}")
                N = int(n)
                coo, vals = A.coordinates()
                rows, cols = coo[0].to(torch.int64), coo[1].to(torch.int64)
                if device is not None:
                    rows, cols, vals = rows.to(device), cols.to(device), vals.to(device)
                if isinstance(partition, torch.Tensor):
                    owners = partition.to(torch.int64).cpu()
                    if owners.shape != (N,) or (owners.numel() and (int(owners.min()) < 0 or int(owners.max()) >= comm.size)):
                        raise st.InputError(f"partition must give one owner in 0..{comm.size - 1} per row "
                                            f"({N} rows), got shape {tuple(owners.shape)}")
                else:
                    owners = graph_parts(partition, rows.cpu(), cols.cpu(), N, comm.size, coords)
            elif A is not None:
                raise st.InputError(f"scatter: only rank {src} passes A; rank {comm.rank} passed {type(A).__name__} "
                                    f"(pass None)")
        except st.SparseTorchError as exc:
            err = exc
        comm.agree(err, "DSparseTensor.scatter")
        meta = comm.allgather_object((N, tuple(vals.shape[:-1]), str(vals.dtype)) if comm.rank == src else None)[src]
        N, batch_shape, dtype = meta[0], meta[1], getattr(torch, meta[2].replace("torch.", ""))
        if comm.rank != src:
            dev = device if device is not None else comm.device
            rows = cols = torch.zeros(0, dtype=torch.int64, device=dev)
            vals = torch.zeros(*batch_shape, 0, dtype=dtype, device=dev)
        if comm.max_int([1 if (comm.rank == src and vals.requires_grad) else 0])[0] and not vals.requires_grad:
            vals = vals.requires_grad_(True)  # the migration's backward communicates: every rank takes part
        owned = torch.arange(N, dtype=torch.int64) if comm.rank == src else torch.zeros(0, dtype=torch.int64)
        parts = owners if comm.rank == src else torch.zeros(0, dtype=torch.int64)
        return cls.from_local_rows(rows, cols, vals, (N, N), owned=owned, partition=parts, comm=comm, cache=False)

    # basic properties ------------------------------------------------------------------------------
    @property
    def comm(self) -> Comm:
        return self.pattern.comm

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[:-1]) + self.pattern.shape

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[:-1])

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def n_local(self) -> int:
        return self.pattern.n_local

    @property
    def nse_local(self) -> int:
        return self.pattern.nse

    @property
    def requires_grad(self) -> bool:
        return self.values.requires_grad

    def owned_rows(self) -> torch.Tensor:
        """Global ids of this rank's rows, in the local order of every vector."""
        return self.pattern.rowmap.owned_ids()

    def local_coo(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Global (row, col) of each local value slot (what ``values`` and its gradient refer to)."""
        p = self.pattern
        ids = self.owned_rows().to(p.row.device)
        colg = torch.cat([ids, p.halo_ids.to(ids.device)])[p.col]
        return ids[p.row], colg

    def with_values(self, values: torch.Tensor) -> "DSparseTensor":
        """The same pattern (no new plan) with new local values ``(*batch, nse_local)``."""
        if not isinstance(values, torch.Tensor) or values.shape[-1] != self.nse_local or values.dtype != self.dtype:
            raise st.InputError(f"with_values needs a {self.dtype} tensor ending in {self.nse_local} (this rank's "
                                f"slots), got {getattr(values, 'shape', type(values).__name__)}")
        return DSparseTensor(self.pattern, values)

    def with_entry_values(self, values: torch.Tensor) -> "DSparseTensor":
        """New values given per input entry (the order passed to :meth:`from_local_rows` on this rank;
        duplicates summed); differentiable, reuses the pattern and its halo plan. Not for tensors
        whose rows were moved by ``partition=`` or :meth:`scatter` (use :meth:`with_values`)."""
        if values.shape[-1] != self.pattern.n_in:
            raise st.InputError(f"with_entry_values needs {self.pattern.n_in} values per matrix on rank "
                                f"{self.comm.rank}, got {values.shape[-1]}")
        return DSparseTensor(self.pattern, _to_slots(values, self.pattern))

    def detach(self) -> "DSparseTensor":
        return DSparseTensor(self.pattern, self.values.detach())

    def member(self, i: int) -> "DSparseTensor":
        """Batch member ``i`` (flat index) of a value batch."""
        flat = self.values.reshape(-1, self.values.shape[-1])
        return DSparseTensor(self.pattern, flat[i])

    def __len__(self) -> int:
        return self.batch_shape[0] if self.batch_shape else 1

    def __repr__(self) -> str:
        b = f", batch={self.batch_shape}" if self.batch_shape else ""
        return (f"DSparseTensor(shape={self.pattern.shape}{b}, rank {self.comm.rank}/{self.comm.size}, "
                f"n_local={self.n_local}, nse_local={self.nse_local}, halo={self.pattern.n_halo}, dtype={self.dtype})")

    # local kernels (no autograd) --------------------------------------------------------------------
    def _blocks(self, values: torch.Tensor | None = None):
        """(interior, boundary or None) torch CSR tensors for one value set: views of the values
        (cached on the tensor while its values are unchanged)."""
        v = (self.values if values is None else values).detach()
        key = (v.data_ptr(), v._version, v.shape)
        if values is None and self._csr_key == key:
            return self._csr
        p = self.pattern
        blocks = (p.interior.tensor(v), p.boundary.tensor(v) if p.boundary.nnz else None)
        if values is None:
            self._csr_key, self._csr = key, blocks
        return blocks

    def _tblocks(self, values: torch.Tensor | None = None):
        """(interior^T, boundary^T or None) for one value set: gathered copies, built on first use
        (A^T products) and cached like :meth:`_blocks`."""
        v = (self.values if values is None else values).detach()
        key = (v.data_ptr(), v._version, v.shape)
        if values is None and self._csrt_key == key:
            return self._csrt
        itT, bdT = self.pattern.transposed
        blocks = (itT.tensor(v), bdT.tensor(v) if bdT is not None else None)
        if values is None:
            self._csrt_key, self._csrt = key, blocks
        return blocks

    def _mv(self, X2: torch.Tensor, values: torch.Tensor | None = None, keep_halo: bool = False):
        """``A X2`` for one matrix; ``X2`` is ``(n_local, m)``. Overlaps the halo with the interior."""
        it, bd = self._blocks(values)
        p = self.pattern
        X2 = X2.contiguous()
        handle = p.halo.start(X2) if p.n_halo or p.halo.sends else None
        Y = _spmm(it, X2)
        if handle is not None:
            H = p.halo.finish(handle)
            if bd is not None:
                Y = Y + _spmm(bd, H)
        else:
            H = X2.new_zeros(0, X2.shape[1])
        return (Y, H) if keep_halo else Y

    def _rmv(self, Y2: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """``A^T Y2`` for one matrix (boundary transpose sent back while the interior one runs)."""
        itT, bdT = self._tblocks(values)
        p = self.pattern
        Y2 = Y2.contiguous()
        if p.halo.recvs or p.halo.sends:
            G = _spmm(bdT, Y2) if bdT is not None else Y2.new_zeros(p.n_halo, Y2.shape[1])
            handle = p.halo.start_reverse(G.contiguous())
            Z = _spmm(itT, Y2)
            return p.halo.finish_reverse(handle, Z)
        return _spmm(itT, Y2)

    def _halo(self, X2: torch.Tensor) -> torch.Tensor:
        return self.pattern.halo.forward(X2.contiguous())

    # public ops ----------------------------------------------------------------------------------
    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        """``A @ X`` with ``X`` local: ``(n_local,)``, ``(n_local, k)``, or ``(*batch, n_local, k)`` for
        a value batch. Differentiable in ``X`` and ``values``. Collective."""
        from .ops import matmul

        return matmul(self, X)

    __matmul__ = matmul

    def rmatmul(self, X: torch.Tensor) -> torch.Tensor:
        """``A^T @ X`` (the transposed exchange); differentiable. Collective."""
        from .ops import matmul

        return matmul(self, X, transpose=True)

    def diagonal(self) -> torch.Tensor:
        """This rank's rows of the diagonal ``(*batch, n_local)`` (zeros where none is stored)."""
        p = self.pattern
        d = self.values.new_zeros(*self.batch_shape, p.n_local)
        has = p.diag_slot >= 0
        d[..., has] = self.values[..., p.diag_slot[has]]
        return d

    def local_block(self, values: torch.Tensor | None = None) -> st.SparseTensor:
        """The ``n_local x n_local`` diagonal block (owned rows and columns) as a SparseTensor."""
        p = self.pattern
        v = self.values if values is None else values
        it = p.interior
        return st.SparseTensor.from_coo(v[..., :it.nnz], it.rows(), it.col.to(torch.int64), shape=(it.nrows, it.ncols),
                                        format=st.format.CSR)

    def storage(self) -> dict[str, torch.Tensor]:
        """Every tensor this rank holds for the matrix now (pattern, halo plan, values, cached CSR
        blocks; the untransposed blocks are views of ``values``)."""
        out = dict(self.pattern.tensors())
        out["values"] = self.values
        for tag, blocks in (("csr", self._csr), ("csr_t", self._csrt)):
            if blocks is not None:
                for name, b in zip(("interior", "boundary"), blocks):
                    if b is not None:
                        out[f"{tag}.{name}.values"] = b.values()
        return out

    def stored_bytes(self) -> int:
        """Bytes of the distinct storages in :meth:`storage` (views counted once)."""
        return _unique_bytes(self.storage().values())

    def halo_volume(self) -> dict[str, int]:
        sent, recv = self.pattern.halo.volume
        return {"rows_sent": sent, "rows_received": recv, "neighbours": len(self.pattern.halo.neighbours)}


class DSparseTensorList:
    """Distributed matrices with different patterns (each a :class:`DSparseTensor` on the same ranks)."""

    def __init__(self, tensors: Sequence[DSparseTensor]) -> None:
        tensors = list(tensors)
        if not tensors or not all(isinstance(t, DSparseTensor) for t in tensors):
            raise st.InputError("DSparseTensorList needs a non-empty sequence of DSparseTensor")
        comm = tensors[0].comm
        if any(t.comm.size != comm.size or t.comm.group is not comm.group for t in tensors):
            raise MismatchError("every member of a DSparseTensorList must live on the same process group")
        comm.check_same("DSparseTensorList", {"members": len(tensors)})
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: int) -> DSparseTensor:
        return self.tensors[i]

    def __iter__(self):
        return iter(self.tensors)

    @property
    def comm(self) -> Comm:
        return self.tensors[0].comm

    def __repr__(self) -> str:
        return f"DSparseTensorList({len(self)} matrices, rank {self.comm.rank}/{self.comm.size})"


# building -------------------------------------------------------------------------------------------
def _owned_text(rowmap: RowMap) -> str:
    if rowmap.contiguous:
        return f"rows {rowmap.start}..{rowmap.stop - 1}"
    return f"{rowmap.n_local} rows given by owned="


def _owned_key(rowmap: RowMap):
    if rowmap.contiguous:
        return ("range", rowmap.start, rowmap.stop)
    return ("ids", rowmap.owned.data_ptr(), rowmap.owned._version, rowmap.n_local)


def _rowmap(comm: Comm, N: int, owned, device) -> RowMap:
    err = None
    if owned is None:
        return RowMap(comm, N, offsets=contiguous_offsets(N, comm.size))
    if isinstance(owned, (tuple, list, range)):
        if isinstance(owned, range):
            owned = (owned.start, owned.stop)
        if len(owned) != 2:
            raise st.InputError(f"owned=(start, stop) expected, got {owned!r}")
        everyone = comm.allgather_object((int(owned[0]), int(owned[1])))
        offsets = [everyone[0][0]] + [e[1] for e in everyone]
        ok = everyone[0][0] == 0 and everyone[-1][1] == N and all(everyone[r][1] == everyone[r + 1][0]
                                                                 for r in range(comm.size - 1))
        ok = ok and all(a <= b for a, b in everyone)
        if not ok:
            raise MismatchError(f"the owned=(start, stop) ranges {everyone} (by rank) do not tile 0..{N} in rank order")
        return RowMap(comm, N, offsets=offsets)
    try:
        ids = _check_index(owned, "owned").cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= N):
            raise st.InputError(f"owned holds row {int(ids[(ids < 0) | (ids >= N)][0])} outside 0..{N - 1} on rank {comm.rank}")
        if torch.unique(ids).numel() != ids.numel():
            raise st.InputError(f"owned lists a row twice on rank {comm.rank}")
    except st.SparseTorchError as exc:
        err, ids = exc, torch.zeros(0, dtype=torch.int64)
    comm.agree(err, "owned rows")
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
    err = None
    try:
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
    except st.SparseTorchError as exc:
        err = exc
    comm.agree(err, "repartitioning rows")
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
