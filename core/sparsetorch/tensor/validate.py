"""Checks of level buffers against a format and a shape.

Every failure raises :class:`ValidationError` naming the buffer (``pos[k]``/``crd[k]``/
``values``), the level, the bad value and its place. Checks run on the buffers' own device; a
few scalars come back to the host to decide.
"""

from __future__ import annotations

import contextvars
import operator
import weakref
from typing import TYPE_CHECKING, Sequence

import torch

from ..errors import InputError, ValidationError
from ..format import LevelFormat, TensorFormat
from . import _levels

if TYPE_CHECKING:
    from .sparse_tensor import SparseTensor

__all__ = ["check_index_buffers", "check_batched_buffers", "count_positions", "check_values", "check_finite"]

INDEX_DTYPES = (torch.int32, torch.int64)

#: True while sparsetorch wraps buffers it built itself, correct by construction (a conversion's
#: output): the structural checks that would read them back (``pos[-1]`` against the length of
#: ``crd``: a device-to-host copy per level on a GPU) are skipped. Never set around user input.
TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("sparsetorch_trusted_buffers", default=False)


def check_shape(shape) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative Python ints; a ValidationError naming it otherwise (an
    entry that is not an integer, 3.5 say, is refused rather than truncated; a 0-d integer tensor or
    NumPy integer is accepted)."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValidationError(f"shape must be a sequence of non-negative integers, got {shape!r}") from None
    out = []
    for s in dims:
        if isinstance(s, bool):
            raise ValidationError(f"shape must hold integers, got {s!r} in {dims}")
        try:
            out.append(operator.index(s))
        except TypeError:
            raise ValidationError(f"shape must hold integers, got {s!r} ({type(s).__name__}) in {dims}") from None
    if any(s < 0 for s in out):
        raise ValidationError(f"shape must be non-negative, got {tuple(out)}")
    return tuple(out)


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


#: Per format (structural identity): ``(has_pos, has_crd)`` of each level; and per (format,
#: shape): the level extents. Remembered (bounded): wrapping buffers runs these checks on every
#: construction, a conversion's and an op's host path among them.
_NEEDS: dict = {}
_EXTENTS: dict = {}
_MEMO_MAX = 4096


def _needs(fmt: TensorFormat) -> tuple[tuple[bool, bool], ...]:
    got = _NEEDS.get(fmt)
    if got is None:
        got = tuple((lv.format.has_pos, lv.format.has_crd) for lv in fmt.levels)
        if len(_NEEDS) < _MEMO_MAX:
            _NEEDS[fmt] = got
    return got


def _extents(fmt: TensorFormat, shape: Sequence[int]) -> list[tuple[int, int]]:
    """``fmt.level_extents(shape)``, remembered per (format, shape) (do not modify the list)."""
    key = (fmt, tuple(shape))
    got = _EXTENTS.get(key)
    if got is None:
        got = fmt.level_extents(shape)
        if len(_EXTENTS) < _MEMO_MAX:
            _EXTENTS[key] = got
    return got


def check_index_buffers(fmt: TensorFormat, shape: Sequence[int], pos, crd, device: torch.device) -> None:
    """Buffer presence, dtypes and devices (before linearization)."""
    if not _common_case(_needs(fmt), pos, crd, device):  # the full check names what is off
        _check_index_buffers_in_full(fmt, pos, crd, device)


def _common_case(needs, pos, crd, device: torch.device) -> bool:
    """Whether the buffers are as ``needs`` says, tensors on ``device`` of one index dtype."""
    if len(pos) != len(needs) or len(crd) != len(needs):
        return False
    dtype = None
    for (has_pos, has_crd), p, c in zip(needs, pos, crd):
        if (p is not None) != has_pos or (c is not None) != has_crd:
            return False
        for buf in (p, c):
            if buf is None:
                continue
            if not isinstance(buf, torch.Tensor) or buf.device != device:
                return False
            if dtype is None:
                dtype = buf.dtype
            elif buf.dtype != dtype:
                return False
    return dtype is None or dtype in INDEX_DTYPES


