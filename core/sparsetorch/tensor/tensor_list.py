"""`SparseTensorList`: a batch of sparse tensors whose patterns (and sizes) differ."""

from __future__ import annotations

import numbers
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
    torch-sla's methods (``L.solve(bs)``, ``L @ xs``, ``det``, ``slogdet``, ``logdet``, ``eigsh``,
    ``norm``) are bound by ``sparsetorch.ops.methods``; arithmetic (``L * s``, ``L1 + L2`` member by
    member), ``T`` and the block-diagonal round trip are here (docs/lists.md).
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

    @property
    def T(self) -> "SparseTensorList":
        """Every member transposed (views on the members' buffers, as :attr:`SparseTensor.T`)."""
        return SparseTensorList(t.T for t in self._items)

    # Arithmetic -------------------------------------------------------------------------------
    # A number (or a 0-d tensor) scales every member; two lists of one length add member by member
    # (``L1 + L2`` is not concatenation, as it would be for a tuple: write SparseTensorList([*L1, *L2])).
    def __neg__(self) -> "SparseTensorList":
        return SparseTensorList(-t for t in self._items)

    def __mul__(self, other: Any) -> "SparseTensorList":
        if not _is_scalar(other):
            return NotImplemented
        return SparseTensorList(t * other for t in self._items)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> "SparseTensorList":
        if not _is_scalar(other):
            return NotImplemented
        return SparseTensorList(t / other for t in self._items)

    def __add__(self, other: Any) -> "SparseTensorList":
        return self._memberwise(other, "+")

    def __sub__(self, other: Any) -> "SparseTensorList":
        return self._memberwise(other, "-")

    def _memberwise(self, other: Any, op: str) -> "SparseTensorList":
        if not isinstance(other, SparseTensorList):
            return NotImplemented
        if len(other) != len(self):
            raise ValidationError(f"L1 {op} L2 adds member by member: the lists have {len(self)} and {len(other)} members "
                                  f"(to concatenate write SparseTensorList([*L1, *L2]))")
        out = []
        for i, (a, b) in enumerate(zip(self._items, other._items)):
            try:
                out.append(a + b if op == "+" else a - b)
            except ValidationError as exc:
                raise ValidationError(f"L1 {op} L2, member {i} of {len(self)}: {exc}") from None
        return SparseTensorList(out)

    # Block diagonal ---------------------------------------------------------------------------
    def to_block_diagonal(self, format: TensorFormat | str | None = "CSR") -> SparseTensor:
        """One matrix with the members (matrices) on its diagonal, in order: shape
        ``(sum m_i, sum n_i)``, ``format`` CSR unless told (None: the triplets as assembled, COO).
        Differentiable in the members' values (a shared value batch is kept: every member must have
        the same one). :meth:`from_block_diagonal` splits it again."""
        if not self._items:
            raise ValidationError("to_block_diagonal of an empty SparseTensorList: there is no dtype or device to build on")
        batch = tuple(self._items[0].batch_shape)
        for i, t in enumerate(self._items):
            if len(t.format_shape) != 2 or t.format.num_batch_levels:
                raise ValidationError(f"to_block_diagonal needs matrices; member {i} has format shape {tuple(t.format_shape)} "
                                      f"({t.format})")
            if tuple(t.batch_shape) != batch:
                raise ValidationError(f"to_block_diagonal: member {i} has value batch {tuple(t.batch_shape)}, member 0 has "
                                      f"{batch}; the members need one value batch")
        coords, values = [], []
        r0 = c0 = 0
        for t in self._items:
            idx, vals = t.coordinates()
            off = torch.tensor([[r0], [c0]], dtype=idx.dtype, device=idx.device)
            coords.append(idx + off)
            values.append(vals)
            r0, c0 = r0 + t.format_shape[0], c0 + t.format_shape[1]
        from .construct import from_coo  # noqa: PLC0415 - construct imports sparse_tensor

        return from_coo(torch.cat(values, -1), [torch.cat(coords, -1)], shape=(r0, c0), format=format,
                        index_dtype=None, check=False)

    @classmethod
    def from_block_diagonal(cls, A: SparseTensor, sizes: Sequence[int] | Sequence[tuple[int, int]],
                            format: TensorFormat | str | None = "CSR") -> "SparseTensorList":
        """The diagonal blocks of a block-diagonal matrix ``A`` as a list: ``sizes`` the blocks' orders
        (square blocks) or their ``(m_i, n_i)``, in order, summing to A's shape. A stored entry outside
        the blocks raises (it would be dropped). Differentiable in A's values; each member in ``format``
        (CSR unless told)."""
        if not isinstance(A, SparseTensor):
            raise ValidationError(f"from_block_diagonal takes a SparseTensor, got {type(A).__name__}")
        if len(A.format_shape) != 2 or A.format.num_batch_levels:
            raise ValidationError(f"from_block_diagonal needs a matrix, got format shape {tuple(A.format_shape)} ({A.format})")
        dims = []
        for s in sizes:
            pair = (s, s) if isinstance(s, int) else tuple(s)
            if len(pair) != 2 or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in pair):
                raise ValidationError(f"from_block_diagonal: sizes must be block orders n_i or pairs (m_i, n_i) of "
                                      f"non-negative ints, got {s!r}")
            dims.append(pair)
        m, n = A.format_shape
        total = (sum(d[0] for d in dims), sum(d[1] for d in dims))
        if total != (m, n):
            raise ValidationError(f"from_block_diagonal: blocks {[tuple(d) for d in dims]} make a {total[0]}x{total[1]} "
                                  f"matrix, A is {m}x{n}")
        idx, vals = A.coordinates()
        rows, cols = idx[0], idx[1]
        dev = rows.device
        r_ends = torch.tensor([d[0] for d in dims], dtype=torch.int64, device=dev).cumsum(0)
        c_ends = torch.tensor([d[1] for d in dims], dtype=torch.int64, device=dev).cumsum(0)
        rb = torch.searchsorted(r_ends, rows, right=True)
        cb = torch.searchsorted(c_ends, cols, right=True)
        outside = rb != cb
        # formats that store zeros (DIA's bands, DENSE) hold entries outside the blocks whose values are 0: not an error
        nonzero = vals.detach().reshape(-1, vals.shape[-1]).ne(0).any(0) if vals.numel() else outside
        bad = outside & nonzero
        if bool(bad.any()):
            at = int(torch.nonzero(bad)[0, 0])
            raise ValidationError(f"from_block_diagonal: A stores {int(bad.sum())} nonzero entries outside the diagonal "
                                  f"blocks {[tuple(d) for d in dims]}, the first at ({int(rows[at])}, {int(cols[at])})")
        from .construct import from_coo  # noqa: PLC0415 - construct imports sparse_tensor

        out = []
        r0 = c0 = 0
        for b, (mb, nb) in enumerate(dims):
            sel = torch.nonzero((rb == b) & ~outside).flatten()
            coords = torch.stack([rows.index_select(0, sel) - r0, cols.index_select(0, sel) - c0])
            out.append(from_coo(vals.index_select(-1, sel), [coords], shape=(mb, nb), format=format,
                                index_dtype=A.index_dtype, check=False))
            r0, c0 = r0 + mb, c0 + nb
        return cls(out)

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(s)) for s in self.shapes[:6]) + (", ..." if len(self) > 6 else "")
        return f"SparseTensorList(len={len(self)}, shapes=[{shapes}], dtype={self.dtype}, device={self.device})"


def _is_scalar(x: Any) -> bool:
    """A number or a 0-d tensor (what scales every member)."""
    if isinstance(x, bool):
        return False
    if isinstance(x, numbers.Number):
        return True
    return isinstance(x, torch.Tensor) and x.dim() == 0


def rebuild_sparse_tensor_list(items: list) -> SparseTensorList:
    """Unpickling of a :class:`SparseTensorList` (a safe global of ``torch.load``)."""
    if not isinstance(items, (list, tuple)):
        raise ValidationError(f"a pickled SparseTensorList stores a list of SparseTensors, got {type(items).__name__}")
    return SparseTensorList(items)


torch.serialization.add_safe_globals([rebuild_sparse_tensor_list])
