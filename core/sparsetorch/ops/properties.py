"""Cheap structural property detection that feeds method choice.

- ``symmetric`` / ``hermitian``: A equals its (conjugate) transpose, entry by entry, each pair
  to a relative tolerance of 1e-12 of its own size (pattern-dependent work is cached per pattern).
- ``spd``: symmetric, positive real diagonal, weakly diagonally dominant by rows (Gershgorin:
  every eigenvalue is then >= 0), and nonsingular: in every connected component of the graph of
  the nonzero off-diagonal entries a row is strictly dominant (Taussky), or, for real values,
  the component's signs are not balanced (a tight component, every row's diagonal equal to the
  sum of its off-diagonal magnitudes, is singular exactly when they are). Dirichlet Laplacians
  (2-D/3-D Poisson), shifted graph Laplacians and the FEM matrices that are dominant (the 2-D P1
  mass matrix included) pass; a singular one (a graph Laplacian, a pure-Neumann Laplacian: every
  row sums to zero; positive semi-definite only) does not. Matrices that are SPD without being
  dominant are not detected: pass ``properties="spd"``.
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

__all__ = ["detect", "detect_cached", "normalize_tags", "KNOWN_TAGS", "recall", "remember", "semidefinite"]

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


def semidefinite(A: SparseTensor) -> bool:
    """Whether A is Hermitian positive semi-definite by Gershgorin's theorem: detected ``spd``, or
    detected symmetric (Hermitian) with a positive real diagonal and weakly diagonally dominant
    rows (what ``spd`` meant before its test asked for a strictly dominant row per connected
    component): a singular graph or pure-Neumann Laplacian passes. eigsh answers
    ``which="SM"`` of such a matrix as ``"SA"`` (no shift-invert at 0 of a singular matrix)."""
    tags = detect_cached(A)
    if "spd" in tags:
        return True
    if "symmetric" not in tags or "zero_diagonal" in tags:
        return False
    coords, slot = A.entries()
    n = A.format_shape[0]
    vals = A.values.detach()[..., slot]
    on = coords[0] == coords[1]
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0][on], vals[..., on])
    off = vals.abs().masked_fill_(on, 0)
    offsum = off.new_zeros(*off.shape[:-1], n).index_add(-1, coords[0], off)
    dre = diag.real if diag.is_complex() else diag
    if diag.is_complex() and not bool((diag.imag.abs() <= 1e-12 * dre.abs()).all()):
        return False
    return bool((dre > 0).all()) and bool((dre >= offsum * (1 - 1e-12)).all())


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


def symmetric_values(A: SparseTensor) -> bool:
    """Whether A's values are symmetric (Hermitian for complex values) on its pattern: :func:`detect`'s first
    test alone (no definiteness tests), for a caller that only needs that (``Solver.update_values``)."""
    m = _symmetry_map(A)
    if m is None:
        return bool({"symmetric", "hermitian"} & _detect(A))
    values = A.values.detach()
    return _mapped_symmetric(m, values, values if m.in_order else values.index_select(-1, m.slot))


def _mapped_symmetric(m: "_SymmetryMap", values: torch.Tensor, vals: torch.Tensor) -> bool:
    if vals.shape[-1] == 0:
        return True
    if m._pending is not None and m.counts_differ and not bool((vals == 0).any()):
        return False  # a non-symmetric pattern with no stored zeros: no transpose search needed
    if m._pending is not None and m.sample is not None and m.sample(values):
        return False  # a sample of entries differs from its transposes: no sort of the transposes needed
    m.resolve()
    tv = values.index_select(-1, m.tslot)
    if tv.is_complex():
        tv = tv.conj()
    return _pairs_symmetric(vals, tv, m.found)


def _detect_mapped(A: SparseTensor, m: "_SymmetryMap") -> frozenset[str]:
    n = A.format_shape[0]
    values = A.values.detach()
    vals = values if m.in_order else values.index_select(-1, m.slot)
    sym = _mapped_symmetric(m, values, vals)
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
              on_idx: torch.Tensor | None = None, graph=None) -> frozenset[str]:
    """Tags of a symmetric (Hermitian) A; ``vals`` in the order of ``A.entries()``. ``graph``: a
    callable giving the ``(rows, cols, values)`` whose nonzero off-diagonal entries make the graph
    of the SPD test, when not A's entries (duplicate coordinates: their sums, see :func:`_definite`)."""
    tags = {"symmetric", "hermitian"} if A.dtype.is_complex else {"symmetric"}
    von = vals[..., on] if on_idx is None else vals.index_select(-1, on_idx)
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, diag_rows, von)
    if bool((diag == 0).any()):
        tags.add("zero_diagonal")  # not definite; factorizations that do not pivot meet zero pivots
    off = vals.abs().masked_fill_(on, 0)  # abs() is a new tensor: fill it in place
    offsum = off.new_zeros(*off.shape[:-1], n).index_add(-1, rows, off)
    dre = diag.real if diag.is_complex() else diag
    if bool((dre > 0).all()) and bool((dre >= offsum * (1 - 1e-12)).all()):
        if ((not diag.is_complex() or bool((diag.imag.abs() <= 1e-12 * dre.abs()).all()))
                and _definite(A, vals, rows, on, dre, offsum, n, graph)):
            tags.add("spd")
    if "spd" not in tags and "zero_diagonal" not in tags and _zero_minor(A, vals, on, diag):
        tags.add("zero_minor")
    return frozenset(tags)


