"""``SparseTensor``'s element access and in-place value updates, with nvmath-python UST's meaning:

- ``get_value(indices)``: the stored value at one logical coordinate, or ``None`` where nothing
  is stored (UST: "not random access, searches compressed levels"; here a binary search in a
  sorted index of the pattern, built once per pattern and cached);
- ``copy_(src)``: copy a compatible tensor's values into this one, in place (same format,
  shape, index dtype, dtype and sparsity pattern; anything else raises and changes nothing);
- ``set_kernel(fn, with_indices=True)`` / ``run_kernel()``: a user transformation applied to
  every stored element, in place (UST compiles a scalar function into a CUDA traversal kernel
  for the tensor's format; here ``fn`` is called once on tensors of all stored values and their
  coordinates, on any device).

A mixin of :class:`~sparsetorch.SparseTensor` (kept apart so each file reads in one sitting).
"""

from __future__ import annotations

import contextlib
import math
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import InputError

if TYPE_CHECKING:
    from .sparse_tensor import SparseTensor

__all__ = ["AccessMethods"]


def _name(t: "SparseTensor") -> str:
    return t.format.name or str(t.format)


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


class AccessMethods:
    """Element access and in-place value updates of a SparseTensor (see the module docstring),
    and UST's metadata names (``num_dimensions``, ``num_levels``, ``levels``, ``index_type``,
    ``device_id``) and ``from_file``."""

    __slots__ = ()

    # UST's metadata names -----------------------------------------------------------------------
    @property
    def num_dimensions(self: "SparseTensor") -> int:  # type: ignore[misc]
        """The number of dimensions of :attr:`shape` (UST's ``num_dimensions``; value batch included)."""
        return self.ndim

    @property
    def num_levels(self: "SparseTensor") -> int:  # type: ignore[misc]
        """The number of storage levels of the format (UST's ``num_levels``)."""
        return len(self.format.levels)

    @property
    def levels(self: "SparseTensor") -> list[int]:  # type: ignore[misc]
        """The extent of each storage level (UST's ``levels``: ``format.dim2lvl(shape, as_size=True)``)."""
        return list(self.format.level_sizes(self.format_shape))

    @property
    def index_type(self: "SparseTensor") -> str:  # type: ignore[misc]
        """The index dtype as a string, ``"int32"`` or ``"int64"`` (UST's ``index_type``; see :attr:`index_dtype`)."""
        return _dtype_name(self.index_dtype)

    @property
    def device_id(self: "SparseTensor") -> int | str:  # type: ignore[misc]
        """``"cpu"`` or the CUDA ordinal (UST's ``device_id``)."""
        d = self.device
        return "cpu" if d.type == "cpu" else (d.index if d.index is not None else torch.cuda.current_device())

    @classmethod
    def from_file(cls, filename: str) -> "SparseTensor":
        """A COO tensor from a Matrix Market (``.mtx``, read by SciPy) or FROSTT (``.tns``) file,
        duplicates summed (UST's ``Tensor.from_file``)."""
        from ._files import from_file  # noqa: PLC0415 - only when reading files

        return from_file(filename)

    def to_file(self: "SparseTensor", filename: str, **options: Any) -> None:  # type: ignore[misc]
        """Write a Matrix Market (``.mtx``, a matrix; ``symmetry=``, ``precision=``) or FROSTT (``.tns``) file that
        :meth:`from_file` reads back (torch-sla's ``save_mtx``)."""
        from ._files import to_file  # noqa: PLC0415 - only when writing files

        to_file(self, filename, **options)

    # get_value ----------------------------------------------------------------------------------
    def get_value(self: "SparseTensor", indices: Any) -> torch.Tensor | None:  # type: ignore[misc]
        """The value stored at the logical coordinate ``indices``, or ``None`` if none is stored.

        ``indices`` holds one integer per dimension of :attr:`shape` (value-batch dimensions
        first, as in ``shape``), each in ``[0, size)``. The result is a 0-d tensor (on the
        tensor's device, differentiable in the values); an explicitly stored zero is returned
        as a zero, not ``None``. In a format with duplicates (COO of a tensor that was not
        coalesced) the duplicates' sum is returned, the entry's value as :meth:`to_dense` sees it.
        Costs one O(nnz log nnz) index build per pattern (cached) and O(log nnz) per call.
        """
        idx = _check_indices(self, indices)
        nb = len(self.batch_shape)
        keys, slot_sorted = self._value_index()
        if keys.dim() == 1:  # one packed key per entry (it fits in int64)
            key = 0
            for i, size in zip(idx[nb:], self.format_shape):
                key = key * size + i
            probe = torch.tensor([key], dtype=keys.dtype, device=keys.device)
            lo = int(torch.searchsorted(keys, probe, right=False))
            hi = int(torch.searchsorted(keys, probe, right=True))
        else:  # too wide to pack: the entries sorted lexicographically, narrowed one dimension at a time
            lo, hi = 0, keys.shape[1]
            for k, i in enumerate(idx[nb:]):
                if lo == hi:
                    break
                col = keys[k, lo:hi]
                probe = torch.tensor([i], dtype=col.dtype, device=col.device)
                lo, hi = (lo + int(torch.searchsorted(col, probe, right=False)),
                          lo + int(torch.searchsorted(col, probe, right=True)))
        if lo == hi:
            return None
        _, _, lvals = self._linear_buffers()
        vals = lvals[tuple(idx[:nb])] if nb else lvals
        picked = vals[..., slot_sorted[lo:hi]]
        return picked[0] if hi - lo == 1 else picked.sum()

    def _value_index(self: "SparseTensor") -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[misc]
        """(sorted keys of the stored entries; their value slots), cached per pattern. The keys are the
        linear coordinates (1-D) where the shape's element count fits in int64 with room to spare, else
        the coordinates themselves (ndim, n), sorted lexicographically (a 2**40 x 2**40 tensor's
        ``i * n + j`` would wrap, and distinct entries collide)."""
        cache = self._cache
        got = cache.get("value_index")
        if got is None:
            coords, slots = self.entries()
            coords = coords.to(torch.int64)
            if math.prod(self.format_shape) < 2**62:
                lin = torch.zeros(coords.shape[1], dtype=torch.int64, device=coords.device)
                for k, size in enumerate(self.format_shape):
                    lin = lin * size + coords[k]
                lin_sorted, order = torch.sort(lin, stable=True)
                got = (lin_sorted, slots[order])
            else:
                order = torch.arange(coords.shape[1], device=coords.device)
                for k in reversed(range(coords.shape[0])):
                    order = order[torch.sort(coords[k][order], stable=True).indices]
                got = (coords[:, order].contiguous(), slots[order])
            cache["value_index"] = got
        return got

    # copy_ --------------------------------------------------------------------------------------
    def copy_(self: "SparseTensor", src: "SparseTensor", stream: Any = None) -> "SparseTensor":  # type: ignore[misc]
        """Copy ``src``'s values into this tensor, in place; returns ``self``.

        As UST's ``copy_``, ``src`` must be *compatible*: the same format, shape (value batch
        included), index dtype, value dtype and sparsity pattern (equal index buffers; ``src``
        may live on another device). Anything else raises :class:`~sparsetorch.InputError`
        naming what differs and the fix, and nothing is written. The structure of a
        SparseTensor never changes, so only the values are copied (UST copies the index
        buffers too, which on an equal pattern writes the same numbers). A kernel set with
        :meth:`set_kernel` is dropped, as in UST. The write is torch's ``values.copy_``: it is
        recorded by autograd like any in-place write, and refused (with the fix) on values that
        are a leaf requiring grad outside ``torch.no_grad()``. ``stream``: a CUDA stream to
        copy on (None: the current stream).
        """
        from .sparse_tensor import SparseTensor  # noqa: PLC0415 - the class this mixin serves

        if not isinstance(src, SparseTensor):
            raise InputError(f"copy_ takes a SparseTensor of the same format and pattern, got {type(src).__name__}; "
                             f"for a torch/SciPy/CuPy object wrap it first (sparsetorch.from_package(obj)), for a "
                             f"dense tensor take its entries on this pattern (SparseTensor.from_dense(d, format, mask=...))")
        if src.format != self.format:
            raise InputError(f"copy_: the source's format {_name(src)} differs from this tensor's {_name(self)}; "
                             f"convert it first (src.convert(dst.format))")
        if tuple(src.shape) != tuple(self.shape):
            raise InputError(f"copy_: the source's shape {tuple(src.shape)} differs from this tensor's "
                             f"{tuple(self.shape)} (value batch included)")
        if src.index_dtype != self.index_dtype:
            raise InputError(f"copy_: the source's index dtype {_dtype_name(src.index_dtype)} differs from this "
                             f"tensor's {_dtype_name(self.index_dtype)}; convert it first "
                             f"(src.convert(index_dtype={self.index_dtype}))")
        if src.dtype != self.dtype:
            raise InputError(f"copy_: the source's dtype {_dtype_name(src.dtype)} differs from this tensor's "
                             f"{_dtype_name(self.dtype)}; cast it first (src.to({self.dtype}))")
        if tuple(src._values.shape) != tuple(self._values.shape):
            raise InputError(f"copy_: the source stores {tuple(src._values.shape)} values, this tensor "
                             f"{tuple(self._values.shape)}: the sparsity patterns differ")
        src.ensure_valid()
        self.ensure_valid()
        _check_same_pattern(self, src)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        try:
            with ctx:
                self._values.copy_(src._values)
        except RuntimeError as e:
            if "leaf Variable that requires grad" not in str(e):
                raise
            raise InputError("copy_: this tensor's values are a leaf that requires grad (a parameter); copy "
                             "under torch.no_grad(), as an optimizer step does") from None
        self._kernel = None
        return self

    # set_kernel / run_kernel ----------------------------------------------------------------------
    def set_kernel(self: "SparseTensor", user_code: Callable, *, with_indices: bool = True,  # type: ignore[misc]
                   arch: Any = None) -> None:
        """Attach a transformation of the stored elements, applied by :meth:`run_kernel`.

        UST's meaning, vectorized: ``user_code(values, i, j, ...)`` (``with_indices=True``) or
        ``user_code(values)`` receives every stored entry at once, ``values`` of shape
        ``batch_shape + (n,)`` and one ``(n,)`` int64 coordinate tensor per format dimension
        (logical coordinates, whatever the storage), and returns the new values (same shape, or
        broadcastable to it). A function written with elementwise torch or Python operators
        (``lambda v, i, j: v * (i == j)``) works as UST's scalar callback would. Padding slots
        of the format (ELL, DIA, N:M fill) are not passed and stay zero. UST compiles the
        function into a CUDA kernel (``arch`` picks the target) and refuses CPU tensors; here it
        runs on any device and ``arch`` is ignored. :meth:`copy_` drops the kernel.
        """
        if not callable(user_code):
            raise InputError(f"set_kernel takes a callable (values[, i, j, ...]) -> values, got {type(user_code).__name__}"
                             f" (compiled LTO-IR bytes are UST's own; pass the Python function instead)")
        self._kernel = (user_code, bool(with_indices))

    def run_kernel(self: "SparseTensor", stream: Any = None) -> None:  # type: ignore[misc]
        """Apply the kernel of :meth:`set_kernel` to every stored element, in place.

        The values are written under ``torch.no_grad()`` (an update of the tensor's data, as an
        optimizer step; autograd does not see it). Raises :class:`~sparsetorch.InputError` when
        no kernel was set, or when it returns a tensor of another shape or a dtype that cannot
        be cast to the values' without loss of kind (complex into real).
        """
        kernel = getattr(self, "_kernel", None)
        if kernel is None:
            raise InputError("run_kernel: no kernel has been set on this tensor; call set_kernel(fn) first")
        fn, with_indices = kernel
        coords, slots = self.entries()
        _, _, lvals = self._linear_buffers()
        if lvals.data_ptr() != self._values.data_ptr() and lvals.numel():
            raise InputError(f"run_kernel: the values of format {_name(self)} are not stored contiguously; "
                             f"call it on a contiguous copy (t.with_values(t.values.contiguous()))")
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            old = lvals[..., slots]
            new = fn(old, *[c.to(torch.int64) for c in coords]) if with_indices else fn(old)
            new = torch.as_tensor(new, device=old.device)
            if new.is_complex() and not old.is_complex():
                raise InputError(f"run_kernel: the kernel returned complex values for a tensor of dtype "
                                 f"{_dtype_name(old.dtype)}; cast the tensor first (t.to(torch.complex128))")
            try:
                new = torch.broadcast_to(new, old.shape)
            except RuntimeError:
                raise InputError(f"run_kernel: the kernel returned shape {tuple(new.shape)} for {tuple(old.shape)} "
                                 f"stored values (one value per stored element is needed)") from None
            lvals[..., slots] = new.to(old.dtype)


