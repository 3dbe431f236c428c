"""The storage engine: dimension coordinates <-> level buffers, for any valid format.

Both directions walk the levels top-down with whole-array torch operations on the tensor's own
device (no Python loop over entries, no copy to the host). A level *position* numbers the
entries a level has stored; level ``k``'s buffers map parent positions (level ``k - 1``) to
child positions. The value array is indexed by the last level's positions.

``compose``    coordinates (ndim, n) + values (*batch, n) -> pos/crd buffers + value array
``decompose``  pos/crd buffers -> coordinates of every stored entry + its value position

BATCH levels are handled as DENSE here, on *linearized* buffers; ``linearize_batch`` and
``delinearize_batch`` convert to and from the per-batch buffers (torch's batched CSR layout).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import FormatError
from ..format import Dimension, FloorDiv, LevelFormat, Mod, TensorFormat
from ._compiling import compiling

Buffers = list  # list[torch.Tensor | None], one entry per level

__all__ = ["compose", "decompose", "level_keys", "linearize_batch", "delinearize_batch", "recover_dims"]


def level_keys(fmt: TensorFormat, shape: Sequence[int], coords: torch.Tensor) -> list[torch.Tensor]:
    """Each level's coordinate for every entry (int64)."""
    named = {d.name: coords[k] for k, d in enumerate(fmt.dims)}
    return [lv.expr.evaluate(named) for lv in fmt.levels]


def recover_dims(fmt: TensorFormat, keys: Sequence[torch.Tensor]) -> torch.Tensor:
    """Invert :func:`level_keys`: dimension coordinates (ndim, n) from level coordinates."""
    out = []
    for rec in fmt.recovery:
        a = keys[rec.a]
        if rec.kind == "plain":
            out.append(a)
        elif rec.kind == "block":
            out.append(a * rec.c + keys[rec.b])
        elif rec.kind == "sub_left":
            out.append(a + keys[rec.b])
        elif rec.kind == "sub_right":
            out.append(keys[rec.b] - a)
        else:  # add
            out.append(a - keys[rec.b])
    return torch.stack(out) if out else torch.empty(0, 0, dtype=torch.int64)


def _sort_and_group(keys: list[torch.Tensor], extents: Sequence[tuple[int, int]]):
    """Order entries by their level keys (first level most significant) and flag the first
    entry of each distinct key tuple. Returns ``(order or None when already sorted, new)``."""
    n = keys[0].numel()
    device = keys[0].device
    radix = 1
    for lo, hi in extents:
        radix *= max(hi - lo, 1)
    if radix < 2**62:
        lin = torch.zeros(n, dtype=torch.int64, device=device)
        for key, (lo, hi) in zip(keys, extents):
            lin = lin * max(hi - lo, 1) + (key - lo)
        step = lin[1:] - lin[:-1]
        if bool((step > 0).all()):  # already sorted, no duplicates: the common case
            return None, None
        if radix < 2**31:  # int32 sorts are several times faster
            lin = lin.to(torch.int32)
        lin, order = torch.sort(lin, stable=True)
        new = torch.ones(n, dtype=torch.bool, device=device)
        new[1:] = lin[1:] != lin[:-1]
        return order, new
    order = torch.arange(n, device=device)
    for key in reversed(keys):
        order = order[torch.sort(key[order], stable=True).indices]
    new = torch.ones(n, dtype=torch.bool, device=device)
    for key in keys:
        k = key[order]
        new[1:] |= k[1:] != k[:-1]
    return order, new