def _definite(A: SparseTensor, vals: torch.Tensor, rows: torch.Tensor, on: torch.Tensor, dre: torch.Tensor,
              offsum: torch.Tensor, n: int, graph) -> bool:
    """Whether a symmetric matrix with a positive real diagonal ``dre`` that is weakly diagonally
    dominant (``offsum``: each row's sum of off-diagonal magnitudes) is positive definite. It is
    positive semi-definite (Gershgorin); it is singular only if, in some connected component of
    the graph of its nonzero off-diagonal entries, no row is strictly dominant (Taussky: an
    irreducible, weakly dominant matrix with one strict row is nonsingular). Weak dominance alone
    allows a singular matrix: a graph or pure-Neumann Laplacian, whose rows sum to zero.

    A component whose rows are all tight (``d_i = sum_j |a_ij|``) is singular exactly when a vector
    of unit entries makes every ``x_i a_ij x_j`` equal ``-|a_ij|`` (the Gershgorin equality case): for
    real values, when the signs are balanced (some ``x`` in ``{-1, 1}^n`` has ``sign(a_ij) = -x_i x_j``:
    a graph Laplacian, all off-diagonal entries negative, or one with rows and columns negated). An
    unbalanced tight component (a cycle with an odd count of positive entries: the 2-D P1 mass matrix,
    ``[[2, 1, 1], [1, 2, 1], [1, 1, 2]]``) is definite. That test runs for real values (a complex
    matrix whose tight components hold non-real entries, and a value batch whose members' signs
    differ, are not called definite: a sufficient test, like dominance itself).

    Strict means ``d_i - offsum_i > tol_i`` with ``tol_i = max(1e-12, k_i eps) (d_i + offsum_i)``:
    ``k_i`` the row's stored entries, ``eps`` the dtype's machine epsilon, ``d_i + offsum_i`` the
    row's sum of magnitudes. A row that sums to zero in exact arithmetic but was assembled in
    floating point (a diagonal computed as the sum of its row's weights) keeps a residue up to
    about ``k_i eps / 2`` of that sum, and our own sums add as much again: such a residue (1e-17
    for 0) is not strict dominance. The 1e-12 floor matches the weak test's slack (a row may fail
    weak dominance by 1e-12 relative and still count as dominant): a smaller margin proves nothing.
    A row within the tolerance counts as tight.

    For a value batch the graph is that of the entries nonzero in every member (finer than any
    member's own: the test stays sufficient for each member)."""
    eps = torch.finfo(dre.dtype).eps
    if dre.dtype.itemsize < 4:  # half types: the margin and the counts in float32 (eps stays the dtype's)
        dre, offsum = dre.float(), offsum.float()
    counts = _row_counts(A, rows, n).to(dre.dtype)
    tol = (dre + offsum) * (counts * eps).clamp_(min=1e-12)
    strict = (dre - offsum) > tol
    if bool(strict.all()):
        return True
    edges = _Edges(A, vals, on, n, graph)
    if not bool(strict.any(-1).all()):  # a member without a strict row: all its components are tight
        tight = torch.ones(n, dtype=torch.bool, device=strict.device)
    else:
        labels = edges.labels()
        # strict rows per component (labels name the components), then for each row its component's count
        per = strict.to(torch.float32).new_zeros(*strict.shape[:-1], n).index_add_(-1, labels, strict.to(torch.float32))
        tight = (per.index_select(-1, labels) == 0).reshape(-1, n).any(0)  # rows of components without a strict row
        if not bool(tight.any()):
            return True
    if not _some_positive_off(vals, on):
        return False  # every off-diagonal entry real and negative (a Laplacian): every component balanced
    balanced = edges.balanced()
    return balanced is not None and not bool((balanced & tight).any())


