"""Dimensions and level expressions of the format DSL.

A *dimension* is a logical index of the tensor (``i``, ``j``). A *level expression* says which
value a storage level is indexed by: a plain dimension ``i``, a block index ``i // c`` (always
paired with ``i % c``), or a diagonal index ``j - i`` / ``i + j`` (paired with a RANGE level
that recovers one of the two dimensions). Expressions do not nest.

Python operators build them: ``i // 2``, ``i % 2``, ``j - i``, ``i + j``.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Union

from ..errors import FormatError

if TYPE_CHECKING:
    import torch

__all__ = ["Dimension", "LevelExpr", "FloorDiv", "Mod", "Add", "Sub"]


class _ExprOps:
    """Operators shared by dimensions: they build level expressions."""

    def __floordiv__(self, c: int) -> "FloorDiv":
        return FloorDiv(_as_dim(self, "//"), _as_const(c, "//"))

    def __truediv__(self, c: int) -> "FloorDiv":
        # The UST documentation writes block indices with "/": accept it as floor division.
        return self.__floordiv__(c)

    def __mod__(self, c: int) -> "Mod":
        return Mod(_as_dim(self, "%"), _as_const(c, "%"))

    def __add__(self, other: "Dimension") -> "Add":
        return Add(_as_dim(self, "+"), _as_dim(other, "+"))

    def __sub__(self, other: "Dimension") -> "Sub":
        return Sub(_as_dim(self, "-"), _as_dim(other, "-"))


class Dimension(_ExprOps):
    """A named logical dimension, e.g. ``i, j = Dimension("i"), Dimension("j")``.

    ``Dimension(dimension_name="i")`` (the UST spelling) is accepted too. Two dimensions with the
    same name are equal.
    """

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str | None = None, *, dimension_name: str | None = None) -> None:
        if name is None:
            name = dimension_name
        elif dimension_name is not None and dimension_name != name:
            raise FormatError(f"Dimension got two names, {name!r} and {dimension_name!r}; give one")
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise FormatError(
                f"Dimension name must be a Python identifier such as 'i' or 'row', got {name!r}"
            )
        object.__setattr__(self, "name", name)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Dimension is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dimension) and other.name == self.name

    def __reduce__(self):
        return (Dimension, (self.name,))

    def __hash__(self) -> int:
        return hash(("Dimension", self.name))

    def __repr__(self) -> str:
        return f"Dimension({self.name!r})"

    def __str__(self) -> str:
        return self.name

    # Level-expression protocol -------------------------------------------------------------
    @property
    def dims(self) -> tuple["Dimension", ...]:
        return (self,)

    def evaluate(self, coords: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
        return coords[self.name]

    def extent(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        """Half-open range ``[low, high)`` of the values this expression takes."""
        return 0, sizes[self.name]

    def canonical(self, index: Mapping[str, int]) -> tuple:
        return ("dim", index[self.name])


class _NoNesting:
    """Operators on a compound expression: expressions do not nest, say so clearly."""

    def _nest(self, op: str, *_: object):
        raise FormatError(f"level expressions do not nest: cannot apply {op!r} to '{self}'")

    def __floordiv__(self, other):
        return self._nest("//")

    __truediv__ = __floordiv__

    def __mod__(self, other):
        return self._nest("%")

    def __add__(self, other):
        return self._nest("+")

    def __sub__(self, other):
        return self._nest("-")


@dataclass(frozen=True)
class FloorDiv(_NoNesting):
    """Block index ``dim // c``; must be paired with ``dim % c`` in the same format."""

    dim: Dimension
    c: int

    @property
    def dims(self) -> tuple[Dimension, ...]:
        return (self.dim,)

    def evaluate(self, coords: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
        return coords[self.dim.name].div(self.c, rounding_mode="floor")

    def extent(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return 0, -(-sizes[self.dim.name] // self.c)

    def canonical(self, index: Mapping[str, int]) -> tuple:
        return ("floordiv", index[self.dim.name], self.c)

    def __str__(self) -> str:
        return f"{self.dim} // {self.c}"


@dataclass(frozen=True)
class Mod(_NoNesting):
    """Offset inside a block, ``dim % c``; paired with ``dim // c``, or the strip of an N:M level."""

    dim: Dimension
    c: int

    @property
    def dims(self) -> tuple[Dimension, ...]:
        return (self.dim,)

    def evaluate(self, coords: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
        return coords[self.dim.name].remainder(self.c)

    def extent(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return 0, self.c

    def canonical(self, index: Mapping[str, int]) -> tuple:
        return ("mod", index[self.dim.name], self.c)

    def __str__(self) -> str:
        return f"{self.dim} % {self.c}"


@dataclass(frozen=True)
class Add(_NoNesting):
    """Anti-diagonal index ``a + b``; one of ``a``, ``b`` must be recovered by a later RANGE level."""

    a: Dimension
    b: Dimension

    @property
    def dims(self) -> tuple[Dimension, ...]:
        return (self.a, self.b)

    def evaluate(self, coords: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
        return coords[self.a.name] + coords[self.b.name]

    def extent(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return 0, sizes[self.a.name] + sizes[self.b.name] - 1

    def canonical(self, index: Mapping[str, int]) -> tuple:
        return ("add", index[self.a.name], index[self.b.name])

    def __str__(self) -> str:
        return f"{self.a} + {self.b}"


@dataclass(frozen=True)
class Sub(_NoNesting):
    """Diagonal offset ``a - b`` (``j - i`` is the DIA offset); paired with a later RANGE level."""

    a: Dimension
    b: Dimension

    @property
    def dims(self) -> tuple[Dimension, ...]:
        return (self.a, self.b)

    def evaluate(self, coords: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
        return coords[self.a.name] - coords[self.b.name]

    def extent(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        return -(sizes[self.b.name] - 1), sizes[self.a.name]

    def canonical(self, index: Mapping[str, int]) -> tuple:
        return ("sub", index[self.a.name], index[self.b.name])

    def __str__(self) -> str:
        return f"{self.a} - {self.b}"


LevelExpr = Union[Dimension, FloorDiv, Mod, Add, Sub]


def _as_dim(x: object, op: str) -> Dimension:
    if not isinstance(x, Dimension):
        raise FormatError(
            f"operator {op!r} applies to plain dimensions only (expressions do not nest), got {x}"
        )
    return x


def _as_const(c: object, op: str) -> int:
    if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
        raise FormatError(f"the constant of {op!r} must be a positive int, got {c!r}")
    return c