def _segments(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For segments [lo[p], hi[p]): (owner p of every member, member position)."""
    counts = hi - lo
    owner = torch.repeat_interleave(torch.arange(lo.numel(), device=lo.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    member = lo[owner] + (torch.arange(owner.numel(), device=lo.device) - starts[owner])
    return owner, member


def decompose(
    fmt: TensorFormat, shape: Sequence[int], pos: Buffers, crd: Buffers, *, keep_padding: bool = False,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinates (ndim, n) of every stored entry and the index of its value.

    Buffers must be linearized (see :func:`linearize_batch`). Entries that fall outside the
    shape (padding of DIA diagonals, of edge blocks, of N:M strips) are dropped unless
    ``keep_padding``; explicit zeros inside the shape are kept.
    """
    if device is None:
        device = next((b.device for b in (*pos, *crd) if b is not None), torch.device("cpu"))
    fast = _decompose_compressed(fmt, pos, crd, device)
    if fast is not None:
        return fast
    extents = fmt.level_extents(shape)
    parent = torch.zeros(1, dtype=torch.int64, device=device)
    # `full`: the current entries are exactly positions 0..count-1 in order, so a compressed
    # level's children are all of its positions and no gather is needed.
    full = True
    keys: list[torch.Tensor] = []
    for k, lv in enumerate(fmt.levels):
        f = lv.format
        lo_ext, hi_ext = extents[k]
        if f.is_dense_like:
            size = hi_ext - lo_ext
            step = torch.arange(size, device=device)
            count = parent.numel()
            child = (parent[:, None] * size + step).reshape(-1) if not full else torch.arange(count * size, device=device)
            keys = [x.repeat_interleave(size) for x in keys] + [(step + lo_ext).repeat(count)]
        elif f is LevelFormat.SINGLETON:
            child = parent
            keys.append((crd[k] if full else crd[k][parent]).long())
        elif f is LevelFormat.STRUCTURED:
            n = lv.type.parameter
            count = parent.numel()
            child = (parent[:, None] * n + torch.arange(n, device=device)).reshape(-1) if not full else torch.arange(count * n, device=device)
            keys = [x.repeat_interleave(n) for x in keys] + [(crd[k] if full else crd[k][child]).long()]
        elif full and f is not LevelFormat.LOOSE_COMPRESSED:
            p = pos[k].long()
            owner = torch.repeat_interleave(torch.arange(p.numel() - 1, device=device), p[1:] - p[:-1], output_size=crd[k].numel())
            child = torch.arange(crd[k].numel(), device=device)
            c = crd[k].long()
            if f is LevelFormat.DELTA:
                c = _delta_decode(c, owner)
            keys = [x[owner] for x in keys] + [c]
        else:
            p = pos[k].long()
            if f is LevelFormat.LOOSE_COMPRESSED:
                lo, hi = p[2 * parent], p[2 * parent + 1]
                full = False
            else:
                lo, hi = p[parent], p[parent + 1]
            owner, child = _segments(lo, hi)
            c = crd[k][child].long()
            if f is LevelFormat.DELTA:
                c = _delta_decode(c, owner)
            keys = [x[owner] for x in keys] + [c]
        parent = child
    coords = recover_dims(fmt, keys)
    if not keep_padding and coords.numel() and _may_pad(fmt, shape):
        size = torch.tensor(list(shape), device=device, dtype=torch.int64)[:, None]
        ok = ((coords >= 0) & (coords < size)).all(0)
        if not bool(ok.all()):
            coords, parent = coords[:, ok], parent[ok]
    return coords, parent


def _decompose_compressed(fmt: TensorFormat, pos: Buffers, crd: Buffers, device: torch.device):
    """Fast path of :func:`decompose` for ``(a : dense, b : compressed)`` over plain dimensions
    (CSR, CSC): the major index of every entry from the pointers in one pass (NumPy's repeat on
    the CPU, one fused kernel on GPUs), the minor index as stored; value slot ``e`` is entry ``e``."""
    if fmt.num_levels != 2 or fmt.ndim != 2:
        return None
    l0, l1 = fmt.levels
    if (l0.format is not LevelFormat.DENSE or l1.format is not LevelFormat.COMPRESSED
            or not isinstance(l0.expr, Dimension) or not isinstance(l1.expr, Dimension)):
        return None
    p, c = pos[1], crd[1]
    nnz, nmaj = c.numel(), p.numel() - 1
    if p.device.type == "cpu" and _plain(p):
        pn = p.contiguous().numpy()
        major = torch.from_numpy(np.repeat(np.arange(nmaj, dtype=np.int64), np.diff(pn)))
    else:
        major = torch.repeat_interleave(torch.arange(nmaj, device=device), (p[1:] - p[:-1]).long(), output_size=nnz)
    return recover_dims(fmt, [major, c.long()]), torch.arange(nnz, device=device)


def _plain(t: torch.Tensor) -> bool:
    """Whether NumPy can share ``t``'s memory (not inside a torch.func transform, where a
    tensor may have no storage of its own)."""
    try:
        t.data_ptr()
        t.detach().numpy()
    except (RuntimeError, TypeError):
        return False
    return True


def _may_pad(fmt: TensorFormat, shape: Sequence[int]) -> bool:
    """Whether stored slots can fall outside the shape (diagonals, edge blocks, N:M strips)."""
    sizes = dict(zip((d.name for d in fmt.dims), shape))
    for lv in fmt.levels:
        e = lv.expr
        if lv.format in (LevelFormat.RANGE, LevelFormat.STRUCTURED):
            return True
        if isinstance(e, (FloorDiv, Mod)) and sizes[e.dim.name] % e.c:
            return True
    return False


def _delta_decode(gaps: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """Columns from gaps: col = (sum of gap + 1 over the segment so far) - 1."""
    step = gaps + 1
    run = torch.cumsum(step, 0)
    if run.numel() == 0:
        return run
    first = torch.ones_like(owner, dtype=torch.bool)
    first[1:] = owner[1:] != owner[:-1]
    segment = torch.cumsum(first.long(), 0) - 1
    base = (run - step)[first][segment]
    return run - base - 1


def compose(
    fmt: TensorFormat,
    shape: Sequence[int],
    coords: torch.Tensor,
    values: torch.Tensor,
    index_dtype: torch.dtype,
) -> tuple[Buffers, Buffers, torch.Tensor]:
    """Build linearized level buffers for entries at ``coords`` (ndim, n) with ``values`` (*b, n).

    Entries are sorted into level order and duplicates are summed. Padding that a level needs
    (DENSE/RANGE slots, ELL rows, DELTA gap bridges, N:M strip slots) is filled with zeros.
    Differentiable with respect to ``values``.
    """
    pos, crd, nslots, dst = compose_map(fmt, shape, coords, index_dtype)
    return pos, crd, scatter_values(values, dst, nslots)


def compose_two_level(
    fmt: TensorFormat, shape: Sequence[int], coords: torch.Tensor, index_dtype: torch.dtype
) -> tuple[Buffers, Buffers, torch.Tensor | None] | None:
    """Fast path of :func:`compose_map` for the common two-level layouts, given unique entries:
    ``(a : dense, b : compressed)`` (CSR, CSC) and ``(a : compressed(nonunique), b : singleton)``
    (COO), ordered. Returns ``(pos, crd, order)`` where target slot ``s`` holds entry
    ``order[s]`` (``order`` None: already in place), or None when it does not apply (other
    layouts, or duplicate entries, which the general path sums).
    """
    if fmt.num_levels != 2 or fmt.ndim != 2:
        return None
    l0, l1 = fmt.levels
    from ..format import Dimension

    if not (isinstance(l0.expr, Dimension) and isinstance(l1.expr, Dimension) and l0.type.ordered and l1.type.ordered):
        return None
    csr_like = l0.format is LevelFormat.DENSE and l1.format is LevelFormat.COMPRESSED and l1.type.unique
    coo_like = (l0.format is LevelFormat.COMPRESSED and not l0.type.unique
                and l1.format is LevelFormat.SINGLETON and l1.type.unique)
    if not (csr_like or coo_like):
        return None
    names = [d.name for d in fmt.dims]
    a = coords[names.index(l0.expr.name)]
    b = coords[names.index(l1.expr.name)]
    na, nb = int(shape[names.index(l0.expr.name)]), int(shape[names.index(l1.expr.name)])
    n = a.numel()
    order = None
    if n > 1 and na * nb >= 2**62:
        # i * n + j would wrap in int64 (a 2**32 x 2**32 graph, a 4 x 2**62 shape): compare the
        # (a, b) pairs themselves, and sort by b then stably by a (lexicographic order)
        if not bool(_pairs_increasing(a, b).all()):
            order = torch.sort(b, stable=True).indices
            order = order[torch.sort(a[order], stable=True).indices]
            sa, sb = a[order], b[order]
            if bool(((sa[1:] == sa[:-1]) & (sb[1:] == sb[:-1])).any()):
                return None  # duplicates: the general path sums them
            b = sb
            if coo_like:
                a = sa
    elif n > 1:
        lin = a * nb + b
        if not bool((lin[1:] > lin[:-1]).all()):
            key = lin.to(torch.int32) if na * nb < 2**31 else lin
            key, order = torch.sort(key, stable=True)
            if not bool((key[1:] != key[:-1]).all()):
                return None  # duplicates: the general path sums them
            b = b[order]
            if coo_like:
                a = a[order]
    if csr_like:  # counts per row do not depend on the order
        counts = torch.bincount(a, minlength=na) if n else torch.zeros(na, dtype=torch.int64, device=a.device)
        pos = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(index_dtype)
        return [None, pos], [None, b.to(index_dtype)], order
    pos = torch.tensor([0, n], dtype=index_dtype, device=a.device)
    return [pos, None], [a.to(index_dtype), b.to(index_dtype)], order


def _pairs_increasing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether each neighbouring pair steps up lexicographically: ``(a[k], b[k]) < (a[k + 1], b[k + 1])``
    (no packed key, so right for coordinates of any size)."""
    return (a[1:] > a[:-1]) | ((a[1:] == a[:-1]) & (b[1:] > b[:-1]))


def scatter_values(values: torch.Tensor, dst: torch.Tensor | None, nslots: int) -> torch.Tensor:
    """Values of the entries placed in their slots (``dst=None``: already in place, one each)."""
    if dst is None:
        return values
    shape = (*values.shape[:-1], nslots)
    np_dtype = _NUMPY_DTYPES.get(values.dtype)
    if values.device.type == "cpu" and np_dtype is not None and _plain(values) and not _compiling():
        # calloc'ed zeros (NumPy's): the pages are zeroed as the scatter touches them, where
        # torch's new_zeros writes them all first (3x the time of the scatter for 16M slots)
        out = torch.from_numpy(np.zeros(shape, dtype=np_dtype))
        return _index_add(out, dst, values) if dst.numel() else out
    out = values.new_zeros(shape)
    return _index_add(out, dst, values) if dst.numel() else out


def _index_add(out: torch.Tensor, dst: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``out.index_add_(-1, dst, values)``, exact for complex values with an infinite part: torch multiplies the
    source by ``alpha = 1 + 0j`` there, which makes ``1 + inf j`` into ``nan + inf j`` (session 26's sweep); the
    real and imaginary parts are added as reals instead (the same sums)."""
    if values.is_complex():
        src = torch.view_as_real(values.resolve_conj().resolve_neg())
        if not (values.requires_grad and torch.is_grad_enabled()):
            torch.view_as_real(out).index_add_(-2, dst, src)
            return out
        return torch.view_as_complex(torch.view_as_real(out).index_add(-2, dst, src))  # differentiable alike
    return out.index_add_(-1, dst, values)


_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
                 torch.complex64: np.complex64, torch.complex128: np.complex128}


#: whether torch.compile is tracing this call in this thread (construct.py reads it as ``_levels._compiling``)
_compiling = compiling


def compose_map(
    fmt: TensorFormat, shape: Sequence[int], coords: torch.Tensor, index_dtype: torch.dtype,
    guard: Callable[[int, int], None] | None = None,
) -> tuple[Buffers, Buffers, int, torch.Tensor | None]:
    """Level buffers for entries at ``coords`` and where each entry's value goes.

    Returns ``(pos, crd, nslots, dst)``: entry ``e`` lands in value slot ``dst[e]`` (duplicates
    share a slot and are summed; slots no entry reaches are padding zeros). ``dst`` is None when
    entry ``e`` lands in slot ``e`` for every ``e`` and ``nslots == n`` (nothing to move). The map
    depends on the pattern only, so it converts any number of value sets.

    ``guard(slots, entries)``, if given, is called with a slot count before any buffer of that
    many slots is allocated (a padded level's coordinates, and the value slots, computed from
    counts first), and with the number of distinct entries; it raises to refuse the fill.
    """
    device = coords.device
    coords = coords.to(dtype=torch.int64)
    extents = fmt.level_extents(shape)
    keys = level_keys(fmt, shape, coords)
    n = coords.shape[1]
    nlev = fmt.num_levels
    # entry_slot maps original entries to the current entry list (after sort and dedupe).
    order = None
    group = None
    if n > 1:
        order, new = _sort_and_group(keys, extents)
        if order is not None:
            keys = [x[order] for x in keys]
            if not bool(new.all()):
                group = torch.cumsum(new.long(), 0) - 1
                keys = [x[new] for x in keys]
                n = int(group[-1]) + 1
    pos: Buffers = [None] * nlev
    crd: Buffers = [None] * nlev
    parent = torch.zeros(n, dtype=torch.int64, device=device)
    pcount = 1
    check = (lambda slots: guard(slots, n)) if guard is not None else (lambda slots: None)  # noqa: E731
    for k, lv in enumerate(fmt.levels):
        f = lv.format
        lo_ext, hi_ext = extents[k]
        key = keys[k]
        if f.is_dense_like:
            size = hi_ext - lo_ext
            parent = parent * size + (key - lo_ext)
            pcount *= size
            continue
        if f is LevelFormat.SINGLETON:
            check(pcount)
            c = torch.zeros(pcount, dtype=index_dtype, device=device)
            crd[k] = c.index_copy(0, parent, key.to(index_dtype)) if n else c
            continue
        if f is LevelFormat.STRUCTURED:
            check(pcount * lv.type.parameter)
            parent, pcount, crd[k] = _structured_map(lv, key, parent, pcount, index_dtype, keys, fmt)
            continue
        if f is LevelFormat.DELTA:
            parent, pcount, pos[k], crd[k] = _delta_map(lv, key, parent, pcount, index_dtype, check)
            continue
        # COMPRESSED / LOOSE_COMPRESSED: one child per distinct (parent, key [, trailing singleton keys]).
        group_keys = [key]
        if not lv.type.unique:
            m = k + 1
            while m < nlev and fmt.levels[m].format is LevelFormat.SINGLETON:
                group_keys.append(keys[m])
                m += 1
        flag = torch.zeros(n, dtype=torch.bool, device=device)
        if n:
            flag[0] = True
            flag[1:] = parent[1:] != parent[:-1]
            for x in group_keys:
                flag[1:] |= x[1:] != x[:-1]
        every = n == 0 or bool(flag.all())  # each entry its own child (the last level, usually)
        child = torch.arange(n, device=device) if every else torch.cumsum(flag.long(), 0) - 1
        owners = parent if every else parent[flag]
        counts = torch.bincount(owners, minlength=pcount) if n else torch.zeros(pcount, dtype=torch.int64, device=device)
        ends = torch.cumsum(counts, 0)
        nchild = int(owners.numel())
        if f is LevelFormat.COMPRESSED:
            pos[k] = torch.cat([ends.new_zeros(1), ends]).to(index_dtype)
            crd[k] = (key if every else key[flag]).to(index_dtype)
            parent, pcount = child, nchild
        else:  # ELL-like: each parent gets `width` slots, the used ones first.
            width = int(counts.max()) if counts.numel() and nchild else 0
            check(pcount * width)
            starts = torch.arange(pcount, device=device) * width
            pos[k] = torch.stack([starts, starts + counts], 1).reshape(-1).to(index_dtype)
            rank = torch.arange(nchild, device=device) - (ends - counts)[owners]
            slot = owners * width + rank
            c = torch.zeros(pcount * width, dtype=index_dtype, device=device)
            crd[k] = c.index_copy(0, slot, (key if every else key[flag]).to(index_dtype)) if nchild else c
            parent, pcount = slot[child], pcount * width
    check(pcount)  # the value slots, before anything of that size exists
    # parent: slot of each (sorted, deduplicated) entry. Compose with the sort and the dedupe.
    dst = parent
    if group is not None:
        dst = dst[group]
    if order is not None:
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=device)
        dst = dst[inv]
    if pcount == dst.numel() and (order is None and group is None) and (
        dst.numel() == 0 or bool((dst == torch.arange(dst.numel(), device=device)).all())
    ):
        return pos, crd, pcount, None
    return pos, crd, pcount, dst


