"""Cheap structural property detection that feeds method choice.

- ``symmetric`` / ``hermitian``: A equals its (conjugate) transpose, entry by entry, each pair
  to a relative tolerance of 1e-12 of its own size (pattern-dependent work is cached per pattern).
- ``spd``: symmetric, positive real diagonal, and weakly diagonally dominant by rows
  (Gershgorin: every eigenvalue is then >= 0; 2-D/3-D Poisson and most FEM mass/stiffness
  matrices pass). Matrices that are SPD without being dominant are not detected: pass
  ``properties="spd"``.
- ``zero_diagonal``: a symmetric matrix with a zero (or unstored) diagonal entry: not definite, and
  factorizations without pivoting (LDL^T) meet zero pivots on it.
- ``zero_minor``: a symmetric matrix, not detected SPD, with an exactly singular 2x2 principal
  minor ``a_ii a_jj = |a_ij|^2`` (unit-valued graph and mesh matrices): an elimination without
  pivoting (LDL^T) meets an exact zero pivot on it.
- ``nonsymmetric`` otherwise, with ``diagonally_dominant`` when every row's diagonal entry
  outweighs the rest of the row (weakly; the iteration model uses it).

User tags (``properties=`` in ``solve``) are trusted and skip detection.
"""

from __future__ import annotations

import torch

from ..dispatch.lru import LRU
from ..errors import InputError
from ..format import CSR
from ..tensor import SparseTensor
from ..tensor.construct import conversion
from ..tensor.sparse_tensor import is_plain
from ..tensor.pattern import version_of

__all__ = ["detect", "detect_cached", "normalize_tags", "KNOWN_TAGS", "recall", "remember"]

KNOWN_TAGS = frozenset({"spd", "symmetric", "hermitian", "nonsymmetric", "general", "diagonally_dominant",
                        "zero_diagonal", "zero_minor"})


def normalize_tags(properties) -> frozenset[str] | None:
    if properties is None:
        return None
    tags = {properties} if isinstance(properties, str) else set(properties)
    bad = tags - KNOWN_TAGS
    if bad:
        raise InputError(f"unknown properties {sorted(bad)}; known: {sorted(KNOWN_TAGS)}")
    given = set(tags)
    if "spd" in tags:
        tags |= {"symmetric", "hermitian"}
    if "general" in tags:
        tags = (tags - {"general"}) | {"nonsymmetric"}
    if "nonsymmetric" in tags and tags & {"symmetric", "hermitian"}:
        raise InputError(f"properties {sorted(given)} contradict each other: a matrix cannot be both "
                         f"{'general / nonsymmetric' if 'general' in given else 'nonsymmetric'} and "
                         f"{'spd (symmetric)' if 'spd' in given else 'symmetric / hermitian'}")
    return frozenset(tags)


#: Properties detected per (pattern, dtype), with what recognises the values they were detected
#: on: a weak reference to the values tensor, its version, and either the solve plan that holds a
#: snapshot of them (its load count) or a snapshot of our own (values of at most _OWN_SNAPSHOT_MAX
#: entries; larger ones are recognised only through a plan's snapshot)
_MEMO: "LRU[tuple, tuple]" = LRU("detected properties by values", 32)
_OWN_SNAPSHOT_MAX = 1 << 20


def recall(A: SparseTensor) -> frozenset[str] | None:
    """The properties :func:`remember` kept for A's values, if these are the same values with the
    same content (the same tensor at the same version, and equal to a snapshot taken when they
    were detected: writes torch does not track are seen), else None. One O(nnz) comparison
    instead of detection's gathers and sums: a loop solving with one matrix (a factorization
    reused) pays detection once (session 22: 8 of the 15 ms of a solve on a 500k-entry matrix)."""
    v = A.values
    entry = _MEMO.peek((A.pattern_key, A.dtype, A.device))
    if entry is None or not is_plain(v):
        return None
    ref, version, props, how = entry
    if ref() is not v or version_of(v) != version:
        return None
    vd = v.detach()
    if how[0] == "own":
        return props if _same_content(how[1], vd) else None
    state = how[1]()
    if state is None or not state.lock.acquire(blocking=False):
        return None  # the plan is gone, or busy in another thread: detect
    try:
        if state.loads != how[2] or state.snapshot is None or not state.holds(vd):
            return None
        return props if _same_content(state.snapshot, vd) else None
    finally:
        state.lock.release()


