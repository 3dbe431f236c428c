"""`SparseTensor`: a format plus its level buffers and values, all torch tensors on one device."""

from __future__ import annotations

import math
import weakref
from typing import Any, Sequence

import torch

from ..errors import InputError, ValidationError
from ..format import TensorFormat
from . import _levels
from ._access import AccessMethods
from ._display import sparse_repr
from ._elementwise import ElementwiseMethods, torch_function_handler
from ._views import ViewMethods
from .pattern import PatternKey, buffer_id as _buffer_id, fingerprint, is_plain, vmapped  # noqa: F401 - vmapped re-exported
from .validate import _check_levels, _versions, check_index_buffers, check_shape, check_values

__all__ = ["SparseTensor", "Tensor", "PatternKey", "rebuild_sparse_tensor"]


class SparseTensor(ViewMethods, AccessMethods, ElementwiseMethods):
    """A sparse tensor in any :class:`~sparsetorch.format.TensorFormat`.

    ``SparseTensor(format, shape, pos, crd, values, check=True)`` wraps existing buffers without
    copying: ``pos[k]``/``crd[k]`` are level ``k``'s position and coordinate buffers (``None``
    where the level has none), ``values`` holds one value per stored slot in its last dimension.
    Leading dimensions of ``values`` beyond the format's are a *batch of value sets sharing one
    pattern*, so ``shape`` is ``batch_shape + format_shape``. Most users build tensors with
    :meth:`from_dense`, :meth:`from_coo` or :func:`sparsetorch.from_package`.

    Tensors are immutable in structure: operations return new tensors and share buffers
    where they can (``T``, ``with_values``, ``convert`` to the same layout). Values may be
    updated in place: :meth:`copy_` (from a tensor on the same pattern), :meth:`run_kernel`
    (a user transformation set with :meth:`set_kernel`); :meth:`get_value` reads one entry.

    ``check=True`` (the default) validates every index buffer before the tensor exists: dtypes
    and devices, lengths, ``pos`` starting at 0 and non-decreasing, every coordinate inside the
    shape, order and uniqueness where the format declares them. Bad buffers raise
    :class:`~sparsetorch.ValidationError` naming the buffer, the level and the bad value.
    ``check=False`` skips the O(nnz) content checks (starts, monotonicity, ranges, order,
    uniqueness) and *trusts the buffers as they are now*; the cheap structural checks (presence,
    dtypes, devices, buffer lengths, ``pos[-1]`` against the length of ``crd``) still run.
    Either way the version counters of the index buffers are recorded, and
    :meth:`ensure_valid` (run by every op and by interop and conversion before compiled code
    reads the buffers) validates them again if one was written in place since. Writes torch
    cannot see (through memory shared with NumPy/SciPy/CuPy after ``from_package``) are not
    detected: call :meth:`validate` after such writes.

    The everyday tensor API (``size``, ``numel``, ``sum``, ``amax``, ``abs``, ``A * B``, ``A * t``,
    ``A + t``, ``A[i, j]``, ``diagonal``, ``torch.sum(A)``, ``torch.equal(A, B)``, ...) means what it
    means on ``to_dense()``; see :class:`~sparsetorch.tensor._elementwise.ElementwiseMethods` and
    docs/tensor.md, "Everyday tensor operations". ``A == B`` is *identity* (tensors are hashed and
    cached by identity): compare contents with ``torch.equal(A, B)`` (same shape and dense content,
    any formats) or ``A.equal(B)`` (same format and bit-identical buffers).
    """

    __slots__ = ("_format", "_shape", "_pos", "_crd", "_values", "_linear", "_derived", "_index", "_checked",
                 "_kernel", "__weakref__")

    def __init__(
        self,
        format: TensorFormat | str,
        shape: Sequence[int],
        pos: Sequence[torch.Tensor | None] | None = None,
        crd: Sequence[torch.Tensor | None] | None = None,
        values: torch.Tensor | None = None,
        *,
        check: bool = True,
    ) -> None:
        if isinstance(format, torch.Tensor) or pos is None or crd is None or values is None:
            raise ValidationError(
                "SparseTensor(format, shape, pos, crd, values) takes a format's level buffers; from triplets write "
                "SparseTensor.from_coo(values, row, col, shape=(m, n)) (torch-sla's SparseTensor(values, row, col, "
                "shape)), from a torch / SciPy / CuPy / NumPy matrix sparsetorch.from_package(x), from a dense tensor "
                "SparseTensor.from_dense(d)")
        if isinstance(format, str):
            format = TensorFormat.parse(format)
        if not isinstance(format, TensorFormat):
            raise ValidationError(f"format must be a TensorFormat or its string form, got {type(format).__name__}")
        if not isinstance(values, torch.Tensor):
            raise ValidationError(f"values must be a torch.Tensor, got {type(values).__name__}")
        shape = check_shape(shape)
        nb = format.num_batch_levels
        nd = format.ndim
        if len(shape) == nd:
            fshape = shape
            nvb = values.dim() - 1 - nb
            if nvb < 0:
                raise ValidationError(
                    f"values of shape {tuple(values.shape)} lack the {nb} batch dimension(s) of format {format}"
                )
            shape = tuple(values.shape[:nvb]) + fshape
        elif len(shape) > nd:
            fshape = shape[len(shape) - nd :]
            nvb = len(shape) - nd
            if tuple(values.shape[:nvb]) != shape[:nvb]:
                raise ValidationError(
                    f"shape {shape} has batch {shape[:nvb]} but values have leading dims {tuple(values.shape[:nvb])}"
                )
            if values.dim() != nvb + nb + 1:
                raise ValidationError(
                    f"values must have {nvb + nb + 1} dims for shape {shape} and format {format}, got {tuple(values.shape)}"
                )
        else:
            raise ValidationError(f"shape {shape} has fewer dimensions than format {format} ({nd})")
        index_dtype = next((b.dtype for b in (*pos, *crd) if isinstance(b, torch.Tensor)), format.index_dtype or torch.int64)
        pos, crd = list(pos), list(crd)
        check_index_buffers(format, fshape, pos, crd, values.device)
        if nb:
            bsizes = tuple(format.level_sizes(fshape)[:nb])
            if tuple(values.shape[nvb : nvb + nb]) != bsizes:
                raise ValidationError(f"values must have batch dims {bsizes} after the shared batch, got {tuple(values.shape)}")
        index = tuple(b for b in (*pos, *crd) if b is not None)
        # The versions the checks below vouch for (read first: a write during the checks shows).
        checked = _versions(index)
        lpos, lcrd, lvals, nslots = _check_levels(format, fshape, pos, crd, values, check=check)
        check_values(lvals, nslots)
        if format.index_dtype != index_dtype:
            format = format.replace(index_dtype=index_dtype)
        self._format = format
        self._shape = shape
        self._pos = tuple(pos)
        self._crd = tuple(crd)
        self._values = values
        self._linear = (lpos, lcrd, lvals) if nb else None
        self._index = index
        self._checked = checked
        # Pattern-derived data (entry coordinates, conversion maps), shared by with_values().
        self._derived: dict = {}

    @classmethod
    def _assembled(cls, format: TensorFormat, format_shape: Sequence[int], pos: Sequence[torch.Tensor | None],
                   crd: Sequence[torch.Tensor | None], values: torch.Tensor, index: tuple,
                   checked: Any, derived: dict | None = None) -> "SparseTensor":
        """A tensor from parts known valid (no BATCH levels): index buffers validated before
        (``checked``: the versions they were validated at) or built correct by this package. No
        check runs and nothing is read back; every slot is set here (the one place besides
        ``__init__`` that knows them). ``derived``: pattern-derived data to share."""
        out = cls.__new__(cls)
        out._format, out._pos, out._crd, out._values, out._linear = format, tuple(pos), tuple(crd), values, None
        fs = tuple(map(int, format_shape))
        out._shape = fs if values.dim() == 1 else tuple(values.shape[:-1]) + fs
        out._index, out._checked = index, checked
        out._derived = {} if derived is None else derived
        return out

    # Validity of the index buffers ---------------------------------------------------------------
    def ensure_valid(self) -> "SparseTensor":
        """Make sure the index buffers are still valid before compiled code reads them.

        Compares the torch version counters of the index buffers with those recorded when they
        were last validated (O(levels) attribute reads, no device synchronization); only when
        one was written in place since are the buffers validated again, in full. Raises
        :class:`~sparsetorch.ValidationError` naming the level and what is wrong; the tensor
        stays unusable until its buffers are repaired (a later call checks again). Returns
        ``self``. Every op, ``to_package``, ``convert`` and ``A @ x`` call this.
        """
        try:
            now = tuple([b._version for b in self._index])
        except RuntimeError:  # inference-mode tensors keep no version counter
            now = _versions(self._index)
        if now != self._checked:
            self._revalidate(now)
        return self

    def validate(self) -> "SparseTensor":
        """Validate every index buffer now, in full (O(nnz)), whatever the version counters say:
        for buffers written through memory torch does not track (NumPy/SciPy/CuPy arrays that
        share it after ``from_package``). Raises :class:`~sparsetorch.ValidationError`; returns ``self``.

        Where the buffers' contents changed since what is cached of them was derived (their fingerprint,
        :attr:`pattern_fingerprint`, differs; with none cached, for buffers wrapped from another package,
        whose writes torch does not see), their version counters are moved on, as a torch write would move
        them: what was derived from the old contents (cached coordinates, conversion maps, product and solve
        plans, on this tensor and on every tensor sharing the buffers) is made again from what they hold now
        (a NumPy write that sorted a row's indices left ``A @ x`` on the old plan; session 26's sweep).
        Unchanged contents keep their counters: a defensive ``validate()`` in a loop costs the O(nnz) check,
        not new plans."""
        from torch.autograd.graph import increment_version

        from .interop._origin import origin_package

        bufs = [b for b in (*self._pos, *self._crd) if b is not None]
        now = fingerprint(self._format, self.format_shape, self.index_dtype, self.device, bufs)
        cached = self._derived.get("fingerprint")
        changed = cached != now if (cached is not None and now is not None) else origin_package(self) != "torch"
        if changed:
            for b in self._index:
                if not b.is_inference():  # inference tensors keep no counter (and nothing caches by it)
                    increment_version(b)
        self._revalidate(_versions(self._index), why="validate()")
        if now is not None:
            self._cache["fingerprint"] = now  # what the next validate() compares with
        return self

    def _revalidate(self, now: tuple, why: str | None = None) -> None:
        fmt, fs = self._format, self.format_shape
        try:
            check_index_buffers(fmt, fs, list(self._pos), list(self._crd), self._values.device)
            lpos, lcrd, lvals, nslots = _check_levels(fmt, fs, list(self._pos), list(self._crd), self._values, check=True)
            if lvals.shape[-1] != nslots:
                raise ValidationError(
                    f"the index buffers now describe {nslots} value slots, but values hold {lvals.shape[-1]}"
                )
        except ValidationError as e:
            when = why or "an index buffer was written in place (its torch version counter changed) since it was last checked"
            raise ValidationError(
                f"this SparseTensor's index buffers are not valid: {e}. Checked because {when}. "
                f"Repair the buffer, or rebuild the tensor from valid indices (SparseTensor.from_coo); "
                f"nothing was handed to compiled code"
            ) from None
        if self._linear is not None:
            self._linear = (lpos, lcrd, self._linear[2])
        self._checked = now

    @property
    def _cache(self) -> dict:
        """The pattern-derived cache, emptied if an index buffer was written in place since
        (the buffers are validated again first)."""
        self.ensure_valid()
        token = self._checked
        if self._derived.get("__versions__") != token:
            self._derived.clear()
            self._derived["__versions__"] = token
        if torch.is_inference_mode_enabled():
            # what is derived under inference mode is made of inference tensors, which a later call
            # with autograd cannot use (to_dense after a validation pass raised "Inference tensors
            # cannot be saved for backward"; session 21's sweep): read the cache, keep nothing new
            return dict(self._derived)
        return self._derived

    def clear_cache(self) -> None:
        """Drop pattern-derived data (entry coordinates, conversion maps) kept on this pattern."""
        self._derived.clear()

    # Basic facts -------------------------------------------------------------------------------
    @property
    def format(self) -> TensorFormat:
        return self._format

    tensor_format = format  # UST spelling

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._shape)

    extents = shape

    @property
    def format_shape(self) -> tuple[int, ...]:
        """The extents of the format's dimensions (``shape`` without the shared value batch)."""
        return self._shape[len(self._shape) - self._format.ndim :]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading dimensions of value sets that share this pattern."""
        return self._shape[: len(self._shape) - self._format.ndim]

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    @property
    def values(self) -> torch.Tensor:
        return self._values

    val = values

    def pos(self, level: int) -> torch.Tensor | None:
        return self._pos[level]

    def crd(self, level: int) -> torch.Tensor | None:
        return self._crd[level]

    @property
    def pos_buffers(self) -> tuple[torch.Tensor | None, ...]:
        return self._pos

    @property
    def crd_buffers(self) -> tuple[torch.Tensor | None, ...]:
        return self._crd

    @property
    def dtype(self) -> torch.dtype:
        return self._values.dtype

    @property
    def index_dtype(self) -> torch.dtype:
        return self._format.index_dtype or torch.int64

    @property
    def device(self) -> torch.device:
        return self._values.device

    @property
    def requires_grad(self) -> bool:
        return self._values.requires_grad

    @property
    def nse(self) -> int:
        """Number of stored value slots per value set (explicit zeros and padding included)."""
        nvb = len(self.batch_shape)
        return math.prod(self._values.shape[nvb:])

    @property
    def nnz(self) -> int:
        """Stored slots per value set (same as ``nse``; padding and explicit zeros count)."""
        return self.nse

    def _linear_buffers(self):
        """Linearized ``(pos, crd, values)``, validated (:meth:`ensure_valid`) before they are read."""
        self.ensure_valid()
        if self._linear is not None:
            return self._linear
        return list(self._pos), list(self._crd), self._values

    # Coordinates and dense ---------------------------------------------------------------------
    def entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(indices, slots)``: the (ndim, n) coordinates of every stored entry inside the shape
        and the index of its value slot (in the linearized value array). Pattern-only, cached."""
        cache = self._cache
        got = cache.get("entries")
        if got is None:
            lpos, lcrd, _ = self._linear_buffers()
            got = _levels.decompose(self._format, self.format_shape, lpos, lcrd, device=self.device)
            if is_plain(got[0]):
                cache["entries"] = got
        return got

    def coordinates(self, *, keep_padding: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(indices, values)``: the (ndim, n) coordinates of every stored entry inside the
        shape, and their values (``batch_shape + (n,)``), in storage order."""
        _, _, lvals = self._linear_buffers()
        if keep_padding:
            lpos, lcrd, _ = self._linear_buffers()
            coords, slot = _levels.decompose(self._format, self.format_shape, lpos, lcrd, keep_padding=True, device=self.device)
        else:
            coords, slot = self.entries()
        return coords, lvals[..., slot]

    def to_dense(self) -> torch.Tensor:
        """A strided tensor of ``shape`` (duplicates of a nonunique format are summed)."""
        fs = self.format_shape
        nflat = math.prod(fs)
        if nflat * max(1, math.prod(self.batch_shape)) > 2**63 - 1:
            raise InputError(f"to_dense: the dense form of shape {tuple(self._shape)} has "
                             f"{nflat * max(1, math.prod(self.batch_shape)):.3g} elements, more than a tensor can "
                             f"index (2^63 - 1); work with the sparse tensor (or a slice of it)")
        coords, vals = self.coordinates()
        lin = torch.zeros(coords.shape[1], dtype=torch.int64, device=self.device)
        for k, size in enumerate(fs):
            lin = lin * size + coords[k]
        flat = vals.reshape(math.prod(self.batch_shape), vals.shape[-1])
        out = flat.new_zeros(flat.shape[0], nflat).index_add(1, lin, flat)
        return out.reshape(self._shape)

    # Construction -----------------------------------------------------------------------------
    @classmethod
    def from_coo(
        cls,
        values: torch.Tensor,
        *indices: torch.Tensor,
        shape: Sequence[int] | None = None,
        format: TensorFormat | str | None = None,
        index_dtype: torch.dtype | None = None,
        check: bool = True,
        max_fill: float | None = None,
    ) -> "SparseTensor":
        """Build from coordinate triplets, summing duplicates.

        ``SparseTensor.from_coo(values, row, col, shape=(m, n))`` or with one (ndim, n) index
        tensor. ``values`` may carry leading batch dimensions (value sets sharing the pattern);
        ``shape`` is the pattern's, or the batch followed by it. With no ``format``, sorted unique
        triplets give COO and others are kept as given (an unordered COO, repeats summed wherever
        it is read): either way the tensor's values are ``values`` itself, so ``with_values`` takes
        values in the triplets' order (docs/tensor.md, "Triplets"). With ``format`` the triplets
        are sorted and summed into it, a copy; gradients flow back to ``values``.

        ``check=True`` verifies that every index lies inside ``shape``; ``check=False`` skips
        that scan (out-of-range indices then make wrong buffers: pass it only for indices known
        to be in range). ``max_fill`` bounds the padding of ``format`` as in :meth:`convert`.
        """
        from .construct import from_coo

        return from_coo(values, indices, shape=shape, format=format, index_dtype=index_dtype, check=check,
                        max_fill=max_fill)

    @classmethod
    def from_dense(
        cls,
        dense: torch.Tensor,
        format: TensorFormat | str | None = None,
        *,
        threshold: float | None = None,
        mask: torch.Tensor | None = None,
        batch_dims: int | None = None,
        index_dtype: torch.dtype | None = None,
        max_fill: float | None = None,
    ) -> "SparseTensor":
        """Keep the entries of ``dense`` that are nonzero (or ``abs > threshold``, or where ``mask``).
        ``index_dtype`` defaults to the format's preference, else int64.

        ``format`` defaults to CSR for matrices (COO of the right order otherwise). With leading
        batch dims (``batch_dims``, default ``dense.dim() - format.ndim``) the pattern is the union
        over the batch and the values carry the batch. ``max_fill`` bounds the padding of
        ``format`` as in :meth:`convert`.
        """
        from .construct import from_dense

        return from_dense(dense, format, threshold=threshold, mask=mask, batch_dims=batch_dims, index_dtype=index_dtype,
                          max_fill=max_fill)

    @classmethod
    def eye(cls, n: int, m: int | None = None, *, dtype: torch.dtype | None = None, device: Any = None,
            format: TensorFormat | str = "CSR") -> "SparseTensor":
        """The ``n`` x ``m`` identity (``m`` defaults to ``n``), as ``torch.eye`` (dtype: torch's default)."""
        k = min(n, n if m is None else m)
        return cls.diag(torch.ones(k, dtype=dtype or torch.get_default_dtype(), device=device), shape=(n, n if m is None else m),
                        format=format)

    @classmethod
    def diag(cls, values: torch.Tensor, offset: int = 0, *, shape: Sequence[int] | None = None,
             format: TensorFormat | str = "CSR") -> "SparseTensor":
        """A matrix with ``values`` (1-D) on diagonal ``offset`` (> 0 above, < 0 below), as ``torch.diag``:
        square of order ``len(values) + |offset|`` unless ``shape`` is given. Every value is stored (zeros
        included); differentiable in ``values``."""
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            raise InputError(f"diag: values must be a 1-D tensor, got "
                             f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}")
        k = values.numel()
        idx = torch.arange(k, device=values.device)
        rows, cols = (idx, idx + offset) if offset >= 0 else (idx - offset, idx)
        order = k + abs(offset)
        shape = tuple(shape) if shape is not None else (order, order)
        if len(shape) != 2 or (k and (int(rows[-1]) >= shape[0] or int(cols[-1]) >= shape[1])):
            raise InputError(f"diag: {k} values on diagonal {offset} do not fit shape {shape}")
        return cls.from_coo(values, rows, cols, shape=shape, format=format)

    @classmethod
    def tridiagonal(cls, lower: Any, diagonal: Any, upper: Any, n: int | None = None, *,
                    dtype: torch.dtype | None = None, device: Any = None,
                    format: TensorFormat | str = "CSR") -> "SparseTensor":
        """The ``n`` x ``n`` tridiagonal matrix with sub-diagonal ``lower`` (``n - 1`` values), ``diagonal`` (``n``)
        and super-diagonal ``upper`` (``n - 1``); each a tensor or a number (numbers need ``n``), e.g.
        ``tridiagonal(-1, 2, -1, n)`` the 1-D Laplacian. Differentiable in tensor arguments."""
        given = [x for x in (lower, diagonal, upper) if isinstance(x, torch.Tensor)]
        if n is None:
            if not given:
                raise InputError("tridiagonal: give n when every band is a number")
            t = given[0]
            n = t.numel() + (0 if t is diagonal else 1)
        dtype = dtype or (given[0].dtype if given else torch.get_default_dtype())
        device = device if device is not None else (given[0].device if given else None)
        bands = []
        for name, x, size in (("lower", lower, n - 1), ("diagonal", diagonal, n), ("upper", upper, n - 1)):
            t = x if isinstance(x, torch.Tensor) else torch.full((max(size, 0),), float(x), dtype=dtype, device=device)
            if t.dim() != 1 or t.numel() != max(size, 0):
                raise InputError(f"tridiagonal: {name} must hold {max(size, 0)} values for n = {n}, got shape {tuple(t.shape)}")
            bands.append(t.to(dtype=dtype, device=device))
        i = torch.arange(n, device=device)
        rows = torch.cat([i[1:], i, i[:-1]])
        cols = torch.cat([i[:-1], i, i[1:]])
        return cls.from_coo(torch.cat(bands), rows, cols, shape=(n, n), format=format)

    # Serialization --------------------------------------------------------------------------------
    def __reduce__(self):
        """Plain data for ``pickle`` and ``torch.save``: the format as its DSL string (and name),
        the shape, the level buffers and the values, rebuilt by :func:`rebuild_sparse_tensor`, a
        safe global of ``torch.load(weights_only=True)``, which validates every buffer. A tensor
        whose buffers were corrupted in place raises here rather than save what cannot load."""
        self.ensure_valid()
        return (rebuild_sparse_tensor, (str(self._format), self._format.name, tuple(self._shape),
                                        list(self._pos), list(self._crd), self._values))

    # Identity and comparison ---------------------------------------------------------------------
    @property
    def pattern_key(self) -> PatternKey:
        bufs = [b for b in (*self._pos, *self._crd) if b is not None]
        return PatternKey(
            self._format, self.format_shape, self.index_dtype, self.device,
            tuple(_buffer_id(b) for b in bufs), tuple(weakref.ref(b) for b in bufs),
        )

    @property
    def pattern_fingerprint(self) -> tuple | None:
        """Content identity of the pattern: equal for two tensors whose index buffers hold the
        same numbers, even in fresh buffers (a matrix rebuilt or re-read with new values).
        Unlike :attr:`pattern_key` it reads the buffers (O(nnz) once per pattern, cached): on the
        CPU a 128-bit BLAKE2 digest of the bytes; on other devices two position-weighted sums
        computed there (one transfer of two numbers), a fingerprint whose rare collisions may only
        mislead estimates that use it (the dispatcher's measurements), never a result. None
        inside a torch.func transform (buffers without storage of their own cannot be read)."""
        cache = self._cache
        got = cache.get("fingerprint")
        if got is None:
            got = fingerprint(self._format, self.format_shape, self.index_dtype, self.device,
                              [b for b in (*self._pos, *self._crd) if b is not None])
            if got is not None:
                cache["fingerprint"] = got
        return got

    def equal(self, other: "SparseTensor") -> bool:
        """Same format, shape and bit-identical buffers and values."""
        if not isinstance(other, SparseTensor) or other._format != self._format or other._shape != self._shape:
            return False
        for a, b in zip((*self._pos, *self._crd), (*other._pos, *other._crd)):
            if (a is None) != (b is None) or (a is not None and not torch.equal(a.long(), b.long())):
                return False
        return self.dtype == other.dtype and torch.equal(self._values, other._values)

    def allclose(self, other: "SparseTensor | torch.Tensor", rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        """Same shape and numerically close entries, whatever the two formats."""
        a = self.to_dense()
        b = other.to_dense() if isinstance(other, SparseTensor) else other
        return tuple(a.shape) == tuple(b.shape) and torch.allclose(a, b.to(a.dtype), rtol=rtol, atol=atol)

    def __repr__(self) -> str:
        return sparse_repr(self)

    __str__ = __repr__

    def __len__(self) -> int:
        return self._shape[0]

    # Arithmetic ------------------------------------------------------------------------------------
    # ``A == B`` is identity (the default: tensors are hashed and cached by identity); compare contents
    # with ``torch.equal(A, B)`` (same shape and dense content, any formats) or ``A.equal(B)``.
    # Scalars scale the values (same pattern and format, differentiable); a sum of two tensors of one
    # pattern adds the values, of two patterns concatenates their triplets (an unordered COO whose
    # repeats sum wherever it is read: docs/tensor.md, "Triplets"). torch-sla's A * s, A + B, -A.
    # With a dense tensor: A * t and A / t stay on A's pattern, A + t and A - t are dense
    # (docs/tensor.md, "Everyday tensor operations"; the helpers live in _elementwise.py).
    def __neg__(self) -> "SparseTensor":
        return self.with_values(-self._values)  # type: ignore[attr-defined]

    def __mul__(self, other: Any) -> "SparseTensor":
        s = _scalar(other)
        if s is not None:
            return self.with_values(self._values * s)  # type: ignore[attr-defined]
        if isinstance(other, SparseTensor):
            return self._mul_sparse(other)
        if isinstance(other, torch.Tensor):
            return self._mul_dense(other)
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> "SparseTensor":
        s = _scalar(other)
        if s is not None:
            return self.with_values(self._values / s)  # type: ignore[attr-defined]
        if isinstance(other, SparseTensor):
            raise TypeError("A / B of two SparseTensors divides the implicit zeros by zero (a dense result of nan); "
                            "write A.to_dense() / B.to_dense(), or A * B.with_values(1 / B.values) for A's entries "
                            "over B's stored ones")
        if isinstance(other, torch.Tensor):
            return self._div_dense(other)
        return NotImplemented

    def __rtruediv__(self, other: Any) -> Any:
        if isinstance(other, torch.Tensor) and not isinstance(other, SparseTensor):
            return other / self.to_dense()  # dense: inf / nan at the implicit zeros, as torch
        return NotImplemented

    def _number(self, other: Any) -> torch.Tensor | None:
        """A Python number (not a bool) as a 0-d tensor of A's dtype and device, else None."""
        if isinstance(other, (int, float, complex)) and not isinstance(other, bool):
            return torch.tensor(other, dtype=self.dtype, device=self.device)
        return None

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # sum([A, B, ...]) starts from 0
        if isinstance(other, torch.Tensor) and not isinstance(other, SparseTensor):
            return self._add_dense(other, 1, True)
        return self.__add__(other)

    def __add__(self, other: Any) -> Any:
        if not isinstance(other, SparseTensor):
            number = self._number(other)
            if number is not None:  # A + s: every entry moves, so the sum is dense (as A + a 0-d tensor)
                return self._add_dense(number, 1, False)
            if isinstance(other, torch.Tensor):
                return self._add_dense(other, 1, False)  # dense + sparse is dense
            return NotImplemented
        if tuple(self._shape) != tuple(other._shape) or self.dtype != other.dtype or self.device != other.device:
            raise ValidationError(
                f"A + B needs the same shape, dtype and device; got {tuple(self._shape)} {self.dtype} on "
                f"{self.device} and {tuple(other._shape)} {other.dtype} on {other.device}")
        if self.pattern_key == other.pattern_key:  # one pattern: the values add, the format stays
            return self.with_values(self._values + other._values)  # type: ignore[attr-defined]
        from .construct import from_coo  # noqa: PLC0415 - construct imports this module

        (ca, sa), (cb, sb) = self.entries(), other.entries()
        vals = torch.cat([self._values.index_select(-1, sa), other._values.index_select(-1, sb)], -1)
        coords = torch.cat([ca, cb], -1)
        return from_coo(vals, [coords], shape=self.format_shape, format=None, index_dtype=None, check=False)

    def __sub__(self, other: Any) -> Any:
        if not isinstance(other, SparseTensor):
            number = self._number(other)
            if number is not None:
                return self._add_dense(number, -1, False)
            if isinstance(other, torch.Tensor):
                return self._add_dense(other, -1, False)
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> Any:
        number = self._number(other)
        if number is not None:
            return self._add_dense(number, -1, True)
        if isinstance(other, torch.Tensor) and not isinstance(other, SparseTensor):
            return self._add_dense(other, -1, True)
        return NotImplemented

    # ``A @ X`` and ``X @ A`` are bound by ``sparsetorch.ops.matmul`` (dispatch lives above this
    # layer): :func:`sparsetorch.matmul` with its plan cache and gradients.

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch's matmul entry points with a SparseTensor operand, as the operators:
        ``torch.matmul(A, x)``, ``torch.matmul(x, A)``, and ``A @ x``/``x @ A`` where torch sees
        them first (under ``torch.compile`` dynamo hands ``A @ x`` to ``Tensor.__rmatmul__(x, A)``).
        Then the everyday functions of ``_elementwise.py`` (``torch.sum``, ``torch.abs``, ``torch.equal``,
        ``torch.add`` / ``mul`` / ``sub`` / ``div``, ``D + A`` where ``Tensor.__add__`` sees it first, ...;
        docs/tensor.md, "Everyday tensor operations"). Every other torch function declines (torch raises
        its TypeError, as for any other object)."""
        if not kwargs and len(args) == 2:
            a, b = args
            if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
                if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
                    return a.__matmul__(b)  # type: ignore[operator]
                if isinstance(b, SparseTensor) and not isinstance(a, SparseTensor):
                    return b.__rmatmul__(a)  # type: ignore[operator]
                if isinstance(a, SparseTensor) and isinstance(b, SparseTensor) and func is torch.matmul:
                    return a.__matmul__(b)  # type: ignore[operator]  # sparse @ sparse (bound by ops.spgemm)
                return NotImplemented
            if func is torch.Tensor.__rmatmul__:
                if isinstance(b, SparseTensor) and not isinstance(a, SparseTensor):
                    return b.__matmul__(a)  # type: ignore[operator]  # Tensor.__rmatmul__(x, A) is A @ x
                return NotImplemented
        handler = torch_function_handler(func)
        if handler is None:
            return NotImplemented
        return handler(*args, **(kwargs or {}))

    # Package interop ------------------------------------------------------------------------------
    def to_package(self, package: str | None = None, **options: Any) -> Any:
        """Hand the tensor to ``package`` ("torch", "scipy", "cupy", "numpy"), zero-copy where the
        layouts agree; with no ``package``, to the one it came from (``from_package``; torch for a
        tensor built here), as UST's ``to_package()`` does. Convert first when the format has no
        counterpart there (the error says which)."""
        from .interop import to_package

        return to_package(self, package, **options)

    @classmethod
    def from_package(cls, obj: Any, *, check: bool = True) -> "SparseTensor":
        from .interop import from_package

        return from_package(obj, check=check)


def rebuild_sparse_tensor(format: str, name: str | None, shape: tuple, pos: list, crd: list, values: torch.Tensor) -> "SparseTensor":
    """Unpickling of a :class:`SparseTensor` (``pickle``, ``torch.load``, also with
    ``weights_only=True``): plain data in, every buffer validated (``check=True``)."""
    if not isinstance(format, str) or not (name is None or isinstance(name, str)):
        raise ValidationError(f"a pickled SparseTensor stores its format as a string, got {type(format).__name__}")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, int) for s in shape):
        raise ValidationError(f"a pickled SparseTensor stores its shape as integers, got {shape!r}")
    fmt = TensorFormat.parse(format)
    if name is not None:
        fmt = fmt.replace(name=name)
    try:
        return SparseTensor(fmt, tuple(shape), list(pos), list(crd), values, check=True)
    except ValidationError as e:
        raise ValidationError(f"the pickled SparseTensor is not valid, and was not loaded: {e}") from None


Tensor = SparseTensor

# torch.load(weights_only=True), torch's default, calls only functions registered as safe.
torch.serialization.add_safe_globals([rebuild_sparse_tensor])


# ``A @ x`` under torch.compile --------------------------------------------------------------------
# dynamo traces ``obj @ tensor`` (obj not a tensor, with __torch_function__) as a torch function
# call with the operands swapped, and looks the reverse method up in its table of reverse
# methods, where matmul has no entry (torch 2.13): it would call ``Tensor.matmul(x, A)``, which
# means ``x @ A``. The entry ``Tensor.__rmatmul__`` makes it ``A @ x``. The table lives in a module
# that ``import torch._dynamo`` loads (2 s: not at ``import sparsetorch``), so the entry is added
# when that module is first imported (or now, if it was before).
_DYNAMO_BUILTIN = "torch._dynamo.variables.builtin"


def _add_reverse_matmul(module: Any) -> None:
    import operator

    table = getattr(module, "BUILTIN_TO_TENSOR_RFN_MAP", None)
    if isinstance(table, dict):
        table.setdefault(operator.matmul, torch.Tensor.__rmatmul__)


def _install_reverse_matmul() -> None:
    from .._after_import import after_import

    after_import(_DYNAMO_BUILTIN, _add_reverse_matmul)


_install_reverse_matmul()


def _scalar(x: Any) -> Any:
    """``x`` when it is a number or a one-element (0-d) tensor (a scale for the values), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float, complex)):
        return x
    if isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) and x.dim() == 0:
        return x
    return None