def _delta_map(lv, col, parent, pcount, index_dtype, check=lambda slots: None):
    bits = lv.type.parameter
    n = col.numel()
    device = col.device
    prev = torch.full_like(col, -1)
    if n:
        prev[1:] = torch.where(parent[1:] == parent[:-1], col[:-1], torch.full_like(col[1:], -1))
    gap = col - prev - 1
    npad = gap >> bits
    reps = npad + 1
    last = torch.cumsum(reps, 0) - 1
    total = int(last[-1]) + 1 if n else 0
    check(total)
    gaps = torch.full((total,), (1 << bits) - 1, dtype=torch.int64, device=device)
    gaps[last] = gap - (npad << bits)
    owner = torch.repeat_interleave(parent, reps, output_size=total)
    counts = torch.bincount(owner, minlength=pcount) if total else torch.zeros(pcount, dtype=torch.int64, device=device)
    pos = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(index_dtype)
    return last, total, pos, gaps.to(index_dtype)


def _structured_map(lv, col, parent, pcount, index_dtype, keys, fmt):
    n_keep, m = lv.type.parameter, lv.expr.c
    device = col.device
    count = torch.bincount(parent, minlength=pcount) if parent.numel() else torch.zeros(pcount, dtype=torch.int64, device=device)
    if count.numel() and int(count.max()) > n_keep:
        bad = int(torch.argmax((count > n_keep).to(torch.int8)))
        at = int(torch.nonzero(parent == bad)[0, 0])
        where = tuple(int(x) for x in recover_dims(fmt, [x[at : at + 1] for x in keys])[:, 0])
        raise FormatError(
            f"{fmt.levels[-1]} allows at most {n_keep} stored entries per strip of {m}, but the strip holding "
            f"entry {where} has {int(count[bad])} (nonzeros and explicit zeros); prune to {n_keep}:{m} first "
            f"(e.g. keep the largest magnitudes), convert with drop_zeros=True, or pick a format without the "
            f"N:M constraint"
        )
    occ = torch.zeros(pcount, m, dtype=torch.bool, device=device)
    if parent.numel():
        occ[parent, col] = True
    pick = torch.argsort((~occ).to(torch.int8), dim=1, stable=True)[:, :n_keep]
    pick = torch.sort(pick, dim=1).values
    real = occ.gather(1, pick).reshape(-1)
    slots = torch.nonzero(real).reshape(-1)  # entries are sorted by (strip, col): same order
    return slots, pcount * n_keep, pick.reshape(-1).to(index_dtype)