def _same_content(snap: torch.Tensor, v: torch.Tensor) -> bool:
    return snap.shape == v.shape and snap.dtype == v.dtype and snap.device == v.device and torch.equal(snap, v)


def remember(A: SparseTensor, props: frozenset[str], state=None, checks: int | None = None) -> None:
    """Keep ``props``, just detected on A's values, for :func:`recall`: through ``state`` (the solve
    plan of this call) when it loaded these values in this call (its ``checks`` grew past
    ``checks``) and holds a snapshot of them, else with a snapshot of our own for values of at
    most :data:`_OWN_SNAPSHOT_MAX` entries."""
    import weakref  # noqa: PLC0415

    v = A.values
    if not is_plain(v):
        return
    vd = v.detach()
    how: tuple | None = None
    if (state is not None and checks is not None and state.checks > checks and state.snapshot is not None
            and state.holds(vd)):
        how = ("state", weakref.ref(state), state.loads)
    elif vd.numel() <= _OWN_SNAPSHOT_MAX:
        how = ("own", vd.clone())
    if how is None:
        return
    try:
        ref = weakref.ref(v)
    except TypeError:
        return
    _MEMO.put((A.pattern_key, A.dtype, A.device), (ref, version_of(v), props, how))


def detect_cached(A: SparseTensor) -> frozenset[str]:
    """:func:`detect`, or the properties detected on these very values before (:func:`recall`): the
    ops that hold no plan snapshot of the values (eigsh, logdet, lstsq) keep their own for values of at
    most ``_OWN_SNAPSHOT_MAX`` entries."""
    got = recall(A)
    if got is None:
        got = detect(A)
        remember(A, got)
    return got


def detect(A: SparseTensor) -> frozenset[str]:
    """Properties of a square matrix (for a value batch: those all members share).

    The value tests run on every call (O(nnz) gathers and comparisons): a cache keyed on the
    values' identity would miss writes torch does not track (NumPy views, DLPack, ``.data``).
    What depends on the pattern only (where each entry's transpose lives, which entries are on
    the diagonal) is computed once per pattern and kept in the pattern's derived cache
    (``A._cache``: shared by ``with_values``/``detach``, emptied when an index buffer is
    written in place; a new pattern has its own).
    """
    sym = _symmetry_map(A)
    if sym is None:  # duplicate coordinates: the general path (sums duplicates through CSR)
        return _detect(A)
    return _detect_mapped(A, sym)


class _SymmetryMap:
    """Pattern-only data of :func:`detect`: the value slot of every stored entry, the slot of its
    transposed entry (None when the pattern is not symmetric), and the diagonal entries."""

    __slots__ = ("slot", "tslot", "in_order", "rows", "on", "on_idx", "diag_rows", "found", "_pending", "sample",
                 "counts_differ")

    def __init__(self, slot, tslot, in_order, rows, on, found=None, pending=None, sample=None, counts_differ=False) -> None:
        self.slot, self.tslot, self.in_order, self.rows, self.on = slot, tslot, in_order, rows, on
        self.diag_rows = rows[on]
        #: the diagonal entries' positions: per-call gathers take ``index_select`` (torch's boolean and
        #: advanced indexing open a parallel region even on small inputs, which stalls on a busy machine)
        self.on_idx = on.nonzero().squeeze(-1)
        #: for a pattern that is not symmetric: which entries have their transpose stored (their
        #: slots in ``tslot``; the others must hold zeros for A to be symmetric)
        self.found = found
        #: computes (tslot, found) when asked: for a pattern whose row and column counts differ (only values
        #: with stored zeros can still be symmetric: most calls never need it), and for a symmetric pattern
        #: (the transposes' sort is paid only when a sample of the values does not already show them
        #: asymmetric: a first call on a general matrix skipped ~30 ms of its ~120 at 500k entries)
        self._pending = pending
        #: ``sample(values) -> bool``: True when a fixed sample of entries proves the values asymmetric
        self.sample = sample
        self.counts_differ = counts_differ

    def resolve(self) -> None:
        if self._pending is not None:
            self.tslot, self.found = self._pending()
            self._pending = None


