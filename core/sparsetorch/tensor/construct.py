"""Building sparse tensors: from coordinate triplets, from dense, and by conversion."""

from __future__ import annotations

import math
import os
import sys
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import ConversionError, FormatError, SparseTorchError, ValidationError
from ..format import COO_ND, CSR, Dimension, LevelFormat, TensorFormat
from . import _levels
from .pattern import is_plain
from .sparse_tensor import SparseTensor
from .validate import TRUSTED, _versions, check_shape

__all__ = ["from_coo", "from_dense", "convert", "build", "Conversion", "conversion", "DEFAULT_MAX_FILL", "FILL_SLACK"]

_INT32_MAX = 2**31 - 1

#: Default bound on stored slots per nonzero of a conversion (padding of DIA, ELL, blocks, N:M).
DEFAULT_MAX_FILL = 8.0
#: Slots every conversion may store beyond ``max_fill * nonzeros`` (512 KB of float64: small
#: tensors never trip the bound).
FILL_SLACK = 65536
#: Environment variable with the default ``max_fill`` (a number, or ``inf`` for no bound).
MAX_FILL_ENV = "SPARSETORCH_MAX_FILL"


def _max_fill(max_fill: float | None) -> float:
    """The bound in force: ``max_fill`` if given, else ``$SPARSETORCH_MAX_FILL``, else 8."""
    where = "max_fill"
    if max_fill is None:
        raw = os.environ.get(MAX_FILL_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_MAX_FILL
        where = f"the environment variable {MAX_FILL_ENV}"
        try:
            max_fill = float(raw)
        except ValueError:
            raise ConversionError(
                f"{where} = {raw!r} is not a number; set it to the allowed stored slots per nonzero "
                f"(e.g. 16, or inf for no bound), or unset it for the default {DEFAULT_MAX_FILL:g}"
            ) from None
    if isinstance(max_fill, bool) or not isinstance(max_fill, (int, float)) or math.isnan(max_fill) or max_fill < 0:
        raise ConversionError(
            f"{where} must be a non-negative number of stored slots per nonzero (e.g. 16, or float('inf') "
            f"for no bound), got {max_fill!r}"
        )
    return float(max_fill)


def fill_guard(fmt: TensorFormat, shape: Sequence[int], max_fill: float | None, value_bytes: int, what: str):
    """``guard(slots, entries)`` for :func:`_levels.compose_map`: raises :class:`ConversionError`
    when ``slots > max_fill * entries + FILL_SLACK`` (None when there is no bound).
    ``value_bytes`` is the size of one slot's values (item size x value sets).

    Formats whose levels are all dense (DENSE, DENSE_COL, DENSE_ND, batches of them) are not
    bounded: they store one slot per entry of the shape whatever the pattern, the size the
    caller asked for by naming them (as with ``to_dense()``)."""
    bound_ratio = _max_fill(max_fill)
    if math.isinf(bound_ratio) or all(lv.format in (LevelFormat.DENSE, LevelFormat.BATCH) for lv in fmt.levels):
        return None

    def guard(slots: int, entries: int) -> None:
        bound = guard.bound(entries)
        if slots <= bound:
            return
        ratio = slots / entries if entries else math.inf
        need = math.ceil((slots - FILL_SLACK) / entries) if entries else math.inf
        allow = f"max_fill={need}" if entries else "max_fill=float('inf')"
        raise ConversionError(
            f"{what} to {_label(fmt)} for shape {tuple(shape)} would store {slots:,} slots for {entries:,} "
            f"nonzeros ({ratio:,.1f}x fill, {_bytes(slots * value_bytes)} of values alone), over the bound of "
            f"{bound_ratio:g}x the nonzeros + {FILL_SLACK} slots ({int(bound):,}); nothing of that size was allocated. "
            f"To allow it pass {allow} (or max_fill=float('inf')) to this call, or set the environment "
            f"variable {MAX_FILL_ENV}; or pick a format without padding (CSR, CSC, COO)"
        )

    guard.bound = lambda entries: bound_ratio * entries + FILL_SLACK  # type: ignore[attr-defined]
    return guard


def _label(fmt: TensorFormat) -> str:
    return f"{fmt.name} '{fmt}'" if fmt.name else f"'{fmt}'"


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _value_bytes(values_shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of one slot's values: item size times the value sets sharing the pattern."""
    return dtype.itemsize * math.prod(values_shape[:-1])


def _as_format(fmt: TensorFormat | str | None, ndim: int, default: TensorFormat | None = None) -> TensorFormat:
    if fmt is None:
        fmt = default if default is not None else (COO_ND(ndim) if ndim != 2 else COO_ND(2))
    if isinstance(fmt, str):
        fmt = TensorFormat.parse(fmt)
    if not isinstance(fmt, TensorFormat):
        raise FormatError(f"format must be a TensorFormat or a format string, got {type(fmt).__name__}")
    if fmt.ndim != ndim:
        raise FormatError(f"format {fmt} has {fmt.ndim} dimensions but the data has {ndim}")
    return fmt


_EXTENTS: dict = {}


def _check_int32(fmt: TensorFormat, shape: Sequence[int], n: int, index_dtype: torch.dtype) -> None:
    if index_dtype != torch.int32:
        return
    key = (fmt, tuple(shape))
    top = _EXTENTS.get(key)
    if top is None:  # the largest level extent, remembered per (format, shape): a conversion's host path
        top = max([0, *(hi for _, hi in fmt.level_extents(shape))])
        if len(_EXTENTS) < 4096:
            _EXTENTS[key] = top
    biggest = max(n, top)
    if biggest > _INT32_MAX:
        raise ConversionError(
            f"int32 indices cannot address {biggest} (> 2**31 - 1) for shape {tuple(shape)}; use index_dtype=torch.int64"
        )


def _plain_indices(bufs):
    """Index buffers built inside a ``torch.func`` transform come out wrapped (every op's output is,
    at the transform's level, even from plain inputs): integers carry no gradient, so the wrappers are
    taken off, and the pattern stays readable by backends and the plan cache (``from_coo`` under
    ``torch.func.grad`` failed with "Cannot access data pointer"; session 21's sweep). Batched
    (vmapped) indices are left as they are."""
    if all(b is None or is_plain(b) for b in bufs):
        return bufs
    f = torch._C._functorch
    out = []
    for b in bufs:
        while b is not None and not is_plain(b) and f.is_gradtrackingtensor(b):
            b = f.get_unwrapped(b)
        out.append(b)
    return type(bufs)(out) if isinstance(bufs, tuple) else out


def _trusted(fmt: TensorFormat, shape: Sequence[int], pos, crd, values: torch.Tensor) -> SparseTensor:
    """Wrap buffers this module built (correct by construction): no content checks, and no
    read-back of ``pos[-1]`` (a device-to-host copy per compressed level on a GPU).

    Without BATCH levels the tensor is assembled from its parts (``SparseTensor._assembled``, as
    ``with_values`` does): the structural checks of the constructor (presence, dtypes, devices, lengths of the buffers
    this module just made) would only re-derive what the builder guarantees."""
    pos, crd = _plain_indices(pos), _plain_indices(crd)
    if not fmt.num_batch_levels and values.dim() >= 1 and len(shape) == fmt.ndim:
        index = tuple(b for b in (*pos, *crd) if b is not None)
        fmt = fmt if fmt.index_dtype is not None or not index else fmt.replace(index_dtype=index[0].dtype)
        return SparseTensor._assembled(fmt, shape, pos, crd, values, index, _versions(index))
    token = TRUSTED.set(True)
    try:
        return SparseTensor(fmt, shape, pos, crd, values, check=False)
    finally:
        TRUSTED.reset(token)


_WITH_INDEX_DTYPE: dict = {}


def _with_index_dtype(fmt: TensorFormat, index_dtype: torch.dtype) -> TensorFormat:
    """``fmt.replace(index_dtype=...)``, remembered (building a format validates it: tens of
    microseconds per conversion otherwise)."""
    key = (fmt, index_dtype)
    got = _WITH_INDEX_DTYPE.get(key)
    if got is None:
        got = fmt if fmt.index_dtype == index_dtype else fmt.replace(index_dtype=index_dtype)
        if len(_WITH_INDEX_DTYPE) < 4096:
            _WITH_INDEX_DTYPE[key] = got
    return got


def build(
    fmt: TensorFormat, shape: Sequence[int], coords: torch.Tensor, values: torch.Tensor, index_dtype: torch.dtype,
    *, max_fill: float | None = None, what: str = "building a tensor",
) -> SparseTensor:
    """Compose level buffers for ``coords``/``values`` (duplicates summed) and wrap them.
    Refuses (:class:`ConversionError`) more than ``max_fill`` stored slots per entry (+ a slack)."""
    shape = tuple(int(s) for s in shape)
    _check_int32(fmt, shape, coords.shape[1], index_dtype)
    guard = fill_guard(fmt, shape, max_fill, _value_bytes(values.shape, values.dtype), what)
    pmap, cmap, nslots, dst = _levels.compose_map(fmt, shape, coords, index_dtype, guard)
    pos, crd, vals = pmap, cmap, _levels.scatter_values(values, dst, nslots)
    pos, crd, vals = _levels.delinearize_batch(fmt, shape, pos, crd, vals)
    return _trusted(fmt.replace(index_dtype=index_dtype), shape, pos, crd, vals)


def from_coo(
    values: torch.Tensor,
    indices: Sequence[torch.Tensor],
    *,
    shape: Sequence[int] | None,
    format: TensorFormat | str | None,
    index_dtype: torch.dtype | None,
    check: bool,
    max_fill: float | None = None,
) -> SparseTensor:
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(values)
        except (TypeError, RuntimeError, ValueError) as exc:
            raise ValidationError(f"from_coo: values must be a tensor or array of numbers, got {type(values).__name__} "
                                  f"({exc})") from None
    last = indices[-1] if indices else None
    if (shape is None and len(indices) >= 2 and isinstance(last, (tuple, torch.Size)) and len(last) == len(indices) - 1
            and all(isinstance(d, int) and not isinstance(d, bool) for d in last)):
        # torch-sla's SparseTensor(values, row, col, shape) order: the shape read as a third index array built a 3-D
        # tensor in silence when nnz equalled its length (session 26's sweep)
        raise ValidationError(f"from_coo: the last positional argument {tuple(last)} looks like the shape; pass it as "
                              f"shape={tuple(last)} (from_coo(values, row, col, shape=(m, n)))")
    if len(indices) == 1 and isinstance(indices[0], torch.Tensor) and indices[0].dim() == 2:
        idx = indices[0]
        rows = [idx[k] for k in range(idx.shape[0])]
    else:
        rows = []
        for k, x in enumerate(indices):
            try:
                rows.append(torch.as_tensor(x))
            except (TypeError, RuntimeError, ValueError) as exc:
                raise ValidationError(f"from_coo: index array {k} must be a tensor or array of integers, got "
                                      f"{type(x).__name__} ({exc})") from None
    if not rows:
        raise ValidationError("from_coo needs index arrays: from_coo(values, row, col, shape=...) or from_coo(values, indices)")
    for k, r in enumerate(rows):
        if r.dim() != 1:
            raise ValidationError(f"index array {k} must be 1-D, got shape {tuple(r.shape)}")
        if r.dtype.is_floating_point or r.dtype.is_complex or r.dtype == torch.bool:
            raise ValidationError(f"index array {k} has dtype {r.dtype}; indices must be integers")
        if r.numel() != rows[0].numel():
            raise ValidationError(f"index arrays differ in length: array 0 has {rows[0].numel()}, array {k} has {r.numel()}")
    n = rows[0].numel()
    if values.dim() == 0 or values.shape[-1] != n:
        raise ValidationError(f"values must have {n} entries in their last dimension (one per index), got shape {tuple(values.shape)}")
    coords = (torch.stack([r.to(device=values.device, dtype=torch.int64) for r in rows]) if n
              else torch.zeros(len(rows), 0, dtype=torch.int64, device=values.device))
    if shape is None:
        shape = [int(c.max()) + 1 if n else 0 for c in coords]
    shape = check_shape(shape)
    lead = tuple(values.shape[:-1])
    if lead and len(shape) == len(rows) + len(lead) and tuple(shape[: len(lead)]) == lead:
        shape = shape[len(lead):]  # a value batch named in shape too (torch-sla's spelling): the pattern's shape
    if len(shape) != len(rows):
        hint = (f"; with a batch of values {tuple(values.shape)}, shape is the pattern's ({len(rows)} dims) or the batch "
                f"followed by it" if lead else "")
        raise ValidationError(f"shape {shape} has {len(shape)} dims but {len(rows)} index arrays were given{hint}")
    if check and n:
        for k, size in enumerate(shape):
            bad = (coords[k] < 0) | (coords[k] >= size)
            if bool(bad.any()):
                at = int(torch.nonzero(bad)[0, 0])
                raise ValidationError(
                    f"index array {k} has {int(coords[k, at])} at position {at}, outside [0, {size}) for shape {shape}"
                )
    if not (values.is_floating_point() or values.is_complex()):
        raise ValidationError(f"values have dtype {values.dtype}; use a floating point or complex dtype (e.g. .double())")
    if format is None and n > 1:
        from .interop._common import sorted_unique  # noqa: PLC0415 - interop imports this module

        if not sorted_unique(list(coords)):
            return _triplets(shape, rows, values, index_dtype or torch.int64)
    fmt = _as_format(format, len(shape))
    return build(fmt, shape, coords, values, index_dtype or fmt.index_dtype or torch.int64, max_fill=max_fill,
                 what="from_coo")


def _triplets(shape: Sequence[int], rows: list, values: torch.Tensor, index_dtype: torch.dtype) -> SparseTensor:
    """The triplets as given (order and repeats kept; repeats sum wherever the tensor is read), their values
    the caller's tensor itself: ``with_values`` then takes values in the triplets' order, and a leaf
    parameter stays the tensor's values (an optimizer's steps reach it, every backward pass has a graph)."""
    from .interop._common import coo_format

    idx = _plain_indices([r.to(device=values.device, dtype=index_dtype) for r in rows])
    pos0 = _plain_indices([torch.tensor([0, idx[0].numel()], dtype=index_dtype, device=values.device)])[0]
    return SparseTensor(coo_format(len(shape), False), tuple(shape), [pos0] + [None] * (len(shape) - 1), idx, values,
                        check=False)


def from_dense(
    dense: torch.Tensor,
    format: TensorFormat | str | None,
    *,
    threshold: float | None,
    mask: torch.Tensor | None,
    batch_dims: int | None,
    index_dtype: torch.dtype | None,
    max_fill: float | None = None,
) -> SparseTensor:
    if not isinstance(dense, torch.Tensor):
        raise ValidationError(f"from_dense takes a torch.Tensor, got {type(dense).__name__} (use from_package for NumPy)")
    if dense.layout != torch.strided:
        raise ValidationError(f"from_dense takes a strided tensor, got layout {dense.layout}; use from_package")
    if batch_dims is None:
        nd = (format.ndim if isinstance(format, TensorFormat)
              else (TensorFormat.parse(format).ndim if isinstance(format, str) else min(dense.dim(), 2)))
        batch_dims = dense.dim() - nd
    if batch_dims < 0 or batch_dims >= dense.dim():
        raise ValidationError(f"batch_dims={batch_dims} is invalid for a tensor of {dense.dim()} dims")
    fshape = tuple(dense.shape[batch_dims:])
    fmt = _as_format(format, len(fshape), CSR if len(fshape) == 2 else COO_ND(len(fshape)))
    if not (dense.is_floating_point() or dense.is_complex()):
        raise ValidationError(f"dense has dtype {dense.dtype}; use a floating point or complex dtype (e.g. .double())")
    flat = dense.reshape(math.prod(dense.shape[:batch_dims]), math.prod(fshape))
    if mask is not None:
        if tuple(mask.shape) not in (fshape, tuple(dense.shape)):
            raise ValidationError(f"mask must have shape {fshape} or {tuple(dense.shape)}, got {tuple(mask.shape)}")
        m = mask.to(device=dense.device, dtype=torch.bool)
        keep = m.reshape(math.prod(m.shape[: m.dim() - len(fshape)]), math.prod(fshape)).any(0)
    elif threshold is not None:
        keep = (flat.detach().abs() > threshold).any(0)
    else:
        keep = (flat.detach() != 0).any(0)
    lin = torch.nonzero(keep).reshape(-1)
    coords = torch.stack(torch.unravel_index(lin, fshape)) if fshape else lin[None]
    vals = flat[:, lin].reshape(*dense.shape[:batch_dims], lin.numel())
    return build(fmt, fshape, coords, vals, index_dtype or fmt.index_dtype or torch.int64, max_fill=max_fill,
                 what="from_dense")


#: the direct CSR / CSC / COO-like pairs by the short path (:func:`convert`'s first lines and
#: :func:`_same_major`); False runs them through the general steps (the same buffers; kept for the
#: GPU conversion benchmark's side-by-side timing and for the tests that compare the two)
FAST_DIRECT = True


def convert(
    t: SparseTensor,
    tensor_format: TensorFormat | str | None,
    *,
    index_dtype: torch.dtype | None,
    dtype: torch.dtype | None,
    drop_zeros: bool,
    copy: bool | None,
    max_fill: float | None = None,
) -> SparseTensor:
    """``t`` in ``tensor_format`` (:meth:`SparseTensor.convert`).

    Index dtype: ``index_dtype`` if given, else the target format's preference, else ``t``'s
    (int32 in, int32 out). Buffers: without ``copy=True`` the result may share buffers with
    ``t`` and with other conversions: between CSR / CSC / COO-like layouts of the same major
    (CSR <-> COO) the minor indices and the values are ``t``'s own buffers, and on a GPU the
    ``[0, nnz]`` pointers of a COO target are one kept buffer per (device, dtype, nnz);
    ``copy=True`` gives buffers of its own. ``t``'s index buffers are validated first if they
    were written in place since they were last checked (compiled code never reads them unchecked);
    the result's buffers are built here and trusted."""
    if FAST_DIRECT and dtype is None and not drop_zeros and not copy and type(tensor_format) is TensorFormat:
        # the direct CSR / CSC / COO-like pairs first, with nothing computed twice (a GPU CSR -> COO
        # is one kernel: these checks are a good part of its host time)
        pair = _direct_pair(t.format, tensor_format)
        if pair is not None:
            idt = index_dtype or tensor_format.index_dtype or t.index_dtype
            if idt is torch.int32 or idt is torch.int64:
                return _convert_direct(t, tensor_format, idt, pair)
    t.ensure_valid()
    fmt = _as_format(tensor_format if tensor_format is not None else t.format, t.format.ndim)
    idt = index_dtype or (fmt.index_dtype if tensor_format is not None else None) or t.index_dtype
    if idt not in (torch.int32, torch.int64):
        raise ConversionError(f"index_dtype must be torch.int32 or torch.int64, got {idt}")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise ConversionError(f"dtype must be floating point or complex, got {dtype}")
    same_format = fmt is t.format or fmt == t.format
    same = same_format and idt == t.index_dtype and (dtype is None or dtype == t.dtype)
    if same and not drop_zeros:
        if copy is False or copy is None:
            return t
        return t.clone()
    if same and copy is False:
        raise ConversionError("drop_zeros=True needs new buffers, but copy=False was given")
    if same_format and not drop_zeros:
        # Same layout: cast the buffers only.
        cast = lambda b: None if b is None else b.to(idt)  # noqa: E731
        _check_int32(fmt, t.format_shape, t.nse, idt)
        vals = t.values if dtype is None else t.values.to(dtype)
        return SparseTensor(fmt.replace(index_dtype=idt), t.format_shape, [cast(b) for b in t.pos_buffers],
                            [cast(b) for b in t.crd_buffers], vals, check=False)
    if drop_zeros:
        coords, vals = t.coordinates()
        if dtype is not None:
            vals = vals.to(dtype)
        if coords.shape[1]:
            keep = (vals.detach() != 0).reshape(math.prod(vals.shape[:-1]), vals.shape[-1]).any(0)
            coords, vals = coords[:, keep], vals[..., keep]
        return build(fmt, t.format_shape, coords, vals, idt, max_fill=max_fill, what="converting")
    pair = _direct_pair(t.format, fmt) if dtype is None and not copy else None
    if pair is not None:  # CSR / CSC / COO-like pairs: no padding, no fill bound, no dtype cast
        return _convert_direct(t, fmt, idt, pair)
    try:
        conv = conversion(t, fmt, idt, max_fill=max_fill, dtype=dtype, values_too=True)
    except FormatError:
        if not any(lv.format is LevelFormat.STRUCTURED for lv in fmt.levels):
            raise
        # N:M counts stored entries; the source's explicit zeros (often padding of its own
        # format) may be what breaks the constraint: retry without them (value-dependent).
        return convert(t, fmt, index_dtype=idt, dtype=dtype, drop_zeros=True, copy=copy, max_fill=max_fill)
    out = conv.apply(t)
    if dtype is not None:
        out = out.with_values(out.values.to(dtype))
    if copy:
        out = out.clone()  # nothing shared with the source or with other conversions
    return out


class Conversion:
    """A reusable conversion of one pattern to another format: the target's index buffers and
    the map from source value slots to target slots. ``apply`` converts any values on the
    source pattern (a training loop converts values only, never re-sorting indices)."""

    __slots__ = ("format", "shape", "pos", "crd", "_src", "_dst", "nslots", "nentries", "_derived", "_first", "_index")

    def __init__(self, t: SparseTensor, fmt: TensorFormat, index_dtype: torch.dtype, guard=None, *,
                 values_too: bool = False, pair: tuple | None = None) -> None:
        shape = t.format_shape
        _check_int32(fmt, shape, t.nse, index_dtype)
        self._first = None
        self._index = None
        direct = _direct(t, fmt, index_dtype, values_too, pair)
        if direct is None:
            direct = _kernel_path(t, fmt, index_dtype, values_too, guard)
        if direct is not None:  # compiled or one-pass routines for the common pairs
            self.pos, self.crd, self._src, self._dst, self.nslots, first = direct
            if first is not None:  # t's values already converted: for the apply that follows
                tvals = t._linear_buffers()[2]
                self._first = (tvals, _version(tvals), first)
            self.format = _with_index_dtype(fmt, index_dtype)
            self.shape = shape
            # distinct entries: the target's slots, or the source's (a CSR source has no padding)
            self.nentries = self.nslots if self._dst is None else t.nse
            self._derived = {}
            return
        coords, src = t.entries()
        nlin = t._linear_buffers()[2].shape[-1]
        identity_src = src.numel() == nlin and (nlin == 0 or bool((src == torch.arange(nlin, device=src.device)).all()))
        fast = _levels.compose_two_level(fmt, shape, coords, index_dtype)
        if fast is not None:  # CSR/CSC/COO-like targets: one sort (or none) and a gather
            pos, crd, order = fast
            nslots, dst = coords.shape[1], None
            nentries = nslots
            if order is not None:
                src = order if identity_src else src[order]
                identity_src = False
        else:
            seen: list[int] = []

            def counting(slots: int, entries: int) -> None:
                if not seen:
                    seen.append(entries)
                if guard is not None:
                    guard(slots, entries)

            pos, crd, nslots, dst = _levels.compose_map(fmt, shape, coords, index_dtype, counting)
            nentries = seen[0] if seen else coords.shape[1]
        self.format = _with_index_dtype(fmt, index_dtype)
        self.shape = shape
        self._src = None if identity_src else src
        self._dst = dst
        self.nslots = nslots
        self.nentries = nentries  # distinct entries of the source (what the fill is measured against)
        # Store the target buffers in the target's own layout (per-batch buffers for BATCH levels).
        probe = torch.empty(0, device=coords.device)
        self.pos, self.crd, _ = _levels.delinearize_batch(fmt, shape, pos, crd, probe.new_zeros(nslots))
        self._derived: dict = {}

    @property
    def src(self) -> torch.Tensor | None:
        """Source value slot of every target slot (before ``dst``), None for the identity."""
        if callable(self._src):  # computed on first use (a direct conversion moved the values)
            self._src = self._src()
        return self._src

    @property
    def dst(self) -> torch.Tensor | None:
        """Target slot of every (gathered) source entry, None when slots map one to one."""
        if callable(self._dst):
            self._dst = self._dst()
        return self._dst

    def values(self, vals: torch.Tensor) -> torch.Tensor:
        """The target's linearized values for the source's linearized values ``vals``: what
        :meth:`apply` computes, without building tensors around it (a gather and, for padded
        targets, a scatter; per call of a product plan on a non-CSR format)."""
        got = self._first  # one read: another thread may clear it between a test and an unpacking
        if got is not None:
            self._first = None  # held for one call only
            first, version, out = got
            if vals is first and _version(vals) == version:
                return out
        if self.src is not None:
            # index_select, not vals[..., src]: the advanced-indexing kernel was 3.5x slower on
            # 8M entries (CPU), and this runs per call of a product plan on a non-CSR format
            vals = vals.index_select(-1, self.src)
        return _levels.scatter_values(vals, self.dst, self.nslots)

    def _apply_flat(self, t: SparseTensor) -> SparseTensor:
        """:meth:`apply` for a target without BATCH levels whose source has none either (the
        direct pairs): the tensor assembled from the buffers built here and the values moved."""
        index = self._index
        if index is None:
            self._index = index = tuple(b for b in (*self.pos, *self.crd) if b is not None)
        vals = self.values(t.values)  # no BATCH levels: the values are linear already
        out = SparseTensor._assembled(self.format, self.shape, self.pos, self.crd, vals, index, _versions(index),
                                      self._derived)
        return out

    def apply(self, t: SparseTensor) -> SparseTensor:
        """The converted tensor for ``t`` (same pattern as the one this was built for)."""
        _, _, vals = t._linear_buffers()
        vals = self.values(vals)
        nb = self.format.num_batch_levels
        if nb:
            bsizes = self.format.level_sizes(self.shape)[:nb]
            bt = math.prod(bsizes)
            vals = vals.reshape(*vals.shape[:-1], *bsizes, self.nslots // bt if bt else 0)
        out = _trusted(self.format, self.shape, self.pos, self.crd, vals)
        out._derived = self._derived
        return out


_PAIRS: dict = {}


def _direct_pair(src: TensorFormat, dst: TensorFormat) -> tuple | None:
    """``(source layout, target layout)`` when a conversion from ``src`` to ``dst`` is one of the
    direct CSR / CSC / COO-like pairs (:func:`_direct`), else None; remembered per pair."""
    key = (src, dst)
    got = _PAIRS.get(key, _PAIRS)
    if got is _PAIRS:
        s, d = _pair_layout(src), _pair_layout(dst)
        got = None if s is None or d is None or s == d or src.num_batch_levels else (s, d)
        if len(_PAIRS) < 4096:
            _PAIRS[key] = got
    return got


def _convert_direct(t: SparseTensor, fmt: TensorFormat, idt: torch.dtype, pair: tuple) -> SparseTensor:
    """:func:`convert` between two direct layouts: the cached :class:`Conversion` (what
    :func:`conversion` returns; these pairs store one slot per entry, so there is no fill bound to
    check), built on a first call, applied to ``t``'s values."""
    cache = t._cache  # validated (once per buffer version) before anything reads the buffers
    key = ("conversion", fmt, idt)
    conv = cache.get(key)
    if conv is None:
        if FAST_DIRECT and pair[0][1] == pair[1][1] and t._linear is None:
            return _same_major(t, fmt, idt, pair, cache, key)
        conv = Conversion(t, fmt, idt, None, values_too=True, pair=pair)
        cache[key] = conv
    return conv._apply_flat(t)


def _same_major(t: SparseTensor, fmt: TensorFormat, idt: torch.dtype, pair: tuple, cache: dict,
                key: tuple) -> SparseTensor:
    """A first CSR -> COO-like or COO -> CSR-like conversion of the same major (no BATCH levels):
    what ``Conversion(...)._apply_flat(t)`` gives (the same buffers: the major expanded or
    compressed, the minor and the values ``t``'s own), built in one pass with no intermediate
    layers: on a GPU this pair is one or two kernels, and the host time of the layers was most of
    the call."""
    (skind, smaj), _ = pair
    minor, vals = t._crd[1], t._values
    shape = t.format_shape
    nnz = minor.shape[0]
    if idt is torch.int32:
        _check_int32(fmt, shape, nnz, idt)
    nmaj = shape[smaj]
    if skind == "csr":  # expand the pointers into the major of every entry
        ptr = t._pos[1]
        rows = _expand(ptr, nmaj, nnz)
        pos: list = [_ends(ptr, nmaj, nnz, idt), None]
        crd: list = [rows if rows.dtype == idt else rows.to(idt), minor if minor.dtype == idt else minor.to(idt)]
    else:  # compress the (sorted) major indices into pointers
        ptr = _compress(t._crd[0], nmaj, minor.dtype)
        pos, crd = [None, ptr if ptr.dtype == idt else ptr.to(idt)], [None, minor if minor.dtype == idt else minor.to(idt)]
    conv = Conversion.__new__(Conversion)
    conv.format, conv.shape, conv.pos, conv.crd = _with_index_dtype(fmt, idt), shape, pos, crd
    conv._src = conv._dst = conv._first = None
    conv.nslots = conv.nentries = nnz
    conv._derived = {}
    conv._index = index = tuple(b for b in (*pos, *crd) if b is not None)
    cache[key] = conv
    return SparseTensor._assembled(conv.format, shape, pos, crd, vals, index, _versions(index), conv._derived)


def conversion(
    t: SparseTensor, fmt: TensorFormat, index_dtype: torch.dtype, *, max_fill: float | None = None,
    dtype: torch.dtype | None = None, values_too: bool = False,
) -> Conversion:
    """The (cached, per pattern) :class:`Conversion` of ``t``'s pattern to ``fmt``.

    A target that stores more than ``max_fill`` slots per nonzero (default 8, or
    ``$SPARSETORCH_MAX_FILL``; plus :data:`FILL_SLACK` slots) raises :class:`ConversionError`
    before its buffers are allocated; a cached conversion is held to the bound of each call.
    ``values_too``: a new conversion may convert ``t``'s current values on the way (when that is
    cheaper than the value map, which it then computes on first use); the next :meth:`apply`
    or :meth:`values` with those very values returns them.
    """
    key = ("conversion", fmt, index_dtype)
    cache = t._cache
    conv = cache.get(key)
    if conv is None and _pair_layout(fmt) is not None and _pair_layout(t.format) is not None \
            and not t.format.num_batch_levels:
        guard = None  # CSR / CSC / COO-like to CSR / CSC / COO-like: one slot per entry, no padding to bound
    else:
        guard = fill_guard(fmt, t.format_shape, max_fill,
                           _value_bytes((*t.batch_shape, 0), dtype or t.dtype), "converting")
    if conv is None:
        conv = Conversion(t, fmt, index_dtype, guard, values_too=values_too)
        if conv._dst is None or callable(conv._dst) or is_plain(conv._dst):
            cache[key] = conv
    elif guard is not None and conv.nslots != conv.nentries:
        guard(conv.nslots, conv.nentries)
    return conv


# Direct conversions among CSR, CSC and COO ---------------------------------------------------
#
# The source is a valid tensor (its buffers were checked, or trusted with check=False), so its
# entries are distinct and in its level order: the target follows by one pass over the index
# buffers (expand or compress the major pointers), or, between the two majors, one stable
# counting sort (SciPy's compiled ``csr_tocsc`` on the CPU when SciPy is importable, a stable
# torch sort otherwise and on GPUs). No coordinates in int64, no re-sort, no re-check.

#: Use SciPy's compiled routines on the CPU when SciPy is importable (tests turn it off to
#: exercise the pure-torch path) ...
USE_SCIPY = True
#: ... for conversions of at least this many entries: below it the torch path is as fast, and a
#: small conversion does not import SciPy (~0.2 s the first time; tests/test_import_light.py)
SCIPY_MIN_ENTRIES = 1 << 12
_TOOLS: list = []


def _sparsetools(entries: int):
    """SciPy's compiled sparse kernels (``scipy.sparse._sparsetools``) for a conversion of
    ``entries`` entries, or None (no SciPy, turned off, or a small conversion)."""
    if not USE_SCIPY or entries < SCIPY_MIN_ENTRIES:
        return None
    if not _TOOLS:
        try:
            from scipy.sparse import _sparsetools as tools  # noqa: PLC0415 - optional, on first use
        except Exception:  # noqa: BLE001 - no SciPy (or a broken one): the torch path
            tools = None
        _TOOLS.append(tools if tools is not None and hasattr(tools, "csr_tocsc") else None)
    return _TOOLS[0]


_LAYOUTS: dict = {}


def _pair_layout(fmt: TensorFormat) -> tuple[str, int] | None:
    """:func:`_layout_of`, remembered per format."""
    got = _LAYOUTS.get(fmt, _LAYOUTS)
    if got is _LAYOUTS:  # not seen yet
        got = _layout_of(fmt)
        if len(_LAYOUTS) < 4096:
            _LAYOUTS[fmt] = got
    return got


def _layout_of(fmt: TensorFormat) -> tuple[str, int] | None:
    """``("csr", major)`` for ``(a : dense, b : compressed)``, ``("coo", major)`` for
    ``(a : compressed(nonunique), b : singleton)``, both ordered and unique at the last level,
    over plain dimensions; ``major`` is the format dimension the first level indexes."""
    if fmt.ndim != 2 or fmt.num_levels != 2:
        return None
    l0, l1 = fmt.levels
    if not (isinstance(l0.expr, Dimension) and isinstance(l1.expr, Dimension)):
        return None
    if not (l0.type.ordered and l1.type.ordered and l1.type.unique):
        return None
    names = [d.name for d in fmt.dims]
    major, minor = names.index(l0.expr.name), names.index(l1.expr.name)
    if major == minor:
        return None
    if l0.format is LevelFormat.DENSE and l1.format is LevelFormat.COMPRESSED:
        return "csr", major
    if l0.format is LevelFormat.COMPRESSED and not l0.type.unique and l1.format is LevelFormat.SINGLETON:
        return "coo", major
    return None


def _on_host(*bufs: torch.Tensor) -> bool:
    """Whether NumPy can read every buffer in place: plain CPU tensors (not inside a torch.func
    transform, nothing that requires grad; NumPy's own check, which raises otherwise)."""
    for b in bufs:
        if b.device.type != "cpu" or not is_plain(b):
            return False
        try:
            b.numpy()
        except (RuntimeError, TypeError):
            return False
    return True


#: how a GPU (or any non-NumPy) conversion expands pointers into major indices: "search" (arange
#: and one searchsorted of every slot in the row ends: two launches), "repeat" (counts,
#: repeat_interleave: a difference, a scan and a fill) or "fused" (torch's CSR -> COO index kernel)
EXPAND = "search"
#: sort keys of a major swap (CSR <-> CSC) in int16 when the new major has at most this many
#: indices: a radix sort of 16-bit keys makes half the passes of one of 32-bit keys
SORT16_MAX = 32767


#: ``arange`` on a GPU of up to this many entries is a view of one buffer kept per (device,
#: dtype) (a conversion's expand and transpose launch one kernel fewer: the host time of a launch
#: is a good part of a CSR -> COO of a million entries); longer ones are made each time. The
#: buffers stay allocated (at most twice this many entries per device and dtype).
ARANGE_CACHE_MAX = 1 << 21
_ARANGES: dict = {}
_ARANGES_KEPT: list = []  # outgrown buffers: never freed (a kernel on another stream may read one)


def _arange(n: int, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """``torch.arange(n, dtype=dtype, device=like.device)``, read-only: on a GPU (outside
    torch.compile and graph capture, ``like`` a plain tensor) a view of the kept buffer."""
    dev = like.device
    buf = _ARANGES.get((dev, dtype))
    if buf is not None and buf.shape[0] >= n and is_plain(like):  # GPU buffers only; no fake tensors
        return buf[:n]
    limit = 1 << 15 if dtype == torch.int16 else ARANGE_CACHE_MAX
    if dev.type != "cuda" or n > limit:
        return torch.arange(n, dtype=dtype, device=dev)
    key = (dev, dtype)
    if _levels._compiling() or not is_plain(like) or torch.cuda.is_current_stream_capturing():
        return torch.arange(n, dtype=dtype, device=dev)
    size = min(max(1 << 16, 1 << max(n - 1, 0).bit_length()), limit)
    new = torch.arange(size, dtype=dtype, device=dev)
    torch.cuda.synchronize(dev)  # written before a kernel on any stream reads it
    if buf is not None:
        _ARANGES_KEPT.append(buf)
    _ARANGES[key] = new
    return new[:n]


_KERNEL_FAILED: set[str] = set()
#: how this layer finds a backend's compiled conversion step by name: set by the dispatch layer when it
#: loads (``dispatch/select.py``: the loaded backends' ``sparsetorch_conversion_kernels``), so that the
#: tensor layer imports nothing above it; None: the core's own code only
_KERNEL_LOOKUP: Callable[[str], Callable | None] | None = None


def set_conversion_kernel_lookup(lookup: Callable[[str], Callable | None] | None) -> None:
    """Install the function that finds a compiled conversion step by name (the dispatch layer's)."""
    global _KERNEL_LOOKUP
    _KERNEL_LOOKUP = lookup


def _plugin_kernel(name: str) -> Callable | None:
    """A backend's compiled conversion step ``name`` (``dispatch.hookspecs.CONVERSION_KERNELS``),
    or None (no lookup installed, none offered, or it raised once in this process)."""
    lookup = _KERNEL_LOOKUP
    if lookup is None or name in _KERNEL_FAILED:
        return None
    return lookup(name)


def _kernel_failed(name: str, exc: BaseException) -> None:
    """A plugin's conversion kernel raised: warn once, and use the core's own code from now on."""
    import warnings  # noqa: PLC0415

    _KERNEL_FAILED.add(name)
    warnings.warn(f"sparsetorch: the conversion kernel {name!r} of a backend raised {type(exc).__name__}: {exc}; "
                  f"the core's own conversion runs instead (for the rest of this process)", RuntimeWarning, stacklevel=3)


def _expand(ptr: torch.Tensor, n: int, nnz: int) -> torch.Tensor:
    """The major index of every entry from the pointers ``ptr`` (n + 1), in ``ptr``'s dtype."""
    cuda = ptr.device.type == "cuda"
    if not cuda and _on_host(ptr):
        p = ptr.contiguous().numpy()
        return torch.from_numpy(np.repeat(np.arange(n, dtype=p.dtype), np.diff(p)))
    if cuda and nnz and is_plain(ptr) and not _levels._compiling():
        fn = _plugin_kernel("csr_rows")  # one kernel of a plugin's (the cuda plugin: blocks of entries, any row lengths)
        if fn is not None:
            out = ptr.new_empty(nnz)
            try:
                if fn(ptr.contiguous(), out):
                    return out
            except Exception as exc:  # noqa: BLE001 - a plugin's bug must not break a conversion
                _kernel_failed("csr_rows", exc)
    if EXPAND == "fused" and hasattr(torch, "_convert_indices_from_csr_to_coo"):
        # torch's CSR -> COO index kernel (one launch; a thread per row; writes a copy of the
        # columns too, which is dropped: the rows are a view of a (2, nnz) buffer)
        cols = ptr.new_empty(nnz)  # its (unset) contents land in the dropped half
        return torch._convert_indices_from_csr_to_coo(ptr, cols, out_int32=ptr.dtype == torch.int32)[0]
    if EXPAND == "search":
        # entry e lies in row r where r = #{rows whose end ptr[r + 1] <= e} (empty rows included):
        # two kernels (arange, searchsorted), no host sync
        slots = _arange(nnz, ptr.dtype, ptr)
        return torch.searchsorted(ptr[1:], slots, right=True, out_int32=ptr.dtype == torch.int32)
    # repeat_interleave(counts) is the major index itself (0 repeated counts[0] times, ...): a scan
    # and one kernel, no host sync with output_size (torch's fused CSR->COO index kernel, one
    # thread per row, was 5x slower on an H200 at 50 entries per row)
    counts = ptr[1:] - ptr[:-1]
    return torch.repeat_interleave(counts, output_size=nnz).to(ptr.dtype)


def _compress(major: torch.Tensor, n: int, index_dtype: torch.dtype) -> torch.Tensor:
    """Pointers (n + 1) of the sorted major indices ``major``: where each major index starts."""
    if _on_host(major):
        counts = np.bincount(major.contiguous().numpy(), minlength=n)
        out = np.empty(n + 1, dtype=np.int64 if index_dtype == torch.int64 else np.int32)
        out[0] = 0
        np.cumsum(counts, out=out[1:])
        return torch.from_numpy(out)
    q = _arange(n + 1, major.dtype, major)
    return _as_dtype(torch.searchsorted(major, q, out_int32=index_dtype == torch.int32), index_dtype)


#: Value dtypes SciPy's kernels move directly (others go through the value map).
_SCIPY_VALUE_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return -1


def _transpose(ptr: torch.Tensor, minor: torch.Tensor, nmaj: int, nmin: int, vals: torch.Tensor | None = None):
    """The other major: ``(ptr', crd', perm, vals')`` in the source's index dtype, entry ``s`` of
    the result being entry ``perm[s]`` of the source (a stable counting sort by the minor index).

    With ``vals`` (1-D values SciPy can move) and SciPy's kernel, the values are moved in the
    same pass and ``perm`` is a function computing the map on first use; else ``vals'`` is None."""
    nnz = minor.numel()
    tools = _sparsetools(nnz) if _on_host(ptr, minor) else None
    if tools is not None:
        p, c = ptr.contiguous().numpy(), minor.contiguous().numpy()

        def run(data: np.ndarray):
            bp = np.empty(nmin + 1, dtype=p.dtype)
            bi = np.empty(nnz, dtype=p.dtype)
            bx = np.empty(nnz, dtype=data.dtype)
            tools.csr_tocsc(nmaj, nmin, p, c, data, bp, bi, bx)
            return torch.from_numpy(bp), torch.from_numpy(bi), torch.from_numpy(bx)

        def perm() -> torch.Tensor:
            return run(np.arange(nnz, dtype=np.int64))[2]

        try:
            if vals is not None:
                bp_t, bi_t, bx_t = run(vals.contiguous().numpy())
                return bp_t, bi_t, perm, bx_t
            bp_t, bi_t, perm_t = run(np.arange(nnz, dtype=np.int64))
            return bp_t, bi_t, perm_t, None
        except (TypeError, ValueError):  # a SciPy whose kernels take other types: the torch path
            pass
    # A radix sort (on GPUs) of 16-bit keys makes half the passes of one of 32-bit keys, and a
    # quarter of one of 64-bit keys; the keys are the minor indices, below nmin.
    if nmin <= SORT16_MAX:
        skey = minor.to(torch.int16)
    elif nmin <= _INT32_MAX:
        skey = minor if minor.dtype == torch.int32 else minor.to(torch.int32)
    else:
        skey = minor
    key, perm = torch.sort(skey, stable=True)
    int32 = minor.dtype == torch.int32
    q = _arange(nmin + 1, key.dtype, minor)
    bp_t = torch.searchsorted(key, q, out_int32=int32)
    # the major index of each moved entry: the number of rows ending at or before its source slot
    # (the pointers in the permutation's dtype: searchsorted would cast both to a common one)
    rows = torch.searchsorted(_as_dtype(ptr[1:], perm.dtype), perm, right=True, out_int32=int32)
    return _as_dtype(bp_t, minor.dtype), _as_dtype(rows, minor.dtype), perm, None


def _direct(t: SparseTensor, fmt: TensorFormat, index_dtype: torch.dtype, values_too: bool = False,
            pair: tuple | None = None):
    """``(pos, crd, src, dst, nslots, vals)`` of ``t`` in ``fmt`` when both are CSR/CSC/COO-like (any
    dimension order), else None. ``src`` is None when the value slots keep their order, or a
    function computing it when ``vals`` (with ``values_too``) holds t's values converted.
    ``pair``: :func:`_direct_pair` of the two formats, when the caller has it."""
    if pair is None:
        pair = _direct_pair(t.format, fmt)
        if pair is None:
            return None
    (skind, smaj), (dkind, dmaj) = pair
    if skind == dkind and smaj == dmaj:
        return None  # the same layout: convert() casts the buffers
    pos, crd, tvals = t._linear_buffers()
    shape = t.format_shape
    nmaj, nmin = shape[smaj], shape[1 - smaj]
    minor = crd[1]
    nnz = minor.numel()
    idt = index_dtype
    if smaj != dmaj and _too_sparse(nmaj if skind == "coo" else 0, nmin if dkind == "coo" else 0, nnz):
        return None  # pointers over a hypersparse dimension the target does not store: the sorting path
    src = first = None
    if skind == "csr":
        ptr = pos[1]
    else:
        ptr = _compress(crd[0], nmaj, minor.dtype) if smaj != dmaj or dkind == "csr" else None
    if smaj != dmaj:
        movable = (values_too and tvals.dim() == 1 and tvals.dtype in _SCIPY_VALUE_DTYPES
                   and not tvals.requires_grad and _on_host(tvals))
        ptr, minor, src, first = _transpose(ptr, minor, nmaj, nmin, tvals if movable else None)
        nmaj, nmin = nmin, nmaj
    if dkind == "csr":
        return [None, _as_dtype(ptr, idt)], [None, _as_dtype(minor, idt)], src, None, nnz, first
    major = crd[0] if skind == "coo" and smaj == dmaj else _expand(ptr, nmaj, nnz)
    return [_ends(ptr, nmaj, nnz, idt), None], [_as_dtype(major, idt), _as_dtype(minor, idt)], src, None, nnz, first


def _too_sparse(src_extent: int, dst_extent: int, nnz: int) -> bool:
    """Whether a direct transpose would build pointer arrays over a dimension far longer than the entries
    that neither end stores densely (a COO source's rows, a COO target's new major dimension): a 2**62 x 4
    CSC to COO would allocate 2**62 row pointers. Ordinary shapes (below 2**31) never decline."""
    extent = max(src_extent, dst_extent)
    return extent > 2**31 and extent > 16 * (nnz + 1)


#: ``[0, nnz]`` pointer buffers of COO targets on GPUs, kept per (device, dtype, nnz) and shared
#: by the tensors converted since (at most this many kept; one written in place is replaced).
ENDS_KEPT = 256
_ENDS: dict = {}


def _ends(ptr: torch.Tensor, nmaj: int, nnz: int, idt: torch.dtype) -> torch.Tensor:
    """``[0, nnz]`` in ``idt`` on ``ptr``'s device: the top pointers of a COO target. On a GPU a
    kept buffer (a conversion launches one kernel fewer; the host time of a launch is a good
    part of a CSR -> COO of a million entries), else one copy kernel from a strided view of
    ``ptr`` (``[ptr[0], ptr[nmaj]]``, no host-to-device copy)."""
    key = (ptr.device, idt, nnz)
    got = _ENDS.get(key)  # GPU buffers only; no fake tensors
    if got is not None and _version(got[0]) == got[1] and is_plain(ptr):
        return got[0]
    if ptr.device.type == "cuda" and not _levels._compiling() and not torch.is_inference_mode_enabled():
        if is_plain(ptr) and not torch.cuda.is_current_stream_capturing():
            # a synchronous host-to-device copy: written when it returns, for kernels on any stream
            top = torch.tensor([0, nnz], dtype=idt).to(ptr.device)
            if len(_ENDS) >= ENDS_KEPT:
                _ENDS.clear()
            _ENDS[key] = (top, _version(top))
            return top
    if nmaj:
        ends = ptr[::nmaj]
        return ends.clone(memory_format=torch.contiguous_format) if ends.dtype == idt else ends.to(idt)
    return torch.stack([ptr[0], ptr[-1]]).to(idt)


def _as_dtype(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``b.to(dtype)`` without the call when it has that dtype already (a conversion's host path)."""
    return b if b.dtype == dtype else b.to(dtype)


# BSR and DIA through SciPy's compiled kernels (CPU, SciPy importable) -----------------------
#
# Each kernel runs once on t's values when they are plain CPU values SciPy can move (the
# converted values of the first apply), and the value map (source slot of each target slot, or
# target slot of each source entry) is computed on first use by the same kernel run on slot
# numbers. Shapes that are not multiples of the blocks, and other formats, take the general path.


_KERNEL_KINDS: dict = {}


def _block_of(fmt: TensorFormat) -> tuple[int, int] | None:
    """``(bh, bw)`` when ``fmt`` is BSR(bh, bw) (whatever its name), else None; remembered per
    format (building the reference BSR validates a format: tens of microseconds per conversion)."""
    key = ("bsr", fmt)
    got = _KERNEL_KINDS.get(key, _KERNEL_KINDS)
    if got is _KERNEL_KINDS:
        got = _find_block(fmt)
        if len(_KERNEL_KINDS) < 4096:
            _KERNEL_KINDS[key] = got
    return got


def _find_block(fmt: TensorFormat) -> tuple[int, int] | None:
    from ..format import BSR, FloorDiv  # noqa: PLC0415

    if fmt.ndim != 2 or fmt.num_levels != 4 or fmt.num_batch_levels:
        return None
    e0, e1 = fmt.levels[0].expr, fmt.levels[1].expr
    if not (isinstance(e0, FloorDiv) and isinstance(e1, FloorDiv)):
        return None
    ref = BSR(e0.c, e1.c)
    return (e0.c, e1.c) if fmt.levels == ref.levels and fmt.dims == ref.dims else None


def _dia_kind(fmt: TensorFormat) -> str | None:
    """``"DIA"`` or ``"DIA_J"`` when ``fmt`` is that layout (whatever its name), else None; remembered per format."""
    key = ("dia", fmt)
    got = _KERNEL_KINDS.get(key, _KERNEL_KINDS)
    if got is _KERNEL_KINDS:
        from ..format import DIA, DIA_J  # noqa: PLC0415

        got = next((name for name, ref in (("DIA", DIA), ("DIA_J", DIA_J))
                    if fmt.levels == ref.levels and fmt.dims == ref.dims), None)
        if len(_KERNEL_KINDS) < 4096:
            _KERNEL_KINDS[key] = got
    return got


def _np(b: torch.Tensor) -> np.ndarray:
    return b.contiguous().numpy()


def _kernel_path(t: SparseTensor, fmt: TensorFormat, index_dtype: torch.dtype, values_too: bool, guard):
    """``(pos, crd, src, dst, nslots, vals)`` through SciPy's kernels, or None."""
    if t.format.ndim != 2 or fmt.ndim != 2:
        return None
    if _pair_layout(t.format) == ("csr", 0) and _dia_kind(fmt) is not None:
        return _csr_to_dia(t, _dia_kind(fmt), index_dtype, guard, values_too)
    dia = _dia_kind(t.format)
    if (dia is not None and _pair_layout(fmt) == ("csr", 0) and not t.format.num_batch_levels
            and _on_host(t.crd(0), t.values)):
        got = _dia_rows_to_csr(t, index_dtype, values_too, dia)
        if got is not None:
            return got
    if (_pair_layout(t.format) == ("csr", 0) and not t.format.num_batch_levels and not fmt.num_batch_levels
            and (blk := _block_of(fmt)) is not None):
        got = _csr_to_bsr_plugin(t, blk, index_dtype, values_too, guard)
        if got is not None:
            return got
    tools = _sparsetools(t.nse or 0)
    if tools is None or t.format.num_batch_levels or fmt.num_batch_levels:
        return None
    pos, crd, tvals = t._linear_buffers()
    if not _on_host(*(b for b in (*pos, *crd) if b is not None)):
        return None
    movable = (values_too and tvals.dim() == 1 and tvals.dtype in _SCIPY_VALUE_DTYPES
               and not tvals.requires_grad and _on_host(tvals))
    vals = _np(tvals) if movable else None
    m, n = t.format_shape
    to_csr = _pair_layout(fmt) == ("csr", 0)
    try:
        if to_csr and (blk := _block_of(t.format)) is not None and m % blk[0] == 0 and n % blk[1] == 0:
            got = _bsr_to_csr(tools, blk, m, n, _np(pos[1]), _np(crd[1]), vals)
        elif to_csr and _dia_kind(t.format) is not None and hasattr(tools, "dia_tocsr"):
            got = _dia_to_csr(tools, _dia_kind(t.format), m, n, _np(crd[0]), vals)
        elif (_pair_layout(t.format) == ("csr", 0) and (blk := _block_of(fmt)) is not None
              and m % blk[0] == 0 and n % blk[1] == 0):
            return _csr_to_bsr(tools, blk, m, n, _np(pos[1]), _np(crd[1]), vals, index_dtype, guard)
        else:
            return None
    except SparseTorchError:
        raise  # the fill guard's refusal
    except (TypeError, ValueError):  # a SciPy whose kernels take other types: the general path
        return None
    if got is None:
        return None
    bp, bj, src, first = got
    return [None, bp.to(index_dtype)], [None, bj.to(index_dtype)], src, None, int(bj.numel()), first


_HALF = (torch.float16, torch.bfloat16)


def _csr_to_bsr_plugin(t: SparseTensor, blk: tuple[int, int], index_dtype: torch.dtype, values_too: bool, guard):
    """CSR -> BSR(bh, bw) on the CPU by a backend's compiled ``csr_to_bsr`` (one merge of each block
    row's sorted rows: canonical blocks without a sort), as :func:`_kernel_path` returns it; None
    when no backend has it, the shape is not a multiple of the blocks, or the kernel declines."""
    fn = _plugin_kernel("csr_to_bsr")
    if fn is None:
        return None
    m, n = t.format_shape
    bh, bw = blk
    if m % bh or n % bw:
        return None
    pos, crd, tvals = t._linear_buffers()
    if not _on_host(pos[1], crd[1]):
        return None
    ptr, col = _np(pos[1]), _np(crd[1])
    if ptr.dtype != col.dtype:
        return None
    vals = None
    if values_too and tvals.dim() == 1 and not tvals.requires_grad and _on_host(tvals):
        if tvals.dtype in _SCIPY_VALUE_DTYPES:
            vals = _np(tvals)
        elif tvals.dtype in _HALF:
            vals = _np(tvals.view(torch.int16))  # moved as bits
    nnz, bs = col.size, bh * bw
    max_blocks = 2**62 if guard is None else max(int(guard.bound(nnz)) // bs, 0)
    try:
        got = fn(bh, bw, m, n, ptr, col, vals, max_blocks, vals is None)
    except Exception as exc:  # noqa: BLE001 - a plugin's bug must not break a conversion
        _kernel_failed("csr_to_bsr", exc)
        return None
    if got is None:
        return None
    if isinstance(got, int):  # over max_blocks, so over the fill bound: the guard raises with its message
        if guard is not None:
            guard(got * bs, nnz)
        return None
    bp, bj, data, slots = got
    nblocks = int(bj.size)
    if index_dtype == torch.int32 and max(nblocks, n // bw) > _INT32_MAX:
        return None  # the general path says what does not fit
    first = None
    if data is not None:
        first = torch.from_numpy(data)
        if tvals.dtype in _HALF:
            first = first.view(tvals.dtype)

    def dst() -> torch.Tensor:
        again = fn(bh, bw, m, n, ptr, col, None, 2**62, True)
        return torch.from_numpy(again[3])

    out_pos = [None, torch.from_numpy(bp).to(index_dtype), None, None]
    out_crd = [None, torch.from_numpy(bj).to(index_dtype), None, None]
    return out_pos, out_crd, None, dst if slots is None else torch.from_numpy(slots), nblocks * bs, first


def _bsr_to_csr(tools, blk, m, n, ptr, bcol, vals):
    bh, bw = blk
    nslots = bcol.size * bh * bw

    def run(data: np.ndarray):
        bp = np.empty(m + 1, dtype=ptr.dtype)
        bj = np.empty(nslots, dtype=ptr.dtype)
        bx = np.empty(nslots, dtype=data.dtype)
        tools.bsr_tocsr(m // bh, n // bw, bh, bw, ptr, bcol, data, bp, bj, bx)
        return torch.from_numpy(bp), torch.from_numpy(bj), torch.from_numpy(bx)

    def perm() -> torch.Tensor:
        return run(np.arange(nslots, dtype=np.int64))[2]

    if vals is not None:
        bp, bj, bx = run(vals)
        return bp, bj, perm, bx
    bp, bj, bx = run(np.arange(nslots, dtype=np.int64))
    return bp, bj, bx, None


def _dia_to_csr(tools, kind, m, n, offsets, vals):
    """DIA_J is SciPy's layout (ncols slots per diagonal); DIA (nrows slots per diagonal) is
    SciPy's layout of the transpose, whose CSR is this matrix's CSC: one more counting sort."""
    nd = offsets.size
    it = offsets.dtype
    if vals is not None and vals.size != nd * (n if kind == "DIA_J" else m):
        return None
    if kind == "DIA_J":
        rows, cols, offs, order = m, n, offsets, np.arange(nd, dtype=it)
    else:
        rows, cols, offs, order = n, m, -offsets, np.arange(nd - 1, -1, -1, dtype=it)
    width = cols  # slots per diagonal
    lo = np.maximum(offs, 0)
    hi = np.minimum(np.minimum(width, cols), rows + offs.astype(np.int64))
    expect = int(np.maximum(hi - lo, 0).sum())  # slots inside the shape: the entries

    def run(data: np.ndarray):
        bx = np.empty(expect, dtype=data.dtype)
        bj = np.empty(expect, dtype=it)
        bp = np.empty(rows + 1, dtype=it)
        got = tools.dia_tocsr(rows, cols, nd, width, offs, data.reshape(nd, width), order, bx, bj, bp)
        if got != expect:  # explicit zeros were dropped by the kernel: not a pattern map
            return None
        if kind == "DIA_J":
            return bp, bj, bx
        cp = np.empty(m + 1, dtype=it)
        ci = np.empty(expect, dtype=it)
        cx = np.empty(expect, dtype=bx.dtype)
        tools.csr_tocsc(rows, cols, bp, bj, bx, cp, ci, cx)
        return cp, ci, cx

    def perm() -> torch.Tensor:
        got = run(np.arange(1, nd * width + 1, dtype=np.int64))
        assert got is not None  # slot numbers from 1: never zero
        return torch.from_numpy(got[2] - 1)

    if vals is not None:
        got = run(vals)
        if got is not None:
            return torch.from_numpy(got[0]), torch.from_numpy(got[1]), perm, torch.from_numpy(got[2])
    got = run(np.arange(1, nd * width + 1, dtype=np.int64))
    if got is None:
        return None
    return torch.from_numpy(got[0]), torch.from_numpy(got[1]), torch.from_numpy(got[2] - 1), None


#: CSR -> BSR sorts the keys of block rows of more than two rows in runs of whole block rows of
#: about this many entries: the blocks of different block rows are already in order, and a run
#: this size stays in the core's cache (1M random keys here: one sort 11 ms, in runs of 2048
#: about 7 ms). Block rows of two rows are two sorted runs each: one stable sort (NumPy's timsort
#: merges the runs; 1M random keys of BSR(2, 2) here: 6-8 ms, 12-16 ms in runs).
BSR_SORT_RUN = 2048

#: CSR -> BSR moves values of these dtypes through SciPy's ``csr_tobsr`` as integers of the same
#: size: the kernel adds each value to a zeroed slot, and 0.0 + -0.0 is +0.0, where integer
#: bits are copied exactly. Other value dtypes (complex128) move by one gather and one scatter.
_BSR_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64, np.dtype(np.complex64): np.int64}


def _csr_to_bsr(tools, blk, m, n, ptr, col, vals, index_dtype, guard):
    """CSR -> BSR with sorted blocks (what SciPy's ``tobsr`` + ``sort_indices`` give).

    Each entry gets a key: its block row (a whole number of bits) above its place in the block
    row, ``block column * bh * bw + slot in the block``, with the entry's position in the CSR
    buffers below the key. Sorting the plain keys (NumPy's sort of plain integers; the keys are
    distinct, so stability does not matter; see :data:`BSR_SORT_RUN`) puts the entries in slot
    order and carries the permutation along. With SciPy's kernels (``tools``) the sorted places
    are a CSR of one row per block row whose ``1 x bh*bw`` blocks are the BSR blocks: SciPy's
    ``csr_count_blocks`` and ``csr_tobsr`` give the pointers, the block columns (in sorted
    order, as the places are sorted) and the values (moved as integer bits, exact) in one pass
    each. Without them, NumPy: a block starts where the block column changes or a block row
    begins; the running count of the starts is each entry's block rank. The map from CSR
    entries to slots is computed on first use (until then the conversion holds the sorted
    places and the permutation). Where they fit, keys and positions are the two int32 halves of
    one int64 and buffers are reused in place: every step is bound by memory traffic."""
    bh, bw = blk
    bs = bh * bw
    nnz = col.size
    nbr, nbc = m // bh, n // bw
    pb_row = max(nbc * bs - 1, 0).bit_length()  # bits of the place in a block row
    kb = max(nbr - 1, 0).bit_length() + pb_row  # bits of a key
    if kb > 62:
        return None  # no int64 key: the general path
    small = kb <= 31 and nnz < _INT32_MAX and sys.byteorder == "little"
    kt = np.int32 if small else np.int64
    i = np.arange(m, dtype=kt)
    part = np.repeat(((i // bh) << pb_row) + (i % bh) * bw, np.diff(ptr))  # the row's part of each key
    if n <= 4 * nnz + 4096:
        j = np.arange(n, dtype=kt)
        cpart = np.take((j // bw) * bs + j % bw, col)  # the column's part
    else:  # few entries in many columns: no table over the columns
        c = col.astype(kt)
        cpart = c // bw
        cpart *= bs
        cpart += c % bw
    if small:
        enc = np.arange(nnz, dtype=np.int64)  # positions in the low halves ...
        key = enc.view(np.int32)[1::2]  # ... keys in the high halves
        np.add(part, cpart, out=key)
        mask = (1 << 32) - 1
    else:
        key = part
        key += cpart
        pb = max(nnz - 1, 1).bit_length()
        if kb + pb <= 63:
            enc = key << pb
            enc |= np.arange(nnz, dtype=np.int64)
            mask = (1 << pb) - 1
        else:  # no room for the positions: an argsort for the permutation
            enc, mask = np.argsort(key, kind="stable"), 0
            key = key[enc]
    del part, cpart
    if mask:
        if bh == 2:
            enc.sort(kind="stable")
        elif bh > 2 or not _increasing(enc):  # one row per block row: in order already
            _sort_block_rows(enc, ptr[::bh])
        if not small:
            key = enc >> mask.bit_length()
    nit = np.int32 if index_dtype == torch.int32 else np.int64  # cast here: one thread, no torch pool
    # the kernel's index type holds the places and the slot offsets (blocks * bh * bw <= nnz * bh * bw)
    kit = nit if nit == np.int64 or (nbc * bs <= _INT32_MAX and nnz * bs <= _INT32_MAX) else np.int64
    bits = _BSR_BITS.get(vals.dtype) if vals is not None else None
    kernel = (bits is not None and tools is not None and hasattr(tools, "csr_tobsr")
              and hasattr(tools, "csr_count_blocks") and nbc <= 4 * nnz + 65536)  # a table over the block columns
    low = np.bitwise_and(key, (1 << pb_row) - 1, dtype=kit if kernel else np.int64)  # places, in slot order
    del key
    order = enc
    if mask:
        order &= mask  # the CSR position of each entry, in slot order
    first = slot = None
    if kernel:
        ap = np.ascontiguousarray(ptr[::bh], dtype=kit)  # each block row's first entry
        nblocks = int(tools.csr_count_blocks(nbr, nbc * bs, 1, bs, ap, low))
        nslots = nblocks * bs
        if guard is not None:
            guard(nslots, nnz)
        bp = np.empty(nbr + 1, dtype=kit)
        bj = np.empty(nblocks, dtype=kit)
        out = np.zeros(nslots, dtype=bits)
        tools.csr_tobsr(nbr, nbc * bs, 1, bs, ap, low, np.take(vals.view(bits), order), bp, bj, out)
        first = torch.from_numpy(out.view(vals.dtype))
        bp, bj = bp.astype(nit, copy=False), bj.astype(nit, copy=False)
    else:
        ap = ptr[::bh]
        bp, bj, slot = _bsr_slots(low, ap, bs, nbr, nit)
        nslots = int(bj.size) * bs
        if guard is not None:
            guard(nslots, nnz)
        if vals is not None:
            out = np.zeros(nslots, dtype=vals.dtype)
            out[slot] = np.take(vals, order)
            first = torch.from_numpy(out)

    def dst() -> torch.Tensor:
        out = np.empty(nnz, dtype=np.int64)
        out[order] = slot if slot is not None else _bsr_slots(low, ap, bs, nbr, nit)[2]
        return torch.from_numpy(out)

    pos = [None, torch.from_numpy(bp), None, None]
    crd = [None, torch.from_numpy(bj), None, None]
    return pos, crd, None, dst if vals is not None else dst(), nslots, first


def _bsr_slots(low: np.ndarray, ap: np.ndarray, bs: int, nbr: int, nit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(bp, bj, slot)`` of the BSR whose entries, in slot order, have the places ``low`` (block
    column * ``bs`` + slot in the block) and whose block row ``i`` holds entries
    ``ap[i]:ap[i + 1]``: the block pointers and columns (in ``nit``), and each entry's slot."""
    nnz = low.size
    sh = bs.bit_length() - 1
    bc = low >> sh if bs == 1 << sh else low // bs  # block columns
    new = np.empty(nnz, dtype=np.int64)  # 1 at the first entry of each block: summed, each entry's block rank
    if nnz:
        new[0] = 0
        np.not_equal(bc[1:], bc[:-1], out=new[1:], casting="unsafe")
        starts = np.asarray(ap[:nbr])
        inside = starts < nnz
        new[starts[inside & (starts > 0)]] = 1  # a block row starts a block
    first = new.astype(bool)
    if nnz:
        first[0] = True
    # each entry's block rank (torch's int64 scan: a third of NumPy's cumsum time)
    rank = torch.from_numpy(new).cumsum_(0).numpy() if nnz else new
    nblocks = int(rank[-1]) + 1 if nnz else 0
    bj = bc[first].astype(nit, copy=False)
    bp = np.full(nbr + 1, nblocks, dtype=nit)
    if nnz:
        bp[:nbr][inside] = rank[starts[inside]]
    slot = rank  # the slot of each entry: its block's rank times the block size, plus its place in the block
    slot *= bs
    slot += low
    slot -= bc * bs
    return bp, bj, slot


def _sort_block_rows(keys: np.ndarray, starts: np.ndarray) -> None:
    """Sort ``keys`` in place, where keys of later block rows (from ``starts``) are larger: in
    runs of whole block rows of about :data:`BSR_SORT_RUN` keys."""
    n = keys.size
    if n <= 2 * BSR_SORT_RUN:
        keys.sort()
        return
    lo = 0
    for hi in starts[np.searchsorted(starts, np.arange(BSR_SORT_RUN, n, BSR_SORT_RUN))].tolist():
        if hi > lo:
            keys[lo:hi].sort()
            lo = hi
    keys[lo:].sort()


def _increasing(a: np.ndarray) -> bool:
    return a.size < 2 or bool((a[1:] > a[:-1]).all())


def _csr_to_dia(t: SparseTensor, kind: str, index_dtype: torch.dtype, guard, values_too: bool):
    """CSR -> DIA / DIA_J without a sort: the diagonals present come from a count over the
    ``m + n - 1`` possible offsets (ascending by construction), each entry's slot from its
    diagonal's rank and its row (DIA) or column (DIA_J). NumPy on the CPU (one thread: torch's
    parallel elementwise kernels lose to it on small shared machines), torch elsewhere."""
    pos, crd, tvals = t._linear_buffers()
    m, n = t.format_shape
    ptr, col = pos[1], crd[1]
    nnz = col.numel()
    width = m if kind == "DIA" else n
    first = None
    if _on_host(ptr, col):
        c = _np(col).astype(np.int64, copy=False)
        r = _expand(ptr, m, nnz).numpy().astype(np.int64, copy=False)
        diag = c - r
        diag += m - 1  # in [0, m + n - 1)
        present = np.bincount(diag, minlength=max(m + n - 1, 0)) > 0
        offsets_np = np.flatnonzero(present) - (m - 1)
        nslots = offsets_np.size * width
        if guard is not None:
            guard(nslots, nnz)
        rank = np.cumsum(present) - 1
        dst_np = rank[diag]
        dst_np *= width
        dst_np += r if kind == "DIA" else c
        dst = torch.from_numpy(dst_np)
        offsets = torch.from_numpy(offsets_np)
        if (values_too and tvals.dim() == 1 and tvals.dtype in _SCIPY_VALUE_DTYPES and not tvals.requires_grad
                and _on_host(tvals)):
            out = np.zeros(nslots, dtype=_np(tvals).dtype)
            out[dst_np] = _np(tvals)
            first = torch.from_numpy(out)
    else:
        dev = col.device
        row = _expand(ptr, m, nnz).long()
        diag_t = col.long() - row + (m - 1)
        present_t = (torch.bincount(diag_t, minlength=max(m + n - 1, 0)) > 0 if nnz
                     else torch.zeros(max(m + n - 1, 0), dtype=torch.bool, device=dev))
        offsets = torch.nonzero(present_t).reshape(-1) - (m - 1)
        nslots = int(offsets.numel()) * width
        if guard is not None:
            guard(nslots, nnz)
        rank_t = torch.cumsum(present_t, 0) - 1
        dst = rank_t.index_select(0, diag_t) * width + (row if kind == "DIA" else col.long())
    top = torch.full((2,), int(offsets.numel()), dtype=index_dtype, device=col.device)
    top[0] = 0
    return [top, None], [offsets.to(device=col.device, dtype=index_dtype), None], None, dst, nslots, first


#: DIA_J -> CSR takes :func:`_dia_rows_to_csr` (NumPy) from this many diagonals on, when at most
#: :data:`DIA_J_MAX_EDGE_SHARE` of the entries lie in the edge rows (those that do not hold every
#: diagonal); fewer diagonals, or more entries in the edge rows, take SciPy's ``dia_tocsr`` where
#: SciPy is there (measured on 20000 x 20000: a band of 50 diagonals in 0.65-0.9x the kernel's
#: time; 5-20 diagonals, or half the entries in edge rows, in 1.3-2.4x)
DIA_J_MIN_DIAGONALS = 24
DIA_J_MAX_EDGE_SHARE = 0.125
#: :func:`_dia_rows_to_csr` moves the middle rows' values by one strided copy per diagonal from
#: this many diagonals on (or where the diagonals' value slots are not evenly spaced), else by one
#: copy from a strided view of them all (as DIA's transposed value array); it writes the column
#: indices by one broadcast addition from half as many diagonals on, else one per diagonal (what
#: was faster on 20000 rows here: NumPy's copy and addition run along the output's rows)
DIA_COPY_PER_DIAGONAL = 24


def _dia_rows_to_csr(t: SparseTensor, index_dtype: torch.dtype, values_too: bool, kind: str = "DIA"):
    """DIA (``nrows`` slots per diagonal) or DIA_J (``ncols`` slots per diagonal) -> CSR on the
    CPU (NumPy). Diagonal ``k`` holds rows ``[r0[k], r1[k])`` (``0 <= i + offset[k] < ncols``),
    the value of row ``i`` at slot ``base[k] + i`` (``base[k] = k * nrows`` for DIA, ``k *
    ncols + offset[k]`` for DIA_J); with the offsets ascending, row ``i`` holds a range of
    diagonals, in offset order. Rows ``[lo, hi)`` hold every diagonal: in the output they are a
    ``(hi - lo, diagonals)`` block, written by slices of the value array (see
    :data:`DIA_COPY_PER_DIAGONAL`), no index arrays; the rows above and below (at most the
    offsets' span) are gathered entry by entry. None (another path converts) when the values
    or offsets are not what a valid tensor has, or for a DIA_J that SciPy's kernel converts
    faster (:data:`DIA_J_MIN_DIAGONALS`)."""
    _, crd, tvals = t._linear_buffers()
    m, n = t.format_shape
    off = _np(crd[0]).astype(np.int64, copy=False)
    nd = off.size
    width = m if kind == "DIA" else n
    if tvals.shape[-1] != nd * width or (nd > 1 and not bool((off[1:] > off[:-1]).all())):
        return None
    kernel = kind != "DIA" and _sparsetools(t.nse or 0) is not None and hasattr(_sparsetools(t.nse), "dia_tocsr")
    if kernel and nd < DIA_J_MIN_DIAGONALS:
        return None
    base = np.arange(nd, dtype=np.int64) * width
    if kind != "DIA":
        base += off
    r0 = np.clip(-off, 0, m)  # diagonal k's rows: [r0[k], r1[k]); both non-increasing in k
    r1 = np.maximum(np.clip(n - off, 0, m), r0)
    lo = int(r0[0]) if nd else 0
    hi = max(int(r1[-1]) if nd else m, lo)  # rows [lo, hi) hold every diagonal
    erows = np.concatenate([np.arange(lo, dtype=np.int64), np.arange(hi, m, dtype=np.int64)])
    # the edge rows' diagonals [klo, khi): those whose rows have begun and not ended
    klo = nd - np.searchsorted(r0[::-1], erows, side="right")
    ecount = np.maximum(nd - np.searchsorted(r1[::-1], erows, side="right") - klo, 0)
    nedge = int(ecount.sum())
    if kernel and nedge > DIA_J_MAX_EDGE_SHARE * (nedge + (hi - lo) * nd):
        return None
    it = np.int32 if index_dtype == torch.int32 else np.int64  # the buffers' dtype (int32: columns, entries fit)
    counts = np.full(m, nd, dtype=it)
    counts[:lo] = ecount[:lo]
    counts[hi:] = ecount[lo:]
    ptr = np.empty(m + 1, dtype=it)
    ptr[0] = 0
    np.cumsum(counts, out=ptr[1:])
    nnz = int(ptr[-1])
    a, b = int(ptr[lo]), int(ptr[hi])
    # the edge rows' entries, in row order (out[:a], then out[b:]): row, diagonal
    erow = np.repeat(erows, ecount)
    estart = np.cumsum(ecount) - ecount
    ek = np.arange(nedge, dtype=np.int64) - np.repeat(estart - klo, ecount)

    def fill(dtype, middle: Callable[[np.ndarray], None], edges: np.ndarray) -> np.ndarray:
        """The stored slots in row order: ``middle(out)`` writes the middle rows' ``(hi - lo,
        nd)`` block ``out``, ``edges`` holds the edge rows'."""
        out = np.empty(nnz, dtype=dtype)
        middle(out[a:b].reshape(hi - lo, nd))
        out[:a] = edges[:a]
        out[b:] = edges[a:]
        return out

    def add(rows: np.ndarray, by: np.ndarray) -> Callable[[np.ndarray], None]:
        """``out[r, k] = rows[r] + by[k]``."""
        def middle(o: np.ndarray) -> None:
            if nd >= DIA_COPY_PER_DIAGONAL // 2:
                np.add(rows[:, None], by[None, :], out=o)
            else:
                for k in range(nd):
                    np.add(rows, by[k], out=o[:, k])
        return middle

    col = fill(it, add(np.arange(lo, hi, dtype=it), off.astype(it)), erow + off[ek])

    def src() -> torch.Tensor:
        return torch.from_numpy(fill(np.int64, add(np.arange(lo, hi, dtype=np.int64), base), base[ek] + erow))

    first = None
    if values_too and tvals.dim() == 1 and tvals.dtype in _SCIPY_VALUE_DTYPES and not tvals.requires_grad:
        v = _np(tvals)
        step = int(base[1] - base[0]) if nd > 1 else 0
        even = nd < 2 or bool((np.diff(base) == step).all())

        def middle(o: np.ndarray) -> None:  # o[r, k] = v[base[k] + lo + r]
            if hi <= lo or not nd:
                return
            if nd < DIA_COPY_PER_DIAGONAL and even:
                view = np.lib.stride_tricks.as_strided(v[int(base[0]) + lo:], shape=(hi - lo, nd),
                                                       strides=(v.itemsize, step * v.itemsize), writeable=False)
                np.copyto(o, view)
            else:
                for k in range(nd):
                    np.copyto(o[:, k], v[base[k] + lo:base[k] + hi])

        first = torch.from_numpy(fill(v.dtype, middle, v[base[ek] + erow]))
        perm = src
    else:
        perm = src()  # type: ignore[assignment]
    return [None, torch.from_numpy(ptr)], [None, torch.from_numpy(col)], perm, None, nnz, first