def _check_index_buffers_in_full(fmt: TensorFormat, pos, crd, device: torch.device) -> None:
    if len(pos) != fmt.num_levels or len(crd) != fmt.num_levels:
        raise ValidationError(
            f"format {fmt} has {fmt.num_levels} levels; got {len(pos)} pos and {len(crd)} crd buffers "
            f"(use None for levels without that buffer)"
        )
    dtypes = set()
    for k, lv in enumerate(fmt.levels):
        for name, buf, needed in (("pos", pos[k], lv.format.has_pos), ("crd", crd[k], lv.format.has_crd)):
            if needed and buf is None:
                raise ValidationError(f"{name}[{k}] is missing: level {k} ({lv}) stores a {name} buffer")
            if not needed and buf is not None:
                raise ValidationError(f"{name}[{k}] must be None: level {k} ({lv}) stores no {name} buffer")
            if buf is None:
                continue
            if not isinstance(buf, torch.Tensor):
                raise ValidationError(f"{name}[{k}] must be a torch.Tensor, got {type(buf).__name__}")
            if buf.dtype not in INDEX_DTYPES:
                raise ValidationError(
                    f"{name}[{k}] has dtype {buf.dtype}; index buffers must be torch.int32 or torch.int64 "
                    f"(cast with .to(torch.int64))"
                )
            if buf.device != device:
                raise ValidationError(f"{name}[{k}] is on {buf.device} but values are on {device}; move them together")
            dtypes.add(buf.dtype)
    if len(dtypes) > 1:
        raise ValidationError(f"index buffers mix dtypes {sorted(map(str, dtypes))}; use one index dtype")


def _place(flat_index: int, shape: tuple[int, ...]) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return "".join(f"[{i}]" for i in reversed(idx))


def check_batched_buffers(fmt: TensorFormat, shape: Sequence[int], pos, crd) -> None:
    """Per-batch checks of the buffers below BATCH levels, reported at their place in the
    user's N-D buffers (before they are linearized)."""
    nb = fmt.num_batch_levels
    extents = fmt.level_extents(shape)
    for k in range(nb, fmt.num_levels):
        lv = fmt.levels[k]
        p, c = pos[k], crd[k]
        if p is not None and lv.format is not LevelFormat.LOOSE_COMPRESSED and p.shape[-1]:
            p2 = p.reshape(-1, p.shape[-1])
            start = p2[:, 0] != 0
            if bool(start.any()):
                b = _first(start)
                raise ValidationError(f"pos[{k}]{_place(b, tuple(p.shape[:-1]))}[0] must be 0 (level {k}, {lv}), got {int(p2[b, 0])}")
            dec = p2[:, 1:] < p2[:, :-1]
            if bool(dec.any()):
                at = _first(dec.reshape(-1))
                b, i = divmod(at, dec.shape[1])
                where = _place(b, tuple(p.shape[:-1]))
                raise ValidationError(
                    f"pos[{k}]{where} must be non-decreasing (level {k}, {lv}): pos[{k}]{where}[{i}] = "
                    f"{int(p2[b, i])} > pos[{k}]{where}[{i + 1}] = {int(p2[b, i + 1])}"
                )
            if c is not None:
                end = p2[:, -1] != c.shape[-1]
                if bool(end.any()):
                    b = _first(end)
                    raise ValidationError(
                        f"pos[{k}]{_place(b, tuple(p.shape[:-1]))}[-1] = {int(p2[b, -1])} must equal the per-batch "
                        f"length of crd[{k}] = {c.shape[-1]} (level {k}, {lv})"
                    )
        if c is not None and c.numel() and lv.format is not LevelFormat.DELTA:
            lo, hi = extents[k]
            cl = c.long()
            bad = ((cl < lo) | (cl >= hi)).reshape(-1)
            if bool(bad.any()):
                at = _first(bad)
                raise ValidationError(
                    f"crd[{k}]{_place(at, tuple(c.shape))} = {int(c.reshape(-1)[at])} is out of range for level {k} "
                    f"({lv}): a coordinate must lie in [{lo}, {hi}) for shape {tuple(shape)}"
                )


class _Label:
    """``level k (lv)``, formatted when an error message is (not on every construction)."""

    __slots__ = ("k", "lv")

    def __init__(self, k: int, lv) -> None:
        self.k, self.lv = k, lv

    def __str__(self) -> str:
        return f"level {self.k} ({self.lv})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