# BATCH levels ------------------------------------------------------------------------------------

def _batch_count(fmt: TensorFormat, shape: Sequence[int]) -> int:
    nb = fmt.num_batch_levels
    total = 1
    for s in fmt.level_sizes(shape)[:nb]:
        total *= s
    return total


def linearize_batch(fmt: TensorFormat, shape, pos: Buffers, crd: Buffers, values: torch.Tensor):
    """Per-batch buffers (leading batch dims, local offsets) -> one linear set of buffers."""
    nb = fmt.num_batch_levels
    if nb == 0:
        return list(pos), list(crd), values
    bt = _batch_count(fmt, shape)
    lpos, lcrd = list(pos), list(crd)
    for k, lv in enumerate(fmt.levels):
        if k < nb:
            continue
        c = crd[k]
        if c is not None:
            lcrd[k] = c.reshape(c.numel())
        p = pos[k]
        if p is not None:
            per = c.shape[-1]
            off = torch.arange(bt, device=p.device, dtype=p.dtype)[:, None] * per
            p2 = p.reshape(bt, p.shape[-1]) + off
            if lv.format is LevelFormat.LOOSE_COMPRESSED:
                lpos[k] = p2.reshape(p2.numel())
            else:
                lpos[k] = torch.cat([p2[:, :-1].reshape(bt * (p2.shape[1] - 1)), p2.new_full((1,), bt * per)])
    vb = values.shape[: values.dim() - nb - 1]
    return lpos, lcrd, values.reshape(*vb, bt * values.shape[-1])


