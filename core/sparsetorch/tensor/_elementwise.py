"""``SparseTensor``'s everyday tensor API: what a torch (or torch-sla) user reaches for first.

- facts: ``size(dim)``, ``numel()``, ``is_sparse``, ``layout``, ``is_complex()``,
  ``is_floating_point()``, ``element_size()``; casts ``half()``, ``bfloat16()``; torch's own sparse
  layouts ``to_sparse_coo()``, ``to_sparse_csr()``, ``to_sparse_csc()``;
- unary maps of the values that send 0 to 0 (``abs``, ``sqrt``, ``sin``, ``pow(p > 0)``, ``conj``,
  ``real``, ...): same pattern and format; maps with ``f(0) != 0`` (``exp``, ``cos``, ``log``, ...)
  raise, since the result would be dense;
- elementwise products with another SparseTensor (on the intersection of the patterns) or with a
  dense tensor (on this tensor's pattern), sums with a dense tensor (dense results);
- reductions counting the implicit zeros as torch does on the dense tensor (``sum``, ``mean``,
  ``amax``/``amin``/``max``/``min``, ``prod``), ``diagonal``, ``trace``;
- indexing ``A[i]``, ``A[i, j]``, ``A[r0:r1, c0:c1]``, ``A[[rows]]``;
- the torch functions of all these (``torch.sum(A)``, ``torch.abs(A)``, ``torch.equal(A, B)``, ...),
  through :func:`torch_function_handler`, used by ``SparseTensor.__torch_function__``.

Every result is a function of the values through ordinary torch ops (differentiable w.r.t. the
values); the tensors passed in are never modified. Entries stored twice (an unordered COO from
``from_coo`` with repeats) count as their sum, as in ``to_dense``. docs/tensor.md, "Everyday tensor
operations", has the rules.

A mixin of :class:`~sparsetorch.SparseTensor` (kept apart so each file reads in one sitting).
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import ConversionError, FormatError, InputError, ValidationError

if TYPE_CHECKING:
    from .sparse_tensor import SparseTensor

__all__ = ["ElementwiseMethods", "torch_function_handler"]

_CLS: list = []


def _st() -> type:
    """The SparseTensor class (imported on first use: its module imports this one)."""
    if not _CLS:
        from .sparse_tensor import SparseTensor  # noqa: PLC0415

        _CLS.append(SparseTensor)
    return _CLS[0]


def _is_st(x: Any) -> bool:
    return isinstance(x, _st())


def _from_coo(values: torch.Tensor, coords: torch.Tensor, shape: tuple, fmt: Any, index_dtype: torch.dtype) -> Any:
    from .construct import from_coo  # noqa: PLC0415 - construct imports the class's module

    return from_coo(values, [coords], shape=shape, format=fmt, index_dtype=index_dtype, check=False)


# Pattern helpers ---------------------------------------------------------------------------------
def _linear_index(coords: torch.Tensor, sizes: tuple) -> torch.Tensor:
    """Row-major linear index of the (k, n) coordinates over ``sizes`` (k entries)."""
    lin = torch.zeros(coords.shape[1], dtype=torch.int64, device=coords.device)
    for k, size in enumerate(sizes):
        lin = lin * size + coords[k]
    return lin


def _coalesced(t: "SparseTensor") -> tuple[torch.Tensor, torch.Tensor]:
    """``(coords, values)`` of the distinct stored entries, sorted row-major: coords (ndim, n) int64 of the format
    dims, values ``batch_shape + (n,)``, entries stored twice summed (as ``to_dense`` reads them), padding left out.
    The pattern part is cached; the values are gathered (and summed) through differentiable torch ops."""
    cache = t._cache
    got = cache.get("coalesced")
    if got is None:
        keys, slot_sorted = t._value_index()
        fs = t.format_shape
        n = keys.shape[-1]
        if n == 0:
            coords = torch.zeros(len(fs), 0, dtype=torch.int64, device=t.device)
            got = (coords, slot_sorted, None, 0)
        elif keys.dim() == 1:
            uniq, inv = torch.unique_consecutive(keys, return_inverse=True)
            coords = torch.empty(len(fs), uniq.numel(), dtype=torch.int64, device=t.device)
            rest = uniq
            for k in reversed(range(len(fs))):
                coords[k] = rest % fs[k]
                rest = torch.div(rest, fs[k], rounding_mode="floor")
            got = (coords, slot_sorted, inv if uniq.numel() != n else None, uniq.numel())
        else:
            uniq, inv = torch.unique_consecutive(keys, dim=1, return_inverse=True)
            got = (uniq, slot_sorted, inv if uniq.shape[1] != n else None, uniq.shape[1])
        cache["coalesced"] = got
    coords, slot_sorted, inv, nu = got
    _, _, lvals = t._linear_buffers()
    v = lvals[..., slot_sorted]
    if inv is not None:
        v = v.new_zeros(*v.shape[:-1], nu).index_add(-1, inv, v)
    return coords, v


def _canonical(t: "SparseTensor") -> "SparseTensor":
    """``t`` itself when no coordinate can be stored twice, else its coalesced form (a sorted COO)."""
    if t.format.is_unique:
        return t
    coords, vals = _coalesced(t)
    return _from_coo(vals, coords, t.format_shape, None, t.index_dtype)


def _simple_format(t: "SparseTensor", ndim: int) -> Any:
    """The format a selection / intersection result is built in: the source's when it has no padding and no
    batch levels (CSR, CSC, COO, DCSR, DCSC), else CSR for a matrix and COO for other orders."""
    from ..format import COO, CSC, CSR, DCSC, DCSR  # noqa: PLC0415

    if ndim == 2:
        for f in (CSR, CSC, COO, DCSR, DCSC):
            if t.format.replace(index_dtype=None, name=None) == f.replace(index_dtype=None, name=None):
                return f
        return CSR
    return None  # from_coo's choice: COO of that order


def _norm_dims(t: "SparseTensor", dim: Any, what: str) -> list[int]:
    nd = t.ndim
    if dim is None:
        return list(range(nd))
    dims = [dim] if not isinstance(dim, (tuple, list, torch.Size)) else list(dim)
    if not dims:  # dim=(): all of them, as torch's sum / amax
        return list(range(nd))
    out = []
    for d in dims:
        try:
            d = operator.index(d)
        except TypeError:
            raise InputError(f"{what}: dim must be an int or a tuple of ints, got {dim!r}") from None
        if not -nd <= d < nd:
            raise IndexError(f"{what}: dimension {d} is out of range for a tensor of {nd} dimensions "
                             f"(shape {tuple(t.shape)}; expected in [{-nd}, {nd - 1}])")
        d = d + nd if d < 0 else d
        if d in out:
            raise InputError(f"{what}: dimension {d} appears more than once in dim={dim!r}")
        out.append(d)
    return sorted(out)


def _dense_error(name: str, at_zero: str) -> InputError:
    return InputError(
        f"{name} maps 0 to {at_zero}, so {name} of a SparseTensor would be dense (every implicit zero becomes "
        f"{at_zero}); no sparse result is returned. Write A.to_dense().{name}() for the dense result, or "
        f"A.with_values(torch.{name}(A.values)) to map the stored entries only")


def _check_same(a: "SparseTensor", b: "SparseTensor", op: str) -> None:
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype or a.device != b.device:
        raise ValidationError(
            f"A {op} B needs the same shape, dtype and device; got {tuple(a.shape)} {a.dtype} on "
            f"{a.device} and {tuple(b.shape)} {b.dtype} on {b.device}")


def _check_dense_operand(a: "SparseTensor", d: torch.Tensor, op: str, *, into_a: bool) -> None:
    """``d`` must be on A's device and broadcast to A's shape (``into_a``) or with it."""
    if d.device != a.device:
        raise ValidationError(f"A {op} t needs t on A's device; A is on {a.device}, t (shape {tuple(d.shape)}) on "
                              f"{d.device}")
    try:
        out = torch.broadcast_shapes(tuple(d.shape), tuple(a.shape))
    except RuntimeError:
        out = None
    if out is None or (into_a and tuple(out) != tuple(a.shape)):
        raise ValidationError(f"A {op} t needs t broadcastable to A's shape {tuple(a.shape)}; got t of shape "
                              f"{tuple(d.shape)}")


def _gather_dense(a: "SparseTensor", d: torch.Tensor, fill: float) -> torch.Tensor:
    """``d`` (broadcast to A's shape) at the coordinates of every value slot of A, shaped like A's
    linearized values; ``fill`` in slots that hold no entry (padding)."""
    coords, slots = a.entries()
    fs = a.format_shape
    bs = a.batch_shape
    lin = _linear_index(coords.long(), fs)
    flat = d.expand(*a.shape).reshape(*bs, math.prod(fs))
    got = flat[..., lin]
    _, _, lvals = a._linear_buffers()
    dtype = torch.promote_types(lvals.dtype, d.dtype)
    if got.shape[-1] == lvals.shape[-1] and slots.numel() and bool((slots == torch.arange(
            slots.numel(), device=slots.device)).all()):
        return got.to(dtype)
    out = torch.full((*bs, lvals.shape[-1]), fill, dtype=dtype, device=a.device)
    return out.index_copy(-1, slots, got.to(dtype))


# Unary maps ---------------------------------------------------------------------------------------
_ZERO_PRESERVING = ("abs", "sqrt", "square", "sign", "sgn", "sin", "tan", "tanh", "asin", "atan", "atanh", "sinh",
                    "asinh", "relu", "expm1", "log1p", "erf", "erfinv", "trunc", "floor", "ceil", "round", "frac",
                    "deg2rad", "rad2deg", "nan_to_num")
#: value maps with f(0) != 0, and what they map 0 to
_DENSE_MAPS = {"exp": "1", "exp2": "1", "cos": "1", "cosh": "1", "acos": "pi/2", "log": "-inf", "log2": "-inf",
               "log10": "-inf", "sigmoid": "0.5", "reciprocal": "inf", "rsqrt": "inf", "erfc": "1", "logit": "-inf",
               "i0": "1", "sinc": "1", "lgamma": "inf", "digamma": "-inf"}


def _value_map(name: str) -> Callable:
    fn = getattr(torch, name)
    linear = name in ("neg",)

    def method(self: "SparseTensor", *args: Any, **kwargs: Any) -> "SparseTensor":
        src = self if linear else _canonical(self)
        return src.with_values(fn(src.values, *args, **kwargs))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (f"``torch.{name}`` of every stored value: the same pattern and format (``{name}(0) = 0``, "
                      f"so the implicit zeros stay zero); differentiable w.r.t. the values. Entries stored twice "
                      f"are summed first (the result is then a coalesced COO).")
    return method


def _dense_map(name: str) -> Callable:
    at_zero = _DENSE_MAPS[name]

    def method(self: "SparseTensor", *args: Any, **kwargs: Any) -> Any:
        raise _dense_error(name, at_zero)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (f"Raises :class:`~sparsetorch.InputError`: ``{name}(0) = {at_zero}``, so the result would be "
                      f"dense. Write ``A.to_dense().{name}()`` (dense) or ``A.with_values(torch.{name}(A.values))`` "
                      f"(the stored entries only).")
    return method


class ElementwiseMethods:
    """The everyday tensor API of a SparseTensor (see the module docstring and docs/tensor.md,
    "Everyday tensor operations").

    Equality: ``A == B`` stays *identity* (tensors are hashed and cached by identity elsewhere);
    compare contents with ``torch.equal(A, B)`` (same shape and dense content, any formats) or
    ``A.equal(B)`` (same format and bit-identical buffers)."""

    __slots__ = ()

    # Facts ----------------------------------------------------------------------------------------
    def size(self: "SparseTensor", dim: int | None = None) -> Any:  # type: ignore[misc]
        """``torch.Size`` of the shape, or the extent of dimension ``dim`` (negative counts from the end)."""
        if dim is None:
            return self.shape
        d = _norm_dims(self, dim, "size")[0]
        return self._shape[d]

    def numel(self: "SparseTensor") -> int:  # type: ignore[misc]
        """The number of elements of the dense tensor this one stands for (``prod(shape)``), as torch's sparse
        tensors report it; :attr:`nse` is the number stored."""
        return math.prod(self._shape)

    @property
    def is_sparse(self) -> bool:
        """True (a SparseTensor is sparse whatever its format, dense formats included)."""
        return True

    @property
    def layout(self: "SparseTensor") -> torch.layout:  # type: ignore[misc]
        """The torch layout closest to the format: ``torch.sparse_csr`` / ``sparse_csc`` / ``sparse_bsr`` /
        ``sparse_bsc`` for CSR / CSC / BSR / BSC (batched too), ``torch.sparse_coo`` for COO (ordered or not)
        and for every format torch has no layout of (DIA, ELL, DCSR, DELTA, N:M, dense formats, custom DSL
        formats). It names a torch layout only; ``to_sparse_coo()`` / ``to_sparse_csr()`` build such tensors."""
        from .interop._common import classify  # noqa: PLC0415

        try:
            got = classify(self._format)
        except Exception:  # noqa: BLE001 - a format torch has no counterpart of
            got = None
        kind = got.kind if got is not None else None
        return {"csr": torch.sparse_csr, "csc": torch.sparse_csc, "bsr": torch.sparse_bsr,
                "bsc": torch.sparse_bsc}.get(kind, torch.sparse_coo)

    def is_complex(self: "SparseTensor") -> bool:  # type: ignore[misc]
        return self._values.is_complex()

    def is_floating_point(self: "SparseTensor") -> bool:  # type: ignore[misc]
        return self._values.is_floating_point()

    def element_size(self: "SparseTensor") -> int:  # type: ignore[misc]
        """Bytes of one value (the value dtype's, as ``Tensor.element_size``)."""
        return self._values.element_size()

    def half(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        return self.to(torch.float16)

    def bfloat16(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        return self.to(torch.bfloat16)

    # torch's sparse layouts -----------------------------------------------------------------------
    def to_sparse_coo(self: "SparseTensor") -> torch.Tensor:  # type: ignore[misc]
        """A torch ``sparse_coo`` tensor of the same content (coalesced; value-batch dims become sparse dims)."""
        from ..format import COO, COO_ND  # noqa: PLC0415

        if not self.batch_shape and not self.format.num_batch_levels:
            fmt = COO if self.format.ndim == 2 else COO_ND(self.format.ndim)
            return _canonical(self).convert(fmt).to_package("torch")
        coords, vals = _coalesced(self)
        if not self.batch_shape:  # BATCH levels (a pattern per member): their coordinates are format coordinates
            return torch.sparse_coo_tensor(coords.long(), vals, tuple(self.shape), is_coalesced=True,
                                           check_invariants=False)
        bs = self.batch_shape
        nb = math.prod(bs)
        n = coords.shape[1]
        bidx = torch.arange(nb, device=self.device).repeat_interleave(n)
        bco = torch.stack(torch.unravel_index(bidx, bs)) if bs else bidx[None, :0]
        idx = torch.cat([bco.reshape(len(bs), -1), coords.repeat(1, nb)], 0)
        return torch.sparse_coo_tensor(idx, vals.reshape(-1), tuple(self.shape), is_coalesced=True,
                                       check_invariants=False)

    def _to_compressed(self: "SparseTensor", kind: str) -> torch.Tensor:  # type: ignore[misc]
        from ..format import CSC, CSR  # noqa: PLC0415

        if self.format.ndim - self.format.num_batch_levels != 2:
            raise InputError(f"to_sparse_{kind} needs a matrix (or a batch of matrices); this tensor has shape "
                             f"{tuple(self.shape)} and format {self.format}")
        fmt = CSR if kind == "csr" else CSC
        if self.batch_shape and not self.format.num_batch_levels:
            # one pattern shared by a batch of value sets: torch's batched layout repeats the indices
            c = _canonical(self).convert(fmt)
            bs = self.batch_shape
            comp, plain = c.pos(1), c.crd(1)
            ctor = torch.sparse_csr_tensor if kind == "csr" else torch.sparse_csc_tensor
            return ctor(comp.expand(*bs, comp.numel()), plain.expand(*bs, plain.numel()), c.values,
                        tuple(self.shape), check_invariants=False)
        if self.format.num_batch_levels:
            return getattr(self.to_dense(), f"to_sparse_{kind}")()
        return _canonical(self).convert(fmt).to_package("torch")

    def to_sparse_csr(self: "SparseTensor") -> torch.Tensor:  # type: ignore[misc]
        """A torch ``sparse_csr`` tensor of the same content (batched for a value batch)."""
        return self._to_compressed("csr")

    def to_sparse_csc(self: "SparseTensor") -> torch.Tensor:  # type: ignore[misc]
        """A torch ``sparse_csc`` tensor of the same content (batched for a value batch)."""
        return self._to_compressed("csc")

    # Unary value maps (the zero-preserving ones and the refused ones are set below the class) ---------
    def neg(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """``-A``: the values negated (same pattern and format)."""
        return self.with_values(-self._values)

    negative = neg

    def __abs__(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        return self.abs()  # type: ignore[attr-defined]

    def __pos__(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        return self

    def conj(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """Complex conjugate of the values (a materialized conjugate, no conj bit); ``self`` for a real tensor."""
        if not self._values.is_complex():
            return self
        return self.with_values(torch.conj_physical(self._values))

    conj_physical = conj

    def resolve_conj(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        return self

    @property
    def mH(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """Conjugate transpose of the last two dims (a view of the pattern; new values for complex)."""
        return self.conj().mT

    @property
    def H(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """Conjugate transpose of a matrix (2 dims, as torch's ``Tensor.H``)."""
        if self.ndim != 2:
            raise InputError(f"A.H is the conjugate transpose of a matrix; this tensor has {self.ndim} dimensions "
                             f"(shape {tuple(self.shape)}): use A.mH for the last two")
        return self.mH

    def adjoint(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """``A.mH`` (torch's ``Tensor.adjoint()``)."""
        return self.mH

    @property
    def real(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """Real part of the values (same pattern and format); ``self`` for a real tensor, as torch."""
        if not self._values.is_complex():
            return self
        return self.with_values(torch.real(self._values).contiguous())

    @property
    def imag(self: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        """Imaginary part of the values (same pattern and format). Raises for a real tensor, as torch's ``.imag``."""
        if not self._values.is_complex():
            raise InputError(f"imag is not defined for a real SparseTensor (dtype {self.dtype}), as torch's .imag "
                             f"refuses real tensors; its imaginary part is zero: A.with_values(torch.zeros_like("
                             f"A.values)) if a zero-valued tensor on the pattern is wanted")
        return self.with_values(torch.imag(self._values).contiguous())

    def pow(self: "SparseTensor", exponent: Any) -> "SparseTensor":  # type: ignore[misc]
        """``A ** p`` for a number (or 0-d tensor) ``p > 0`` (complex: real part > 0): the values raised to ``p``,
        same pattern and format. ``p <= 0`` maps 0 to inf or 1 (a dense result) and raises."""
        p = exponent
        if _is_st(p) or (isinstance(p, torch.Tensor) and p.dim() > 0):
            raise InputError("A ** p takes a number (or a 0-d tensor) p > 0; for an elementwise power by a tensor "
                             "write A.to_dense() ** p")
        if isinstance(p, bool) or not isinstance(p, (int, float, complex, torch.Tensor)):
            raise InputError(f"A ** p takes a number p > 0, got {type(p).__name__}")
        pv = p.detach().item() if isinstance(p, torch.Tensor) else p
        re = pv.real if isinstance(pv, complex) else pv
        if not re > 0:
            at_zero = "1" if pv == 0 else ("inf" if not isinstance(pv, complex) else "inf or nan")
            raise InputError(f"pow with exponent {pv} maps 0 to {at_zero}, so A ** {pv} of a SparseTensor would be "
                             f"dense; no sparse result is returned. Write A.to_dense() ** {pv} for the dense result, "
                             f"or A.with_values(A.values ** {pv}) to raise the stored entries only")
        src = _canonical(self)
        return src.with_values(torch.pow(src.values, p))

    __pow__ = pow

    def __rpow__(self: "SparseTensor", base: Any) -> Any:  # type: ignore[misc]
        raise InputError(f"{base!r} ** A maps the implicit zeros to 1, so it would be dense; write "
                         f"{base!r} ** A.to_dense(), or A.with_values({base!r} ** A.values) for the stored entries only")

    def clamp(self: "SparseTensor", min: Any = None, max: Any = None) -> "SparseTensor":  # type: ignore[misc]
        """``torch.clamp`` of the values when it keeps 0 fixed (``min <= 0 <= max``, either may be None):
        same pattern and format. Bounds that move 0 would make the result dense and raise."""
        lo = min.item() if isinstance(min, torch.Tensor) else min
        hi = max.item() if isinstance(max, torch.Tensor) else max
        if (lo is not None and lo > 0) or (hi is not None and hi < 0):
            at = lo if (lo is not None and lo > 0) else hi
            raise InputError(f"clamp(min={lo}, max={hi}) maps 0 to {at}, so it would be dense; no sparse result is "
                             f"returned. Write A.to_dense().clamp({lo}, {hi}) for the dense result, or "
                             f"A.with_values(A.values.clamp({lo}, {hi})) to clamp the stored entries only")
        src = _canonical(self)
        return src.with_values(torch.clamp(src.values, min, max))

    clip = clamp

    # Binary elementwise -----------------------------------------------------------------------------
    def mul(self: "SparseTensor", other: Any) -> Any:  # type: ignore[misc]
        """``A * other``: a number or 0-d tensor scales the values; a SparseTensor of the same shape gives the
        product on the intersection of the two patterns (one pattern: the values multiply, the format stays);
        a dense tensor broadcastable to A's shape gives a SparseTensor on A's pattern and format (A's values
        times the dense entries at A's coordinates)."""
        return self * other

    multiply = mul

    def add(self: "SparseTensor", other: Any, *, alpha: Any = 1) -> Any:  # type: ignore[misc]
        """``A + alpha * other`` (sparse for a SparseTensor ``other``, dense for a dense one)."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self: "SparseTensor", other: Any, *, alpha: Any = 1) -> Any:  # type: ignore[misc]
        """``A - alpha * other`` (sparse for a SparseTensor ``other``, dense for a dense one)."""
        return self - (other if alpha == 1 else other * alpha)

    subtract = sub

    def div(self: "SparseTensor", other: Any) -> Any:  # type: ignore[misc]
        """``A / other`` for a number, a 0-d tensor or a dense tensor broadcastable to A's shape: on A's pattern."""
        return self / other

    divide = div

    def _mul_sparse(self: "SparseTensor", other: "SparseTensor") -> "SparseTensor":  # type: ignore[misc]
        _check_same(self, other, "*")
        if self.pattern_key == other.pattern_key and self.format.is_unique:
            return self.with_values(self._values * other._values)
        ca, va = _coalesced(self)
        cb, vb = _coalesced(other)
        fs = self.format_shape
        if math.prod(fs) < 2**62:
            ka, kb = _linear_index(ca, fs), _linear_index(cb, fs)
        else:  # too wide to pack: rank the coordinates together
            both = torch.cat([ca, cb], 1)
            _, rank = torch.unique(both, dim=1, return_inverse=True)
            ka, kb = rank[: ca.shape[1]], rank[ca.shape[1]:]
        if kb.numel():
            at = torch.searchsorted(kb, ka).clamp(max=kb.numel() - 1)
            hit = kb[at] == ka
        else:
            at = torch.zeros_like(ka)
            hit = torch.zeros_like(ka, dtype=torch.bool)
        ia = hit.nonzero().reshape(-1)
        vals = va[..., ia] * vb[..., at[ia]]
        return _from_coo(vals, ca[:, ia], fs, _simple_format(self, len(fs)), self.index_dtype)

    def _mul_dense(self: "SparseTensor", d: torch.Tensor) -> "SparseTensor":  # type: ignore[misc]
        _check_dense_operand(self, d, "*", into_a=True)
        g = _gather_dense(self, d, 0.0)
        _, _, lvals = self._linear_buffers()
        return self.with_values((lvals * g).reshape(self._values.shape))

    def _div_dense(self: "SparseTensor", d: torch.Tensor) -> "SparseTensor":  # type: ignore[misc]
        _check_dense_operand(self, d, "/", into_a=True)
        g = _gather_dense(self, d, 1.0)
        _, _, lvals = self._linear_buffers()
        return self.with_values((lvals / g).reshape(self._values.shape))

    def _add_dense(self: "SparseTensor", d: torch.Tensor, sign: int, reverse: bool) -> torch.Tensor:  # type: ignore[misc]
        op = "+" if sign > 0 else "-"
        _check_dense_operand(self, d, op, into_a=False)
        a = self.to_dense()
        if reverse:
            return d + a if sign > 0 else d - a
        return a + d if sign > 0 else a - d

    # Reductions -----------------------------------------------------------------------------------
    def _reduce(self: "SparseTensor", dim: Any, keepdim: bool, how: str, what: str,  # type: ignore[misc]
                dtype: torch.dtype | None = None) -> torch.Tensor:
        dims = _norm_dims(self, dim, what)
        nvb = len(self.batch_shape)
        fs = self.format_shape
        bred = [d for d in dims if d < nvb]
        fred = [d - nvb for d in dims if d >= nvb]
        keep = [k for k in range(len(fs)) if k not in fred]
        kshape = tuple(fs[k] for k in keep)
        K = math.prod(kshape)
        cell = math.prod(fs[k] for k in fred)
        if how in ("max", "min") and (cell == 0 or any(self._shape[d] == 0 for d in bred)):
            raise IndexError(f"{what}: cannot reduce over an empty dimension (shape {tuple(self.shape)}, dim={dim!r}), "
                             f"as torch refuses it")
        if how == "sum":
            coords, vals = self.coordinates()
            coords = coords.long()
        else:
            coords, vals = _coalesced(self)
        if dtype is not None:
            vals = vals.to(dtype)
        low = vals.dtype in (torch.float16, torch.bfloat16) and how == "sum"
        out_dtype = vals.dtype
        if low:
            vals = vals.float()
        bs = self.batch_shape
        B = math.prod(bs)
        n = coords.shape[1]
        lin = _linear_index(coords[keep], kshape) if keep else torch.zeros(n, dtype=torch.int64, device=self.device)
        v2 = vals.reshape(B, n)
        if how == "sum":
            out = v2.new_zeros(B, K).index_add(1, lin, v2)
        else:
            if vals.is_complex() and how != "prod":
                raise InputError(f"{what} is not defined for complex values (dtype {vals.dtype}), as in torch")
            if how == "prod":
                out = _prod_cells(v2, lin, K, cell)
            else:
                out = v2.new_zeros(B, K).scatter_reduce(1, lin.expand(B, n), v2, reduce={"max": "amax", "min": "amin"}[how],
                                                        include_self=False)
                full = torch.bincount(lin, minlength=K) == cell  # every entry of the cell stored: no implicit zero
                out = torch.where(full, out, out.clamp(min=0) if how == "max" else out.clamp(max=0))
        out = out.reshape(tuple(bs) + tuple(kshape))
        if bred:
            if how == "sum":
                out = out.sum(dim=bred)
            elif how == "max":
                out = out.amax(dim=bred)
            elif how == "min":
                out = out.amin(dim=bred)
            else:
                for d in reversed(bred):
                    out = out.prod(dim=d)
        if low:
            out = out.to(out_dtype)
        if keepdim:
            for d in dims:
                out = out.unsqueeze(d)
        return out

    def sum(self: "SparseTensor", dim: Any = None, keepdim: bool = False, *,  # type: ignore[misc]
            dtype: torch.dtype | None = None) -> torch.Tensor:
        """Sum over ``dim`` (an int, a tuple, or None for all), as ``A.to_dense().sum(dim, keepdim, dtype=dtype)``:
        a dense tensor, differentiable w.r.t. the values. float16 / bfloat16 accumulate in float32."""
        return self._reduce(dim, keepdim, "sum", "sum", dtype)

    def mean(self: "SparseTensor", dim: Any = None, keepdim: bool = False, *,  # type: ignore[misc]
             dtype: torch.dtype | None = None) -> torch.Tensor:
        """Mean over ``dim`` counting the implicit zeros (the sum divided by the dense count), as
        ``A.to_dense().mean(dim, keepdim)``."""
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise InputError(f"mean: dtype must be a floating point or complex dtype, got {dtype} (as torch's mean)")
        dims = _norm_dims(self, dim, "mean")
        count = math.prod(self._shape[d] for d in dims)
        s = self._reduce(dim, keepdim, "sum", "mean", dtype)
        return s / count if count else s / 0.0

    def amax(self: "SparseTensor", dim: Any = None, keepdim: bool = False) -> torch.Tensor:  # type: ignore[misc]
        """Largest entry over ``dim`` (default: all), implicit zeros included where a reduced slice is not
        fully stored; as ``A.to_dense().amax(dim, keepdim)``. Real dtypes only."""
        return self._reduce(dim, keepdim, "max", "amax")

    def amin(self: "SparseTensor", dim: Any = None, keepdim: bool = False) -> torch.Tensor:  # type: ignore[misc]
        """Smallest entry over ``dim`` (default: all), implicit zeros included; as ``A.to_dense().amin(dim, keepdim)``."""
        return self._reduce(dim, keepdim, "min", "amin")

    def max(self: "SparseTensor", dim: int | None = None, keepdim: bool = False) -> Any:  # type: ignore[misc]
        """``A.max()``: the largest entry (0-d), implicit zeros included (:meth:`amax`). ``A.max(dim)``: torch's
        ``(values, indices)``, computed on the dense form (O(numel) memory; :meth:`amax` gives the values
        from the stored entries)."""
        if dim is None:
            return self._reduce(None, False, "max", "max")
        return self.to_dense().max(dim, keepdim)

    def min(self: "SparseTensor", dim: int | None = None, keepdim: bool = False) -> Any:  # type: ignore[misc]
        """``A.min()``: the smallest entry (0-d); ``A.min(dim)``: ``(values, indices)`` as :meth:`max`."""
        if dim is None:
            return self._reduce(None, False, "min", "min")
        return self.to_dense().min(dim, keepdim)

    def prod(self: "SparseTensor", dim: int | None = None, keepdim: bool = False, *,  # type: ignore[misc]
             dtype: torch.dtype | None = None) -> torch.Tensor:
        """Product over ``dim`` (default: all), as ``A.to_dense().prod(dim, keepdim)``: 0 unless every entry of the
        reduced slice is stored (NaN where a stored entry of such a slice is inf or NaN: 0 * inf), 1 over an empty
        dimension."""
        return self._reduce(dim, keepdim, "prod", "prod", dtype)

    # Diagonal and trace ---------------------------------------------------------------------------
    def diagonal(self: "SparseTensor", offset: int = 0, dim1: int = -2, dim2: int = -1) -> torch.Tensor:  # type: ignore[misc]
        """The ``offset`` diagonal of dims ``dim1``/``dim2`` (default the last two) as a dense tensor, as
        ``torch.diagonal(A.to_dense(), offset, dim1, dim2)``: the other dims first, the diagonal last."""
        d1, d2 = (_norm_dims(self, d, "diagonal")[0] for d in (dim1, dim2))
        if d1 == d2:
            raise InputError(f"diagonal: dim1 and dim2 are the same dimension ({dim1}, {dim2})")
        nvb = len(self.batch_shape)
        if d1 < nvb or d2 < nvb:
            return torch.diagonal(self.to_dense(), offset, dim1, dim2)
        fs = self.format_shape
        f1, f2 = d1 - nvb, d2 - nvb
        L = max(0, min(fs[f1] + min(offset, 0), fs[f2] - max(offset, 0)))
        coords, vals = self.coordinates()
        coords = coords.long()
        on = (coords[f2] - coords[f1]) == offset
        sel = on.nonzero().reshape(-1)
        c = coords[:, sel]
        pos = c[f1] if offset >= 0 else c[f2]
        others = [k for k in range(len(fs)) if k not in (f1, f2)]
        oshape = tuple(fs[k] for k in others)
        lin = _linear_index(torch.cat([c[others], pos[None]], 0), oshape + (L,))
        bs = self.batch_shape
        B = math.prod(bs)
        v = vals[..., sel].reshape(B, sel.numel())
        out = v.new_zeros(B, math.prod(oshape) * L).index_add(1, lin, v)
        return out.reshape(tuple(bs) + oshape + (L,))

    def trace(self: "SparseTensor") -> torch.Tensor:  # type: ignore[misc]
        """Sum of the main diagonal (``torch.trace(A.to_dense())`` for a matrix; one trace per member,
        shaped like the batch, for a batch of matrices)."""
        return self.diagonal().sum(-1)

    # Indexing -------------------------------------------------------------------------------------
    def __getitem__(self: "SparseTensor", key: Any) -> Any:  # type: ignore[misc]
        """``A[...]`` with integers, slices (steps > 0), one 1-D integer list / LongTensor, and ``...``.

        Value-batch dims come first: indexing them picks members (a SparseTensor on the same pattern).
        Over the format's dims: when two or more of them remain (only slices and index lists there) the
        result is a SparseTensor of the selected part, in the source's format when it is CSR, CSC, COO,
        DCSR or DCSC, else CSR (matrices) or COO (other orders); when fewer remain (an integer on a format
        dim: ``A[i]``, ``A[:, j]``, ``A[i, j]``) it is the dense tensor ``A.to_dense()[key]`` (0 where nothing
        is stored, differentiable w.r.t. the stored values). Out-of-range indices raise IndexError."""
        keys = list(key) if isinstance(key, tuple) else [key]
        nd = self.ndim
        if sum(k is Ellipsis for k in keys) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if any(k is Ellipsis for k in keys):
            at = next(i for i, k in enumerate(keys) if k is Ellipsis)
            keys = keys[:at] + [slice(None)] * (nd - len(keys) + 1) + keys[at + 1:]
        if len(keys) > nd:
            raise IndexError(f"too many indices for a SparseTensor of {nd} dimensions (shape {tuple(self.shape)}): "
                             f"{len(keys)} given")
        keys = keys + [slice(None)] * (nd - len(keys))
        sel = [_selector(k, self._shape[d], d) for d, k in enumerate(keys)]
        if sum(s[0] == "list" for s in sel) > 1:
            raise IndexError("a SparseTensor takes one index list per indexing; torch pairs several lists up "
                             "(D[[0, 2], [1, 3]] is the entries (0, 1) and (2, 3)): write A.to_dense()[rows, cols] for "
                             "those entries, or A[rows][:, cols] for the block of all pairs")
        nvb = len(self.batch_shape)
        t = self
        if any(s[0] != "all" for s in sel[:nvb]):
            bkey = tuple(s[1] for s in sel[:nvb])
            t = self.with_values(self._values[bkey])
        fsel = sel[nvb:]
        if all(s[0] == "all" for s in fsel):
            return t
        return _select(t, fsel)


for _n in _ZERO_PRESERVING:
    setattr(ElementwiseMethods, _n, _value_map(_n))
for _n in _DENSE_MAPS:
    setattr(ElementwiseMethods, _n, _dense_map(_n))
del _n


def _prod_cells(v2: torch.Tensor, lin: torch.Tensor, K: int, cell: int) -> torch.Tensor:
    """``(B, K)`` products of the cells of ``cell`` entries (coalesced ``v2`` ``(B, n)`` in cells ``lin``): a fully
    stored cell's entries multiplied by torch.prod (its forward- and reverse-mode derivatives, complex and exact
    zeros included: scatter_reduce's "prod" has neither), a partially stored one 0 (an implicit zero), or NaN where
    one of its stored entries is not finite (0 * inf, as the dense product); an empty cell 1."""
    B = v2.shape[0]
    if cell == 0:
        return v2.new_ones(B, K)
    counts = torch.bincount(lin, minlength=K)
    bad = v2.new_zeros(B, K, dtype=torch.int64).index_add(1, lin, (~torch.isfinite(v2)).to(torch.int64))
    out = torch.where(bad > 0, torch.full((), float("nan"), dtype=v2.dtype, device=v2.device), v2.new_zeros(B, K))
    in_full = (counts == cell).index_select(0, lin)
    if bool(in_full.any()):
        idx = in_full.nonzero().squeeze(1)
        order = idx.index_select(0, torch.argsort(lin.index_select(0, idx), stable=True))
        cells = lin.index_select(0, order).reshape(-1, cell)[:, 0]
        prods = v2.index_select(1, order).reshape(B, -1, cell).prod(-1)
        out = out.index_copy(1, cells, prods)
    return out


def _selector(k: Any, size: int, d: int) -> tuple:
    """``("int", i)``, ``("slice", slice)``, ``("list", LongTensor)`` or ``("all", slice(None))`` for index ``k``
    of dimension ``d`` (extent ``size``), bounds checked."""
    if k is None:
        raise IndexError("SparseTensor indexing does not insert dimensions (None); index A.to_dense() for that")
    if isinstance(k, slice):
        start, stop, step = k.indices(size)
        if step <= 0:
            raise IndexError(f"slice step must be positive, got {k.step} (dimension {d})")
        if (start, stop, step) == (0, size, 1):
            return ("all", slice(None))
        return ("slice", slice(start, stop, step))
    if isinstance(k, torch.Tensor) and k.dim() == 0 and not k.dtype.is_floating_point and k.dtype != torch.bool:
        k = int(k)
    if isinstance(k, bool):
        raise IndexError(f"boolean indices are not supported on a SparseTensor (dimension {d}, got {k})")
    if isinstance(k, numbers.Integral) and not isinstance(k, int):  # a NumPy integer
        k = int(k)
    if type(k).__module__ == "numpy" and hasattr(k, "shape"):  # a NumPy array: as a list of indices
        k = torch.as_tensor(k)
    if isinstance(k, (list, tuple)) and len(k) == 0:
        k = torch.zeros(0, dtype=torch.int64)
    if isinstance(k, int):
        if not -size <= k < size:
            raise IndexError(f"index {k} is out of range for dimension {d} with size {size}")
        return ("int", k + size if k < 0 else k)
    if isinstance(k, (list, tuple, torch.Tensor)):
        idx = torch.as_tensor(k)
        if idx.dtype == torch.bool or idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dim() != 1:
            raise IndexError(f"a SparseTensor takes 1-D integer index lists; dimension {d} got a tensor of shape "
                             f"{tuple(idx.shape)} and dtype {idx.dtype}")
        idx = idx.long()
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < -size or hi >= size:
                bad = lo if lo < -size else hi
                raise IndexError(f"index {bad} is out of range for dimension {d} with size {size}")
        return ("list", torch.where(idx < 0, idx + size, idx))
    raise IndexError(f"unsupported index {k!r} ({type(k).__name__}) for dimension {d}")


def _select(t: "SparseTensor", sel: list) -> Any:
    """The part of ``t`` (no value batch indices left) that the per-format-dim selectors pick."""
    fs = t.format_shape
    coords, vals = _coalesced(t)
    device = t.device
    entry = torch.arange(coords.shape[1], device=device)
    out_coords: list[torch.Tensor] = []
    out_shape: list[int] = []
    for d, (kind, arg) in enumerate(sel):
        c = coords[d][entry]
        if kind == "all":
            out_coords.append(c)
            out_shape.append(fs[d])
        elif kind == "int":
            keep = (c == arg).nonzero().reshape(-1)
            entry, out_coords = entry[keep], [x[keep] for x in out_coords]
        elif kind == "slice":
            off = c - arg.start
            n_out = len(range(arg.start, arg.stop, arg.step))
            ok = (off >= 0) & (off % arg.step == 0) & (torch.div(off, arg.step, rounding_mode="floor") < n_out)
            keep = ok.nonzero().reshape(-1)
            entry, out_coords = entry[keep], [x[keep] for x in out_coords]
            out_coords.append(torch.div(off[keep], arg.step, rounding_mode="floor"))
            out_shape.append(n_out)
        else:  # a list: each entry goes to every place its coordinate is listed
            idx = arg.to(device)
            srt, perm = torch.sort(idx, stable=True)
            lo = torch.searchsorted(srt, c, right=False)
            hi = torch.searchsorted(srt, c, right=True)
            cnt = hi - lo
            rep = torch.repeat_interleave(torch.arange(c.numel(), device=device), cnt)
            start = torch.repeat_interleave(lo, cnt)
            first = torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt)
            where = perm[start + torch.arange(rep.numel(), device=device) - first]
            entry, out_coords = entry[rep], [x[rep] for x in out_coords]
            out_coords.append(where)
            out_shape.append(idx.numel())
    v = vals[..., entry]
    shape = tuple(out_shape)
    if len(shape) >= 2:
        oc = torch.stack(out_coords) if out_coords else torch.zeros(0, 0, dtype=torch.int64, device=device)
        if oc.shape[1] > 1:  # a list in any order leaves the entries unsorted: sort them row-major
            order = torch.argsort(_linear_index(oc, shape), stable=True)
            oc, v = oc[:, order], v[..., order]
        fmt = _simple_format(t, len(shape))
        try:
            return _from_coo(v, oc, shape, fmt, t.index_dtype)
        except (ConversionError, FormatError):
            return _from_coo(v, oc, shape, None, t.index_dtype)
    bs = t.batch_shape
    B = math.prod(bs)
    n = entry.numel()
    lin = _linear_index(torch.stack(out_coords), shape) if out_coords else torch.zeros(n, dtype=torch.int64,
                                                                                       device=device)
    out = v.reshape(B, n).new_zeros(B, math.prod(shape)).index_add(1, lin, v.reshape(B, n))
    return out.reshape(tuple(bs) + shape)


# torch functions ----------------------------------------------------------------------------------
def _equal(a: Any, b: Any) -> bool:
    """``torch.equal``: same shape and the same dense content (formats may differ; NaN is unequal)."""
    if not _is_st(a):
        a, b = b, a
    if not _is_st(b):
        if not isinstance(b, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
            return False
        return torch.equal(a.to_dense(), b)
    if tuple(a.shape) != tuple(b.shape) or a.device != b.device:
        return False
    ca, va = _coalesced(a)
    cb, vb = _coalesced(b)
    dtype = torch.promote_types(va.dtype, vb.dtype)
    va, vb = va.to(dtype), vb.to(dtype)
    fs = a.format_shape
    if math.prod(fs) < 2**62:
        ka, kb = _linear_index(ca, fs), _linear_index(cb, fs)
    else:
        _, rank = torch.unique(torch.cat([ca, cb], 1), dim=1, return_inverse=True)
        ka, kb = rank[: ca.shape[1]], rank[ca.shape[1]:]

    def other_at(k1: torch.Tensor, k2: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        if k2.numel() == 0:
            return torch.zeros(*v2.shape[:-1], k1.numel(), dtype=v2.dtype, device=v2.device)
        at = torch.searchsorted(k2, k1).clamp(max=k2.numel() - 1)
        hit = k2[at] == k1
        return torch.where(hit, v2[..., at], torch.zeros((), dtype=v2.dtype, device=v2.device))

    with torch.no_grad():
        return bool((va == other_at(ka, kb, vb)).all()) and bool((vb == other_at(kb, ka, va)).all())


def _run_binary(op: str, reverse: bool, a: Any, b: Any, args: tuple, kwargs: dict) -> Any:
    x, y = (b, a) if reverse else (a, b)
    alpha = kwargs.pop("alpha", 1)
    if args or kwargs:
        return NotImplemented
    if alpha != 1:
        y = y * alpha
    # the operators' methods called directly: under torch.compile an operator between a SparseTensor and a tensor
    # comes back here through __torch_function__ (Tensor.__rmul__), which recursed without end
    if _is_st(x):
        method = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "div": "__truediv__"}[op]
        return getattr(x, method)(y)
    if not _is_st(y):
        return NotImplemented
    if op == "mul":
        return y.__mul__(x)  # elementwise products commute
    if not isinstance(x, torch.Tensor):
        return NotImplemented
    if op == "div":
        return x / y.to_dense()  # a dense tensor over A: dense (inf/nan at the implicit zeros)
    return y._add_dense(x, 1 if op == "add" else -1, True)


def _binary(op: str, reverse: bool = False) -> Callable:
    def run(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        return _run_binary(op, reverse, a, b, args, kwargs)

    return run


def _method(name: str) -> Callable:
    def run(a: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_st(a):
            return NotImplemented
        return getattr(a, name)(*args, **kwargs)

    return run


def _functional_relu(a: Any, inplace: bool = False) -> Any:
    if not _is_st(a):
        return NotImplemented
    if inplace:
        raise InputError("relu(A, inplace=True): a SparseTensor's operations never modify it; call relu(A) (a new "
                         "tensor on the same pattern)")
    return a.relu()


_TABLE: dict = {}


def _build_table() -> dict:
    T = torch.Tensor
    table: dict = {}
    for name in (*_ZERO_PRESERVING, *_DENSE_MAPS, "neg", "negative", "conj", "conj_physical", "resolve_conj", "pow",
                 "clamp", "clip", "sum", "mean", "amax", "amin", "max", "min", "prod", "diagonal", "trace", "numel",
                 "is_complex", "is_floating_point", "real", "imag", "square"):
        fn = getattr(torch, name, None)
        if fn is None:
            continue
        if name in ("real", "imag"):
            table[fn] = (lambda attr: lambda a: getattr(a, attr) if _is_st(a) else NotImplemented)(name)
        else:
            table[fn] = _method(name)
    table[torch.nn.functional.relu] = _functional_relu
    for op, fns, rfns in (
        ("add", (torch.add, T.add, T.__add__), (T.__radd__,)),
        ("sub", (torch.sub, torch.subtract, T.sub, T.__sub__), (T.__rsub__,)),
        ("mul", (torch.mul, torch.multiply, T.mul, T.__mul__), (T.__rmul__,)),
        ("div", (torch.div, torch.divide, torch.true_divide, T.div, T.__truediv__), (T.__rtruediv__,)),
    ):
        for fn in fns:
            table[fn] = _binary(op)
        for fn in rfns:
            table[fn] = _binary(op, reverse=True)
    table[torch.equal] = _equal
    table[T.equal] = _equal
    return table


def _lookup(func: Any) -> Callable | None:
    if not _TABLE:
        _TABLE.update(_build_table())
    return _TABLE.get(func)


# Looked up outside torch.compile's tracing (a graph break there): traced, the lookup of a torch function in this
# table answered Tensor.sub with the handler of mul once other graphs had been compiled (t - E gave E * t).
# Made on first use under compilation (importing torch._dynamo at import time costs ~1 s: test_compile_ops).
_EAGER: list = []


def torch_function_handler(func: Any) -> Callable | None:
    """What ``SparseTensor.__torch_function__`` runs for ``func`` (None: not handled here). A handler may
    still return NotImplemented for operands it does not take."""
    if not torch.compiler.is_compiling():
        return _lookup(func)
    if not _EAGER:
        from torch import _dynamo  # noqa: PLC0415 - already loaded: we are compiling

        _EAGER.append(_dynamo.disable(_lookup))
    return _EAGER[0](func)  # type: ignore[no-any-return]