_DENSE, _COMPRESSED, _LOOSE, _SINGLETON, _STRUCTURED, _OTHER = range(6)
_KINDS: dict = {}


def _kinds(fmt: TensorFormat) -> tuple[tuple[int, int], ...]:
    """Per level ``(kind, N of N:M)``, remembered per format (the structural checks' plan)."""
    got = _KINDS.get(fmt)
    if got is None:
        out = []
        for lv in fmt.levels:
            f = lv.format
            if f.is_dense_like:
                out.append((_DENSE, 0))
            elif f in (LevelFormat.COMPRESSED, LevelFormat.DELTA):
                out.append((_COMPRESSED, 0))
            elif f is LevelFormat.LOOSE_COMPRESSED:
                out.append((_LOOSE, 0))
            elif f is LevelFormat.SINGLETON:
                out.append((_SINGLETON, 0))
            elif f is LevelFormat.STRUCTURED:
                out.append((_STRUCTURED, lv.type.parameter))
            else:
                out.append((_OTHER, 0))
        got = tuple(out)
        if len(_KINDS) < _MEMO_MAX:
            _KINDS[fmt] = got
    return got


#: ``id(buffer) -> (weak reference, version, data pointer, buffer[-1])``: the last pointer of each position buffer
#: read back by a structural check, at the buffer's version then. Wrapping the same buffer again,
#: not written in place since (its torch version counter unchanged: the rule ensure_valid keeps
#: too), reuses the value instead of reading it back (a device-to-host copy and a synchronization
#: on a GPU). Writes torch cannot see (through NumPy/CuPy memory) are not seen here either, as with
#: ensure_valid: check=False trusts the contents. Bounded; an entry goes when its buffer does.
_LAST: dict = {}


def _last(p: torch.Tensor) -> int:
    """``int(p[-1])``, remembered per buffer object and version."""
    try:
        version = p._version
    except RuntimeError:  # inference tensors keep no version counter: read it each time
        return int(p[-1])
    try:
        ptr = p.data_ptr()  # a plain tensor (not inside a torch.func transform, not a fake tensor)
    except (RuntimeError, TypeError):
        return int(p[-1])
    key = id(p)
    got = _LAST.get(key)
    if got is not None and got[1] == version and got[2] == ptr and got[0]() is p:
        return got[3]
    value = int(p[-1])
    if len(_LAST) >= _MEMO_MAX:
        _LAST.clear()
    _LAST[key] = (weakref.ref(p, lambda _, key=key: _LAST.pop(key, None)), version, ptr, value)
    return value


def _count_structural(fmt: TensorFormat, shape: Sequence[int], pos, crd) -> int | None:
    """``count_positions(check=False)`` when every structural check passes, else None (the full
    function then names what failed). ``pos[-1]`` of each compressed level is read back (one
    scalar) unless :data:`TRUSTED`."""
    extents = _extents(fmt, shape)
    trusted = TRUSTED.get()
    pcount = 1
    for (kind, n), (lo, hi), p, c in zip(_kinds(fmt), extents, pos, crd):
        if kind == _DENSE:
            pcount *= hi - lo
            continue
        if c.dim() != 1:
            return None
        if kind == _COMPRESSED:
            if p.dim() != 1 or p.shape[0] != pcount + 1 or (not trusted and _last(p) != c.shape[0]):
                return None
        elif kind == _LOOSE:
            if p.dim() != 1 or p.shape[0] != 2 * pcount:
                return None
        elif kind == _SINGLETON:
            if c.shape[0] != pcount:
                return None
            continue
        elif kind == _STRUCTURED:
            if c.shape[0] != pcount * n:
                return None
        pcount = c.shape[0]
    return pcount


