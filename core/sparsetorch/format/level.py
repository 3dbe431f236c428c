"""Level formats, level properties and the level type that combines them.

=================  ===============  =================================================================
level format       buffers          meaning of one level
=================  ===============  =================================================================
DENSE              none             every coordinate of the level is stored (``p * size + c``)
BATCH              none             a leading dense level whose sub-buffers carry a batch dimension
                                    (the layout of torch's batched CSR)
COMPRESSED         pos, crd         segment ``[pos[p], pos[p+1])`` lists the stored coordinates
LOOSE_COMPRESSED   pos (2 per p),   segment ``[pos[2p], pos[2p+1])``; room between segments is
                   crd              padding (ELL: fixed width per row)
SINGLETON          crd              exactly one coordinate per parent position (COO's trailing levels)
RANGE              none             a dense level whose bounds come from an earlier diagonal level
DELTA(bits)        pos, crd         ``crd`` holds gaps to the previous stored coordinate; a gap wider
                                    than ``2**bits - 1`` is bridged by explicit zeros (MACKO)
STRUCTURED(n)      crd              exactly ``n`` entries in each strip of ``m`` (the ``j % m`` level):
                                    N:M structured sparsity
=================  ===============  =================================================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Union

from ..errors import FormatError

__all__ = ["LevelFormat", "LevelProperty", "LevelType", "LevelSpec", "as_level_type"]


class LevelFormat(enum.Enum):
    """How one level of a format stores its coordinates (docs/format-dsl.md): ``dense`` (every index),
    ``batch``, ``compressed`` (positions + coordinates, CSR's column level), ``loose_compressed``,
    ``singleton`` (one coordinate per parent entry, COO's second level), ``range`` (a contiguous span,
    DIA), ``delta`` (bit-packed gaps) and ``structured`` (N:M)."""
    DENSE = "dense"
    BATCH = "batch"
    COMPRESSED = "compressed"
    LOOSE_COMPRESSED = "loose_compressed"
    SINGLETON = "singleton"
    RANGE = "range"
    DELTA = "delta"
    STRUCTURED = "structured"

    @property
    def takes_parameter(self) -> bool:
        return self in (LevelFormat.DELTA, LevelFormat.STRUCTURED)

    @property
    def has_pos(self) -> bool:
        return self in (LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED, LevelFormat.DELTA)

    @property
    def has_crd(self) -> bool:
        return self in (
            LevelFormat.COMPRESSED,
            LevelFormat.LOOSE_COMPRESSED,
            LevelFormat.DELTA,
            LevelFormat.SINGLETON,
            LevelFormat.STRUCTURED,
        )

    @property
    def is_dense_like(self) -> bool:
        """Levels that store every coordinate and need no buffer."""
        return self in (LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.RANGE)


class LevelProperty(enum.Enum):
    """Properties a level may declare: ``unique`` / ``nonunique`` (repeated coordinates allowed, COO's
    first level) and ``ordered`` / ``unordered`` (coordinates sorted within a parent)."""
    UNIQUE = "unique"
    NONUNIQUE = "nonunique"
    ORDERED = "ordered"
    UNORDERED = "unordered"


@dataclass(frozen=True)
class LevelType:
    """A level format with its parameter (bits for DELTA, n for STRUCTURED) and properties."""

    format: LevelFormat
    parameter: int | None = None
    unique: bool = True
    ordered: bool = True

    def __post_init__(self) -> None:
        f = self.format
        if not isinstance(f, LevelFormat):
            raise FormatError(f"level format must be a LevelFormat, got {f!r}")
        if f.takes_parameter:
            p = self.parameter
            if isinstance(p, bool) or not isinstance(p, int):
                raise FormatError(
                    f"{f.name} needs an int parameter, e.g. (LevelFormat.{f.name}, 4); "
                    f"got {p!r}"
                )
            if f is LevelFormat.DELTA and not 1 <= p <= 31:
                raise FormatError(f"DELTA bits must be in 1..31, got {p}")
            if f is LevelFormat.STRUCTURED and p < 1:
                raise FormatError(f"STRUCTURED(n) needs n >= 1, got {p}")
        elif self.parameter is not None:
            raise FormatError(f"{f.name} takes no parameter, got {self.parameter!r}")
        if f.is_dense_like and not (self.unique and self.ordered):
            raise FormatError(f"a {f.name} level is always unique and ordered")
        if f in (LevelFormat.DELTA, LevelFormat.STRUCTURED) and not (self.unique and self.ordered):
            raise FormatError(f"a {f.name} level must be unique and ordered")

    def __str__(self) -> str:
        args: list[str] = []
        if self.parameter is not None:
            args.append(str(self.parameter))
        if not self.unique:
            args.append("nonunique")
        if not self.ordered:
            args.append("unordered")
        return self.format.value + (f"({', '.join(args)})" if args else "")


LevelSpec = Union[LevelType, LevelFormat, tuple]


def as_level_type(spec: LevelSpec) -> LevelType:
    """Normalise the accepted spellings of a level type.

    ``LevelFormat.DENSE``; ``(LevelFormat.DELTA, 2)``; ``(LevelFormat.COMPRESSED,
    LevelProperty.NONUNIQUE)``; ``(LevelFormat.STRUCTURED, 2, LevelProperty.ORDERED)``; or a
    :class:`LevelType`.
    """
    if isinstance(spec, LevelType):
        return spec
    if isinstance(spec, LevelFormat):
        return LevelType(spec)
    if isinstance(spec, tuple) and spec and isinstance(spec[0], LevelFormat):
        parameter = None
        props: list[LevelProperty] = []
        for item in spec[1:]:
            if isinstance(item, LevelProperty):
                props.append(item)
            elif isinstance(item, int) and not isinstance(item, bool) and parameter is None:
                parameter = item
            else:
                raise FormatError(
                    f"level spec {spec!r}: expected an int parameter or LevelProperty values, got {item!r}"
                )
        where = spec[0].value + "(" + ", ".join(p.value for p in props) + ")"
        return LevelType(spec[0], parameter, *_resolve_properties(props, where))
    raise FormatError(
        f"level spec must be a LevelFormat, a tuple (LevelFormat, [param], *LevelProperty) or a "
        f"LevelType, got {spec!r}"
    )


def _resolve_properties(props: Iterable[LevelProperty], where: object) -> tuple[bool, bool]:
    props = list(props)
    if LevelProperty.UNIQUE in props and LevelProperty.NONUNIQUE in props:
        raise FormatError(f"{where}: a level cannot be both unique and nonunique")
    if LevelProperty.ORDERED in props and LevelProperty.UNORDERED in props:
        raise FormatError(f"{where}: a level cannot be both ordered and unordered")
    return LevelProperty.NONUNIQUE not in props, LevelProperty.UNORDERED not in props