def _some_positive_off(vals: torch.Tensor, on: torch.Tensor) -> bool:
    """Whether an off-diagonal entry is not real and negative (a positive or a non-real one)."""
    if vals.is_complex():
        return bool((((vals.real > 0) | (vals.imag != 0)) & ~on).any())
    return bool(((vals > 0) & ~on).any())


def _row_counts(A: SparseTensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Stored entries per row (pattern-only: kept in the pattern's cache)."""
    cache = A._cache
    key = ("properties", "row_counts")
    got = cache.get(key)
    if got is None or got.numel() != n:
        got = torch.bincount(rows, minlength=n)
        if is_plain(got):
            cache[key] = got
    return got  # type: ignore[no-any-return]


class _Edges:
    """The graph of :func:`_definite`: the off-diagonal entries nonzero in every member of ``vals``
    (stored zeros connect nothing), found when first asked. ``graph``: a callable giving ``(rows,
    cols, values)`` to take instead of A's entries (duplicate coordinates: their sums)."""

    def __init__(self, A: SparseTensor, vals: torch.Tensor, on: torch.Tensor, n: int, graph) -> None:
        self.A, self.n, self._graph = A, n, graph
        self._vals, self._on = vals, on
        self._found: tuple | None = None
        self._full: bool | None = None

    @property
    def full(self) -> bool:
        """No stored entry is zero: the graph (its labels, its balance for given signs) is the
        pattern's, kept in the pattern's cache."""
        if self._full is None:
            self._full = self._graph is None and not bool((self._vals == 0).any())
        return self._full

    def _find(self) -> tuple:
        if self._found is None:
            if self._graph is not None:
                rows, cols, vals = self._graph()
                off = rows != cols
            else:
                coords, _ = self.A.entries()  # the order of ``vals``
                rows, cols, vals, off = coords[0], coords[1], self._vals, ~self._on
            if self.full:
                edge = off
            else:
                nz = vals != 0
                edge = (nz.reshape(-1, nz.shape[-1]).all(0) if nz.dim() > 1 else nz) & off
            idx = edge.nonzero().squeeze(-1)
            self._found = (rows.index_select(0, idx), cols.index_select(0, idx), vals.index_select(-1, idx))
        return self._found

    @property
    def src(self) -> torch.Tensor:
        return self._find()[0]  # type: ignore[no-any-return]

    @property
    def dst(self) -> torch.Tensor:
        return self._find()[1]  # type: ignore[no-any-return]

    @property
    def values(self) -> torch.Tensor:
        return self._find()[2]  # type: ignore[no-any-return]

    def balanced(self) -> torch.Tensor | None:
        """For each row, whether its component's signs are balanced (see :func:`_definite`): some ``x``
        in ``{-1, 1}^n`` has ``sign(a_ij) = -x_i x_j`` on its edges. Through the signed double cover:
        vertices ``i`` and ``n + i`` (``x_i = 1`` and ``-1``), a negative entry joining equal signs, a
        positive one opposite ones; a component is balanced exactly when ``i`` and ``n + i`` land in
        different components of the cover. None where it is not decided here: non-real entries, or
        members of a value batch with other signs. Kept in the pattern's cache with the signs it was
        found for (a mass matrix's later detections pay one comparison)."""
        ev = self.values
        if ev.is_complex():
            if not bool((ev.imag == 0).all()):
                return None  # phases: not decided here
            ev = ev.real
        pos = ev > 0
        if pos.dim() > 1:
            pos = pos.reshape(-1, pos.shape[-1])
            if not bool((pos == pos[:1]).all()):
                return None  # members with other signs
            pos = pos[0]
        key = ("properties", "balanced")
        if self.full:
            got = self.A._cache.get(key)
            if got is not None and got[0].shape == pos.shape and torch.equal(got[0], pos):
                return got[1]  # type: ignore[no-any-return]
        n, src, dst = self.n, self.src, self.dst
        cover = _components(2 * n, torch.cat([src, src + n]),
                            torch.cat([torch.where(pos, dst + n, dst), torch.where(pos, dst, dst + n)]))
        out = cover[:n] != cover[n:]
        if self.full and is_plain(out):
            self.A._cache[key] = (pos, out)
        return out

    def labels(self) -> torch.Tensor:
        """Each row's connected component (labels in ``[0, n)``, one per component); of a full graph
        kept in the pattern's cache (later detections on that pattern pay one O(nnz) comparison)."""
        key = ("properties", "components")
        if self.full:
            got = self.A._cache.get(key)
            if got is not None and got.numel() == self.n:
                return got  # type: ignore[no-any-return]
        labels = _components(self.n, self.src, self.dst)
        if self.full and is_plain(labels):
            self.A._cache[key] = labels
        return labels


def _components(n: int, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Connected components of the graph with edges ``src[e] -- dst[e]`` (a symmetric edge set:
    each edge listed both ways), each vertex labelled by the smallest vertex of its component.
    Vectorized hooking and pointer jumping (Shiloach-Vishkin), on any device, without SciPy: every
    root takes the smallest root across its edges as its parent (parents only decrease, so no
    cycles), then pointers jump until every tree is a star; it stops when no edge joins two trees.
    A few rounds on grids and random graphs (2 on a 1000 x 1000 grid numbered by rows, 8 numbered
    at random), each O(nnz) gathers and one scatter, plus O(n) jumps. CPU time on one thread about
    SciPy's ``connected_components`` (with its CSR built): 106 against 55 ms on that grid, 129
    against 218 ms on a random graph of 5.2M entries; SciPy's import alone costs ~150 ms."""
    parent = torch.arange(n, device=src.device)
    if src.numel() == 0:
        return parent
    src, dst = src.to(torch.int64), dst.to(torch.int64)
    while True:
        new = parent.scatter_reduce(0, parent.index_select(0, src), parent.index_select(0, dst), reduce="amin")
        while True:
            nxt = new.index_select(0, new)
            if torch.equal(nxt, new):
                break
            new = nxt
        if torch.equal(new, parent):
            return parent
        parent = new


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
    di = diag.index_select(-1, coords[0].index_select(0, off))
    dj = diag.index_select(-1, coords[1].index_select(0, off))
    prod = (di * dj).abs()
    hit = sq == prod
    if not bool(hit.any()):
        return False
    # a pair whose products leave the dtype's range compares equal as inf == inf (or as two underflows to 0): blocks
    # of 1e+160 and 1e-160 were tagged, and LDL^T was not offered (session 29). Those are compared again with the
    # entries' binades taken out first (exact powers of two): |a'|^2 2^(2 e_a) == m_i m_j 2^(e_i + e_j)
    fi = torch.finfo(sq.dtype)
    odd = hit & ~((sq >= fi.tiny) & (sq <= fi.max))
    if not bool(odd.any()):
        return True
    mi, ei = torch.frexp(di.abs())
    mj, ej = torch.frexp(dj.abs())
    _, ea = torch.frexp(a.abs())
    a1 = _times_pow2(a, -ea)
    sq1 = (a1 * a1.conj()).real if a1.is_complex() else a1 * a1
    exact = _times_pow2(sq1, 2 * ea - ei - ej) == mi * mj
    return bool(((hit & ~odd) | (odd & exact)).any())


def _times_pow2(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``t * 2^e`` (``e`` integers), exact where the result is a normal number: two factors, so that ``2^e`` itself
    need not be one."""
    real = t.real.dtype if t.is_complex() else t.dtype
    e = e.to(real)
    h = torch.floor(e / 2)
    return t * torch.exp2(h) * torch.exp2(e - h)


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
    # the SPD test's components come from the summed duplicates (two stored entries of one
    # coordinate that cancel connect nothing)
    def graph():
        return torch.repeat_interleave(torch.arange(n, device=csr.pos[1].device), csr.pos[1].diff()), csr.crd[1], v

    return _spd_tags(A, values[..., slot], rows, on, rows[on], n, graph=graph)