def _check_indices(t: "SparseTensor", indices: Any) -> list[int]:
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__"):
        raise InputError(f"get_value takes one index per dimension ({t.ndim} for shape {tuple(t.shape)}), got {indices!r}")
    if isinstance(indices, torch.Tensor):
        indices = indices.tolist()
    if len(indices) != t.ndim:
        raise InputError(f"get_value: {len(indices)} indices {list(indices)!r} for a tensor of {t.ndim} dimensions "
                         f"(shape {tuple(t.shape)}); give one per dimension")
    out = []
    for k, (i, size) in enumerate(zip(indices, t.shape)):
        if isinstance(i, bool):
            raise InputError(f"get_value: index {k} is a bool ({i}); indices are integers")
        try:
            v = operator.index(i)
        except TypeError:
            raise InputError(f"get_value: index {k} is {i!r} ({type(i).__name__}); indices are integers") from None
        if not 0 <= v < size:
            raise InputError(f"get_value: index {v} of dimension {k} is outside [0, {size}) (shape {tuple(t.shape)})")
        out.append(v)
    return out


def _check_same_pattern(dst: "SparseTensor", src: "SparseTensor") -> None:
    """Raise naming the first index buffer that differs (same length ones compared by content)."""
    for kind, a_bufs, b_bufs in (("pos", dst.pos_buffers, src.pos_buffers), ("crd", dst.crd_buffers, src.crd_buffers)):
        for level, (a, b) in enumerate(zip(a_bufs, b_bufs)):
            if a is None and b is None or a is b:
                continue
            if (a is None) != (b is None) or tuple(a.shape) != tuple(b.shape):
                raise InputError(f"copy_: the sparsity patterns differ ({kind}[{level}] has shape "
                                 f"{None if b is None else tuple(b.shape)} in the source, "
                                 f"{None if a is None else tuple(a.shape)} here); copy_ writes values onto the same "
                                 f"pattern: build a new tensor instead (dst.with_values(...) or src.clone())")
            diff = a != b.to(a.device)
            if bool(diff.any()):
                at = int(diff.flatten().nonzero()[0])
                raise InputError(f"copy_: the sparsity patterns differ ({kind}[{level}] at position {at}: "
                                 f"{int(b.flatten()[at])} in the source, {int(a.flatten()[at])} here); copy_ writes "
                                 f"values onto the same pattern: build a new tensor instead (src.clone())")