def count_positions(fmt: TensorFormat, shape: Sequence[int], pos, crd, *, check: bool) -> int:
    """Number of value slots; with ``check``, validate every linearized buffer's contents."""
    if not check:
        got = _count_structural(fmt, shape, pos, crd)
        if got is not None:
            return got
    extents = _extents(fmt, shape)
    pcount = 1
    pending: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []  # order checks, run last
    for k, lv in enumerate(fmt.levels):
        f = lv.format
        lo_ext, hi_ext = extents[k]
        label = _Label(k, lv)  # formatted only into an error message
        if f.is_dense_like:
            pcount *= hi_ext - lo_ext
            continue
        c = crd[k]
        if c.dim() != 1:
            raise ValidationError(f"crd[{k}] must be 1-D, got shape {tuple(c.shape)}")
        owner = None
        if f in (LevelFormat.COMPRESSED, LevelFormat.DELTA):
            p = pos[k]
            if p.dim() != 1 or p.numel() != pcount + 1:
                raise ValidationError(
                    f"pos[{k}] must have {pcount + 1} entries (parents + 1) for {label}, got shape {tuple(p.shape)}"
                )
            if check:
                if int(p[0]) != 0:
                    raise ValidationError(f"pos[{k}][0] must be 0 for {label}, got {int(p[0])}")
                dec = p[1:] < p[:-1]
                if bool(dec.any()):
                    at = _first(dec)
                    raise ValidationError(
                        f"pos[{k}] must be non-decreasing ({label}): pos[{k}][{at}] = {int(p[at])} > "
                        f"pos[{k}][{at + 1}] = {int(p[at + 1])}"
                    )
            if (check or not TRUSTED.get()) and int(p[-1]) != c.numel():
                raise ValidationError(
                    f"pos[{k}][-1] = {int(p[-1])} must equal the length of crd[{k}] = {c.numel()} ({label})"
                )
            if check and (f is LevelFormat.DELTA or _order_checked(fmt, k)):
                # the owner of every entry: for the order checks (none for an unordered, nonunique level:
                # the loose variant from_package validates first) and DELTA's decode
                owner = torch.repeat_interleave(torch.arange(pcount, device=p.device), (p[1:] - p[:-1]).long())
        elif f is LevelFormat.LOOSE_COMPRESSED:
            p = pos[k]
            if p.dim() != 1 or p.numel() != 2 * pcount:
                raise ValidationError(f"pos[{k}] must hold {2 * pcount} entries (lo, hi per parent) for {label}, got {tuple(p.shape)}")
            if check and pcount:
                lo, hi = p[0::2], p[1::2]
                bad = (lo < 0) | (hi < lo) | (hi > c.numel())
                bad[1:] |= lo[1:] < hi[:-1]
                if bool(bad.any()):
                    at = _first(bad)
                    raise ValidationError(
                        f"pos[{k}] segment {at} = [{int(lo[at])}, {int(hi[at])}) is invalid for {label}: segments "
                        f"must be ordered, non-overlapping and within crd[{k}] (length {c.numel()})"
                    )
                # Order/uniqueness inside the used part of each segment (the rest is padding).
                cnt = (hi - lo).long()
                seg_owner = torch.repeat_interleave(torch.arange(pcount, device=p.device), cnt)
                starts = torch.cumsum(cnt, 0) - cnt
                member = lo.long()[seg_owner] + (torch.arange(seg_owner.numel(), device=p.device) - starts[seg_owner])
                pending.append((k, seg_owner, member))
        elif f is LevelFormat.SINGLETON:
            if c.numel() != pcount:
                raise ValidationError(f"crd[{k}] must have one entry per parent ({pcount}) for {label}, got {c.numel()}")
        elif f is LevelFormat.STRUCTURED:
            n = lv.type.parameter
            if c.numel() != pcount * n:
                raise ValidationError(f"crd[{k}] must have {n} entries per strip ({pcount * n}) for {label}, got {c.numel()}")
        if check and c.numel():
            if f is LevelFormat.DELTA:
                lo_ok, hi_ok = 0, 1 << lv.type.parameter
            else:
                lo_ok, hi_ok = lo_ext, hi_ext
            cl = c.long()  # compare in int64: 2**31 does not fit int32
            bad = (cl < lo_ok) | (cl >= hi_ok)
            if bool(bad.any()):
                at = _first(bad)
                what = "gap" if f is LevelFormat.DELTA else "coordinate"
                raise ValidationError(
                    f"crd[{k}][{at}] = {int(c[at])} is out of range for {label}: a {what} must lie in "
                    f"[{lo_ok}, {hi_ok}) for shape {tuple(shape)}"
                )
            if f is LevelFormat.DELTA and owner is not None:
                from ._levels import _delta_decode

                cols = _delta_decode(cl, owner)
                bad = cols >= lo_ext + (hi_ext - lo_ext)
                if bool(bad.any()):
                    at = _first(bad)
                    raise ValidationError(
                        f"crd[{k}] gaps walk past the last column at entry {at} ({label}): the decoded column is "
                        f"{int(cols[at])}, but the shape {tuple(shape)} has {hi_ext} columns"
                    )
            if f is LevelFormat.STRUCTURED:
                owner = torch.arange(pcount, device=c.device).repeat_interleave(lv.type.parameter)
            if owner is not None and f is not LevelFormat.DELTA and c.numel() > 1:
                pending.append((k, owner, None))
        pcount = c.numel() if f not in (LevelFormat.SINGLETON,) else pcount
    # Order and uniqueness last, once every buffer's length and range is known to be right.
    for k, owner, member in pending:
        if owner.numel() > 1:
            bufs = list(crd) if member is None else [b if m != k else b[member] for m, b in enumerate(crd)]
            _check_segment_order(fmt, k, bufs, owner, extents)
    return pcount


