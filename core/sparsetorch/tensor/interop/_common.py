"""Helpers shared by the package adapters: format variants, layout matching, index checks.

Nothing here imports an optional package. Layout matching compares formats with ``==``
(structural identity, names ignored), so a format spelled by hand or reached by ``permute``
matches its named counterpart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...errors import InteropError, ValidationError
from ...format import (
    BSC, BSR, COO_ND, CSC, CSR, DENSE, DENSE_COL, DENSE_ND, DIA, DIA_J, Dimension, LevelFormat,
    LevelType, TensorFormat,
)
from ...format.expr import FloorDiv
from ..sparse_tensor import SparseTensor

__all__ = [
    "Layout", "classify", "coo_format", "dense_format", "with_level", "strip_batch", "lex_props",
    "segment_owner", "unify_index", "check_value_dtype", "no_counterpart", "shared_batch_error",
    "plain_values", "wrap_scanned", "format_label",
]

_F = LevelFormat


def with_level(fmt: TensorFormat, k: int, unique: bool, ordered: bool) -> TensorFormat:
    """``fmt`` with level ``k``'s unique/ordered properties replaced (same name)."""
    pairs = [(lv.expr, lv.type) for lv in fmt.levels]
    expr, ty = pairs[k]
    pairs[k] = (expr, LevelType(ty.format, ty.parameter, unique, ordered))
    return TensorFormat(fmt.dims, pairs, index_dtype=fmt.index_dtype, name=fmt.name)


def coo_format(ndim: int, coalesced: bool) -> TensorFormat:
    """COO of order ``ndim``: ``COO_ND(ndim)`` when sorted and unique, else the unordered COO
    ``(i, j) -> (i : compressed(nonunique, unordered), j : singleton(nonunique, unordered))``: duplicates allowed."""
    fmt = COO_ND(ndim)
    if coalesced:
        return fmt
    pairs = [(fmt.levels[0].expr, LevelType(_F.COMPRESSED, None, False, False))]
    pairs += [(lv.expr, LevelType(_F.SINGLETON, None, False, False)) for lv in fmt.levels[1:]]
    return TensorFormat(fmt.dims, pairs, name=f"UnorderedCOO{ndim}")


def dense_format(order: Sequence[int]) -> TensorFormat:
    """Dense format whose level ``k`` stores dimension ``order[k]`` (DENSE/DENSE_COL for 2-D)."""
    order = tuple(order)
    if order == (0, 1):
        return DENSE
    if order == (1, 0):
        return DENSE_COL
    base = DENSE_ND(len(order))
    return TensorFormat(base.dims, [(base.dims[d], _F.DENSE) for d in order],
                        name=base.name if order == tuple(range(len(order))) else None)


def strip_batch(fmt: TensorFormat, nb: int) -> TensorFormat:
    """The format without its ``nb`` leading BATCH levels (which must store ``dims[:nb]``)."""
    return TensorFormat(fmt.dims[nb:], [(lv.expr, lv.type) for lv in fmt.levels[nb:]])


@dataclass(frozen=True)
class Layout:
    """What a format is, in package terms.

    kind: ``dense``, ``coo``, ``csr``, ``csc``, ``bsr``, ``bsc``, ``dia`` (SciPy's, indexed by
    column: DIA_J) or ``dia_row`` (DIA, indexed by row). ``order``: for ``dense``/``coo``, the
    dimension each level stores. ``unique``/``ordered``: the compressed level's properties.
    """

    kind: str
    nbatch: int = 0
    order: tuple[int, ...] = ()
    block: tuple[int, int] = (1, 1)
    unique: bool = True
    ordered: bool = True


def _block_sizes(fmt: TensorFormat) -> tuple[int, int] | None:
    """``(bh, bw)`` read off the ``i // bh`` and ``j // bw`` levels of a 2-D format."""
    if fmt.ndim != 2:
        return None
    sizes: dict[int, int] = {}
    for lv in fmt.levels:
        if isinstance(lv.expr, FloorDiv):
            sizes[fmt.dims.index(lv.expr.dim)] = lv.expr.c
    return (sizes[0], sizes[1]) if len(sizes) == 2 else None