#: Pattern-only data of small CPU patterns shared by content (the pattern's BLAKE2 fingerprint):
#: a matrix rebuilt with fresh index buffers of the same pattern (re-read, re-assembled each
#: step) skips the sorts. Bounded in count and size; device patterns (whose fingerprint is a weak
#: checksum) are never shared.
_SHARED: "LRU[tuple, tuple]" = LRU("pattern data by content", 32)
_SHARE_MAX_NNZ = 1 << 17


def _shared_key(A: SparseTensor) -> tuple | None:
    if A.device.type != "cpu" or (A.nse or 0) > _SHARE_MAX_NNZ:
        return None
    return A.pattern_fingerprint


def _symmetry_map(A: SparseTensor) -> "_SymmetryMap | None":
    cache = A._cache
    key = ("properties", "symmetry_map")
    if key in cache:
        return cache[key]
    fp = _shared_key(A)
    if fp is not None:
        got = _SHARED.get(fp)
        if got is not None:
            # the same numbers in other buffers: their entries and map are this pattern's too
            cache.setdefault("entries", got[1])
            cache[key] = got[0]
            return got[0]  # type: ignore[no-any-return]
    out = _build_symmetry_map(A)
    entries = A.entries()
    if is_plain(entries[1]):
        cache[key] = out
        if fp is not None and out is not None:
            _SHARED.put(fp, (out, entries))
    return out


def _build_symmetry_map(A: SparseTensor) -> "_SymmetryMap | None":
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    n = A.format_shape[0]
    nnz = slot.numel()
    keys = rows.to(torch.int64) * n + cols.to(torch.int64)
    # entries in row-major order without duplicates (CSR with sorted columns, most COO) need no
    # sort of their keys, and their transposes come in order from a stable sort of the columns
    row_major = nnz > 1 and bool((keys[1:] > keys[:-1]).all())
    if row_major:
        skeys, order = keys, torch.arange(nnz, device=keys.device)
    else:
        skeys, order = torch.sort(keys)
    out: _SymmetryMap | None
    if not row_major and nnz > 1 and bool((skeys[1:] == skeys[:-1]).any()):
        out = None
    elif nnz and not torch.equal(torch.bincount(rows, minlength=n), torch.bincount(cols, minlength=n)):
        # rows and columns hold different counts: not a symmetric pattern, and the transposes are
        # searched for only if the values could still be symmetric (stored zeros)
        def pending(rows=rows, cols=cols, skeys=skeys, order=order, slot=slot, nnz=nnz, n=n):
            tkeys = cols.to(torch.int64) * n + rows.to(torch.int64)
            pos = torch.searchsorted(skeys, tkeys).clamp_(max=nnz - 1)
            found = skeys[pos] == tkeys
            return torch.where(found, slot[order[pos]], slot), found

        nslots = A.values.shape[-1]
        in_order = nnz == nslots and bool((slot == torch.arange(nslots, device=slot.device)).all())
        out = _SymmetryMap(slot, None, in_order, rows, rows == cols, None, pending,
                           _sampler(skeys, order, slot, rows, cols, n), counts_differ=True)
    else:
        def transposes(rows=rows, cols=cols, skeys=skeys, order=order, slot=slot, nnz=nnz, n=n, row_major=row_major):
            tkeys = cols.to(torch.int64) * n + rows.to(torch.int64)
            if row_major:
                torder = torch.sort(cols, stable=True)[1]
                stkeys = tkeys[torder]
            else:
                stkeys, torder = torch.sort(tkeys)
            found = None
            if nnz == 0:
                tslot = slot
            elif torch.equal(stkeys, skeys):
                # a symmetric pattern: the entry with the i-th smallest transposed key (torder[i]) is
                # the transpose of the entry with the i-th smallest key (order[i]); two sorts, no search
                tslot = torch.empty_like(slot)
                tslot[torder] = slot[order]
            else:
                pos = torch.searchsorted(skeys, tkeys).clamp_(max=nnz - 1)
                found = skeys[pos] == tkeys
                tslot = torch.where(found, slot[order[pos]], slot)
            return tslot, found

        nslots = A.values.shape[-1]
        in_order = nnz == nslots and (nnz == 0 or bool((slot == torch.arange(nslots, device=slot.device)).all()))
        if nnz <= _SAMPLE:  # small: the transposes at once (the sample would be the whole matrix)
            tslot, found = transposes()
            out = _SymmetryMap(slot, tslot, in_order, rows, rows == cols, found)
        else:
            out = _SymmetryMap(slot, None, in_order, rows, rows == cols, None, transposes,
                               _sampler(skeys, order, slot, rows, cols, n))
    return out