def _order_run(fmt: TensorFormat, k: int) -> list[int]:
    run = [k]
    if not fmt.levels[k].type.unique:
        while run[-1] + 1 < fmt.num_levels and fmt.levels[run[-1] + 1].format is LevelFormat.SINGLETON:
            run.append(run[-1] + 1)
    return run


def _order_checked(fmt: TensorFormat, k: int) -> bool:
    """Whether :func:`_check_segment_order` has anything to check at level ``k``."""
    run = _order_run(fmt, k)
    return all(fmt.levels[m].type.ordered for m in run) or fmt.levels[run[-1]].type.unique


def _check_segment_order(fmt: TensorFormat, k: int, crd, owner: torch.Tensor, extents) -> None:
    """Order and uniqueness of level ``k``'s coordinates within each parent segment.

    A nonunique level is checked together with the singleton levels that follow it (COO's
    ``(i, j)`` pairs): ordered means the tuples are non-decreasing, unique (the last level's
    property) means no tuple repeats.
    """
    run = _order_run(fmt, k)
    ordered = all(fmt.levels[m].type.ordered for m in run)
    unique = fmt.levels[run[-1]].type.unique
    if not ordered and not unique:
        return
    radix = 1
    for m in run:
        lo, hi = extents[m]
        radix *= hi - lo
    # one packed key per entry where it fits in int64 with room to spare; else (a 2**40 x 2**40 COO,
    # whose i * n + j wraps) the coordinate tuples are compared themselves
    packed = radix < 2**62
    lin = torch.zeros_like(owner)
    if packed:
        for m in run:
            lo, hi = extents[m]
            lin = lin * (hi - lo) + (crd[m].long() - lo)
    names = ", ".join(f"crd[{m}]" for m in run)
    label = " + ".join(str(fmt.levels[m]) for m in run)
    if ordered:
        same = owner[1:] == owner[:-1]
        if packed:
            step = lin[1:] - lin[:-1]
        else:  # the sign of each lexicographic step, by comparisons (no difference can wrap)
            step = torch.zeros(owner.numel() - 1, dtype=torch.int64, device=owner.device)
            for m in run:
                c = crd[m]
                step = torch.where(step == 0, (c[1:] > c[:-1]).long() - (c[1:] < c[:-1]).long(), step)
        bad = same & ((step <= 0) if unique else (step < 0))
        if bool(bad.any()):
            at = _first(bad)
            got = [tuple(int(crd[m][x]) for m in run) for x in (at, at + 1)]
            rule = "strictly increasing" if unique else "non-decreasing"
            raise ValidationError(
                f"{names} must be {rule} within each segment ({label}): entries {at} and {at + 1} are "
                f"{got[0]} then {got[1]}. Sort the indices first, or declare the level unordered"
                f"{'' if not unique else '/nonunique'}"
            )
        return
    if packed and radix * (int(owner[-1]) + 1) < 2**62:
        key, order = torch.sort(owner * radix + lin)
        dup = key[1:] == key[:-1]
    else:  # too wide to pack with the segment: a lexicographic sort of (owner, coordinates...)
        keys = [owner.long(), *(crd[m].long() for m in run)]
        order = torch.arange(owner.numel(), device=owner.device)
        for x in reversed(keys):
            order = order[torch.sort(x[order], stable=True).indices]
        dup = torch.ones(owner.numel() - 1, dtype=torch.bool, device=owner.device)
        for x in keys:
            sx = x[order]
            dup &= sx[1:] == sx[:-1]
    if bool(dup.any()):
        at = int(order[_first(dup)])
        got = tuple(int(crd[m][at]) for m in run)
        raise ValidationError(
            f"{names} repeat the coordinate {got} within one segment, but the level ({label}) is unique; "
            f"sum duplicates first (SparseTensor.from_coo does) or declare it nonunique"
        )