def classify(fmt: TensorFormat) -> Layout | None:
    """The package layout ``fmt`` is (None if it is none of them)."""
    levels = fmt.levels
    plain = [fmt.dims.index(lv.expr) if isinstance(lv.expr, Dimension) else None for lv in levels]
    if None not in plain:
        if all(lv.format in (_F.DENSE, _F.BATCH) for lv in levels):
            return Layout("dense", fmt.num_batch_levels, tuple(plain))
        if levels[0].format is _F.COMPRESSED and all(lv.format is _F.SINGLETON for lv in levels[1:]):
            t = levels[0].type
            return Layout("coo", 0, tuple(plain), unique=t.unique, ordered=t.ordered)
    nb = fmt.num_batch_levels
    if plain[:nb] != list(range(nb)) or fmt.ndim - nb != 2:
        return None
    inner = strip_batch(fmt, nb)
    comp = next((lv.type for lv in inner.levels if lv.format is _F.COMPRESSED), None)
    if comp is None:
        return None
    u, o = comp.unique, comp.ordered
    candidates: list[tuple[str, TensorFormat, tuple[int, int]]] = [
        ("csr", with_level(CSR, 1, u, o), (1, 1)), ("csc", with_level(CSC, 1, u, o), (1, 1)),
    ]
    block = _block_sizes(inner)
    if block is not None:
        candidates += [("bsr", with_level(BSR(*block), 1, u, o), block),
                       ("bsc", with_level(BSC(*block), 1, u, o), block)]
    if nb == 0:
        candidates += [("dia", with_level(DIA_J, 0, u, o), (1, 1)), ("dia_row", with_level(DIA, 0, u, o), (1, 1))]
    for kind, cand, blk in candidates:
        if inner == cand:
            return Layout(kind, nb, block=blk, unique=u, ordered=o)
    return None