#: entries a pattern's symmetry sample compares (evenly spaced in key order)
_SAMPLE = 4096


def _sampler(skeys: torch.Tensor, order: torch.Tensor, slot: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
             n: int):
    """``sample(values) -> bool``: whether a fixed sample of :data:`_SAMPLE` stored entries (evenly spaced
    in key order) proves the values asymmetric: an entry that differs from its transposed entry beyond
    1e-12 of the larger (the test of :func:`_pairs_symmetric`), or a nonzero one whose transpose is not
    stored. False proves nothing (the full comparison follows). The sample's positions are found once."""
    nnz = skeys.numel()
    pick = torch.linspace(0, nnz - 1, min(nnz, _SAMPLE), device=skeys.device).to(torch.int64)
    e = order.index_select(0, pick)
    tk = cols.index_select(0, e).to(torch.int64) * n + rows.index_select(0, e).to(torch.int64)
    pos = torch.searchsorted(skeys, tk).clamp_(max=nnz - 1)
    found = skeys.index_select(0, pos) == tk
    mine = slot.index_select(0, e)
    theirs = torch.where(found, slot.index_select(0, order.index_select(0, pos)), mine)

    def sample(values: torch.Tensor) -> bool:
        v = values.index_select(-1, mine)
        tv = values.index_select(-1, theirs)
        if tv.is_complex():
            tv = tv.conj()
        tv = torch.where(found, tv, torch.zeros_like(tv))
        return bool(((v - tv).abs() > 1e-12 * torch.maximum(v.abs(), tv.abs())).any())

    return sample


def _detect_mapped(A: SparseTensor, m: "_SymmetryMap") -> frozenset[str]:
    n = A.format_shape[0]
    values = A.values.detach()
    vals = values if m.in_order else values.index_select(-1, m.slot)
    if vals.shape[-1] == 0:
        sym = True
    elif m._pending is not None and m.counts_differ and not bool((vals == 0).any()):
        sym = False  # a non-symmetric pattern with no stored zeros: no transpose search needed
    elif m._pending is not None and m.sample is not None and m.sample(values):
        sym = False  # a sample of entries differs from its transposes: no sort of the transposes needed
    else:
        m.resolve()
        tv = values.index_select(-1, m.tslot)
        if tv.is_complex():
            tv = tv.conj()
        sym = _pairs_symmetric(vals, tv, m.found)
    if not sym:
        return frozenset({"nonsymmetric"}) | _dominance(vals, m.rows, m.on, m.diag_rows, n, m.on_idx)
    return _spd_tags(A, vals, m.rows, m.on, m.diag_rows, n, m.on_idx)


def _pairs_symmetric(vals: torch.Tensor, tv: torch.Tensor, found: torch.Tensor | None) -> bool:
    """Whether every stored ``a_ij`` equals (the conjugate of) its transposed entry ``tv`` to 1e-12
    of the larger of the two (``found``: which entries have their transpose stored; the others must
    be zero). Each pair against its own size, not against the largest entry of A: a matrix holding
    one huge entry (a penalty row of boundary conditions, a decoupled unknown in other units) is not
    symmetric because its other asymmetries are small next to that entry (session 19: such a
    convection-diffusion block was called symmetric and solved by Cholesky). A NaN fails the test."""
    diff = vals - tv
    mag = torch.maximum(vals.abs(), tv.abs())
    if found is not None:
        # entries whose transpose is not stored are compared with zero
        diff = torch.where(found, diff, vals)
        mag = torch.where(found, mag, vals.abs())
    return bool((diff.abs() <= 1e-12 * mag).all())


