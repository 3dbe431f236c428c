"""`TensorFormat`: dimensions mapped to storage levels, validated, hashable, printable.

Identity is structural: two formats are equal when they have the same number of dimensions and
the same level expressions and level types in the same order, with dimensions matched by
position. The format's name, its dimensions' names and its index-dtype preference are labels,
not part of the identity, so ``parse("(r, c) -> (r : dense, c : compressed)") == CSR``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import torch

from ..errors import FormatError
from .expr import Add, Dimension, FloorDiv, LevelExpr, Mod, Sub
from .level import LevelFormat, LevelSpec, LevelType, as_level_type

if TYPE_CHECKING:
    pass

__all__ = ["TensorFormat", "Level", "Recovery"]

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class Level:
    """One storage level: the expression it is indexed by and its level type."""

    expr: LevelExpr
    type: LevelType

    @property
    def format(self) -> LevelFormat:
        return self.type.format

    def __str__(self) -> str:
        return f"{self.expr} : {self.type}"


@dataclass(frozen=True)
class Recovery:
    """How one dimension's coordinate is computed back from level coordinates.

    kind "plain": ``dim = L[a]``; "block": ``dim = L[a] * c + L[b]``;
    "sub_left": ``dim = L[a] + L[b]`` (dim is ``x`` of ``x - y``, range on ``y``);
    "sub_right": ``dim = L[b] - L[a]`` (dim is ``y`` of ``x - y``, range on ``x``);
    "add": ``dim = L[a] - L[b]`` (``x + y`` minus the other one, which a range level holds).
    """

    kind: str
    a: int
    b: int = -1
    c: int = 0


class TensorFormat:
    """A storage layout: ``TensorFormat(dims, levels, index_dtype=None, name=None)``.

    ``dims`` is a sequence of :class:`Dimension`; ``levels`` maps level expressions to level
    specs in storage order (a ``dict`` keeps insertion order), or is a sequence of
    ``(expr, spec)`` pairs. Examples::

        i, j = Dimension("i"), Dimension("j")
        CSC = TensorFormat([i, j], {j: LevelFormat.DENSE, i: LevelFormat.COMPRESSED})
        DELTA2 = TensorFormat([i, j], {i: LevelFormat.DENSE, j: (LevelFormat.DELTA, 2)})
        BSR23 = TensorFormat([i, j], {i // 2: LevelFormat.DENSE, j // 3: LevelFormat.COMPRESSED,
                                      i % 2: LevelFormat.DENSE, j % 3: LevelFormat.DENSE})

    ``index_dtype`` (``torch.int32``/``torch.int64``/None) is the index type a conversion to this
    format produces (None keeps the source's).
    """

    __slots__ = ("dims", "levels", "index_dtype", "name", "_recovery", "_key", "_hash")

    dims: tuple[Dimension, ...]
    levels: tuple[Level, ...]
    index_dtype: torch.dtype | None
    name: str | None

    def __init__(
        self,
        dims: Sequence[Dimension],
        levels: Mapping[LevelExpr, LevelSpec] | Iterable[tuple[LevelExpr, LevelSpec]],
        *,
        index_dtype: torch.dtype | str | None = None,
        name: str | None = None,
    ) -> None:
        dims = tuple(dims)
        if not dims:
            raise FormatError("a format needs at least one dimension")
        for d in dims:
            if not isinstance(d, Dimension):
                raise FormatError(f"dims must be Dimension objects, got {d!r}")
        names = [d.name for d in dims]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FormatError(f"dimension names must be unique, repeated: {dup}")
        pairs = list(levels.items()) if isinstance(levels, Mapping) else list(levels)
        built: list[Level] = []
        for item in pairs:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise FormatError(f"each level must be an (expression, level spec) pair, got {item!r}")
            expr, spec = item
            if not isinstance(expr, (Dimension, FloorDiv, Mod, Add, Sub)):
                raise FormatError(f"level expression must be a dimension or i//c, i%c, i+j, j-i; got {expr!r}")
            built.append(Level(expr, as_level_type(spec)))
        if isinstance(index_dtype, str):
            index_dtype = getattr(torch, index_dtype, None) if index_dtype in ("int32", "int64") else index_dtype
        if index_dtype is not None and index_dtype not in _INDEX_DTYPES:
            raise FormatError(f"index_dtype must be torch.int32, torch.int64 or None, got {index_dtype!r}")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "levels", tuple(built))
        object.__setattr__(self, "index_dtype", index_dtype)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_recovery", _validate(dims, tuple(built)))
        index = {d.name: k for k, d in enumerate(dims)}
        key = (len(dims), tuple((lv.expr.canonical(index), lv.type) for lv in built))
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    # Immutability and identity ---------------------------------------------------------------
    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("TensorFormat is immutable; use .replace(...) for a changed copy")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorFormat) and other._key == self._key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (_rebuild, (str(self), str(self.index_dtype).replace("torch.", "") if self.index_dtype else None, self.name))

    # Derived facts ----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def recovery(self) -> tuple[Recovery, ...]:
        """Per dimension, how its coordinate is recovered from level coordinates."""
        return self._recovery

    @property
    def num_batch_levels(self) -> int:
        n = 0
        for lv in self.levels:
            if lv.format is not LevelFormat.BATCH:
                break
            n += 1
        return n

    @property
    def is_dense(self) -> bool:
        return all(lv.format is LevelFormat.DENSE for lv in self.levels)

    # UST's queries (nvmath-python's ``ust.TensorFormat`` spelling) ------------------------------
    @property
    def num_dimensions(self) -> int:
        """The tensor's order (UST's name for :attr:`ndim`)."""
        return len(self.dims)

    @property
    def dimensions(self) -> tuple[Dimension, ...]:
        """The dimensions (UST's name for :attr:`dims`)."""
        return self.dims

    @property
    def is_identity(self) -> bool:
        """Level ``k`` is dimension ``k`` itself for every ``k`` (and there are as many levels as
        dimensions): CSR, COO, DENSE, BATCHED_CSR; not CSC, BSR or DIA."""
        return len(self.levels) == len(self.dims) and all(
            isinstance(lv.expr, Dimension) and lv.expr == d for lv, d in zip(self.levels, self.dims))

    @property
    def is_ordered(self) -> bool:
        """Every level keeps its coordinates in order (no level is marked ``unordered``)."""
        return all(lv.type.ordered for lv in self.levels)

    @property
    def is_unique(self) -> bool:
        """No two stored entries have the same coordinates: the last level is unique (COO's
        nonunique first level is resolved by its unique singleton). nvmath-python 1.0 asks
        whether *any* level is unique, which agrees on its named formats and on COO with
        duplicates (all levels nonunique); it differs for a nonunique last level under a unique
        one, which this query reports as not unique."""
        return self.levels[-1].type.unique

    def dim2lvl(self, dim_indices: Sequence, as_size: bool = False) -> list:
        """Level coordinates of the dimension coordinates ``dim_indices`` (one per dimension:
        ints, or equally shaped integer tensors for many points at once): ``[i, j] -> [j, i]``
        for CSC, ``[i // bh, j // bw, i % bh, j % bw]`` for BSR, ``[j - i, i]`` for DIA.
        With ``as_size=True`` the arguments are the dimension sizes and the level sizes are
        returned (``m + n - 1`` diagonals; ``ceil(m / bh)`` blocks, where UST requires exact
        division)."""
        values = self._per_dimension(dim_indices, "dim2lvl", "dimension")
        if as_size:
            return self.level_sizes([int(v) for v in values])
        coords, plain = _as_tensors(values)
        named = {d.name: c for d, c in zip(self.dims, coords)}
        out = [lv.expr.evaluate(named) for lv in self.levels]
        return [int(x) for x in out] if plain else out

    def lvl2dim(self, lvl_indices: Sequence) -> list:
        """Dimension coordinates of the level coordinates ``lvl_indices`` (one per level; the
        inverse of :meth:`dim2lvl`): ``[j, i] -> [i, j]`` for CSC, block and offset back to
        ``i = ib * bh + io``, a diagonal and its range level back to the row and column."""
        if not isinstance(lvl_indices, Sequence) or isinstance(lvl_indices, (str, bytes)) or \
                len(lvl_indices) != len(self.levels):
            raise FormatError(f"lvl2dim takes one coordinate per level ({len(self.levels)} for {self}), "
                              f"got {lvl_indices!r}")
        L, plain = _as_tensors(list(lvl_indices))
        out = []
        for r in self._recovery:
            if r.kind == "plain":
                out.append(L[r.a])
            elif r.kind == "block":
                out.append(L[r.a] * r.c + L[r.b])
            elif r.kind == "sub_left":
                out.append(L[r.a] + L[r.b])
            elif r.kind == "sub_right":
                out.append(L[r.b] - L[r.a])
            else:  # "add"
                out.append(L[r.a] - L[r.b])
        return [int(x) for x in out] if plain else out

    def _per_dimension(self, values: Sequence, what: str, unit: str) -> list:
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or len(values) != len(self.dims):
            raise FormatError(f"{what} takes one coordinate per {unit} ({len(self.dims)} for {self}), got {values!r}")
        return list(values)

    def level_extents(self, shape: Sequence[int]) -> list[tuple[int, int]]:
        """The ``[low, high)`` range of each level's coordinate for a tensor of ``shape``."""
        if len(shape) != self.ndim:
            raise FormatError(f"format {self} has {self.ndim} dimensions, shape {tuple(shape)} has {len(shape)}")
        sizes = {d.name: int(n) for d, n in zip(self.dims, shape)}
        return [lv.expr.extent(sizes) for lv in self.levels]

    def level_sizes(self, shape: Sequence[int]) -> list[int]:
        return [hi - lo for lo, hi in self.level_extents(shape)]

    def replace(self, *, index_dtype: torch.dtype | None | str = "keep", name: str | None | str = "keep") -> "TensorFormat":
        """A copy with another index-dtype preference or name (same layout)."""
        return TensorFormat(
            self.dims,
            [(lv.expr, lv.type) for lv in self.levels],
            index_dtype=self.index_dtype if index_dtype == "keep" else index_dtype,
            name=self.name if name == "keep" else name,
        )

    def with_dims(self, dims: Sequence[Dimension]) -> "TensorFormat":
        """The same layout written with other dimension objects (matched by position)."""
        if len(dims) != self.ndim:
            raise FormatError(f"expected {self.ndim} dimensions, got {len(dims)}")
        ren = {old.name: new for old, new in zip(self.dims, dims)}
        return TensorFormat(dims, [(_rename(lv.expr, ren), lv.type) for lv in self.levels],
                            index_dtype=self.index_dtype, name=self.name)

    # Text --------------------------------------------------------------------------------------
    def __str__(self) -> str:
        d = ", ".join(x.name for x in self.dims)
        lv = ", ".join(str(x) for x in self.levels)
        return f"({d}) -> ({lv})"

    def __repr__(self) -> str:
        extra = ""
        if self.name:
            extra += f", name={self.name!r}"
        if self.index_dtype is not None:
            extra += f", index_dtype={self.index_dtype}"
        return f"TensorFormat({str(self)!r}{extra})"

    @classmethod
    def parse(cls, text: str, *, index_dtype: torch.dtype | str | None = None, name: str | None = None) -> "TensorFormat":
        """Parse the string form, e.g. ``"(i, j) -> (j : dense, i : compressed)"``, or a named format's name
        (``"CSR"``, ``"BSR(2, 2)"``, ``"DELTA(4)"``: :func:`~sparsetorch.format.named.format_named`)."""
        from .parser import parse_format

        if isinstance(text, str) and "->" not in text:
            from .named import format_named

            fmt = format_named(text)
            if fmt is not None:
                return fmt if index_dtype is None and name is None else parse_format(
                    str(fmt), index_dtype=index_dtype, name=name or fmt.name)
            word = text.strip().split("(")[0]
            if word and word.replace("_", "").isalnum():  # a name, not a DSL string: say which names exist
                import difflib

                from ..errors import FormatError
                known = ["COO", "CSR", "CSC", "DCSR", "DCSC", "DIA", "DIA_J", "ELL", "DENSE", "DENSE_COL", "BSR(r, c)",
                         "BSC(r, c)", "DELTA(bits)", "NM(n, m)", "COO(ndim)", "DENSE(ndim)"]
                close = difflib.get_close_matches(word.upper(), [k.split("(")[0] for k in known], n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise FormatError(f"unknown format name {text.strip()!r}{hint} Named formats: {', '.join(known)}; or a "
                                  f"DSL string such as '(i, j) -> (i : dense, j : compressed)'")

        return parse_format(text, index_dtype=index_dtype, name=name)


def _as_tensors(values: list) -> tuple[list[torch.Tensor], bool]:
    """The coordinates as int64 tensors, and whether they were all Python ints."""
    plain = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if plain:
        return [torch.tensor(v, dtype=torch.int64) for v in values], True
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
                raise FormatError(f"coordinates must be integers, got a {v.dtype} tensor")
            out.append(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            out.append(torch.tensor(v, dtype=torch.int64))
        else:
            raise FormatError(f"coordinates must be ints or integer tensors, got {type(v).__name__}")
    return out, False


def _rebuild(text: str, index_dtype: str | None, name: str | None) -> TensorFormat:
    return TensorFormat.parse(text, index_dtype=index_dtype, name=name)


def _rename(expr: LevelExpr, ren: Mapping[str, Dimension]) -> LevelExpr:
    if isinstance(expr, Dimension):
        return ren[expr.name]
    if isinstance(expr, (FloorDiv, Mod)):
        return type(expr)(ren[expr.dim.name], expr.c)
    return type(expr)(ren[expr.a.name], ren[expr.b.name])


def _validate(dims: tuple[Dimension, ...], levels: tuple[Level, ...]) -> tuple[Recovery, ...]:
    """Check the layout rules and return, per dimension, how it is recovered from the levels."""
    if not levels:
        raise FormatError("a format needs at least one level")
    declared = {d.name for d in dims}
    where = lambda k: f"level {k} ({levels[k]})"  # noqa: E731
    for k, lv in enumerate(levels):
        for d in lv.expr.dims:
            if d.name not in declared:
                raise FormatError(f"{where(k)} uses dimension {d.name!r}, which is not declared in {sorted(declared)}")
        if isinstance(lv.expr, (Add, Sub)) and lv.expr.a == lv.expr.b:
            raise FormatError(f"{where(k)}: a diagonal expression needs two different dimensions")

    seen_non_batch = False
    for k, lv in enumerate(levels):
        f = lv.format
        if f is LevelFormat.BATCH:
            if seen_non_batch:
                raise FormatError(f"{where(k)}: BATCH levels must come first")
            if not isinstance(lv.expr, Dimension):
                raise FormatError(f"{where(k)}: a BATCH level is indexed by a plain dimension")
        else:
            seen_non_batch = True
        if isinstance(lv.expr, (Add, Sub)) and f not in (LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED):
            raise FormatError(f"{where(k)}: a diagonal level ({lv.expr}) must be compressed, e.g. 'j - i : compressed'")
        if f is LevelFormat.RANGE and not isinstance(lv.expr, Dimension):
            raise FormatError(f"{where(k)}: a RANGE level is indexed by a plain dimension")
        if f is LevelFormat.SINGLETON:
            prev = levels[k - 1].type if k else None
            if prev is None or not (prev.format is LevelFormat.SINGLETON or not prev.unique):
                raise FormatError(
                    f"{where(k)}: a SINGLETON level must follow a nonunique compressed level or another "
                    f"singleton, as in COO '(i, j) -> (i : compressed(nonunique), j : singleton)'"
                )
        if f in (LevelFormat.DELTA, LevelFormat.STRUCTURED) and k != len(levels) - 1:
            raise FormatError(f"{where(k)}: a {f.name} level must be the last level")
        if f is LevelFormat.STRUCTURED:
            if not isinstance(lv.expr, Mod):
                raise FormatError(f"{where(k)}: a STRUCTURED(n) level is indexed by 'j % m' (the strip offset)")
            if lv.type.parameter > lv.expr.c:
                raise FormatError(f"{where(k)}: STRUCTURED(n) with n={lv.type.parameter} > m={lv.expr.c}")
        if f is LevelFormat.DELTA and not isinstance(lv.expr, Dimension):
            raise FormatError(f"{where(k)}: a DELTA level is indexed by a plain dimension")
    if levels[0].format is LevelFormat.BATCH and all(lv.format is LevelFormat.BATCH for lv in levels):
        raise FormatError("a format cannot consist of BATCH levels only")

    # Pairing of blocks and diagonals, and the recovery of each dimension.
    index = {d.name: n for n, d in enumerate(dims)}
    recovery: dict[int, Recovery] = {}

    def claim(dim: Dimension, rec: Recovery, k: int) -> None:
        n = index[dim.name]
        if n in recovery:
            raise FormatError(f"dimension {dim.name!r} is mapped twice (again by {where(k)}); each dimension maps once")
        recovery[n] = rec

    for k, lv in enumerate(levels):
        e = lv.expr
        if isinstance(e, FloorDiv):
            partners = [m for m, o in enumerate(levels) if isinstance(o.expr, Mod) and o.expr.dim == e.dim]
            if len(partners) != 1 or levels[partners[0]].expr.c != e.c:
                raise FormatError(f"{where(k)}: '{e}' must be paired with exactly one '{e.dim} % {e.c}' level")
            m = partners[0]
            if m < k:
                raise FormatError(f"{where(k)}: '{e}' must come before its '{e.dim} % {e.c}' level")
            claim(e.dim, Recovery("block", k, m, e.c), k)
        elif isinstance(e, Mod):
            partners = [m for m, o in enumerate(levels) if isinstance(o.expr, FloorDiv) and o.expr.dim == e.dim]
            if len(partners) != 1 or levels[partners[0]].expr.c != e.c:
                raise FormatError(f"{where(k)}: '{e}' must be paired with exactly one '{e.dim} // {e.c}' level")
        elif isinstance(e, (Add, Sub)):
            ranges = [m for m, o in enumerate(levels)
                      if m > k and o.format is LevelFormat.RANGE and o.expr in (e.a, e.b)]
            if len(ranges) != 1:
                raise FormatError(
                    f"{where(k)}: '{e}' needs exactly one later RANGE level on {e.a} or {e.b}, "
                    f"e.g. '(i, j) -> ({e} : compressed, {e.b} : range)'"
                )
            m = ranges[0]
            r = levels[m].expr
            if isinstance(e, Sub):
                target, kind = (e.a, "sub_left") if r == e.b else (e.b, "sub_right")
            else:
                target, kind = (e.b if r == e.a else e.a), "add"
            claim(target, Recovery(kind, k, m), k)
        elif lv.format is LevelFormat.RANGE:
            diag = [m for m, o in enumerate(levels) if m < k and isinstance(o.expr, (Add, Sub)) and e in o.expr.dims]
            if not diag:
                raise FormatError(f"{where(k)}: a RANGE level needs an earlier diagonal level ('j - i' or 'i + j') using {e}")
            claim(e, Recovery("plain", k), k)
        else:
            claim(e, Recovery("plain", k), k)
    missing = [d.name for n, d in enumerate(dims) if n not in recovery]
    if missing:
        raise FormatError(f"dimension(s) {missing} are not mapped to any level; every dimension must be stored")
    return tuple(recovery[n] for n in range(len(dims)))