def _lex_steps(keys: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sign of each step between neighbouring tuples ``(keys[0][p], keys[1][p], ...)``: -1 down, 0 a
    repeat, 1 up (lexicographically)."""
    n = keys[0].numel()
    cmp = torch.zeros(max(n - 1, 0), dtype=torch.int64, device=keys[0].device)
    for k in keys:
        k = k.long()
        cmp = torch.where(cmp == 0, torch.sign(k[1:] - k[:-1]), cmp)
    return cmp


def sorted_unique(keys: Sequence[torch.Tensor]) -> bool:
    """Whether the tuples are strictly increasing (lexicographically ordered, no repeats): no sort."""
    return keys[0].numel() < 2 or not bool((_lex_steps(keys) <= 0).any())


def lex_props(keys: Sequence[torch.Tensor]) -> tuple[bool, bool]:
    """``(ordered, unique)`` of the tuples ``(keys[0][p], keys[1][p], ...)`` in storage order:
    ordered = lexicographically non-decreasing, unique = no tuple repeats (checked by a sort
    only when the tuples are not ordered)."""
    keys = [k.long() for k in keys]
    n = keys[0].numel()
    if n < 2:
        return True, True
    cmp = _lex_steps(keys)
    if not bool((cmp < 0).any()):
        return True, not bool((cmp == 0).any())
    order = torch.arange(n, device=keys[0].device)
    for k in reversed(keys):
        order = order[torch.sort(k[order], stable=True).indices]
    same = torch.ones(n - 1, dtype=torch.bool, device=keys[0].device)
    for k in keys:
        s = k[order]
        same &= s[1:] == s[:-1]
    return False, not bool(same.any())


def segment_props(pos: torch.Tensor, crd: torch.Tensor) -> tuple[bool, bool]:
    """:func:`lex_props` of the pairs ``(segment, crd)`` of a compressed level (``pos``: validated
    segment offsets): ordered = every segment's coordinates non-decreasing, unique = strictly
    increasing. One difference of neighbours with the segment boundaries masked (no segment owner
    per entry: ``from_package`` of a 1.35M-entry SciPy CSR spent 12 of its ~22 ms in the general
    test)."""
    n = crd.numel()
    if n < 2:
        return True, True
    d = crd[1:] - crd[:-1]  # int32 coordinates: the difference of two in [0, 2^31) fits int32
    starts = pos[1:-1].long() - 1  # the step into a new segment is not compared
    starts = starts[(starts >= 0) & (starts < n - 1)]
    if starts.numel():
        d.index_fill_(0, starts, 1)
    if not bool((d >= 0).all()):
        return False, lex_props([segment_owner(pos), crd])[1]
    return True, bool((d > 0).all())


def segment_owner(pos: torch.Tensor) -> torch.Tensor:
    """For a compressed ``pos`` (parents + 1 offsets), the parent of every stored child."""
    counts = (pos[1:] - pos[:-1]).long()
    return torch.repeat_interleave(torch.arange(counts.numel(), device=pos.device), counts)


def wrap_scanned(base: TensorFormat, k: int, shape: Sequence[int], pos: list, crd: list,
                 values: torch.Tensor, check: bool) -> SparseTensor:
    """Wrap buffers in ``base`` with level ``k``'s unique/ordered properties read off the data.

    The buffers are validated first under the loosest variant (nonunique, unordered), so bad
    package data raises :class:`ValidationError` before anything indexes with it; then the
    segments of level ``k`` are scanned and the exact variant is returned (same buffers).
    """
    loose = with_level(base, k, False, False)
    st = SparseTensor(loose, shape, pos, crd, values, check=check)
    ordered, unique = lex_props([crd[k]]) if k == 0 else segment_props(pos[k], crd[k])
    exact = with_level(base, k, unique, ordered)
    return st if exact == loose else SparseTensor(exact, shape, pos, crd, values, check=False)


def unify_index(*bufs: torch.Tensor) -> list[torch.Tensor]:
    """Index buffers as int32/int64 of one dtype: other integer dtypes become int64 and a mix
    of int32 and int64 becomes int64 (copying only the buffers that change)."""
    out = []
    for k, b in enumerate(bufs):
        if b.dtype in (torch.int32, torch.int64):
            out.append(b)
        elif b.dtype.is_floating_point or b.dtype.is_complex or b.dtype == torch.bool:
            raise ValidationError(f"index array {k} has dtype {b.dtype}; indices must be integers")
        else:
            out.append(b.to(torch.int64))
    if len({b.dtype for b in out}) > 1:
        out = [b.to(torch.int64) for b in out]
    return out


def check_value_dtype(dtype: torch.dtype, what: str, fix: str) -> None:
    """Raise unless ``dtype`` is floating point or complex (what sparsetorch stores)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        raise InteropError(
            f"{what} has values of dtype {dtype}; sparsetorch stores floating point or complex values. "
            f"Cast first: {fix}"
        )


def format_label(fmt: TensorFormat) -> str:
    return f"{fmt.name} '{fmt}'" if fmt.name else f"'{fmt}'"


def no_counterpart(t: SparseTensor, package: str, formats: str, target: str = "CSR") -> InteropError:
    """The error for a format ``package`` cannot hold: names its formats and the conversion."""
    return InteropError(
        f"format {format_label(t.format)} has no counterpart in {package}, which holds {formats}. "
        f"Convert first: t.convert(sparsetorch.format.{target}).to_package({package!r})"
    )


def shared_batch_error(t: SparseTensor, package: str, why: str) -> InteropError:
    return InteropError(
        f"this tensor holds a batch of {tuple(t.batch_shape)} value sets sharing one pattern, and {why}. "
        f"Hand over one value set at a time: t.with_values(t.values[k]).to_package({package!r})"
    )


def plain_values(v: torch.Tensor) -> torch.Tensor:
    """``v`` detached, with lazy conjugation/negation resolved (a view when none is pending)."""
    return v.detach().resolve_conj().resolve_neg()