def _spd_tags(A: SparseTensor, vals: torch.Tensor, rows: torch.Tensor, on: torch.Tensor, diag_rows: torch.Tensor, n: int,
              on_idx: torch.Tensor | None = None) -> frozenset[str]:
    tags = {"symmetric", "hermitian"} if A.dtype.is_complex else {"symmetric"}
    von = vals[..., on] if on_idx is None else vals.index_select(-1, on_idx)
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, diag_rows, von)
    if bool((diag == 0).any()):
        tags.add("zero_diagonal")  # not definite; factorizations that do not pivot meet zero pivots
    off = vals.abs().masked_fill_(on, 0)  # abs() is a new tensor: fill it in place
    offsum = off.new_zeros(*off.shape[:-1], n).index_add(-1, rows, off)
    dre = diag.real if diag.is_complex() else diag
    if bool((dre > 0).all()) and bool((dre >= offsum * (1 - 1e-12)).all()):
        if not diag.is_complex() or bool((diag.imag.abs() <= 1e-12 * dre.abs()).all()):
            tags.add("spd")
    if "spd" not in tags and "zero_diagonal" not in tags and _zero_minor(A, vals, on, diag):
        tags.add("zero_minor")
    return frozenset(tags)


def _zero_minor(A: SparseTensor, vals: torch.Tensor, on: torch.Tensor, diag: torch.Tensor) -> bool:
    """Whether a stored ``a_ij`` has ``|a_ij|^2 == |a_ii a_jj|`` exactly: a singular 2x2 principal
    minor. Eliminating ``i`` without pivoting then leaves exactly zero at ``j``'s pivot unless
    other updates reach it (graph, mesh and network matrices stored with unit values: every
    edge is such a minor), so LDL^T without pivoting is not offered first."""
    coords, _ = A.entries()  # the order of ``vals``
    off = (~on).nonzero().squeeze(-1)  # gathers by index_select (boolean indexing opens a parallel region)
    if not off.numel():
        return False
    a = vals.index_select(-1, off)
    sq = (a * a.conj()).real if a.is_complex() else a * a
    prod = (diag.index_select(-1, coords[0].index_select(0, off)) * diag.index_select(-1, coords[1].index_select(0, off))).abs()
    return bool((sq == prod).any())


def _dominance(vals: torch.Tensor, rows: torch.Tensor, on: torch.Tensor, diag_rows: torch.Tensor, n: int,
               on_idx: torch.Tensor | None = None) -> frozenset[str]:
    """``{"diagonally_dominant"}`` when every row has ``|a_ii| >= sum_j!=i |a_ij|`` with a nonzero
    diagonal (then Jacobi-preconditioned Krylov methods converge at the dominance ratio's rate)."""
    mag = vals.abs()
    diag = mag.new_zeros(*mag.shape[:-1], n).index_add(-1, diag_rows, mag[..., on] if on_idx is None else mag.index_select(-1, on_idx))
    offsum = mag.masked_fill(on, 0).new_zeros(*mag.shape[:-1], n).index_add(-1, rows, mag.masked_fill(on, 0))
    if bool((diag > 0).all()) and bool((diag >= offsum * (1 - 1e-12)).all()):
        return frozenset({"diagonally_dominant"})
    return frozenset()


def _detect(A: SparseTensor) -> frozenset[str]:
    n = A.format_shape[0]
    values = A.values.detach()
    csr = conversion(A, CSR, A.index_dtype)
    v = csr.apply(A.detach()).values
    At = A.detach().T
    tconv = conversion(At, CSR, A.index_dtype)
    t = tconv.apply(At)
    same_pattern = torch.equal(t.pos(1), csr.pos[1]) and torch.equal(t.crd(1), csr.crd[1])
    if not same_pattern:
        # Patterns differ; still symmetric if the extra entries are zeros. Compare densely for small n.
        if n > 2048:
            coords, slot = A.entries()
            on = coords[0] == coords[1]
            return frozenset({"nonsymmetric"}) | _dominance(values[..., slot], coords[0], on, coords[0][on], n)
        d = A.detach().to_dense()
        sym = bool(torch.allclose(d, d.transpose(-2, -1).conj(), rtol=1e-12, atol=0))
    else:
        tv = t.values.conj() if t.values.is_complex() else t.values
        sym = _pairs_symmetric(v, tv, None)
    coords, slot = A.entries()
    rows = coords[0]
    on = rows == coords[1]
    if not sym:
        return frozenset({"nonsymmetric"}) | _dominance(values[..., slot], rows, on, rows[on], n)
    return _spd_tags(A, values[..., slot], rows, on, rows[on], n)
