"""``SparseTensor``'s conversions and views: ``convert``, ``with_values``, ``to``/``cpu``/``cuda``/
dtype casts, ``clone``/``detach``, and the transpositions (``permute``, ``transpose``, ``T``) that
keep the buffers and only relabel which dimension each level indexes.

A mixin of :class:`~sparsetorch.SparseTensor` (kept apart so each file reads in one sitting); it
reads the tensor's slots and builds new tensors with ``type(self)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConversionError, ValidationError
from ._compiling import compiling
from ..format import TensorFormat
from ._display import _known_name, _parse_to
from .pattern import is_plain
from .validate import check_values

if TYPE_CHECKING:
    from .sparse_tensor import SparseTensor

__all__ = ["ViewMethods"]


def _torch_dtype(d: Any, what: str) -> torch.dtype | None:
    """A torch dtype from a dtype or its name (UST passes NumPy-style strings: "int32", "float64")."""
    if d is None or isinstance(d, torch.dtype):
        return d
    got = getattr(torch, d, None) if isinstance(d, str) else None
    if not isinstance(got, torch.dtype):
        raise ConversionError(f"convert: {what}={d!r} is not a torch dtype or the name of one (e.g. 'int32', 'float64')")
    return got


_CONVERT: list = []


def _convert_fn():
    """``construct.convert`` (imported on first use: construct imports this module's class's home)."""
    from .construct import convert  # noqa: PLC0415

    _CONVERT.append(convert)
    return convert


class ViewMethods:
    """Conversions and views of a SparseTensor (see the module docstring)."""

    __slots__ = ()

    # Conversion -------------------------------------------------------------------------------
    def convert(
        self,
        tensor_format: TensorFormat | str | None = None,
        *,
        index_dtype: torch.dtype | None = None,
        dtype: torch.dtype | None = None,
        drop_zeros: bool = False,
        copy: bool | None = None,
        max_fill: float | None = None,
        index_type: str | None = None,
    ) -> "SparseTensor":
        """This tensor in another format (any to any, custom DSL formats included).

        UST's spelling works too: ``index_type="int32"`` for ``index_dtype``, and dtypes given as
        strings (``dtype="float32"``).

        Runs on the tensor's device with vectorized torch operations. Explicit zeros are kept
        unless ``drop_zeros``; padding the target format needs (DIA, ELL, DELTA, N:M, blocks) is
        inserted. Returns ``self`` when nothing changes (a clone if ``copy=True``).

        Fill guard: a target that would store more than ``max_fill`` slots per nonzero (plus
        65536 slots) raises :class:`~sparsetorch.ConversionError` naming the slots, the nonzeros
        and the bytes, before anything of that size is allocated (a random 20000 x 20000 matrix
        with 200k nonzeros would need 720M DIA slots). ``max_fill`` defaults to
        ``$SPARSETORCH_MAX_FILL`` or 8; ``max_fill=float('inf')`` lifts the bound. All-dense
        targets (DENSE, DENSE_COL, DENSE_ND) are not bounded: their size is the shape's.
        """
        convert = _CONVERT[0] if _CONVERT else _convert_fn()
        if index_type is not None:
            if index_dtype is not None:
                raise ConversionError("convert takes index_dtype or UST's index_type, not both")
            index_dtype = index_type  # type: ignore[assignment]
        if index_dtype is not None:
            index_dtype = _torch_dtype(index_dtype, "index_dtype")
        if dtype is not None:
            dtype = _torch_dtype(dtype, "dtype")
        return convert(self, tensor_format, index_dtype=index_dtype, dtype=dtype, drop_zeros=drop_zeros, copy=copy,
                       max_fill=max_fill)

    def with_values(self, values: torch.Tensor) -> "SparseTensor":
        """A tensor with the same pattern (shared index buffers, same ``pattern_key``) and new values."""
        if not isinstance(values, torch.Tensor):
            raise ValidationError(f"values must be a torch.Tensor, got {type(values).__name__}")
        inner = self._values.shape[len(self.batch_shape):]
        if tuple(values.shape[values.dim() - len(inner):]) != tuple(inner):
            raise ValidationError(
                f"new values must end with shape {tuple(inner)} (this pattern's slots), got {tuple(values.shape)}"
            )
        if values.device != self.device:
            raise ValidationError(f"new values are on {values.device}, the pattern on {self.device}")
        if self._format.num_batch_levels == 0 and values.dim() >= 1:
            # Same pattern, no BATCH levels: nothing about the index buffers to recompute or
            # re-read (constructing anew reads pos[-1], a device-to-host copy on a GPU).
            check_values(values, self._values.shape[-1])
            # The same index buffers: what was validated for them holds for both tensors.
            return _carry_origin(self, type(self)._assembled(self._format, self.format_shape, self._pos, self._crd,
                                                             values, self._index, self._checked, self._derived))
        self.ensure_valid()  # the new tensor trusts the shared buffers (check=False)
        out = type(self)(self._format, self.format_shape, self._pos, self._crd, values, check=False)
        out._derived = self._derived
        return _carry_origin(self, out)

    def to(self, *args: Any, **kwargs: Any) -> "SparseTensor":
        """Like ``torch.Tensor.to``: a device and/or a value dtype (index buffers keep theirs)."""
        device, dtype, non_blocking = _parse_to(args, kwargs)
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise ConversionError(f"values must stay floating point or complex, got dtype {dtype}")
        if device is not None and torch.device(device).type == "meta":
            raise ConversionError("a SparseTensor cannot move to the meta device: its index buffers are read (checked, "
                                  "converted) and meta tensors hold no data; keep it on cpu / cuda")
        move = lambda b: None if b is None else b.to(device=device, non_blocking=non_blocking)  # noqa: E731
        values = self._values.to(device=device, dtype=dtype, non_blocking=non_blocking)
        if values is self._values and (device is None or torch.device(device) == self.device):
            return self
        self.ensure_valid()  # the copies are trusted (check=False): they must be copies of valid buffers
        return type(self)(self._format, self.format_shape, [move(b) for b in self._pos],
                            [move(b) for b in self._crd], values, check=False)

    def cpu(self) -> "SparseTensor":
        return self.to("cpu")

    def cuda(self, device: int | str | None = None) -> "SparseTensor":
        return self.to(torch.device("cuda" if device is None else device) if not isinstance(device, int) else torch.device("cuda", device))

    def double(self) -> "SparseTensor":
        return self.to(torch.float64)

    def float(self) -> "SparseTensor":
        return self.to(torch.float32)

    def clone(self) -> "SparseTensor":
        self.ensure_valid()
        c = lambda b: None if b is None else b.clone()  # noqa: E731
        return type(self)(self._format, self.format_shape, [c(b) for b in self._pos], [c(b) for b in self._crd],
                            self._values.clone(), check=False)

    def detach(self) -> "SparseTensor":
        return self.with_values(self._values.detach())

    def requires_grad_(self, flag: bool = True) -> "SparseTensor":
        self._values.requires_grad_(flag)
        return self

    # Transposition ------------------------------------------------------------------------------
    def permute(self, *order: int) -> "SparseTensor":
        """Reorder the format's dimensions. Always a view: the levels are kept and only which
        dimension each level indexes changes (CSR.T is CSC over the same buffers). Under
        ``torch.compile`` the transpose of a matrix is a :class:`TracedTranspose` (no tensor
        is built in the trace; products and solves with it run A's adjoint direction)."""
        if len(order) == 1 and isinstance(order[0], (tuple, list)):
            order = tuple(order[0])
        nd = self._format.ndim
        if nd == 2 and tuple(order) == (1, 0) and compiling():
            return TracedTranspose(self)  # type: ignore[return-value]
        if sorted(order) != list(range(nd)):
            raise ValidationError(f"permute needs a permutation of 0..{nd - 1} (the format's dims), got {order}")
        dims = self._format.dims
        new_dims = [dims[o] for o in order]
        fmt = TensorFormat(new_dims, [(lv.expr, lv.type) for lv in self._format.levels],
                           index_dtype=self._format.index_dtype)
        fmt = fmt.replace(name=_known_name(fmt))
        fs = self.format_shape
        self.ensure_valid()
        return type(self)(fmt, tuple(fs[o] for o in order), self._pos, self._crd, self._values, check=False)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> "SparseTensor":
        nd = self._format.ndim
        nvb = len(self.batch_shape)
        d0, d1 = (d + self.ndim if d < 0 else d for d in (dim0, dim1))
        d0, d1 = d0 - nvb, d1 - nvb
        if not (0 <= d0 < nd and 0 <= d1 < nd):
            raise ValidationError(f"can only transpose the format's dims ({nvb}..{self.ndim - 1}), got {dim0}, {dim1}")
        order = list(range(nd))
        order[d0], order[d1] = order[d1], order[d0]
        return self.permute(*order)

    @property
    def T(self) -> "SparseTensor":
        """Transpose of the last two dims (a view: no buffer is copied)."""
        return self.transpose(-2, -1)

    @property
    def mT(self) -> "SparseTensor":
        return self.T

    def t(self) -> "SparseTensor":
        """Transpose of a matrix (2 dims, as torch's ``Tensor.t``; a view)."""
        if self.ndim != 2:
            raise ValidationError(f"t() expects a matrix (2 dimensions), this tensor has {self.ndim}: use "
                                  f"transpose(-2, -1) or .mT for the last two")
        return self.transpose(-2, -1)


class TracedTranspose:
    """``A.T`` (``mT``, ``t()``, ``transpose(-2, -1)``) of a matrix taken inside a
    ``torch.compile`` region: the matrix and a flag, nothing built or validated in the trace.
    ``@`` on either side, ``sparsetorch.matmul`` and ``sparsetorch.solve`` take it and run A's
    transposed direction (the operators are bound by the ops layer, ``ops/matmul.py``);
    transposing it again gives A back."""

    __slots__ = ("base",)

    def __init__(self, base: "SparseTensor") -> None:
        self.base = base

    @property
    def shape(self) -> torch.Size:
        s = tuple(self.base.shape)
        return torch.Size(s[:-2] + (s[-1], s[-2]))

    @property
    def format_shape(self) -> tuple[int, int]:
        m, n = self.base.format_shape
        return (n, m)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def ndim(self) -> int:
        return self.base.ndim

    def dim(self) -> int:
        return self.base.ndim

    @property
    def T(self) -> "SparseTensor":
        return self.base

    mT = T

    def t(self) -> "SparseTensor":
        return self.base

    def transpose(self, dim0: int = -2, dim1: int = -1) -> "SparseTensor":
        nd = self.base.ndim
        if sorted(d + nd if d < 0 else d for d in (dim0, dim1)) != [nd - 2, nd - 1]:
            raise ValidationError(f"a transposed matrix under torch.compile transposes its last two dims only, got "
                                  f"{dim0}, {dim1}")
        return self.base

    def __repr__(self) -> str:
        return f"TracedTranspose({self.base!r})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """torch's matmul entry points with this operand, as the operators (what dynamo hands
        ``A.T @ x`` to: ``Tensor.__rmatmul__(x, A.T)``; see ``SparseTensor.__torch_function__``)."""
        if kwargs or len(args) != 2:
            return NotImplemented
        a, b = args
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            if isinstance(a, TracedTranspose) and isinstance(b, torch.Tensor):
                return a.__matmul__(b)  # type: ignore[operator]
            if isinstance(b, TracedTranspose) and isinstance(a, torch.Tensor):
                return b.__rmatmul__(a)  # type: ignore[operator]
        elif func is torch.Tensor.__rmatmul__ and isinstance(b, TracedTranspose) and isinstance(a, torch.Tensor):
            return b.__matmul__(a)  # type: ignore[operator]
        return NotImplemented


def _carry_origin(src: Any, dst: Any) -> Any:
    """``dst`` with ``src``'s package origin where the origin is keyed by the values (a dense format:
    ``interop/_origin.py``); sparse formats share it through their index buffers."""
    if dst._index or compiling() or not is_plain(dst._values):
        # sparse formats share it through their index buffers; a traced or torch.func-wrapped value tensor has no
        # identity to key a record by (dynamo refused id() / weakref; vmap's BatchedTensor has no data pointer)
        return dst
    from .interop._origin import carry_origin  # noqa: PLC0415 - interop imports the tensor module

    return carry_origin(src, dst)
