"""`SparseTensorList`: a batch of sparse tensors whose patterns (and sizes) differ."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence, overload

import torch

from ..errors import ValidationError
from ..format import TensorFormat
from .sparse_tensor import SparseTensor

__all__ = ["SparseTensorList", "rebuild_sparse_tensor_list"]


class SparseTensorList(Sequence[SparseTensor]):
    """An ordered batch of :class:`SparseTensor` with one dtype, one device and one order
    (number of dimensions), but patterns, sizes and formats of their own.

    Use it where a batched ``SparseTensor`` (one shared pattern, values with a leading batch
    dimension) does not fit: meshes of different sizes, graphs of different topologies.
    Operations map over the members; solvers that support non-uniform batches take it whole.
    """

    __slots__ = ("_items",)

    def __init__(self, tensors: Iterable[SparseTensor]) -> None:
        items = tuple(tensors)
        for k, t in enumerate(items):
            if not isinstance(t, SparseTensor):
                raise ValidationError(f"SparseTensorList item {k} is a {type(t).__name__}, not a SparseTensor")
        if items:
            first = items[0]
            for k, t in enumerate(items[1:], 1):
                if t.dtype != first.dtype:
                    raise ValidationError(f"item {k} has dtype {t.dtype}, item 0 has {first.dtype}; convert them to one dtype")
                if t.device != first.device:
                    raise ValidationError(f"item {k} is on {t.device}, item 0 on {first.device}; move them to one device")
                if t.ndim != first.ndim:
                    raise ValidationError(f"item {k} has {t.ndim} dims, item 0 has {first.ndim}; all items need the same order")
        self._items = items

    # Construction -----------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, dense: Iterable[torch.Tensor], format: TensorFormat | str | None = None, **kw: Any) -> "SparseTensorList":
        return cls(SparseTensor.from_dense(d, format, **kw) for d in dense)

    @classmethod
    def from_batched(cls, t: SparseTensor) -> "SparseTensorList":
        """Split a tensor's shared-pattern value batch (first batch dim) into a list."""
        if not t.batch_shape:
            raise ValidationError(f"tensor of shape {tuple(t.shape)} has no value batch to split; wrap it as SparseTensorList([t])")
        return cls(t.with_values(v) for v in t.values.unbind(0))

    def __reduce__(self):
        """Pickled as its members (each a validated :class:`SparseTensor` rebuild), so that
        ``torch.load(weights_only=True)`` loads it too."""
        return (rebuild_sparse_tensor_list, (list(self._items),))

    # Sequence -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> SparseTensor: ...
    @overload
    def __getitem__(self, index: slice) -> "SparseTensorList": ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SparseTensorList(self._items[index])
        return self._items[index]

    def __iter__(self) -> Iterator[SparseTensor]:
        return iter(self._items)

    # Facts --------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype | None:
        return self._items[0].dtype if self._items else None

    @property
    def device(self) -> torch.device | None:
        return self._items[0].device if self._items else None

    @property
    def shapes(self) -> list[torch.Size]:
        return [t.shape for t in self._items]

    @property
    def is_uniform(self) -> bool:
        """True when every member has the same shape and pattern (a batched tensor would do)."""
        keys = {t.pattern_key for t in self._items}
        return len(keys) <= 1

    # Mapped operations ------------------------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> "SparseTensorList":
        return SparseTensorList(t.to(*args, **kwargs) for t in self._items)

    def convert(self, tensor_format: TensorFormat | str | None = None, **kw: Any) -> "SparseTensorList":
        return SparseTensorList(t.convert(tensor_format, **kw) for t in self._items)

    def to_dense(self) -> list[torch.Tensor]:
        return [t.to_dense() for t in self._items]

    def with_values(self, values: Sequence[torch.Tensor]) -> "SparseTensorList":
        if len(values) != len(self._items):
            raise ValidationError(f"got {len(values)} value tensors for {len(self._items)} items")
        return SparseTensorList(t.with_values(v) for t, v in zip(self._items, values))

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(s)) for s in self.shapes[:6]) + (", ..." if len(self) > 6 else "")
        return f"SparseTensorList(len={len(self)}, shapes=[{shapes}], dtype={self.dtype}, device={self.device})"


def rebuild_sparse_tensor_list(items: list) -> SparseTensorList:
    """Unpickling of a :class:`SparseTensorList` (a safe global of ``torch.load``)."""
    if not isinstance(items, (list, tuple)):
        raise ValidationError(f"a pickled SparseTensorList stores a list of SparseTensors, got {type(items).__name__}")
    return SparseTensorList(items)


torch.serialization.add_safe_globals([rebuild_sparse_tensor_list])