def delinearize_batch(fmt: TensorFormat, shape, pos: Buffers, crd: Buffers, values: torch.Tensor):
    """Inverse of :func:`linearize_batch`; every batch must hold the same number of entries."""
    nb = fmt.num_batch_levels
    if nb == 0:
        return pos, crd, values
    bsizes = fmt.level_sizes(shape)[:nb]
    bt = _batch_count(fmt, shape)
    out_pos, out_crd = list(pos), list(crd)
    for k, lv in enumerate(fmt.levels):
        if k < nb:
            continue
        c, p = crd[k], pos[k]
        if p is not None:
            if lv.format is LevelFormat.LOOSE_COMPRESSED:
                p2 = p.reshape(bt, -1)
                per = c.numel() // bt
                out_pos[k] = (p2 - torch.arange(bt, device=p.device, dtype=p.dtype)[:, None] * per).reshape(*bsizes, -1)
            elif bt == 0:
                out_pos[k] = p.new_zeros(*bsizes, (p.numel() - 1) if p.numel() else 1)
            else:
                parents = (p.numel() - 1) // bt
                bounds = p[:: parents] if parents else p.new_zeros(bt + 1)
                counts = bounds[1:] - bounds[:-1]
                if bt and not bool((counts == counts[0]).all()):
                    raise FormatError(
                        f"{fmt} needs the same number of stored entries in every batch at level {k} "
                        f"({lv}); got {counts.tolist()[:8]}{'...' if bt > 8 else ''}. Use a shared-pattern "
                        f"tensor (values with a leading batch dimension) or a SparseTensorList instead"
                    )
                starts = bounds[:-1]
                body = p[:-1].reshape(bt, parents) - starts[:, None]
                ends = (bounds[1:] - starts)[:, None]
                out_pos[k] = torch.cat([body, ends], 1).reshape(*bsizes, parents + 1)
        if c is not None:
            out_crd[k] = c.reshape(*bsizes, c.numel() // bt if bt else 0)
    vb = values.shape[:-1]
    return out_pos, out_crd, values.reshape(*vb, *bsizes, values.shape[-1] // bt if bt else 0)