def check_values(values: torch.Tensor, nslots: int) -> None:
    if not isinstance(values, torch.Tensor):
        raise ValidationError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if values.dim() == 0 or values.shape[-1] != nslots:
        raise ValidationError(
            f"values must have {nslots} entries in its last dimension (one per stored slot), got shape {tuple(values.shape)}"
        )
    if values.dtype in (torch.bool,) or not (values.is_floating_point() or values.is_complex()):
        raise ValidationError(
            f"values have dtype {values.dtype}; sparsetorch stores floating point or complex values (cast with .double())"
        )


def check_finite(A: "SparseTensor", B: torch.Tensor | None, op: str) -> None:
    """NaN/Inf in A's values or in B raise (one device-to-host check each; ``check_finite=False`` skips)."""
    if not _all_finite(A.values.detach()):
        bad = torch.nonzero(~torch.isfinite(A.values.detach().reshape(-1)))[0, 0]
        raise InputError(
            f"{op}: A's values contain NaN or Inf (first at value slot {int(bad)}: "
            f"{A.values.detach().reshape(-1)[bad].item()}); fix the matrix or pass check_finite=False"
        )
    if B is not None:
        check_finite_rhs(B, op)


def check_finite_rhs(B: torch.Tensor, op: str) -> None:
    """NaN/Inf in a right-hand side raise (one device-to-host check)."""
    if not _all_finite(B.detach()):
        bad = torch.nonzero(~torch.isfinite(B.detach().reshape(-1)))[0, 0]
        raise InputError(
            f"{op}: the right-hand side contains NaN or Inf (first at flat index {int(bad)}); "
            f"fix it or pass check_finite=False"
        )


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every element is finite: one sum first (NaN and Inf propagate into it, so a finite
    sum proves it; a pass that reads once and writes nothing), the exact elementwise test only
    when the sum is not finite (a non-finite element, or finite ones that overflow the sum)."""
    if t.numel() == 0:
        return True
    if t.dtype.is_floating_point or t.dtype.is_complex:
        if bool(torch.isfinite(t.sum()).all()):
            return True
    return bool(torch.isfinite(t).all())


def _versions(buffers: tuple) -> tuple:
    """Version counters of ``buffers`` (-1 for inference-mode tensors, which keep none)."""
    out = []
    for b in buffers:
        try:
            out.append(b._version)
        except RuntimeError:
            out.append(-1)
    return tuple(out)


def _check_levels(fmt: TensorFormat, fshape: tuple[int, ...], pos: list, crd: list, values: torch.Tensor, *, check: bool):
    """The level checks of construction (contents only with ``check``): per-batch buffer shapes
    and contents, then the linearized buffers. Returns ``(lpos, lcrd, lvals, nslots)``."""
    nb = fmt.num_batch_levels
    if nb:
        bsizes = tuple(fmt.level_sizes(fshape)[:nb])
        for name, bufs in (("pos", pos), ("crd", crd)):
            for k, b in enumerate(bufs):
                if b is not None and (b.dim() != nb + 1 or tuple(b.shape[:nb]) != bsizes):
                    raise ValidationError(f"{name}[{k}] must have shape {bsizes} + (n,) for batch format {fmt}, got {tuple(b.shape)}")
        if check:
            check_batched_buffers(fmt, fshape, pos, crd)
    lpos, lcrd, lvals = _levels.linearize_batch(fmt, fshape, pos, crd, values)
    nslots = count_positions(fmt, fshape, lpos, lcrd, check=check)
    return lpos, lcrd, lvals, nslots
