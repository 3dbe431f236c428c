"""CuPy arrays and ``cupyx.scipy.sparse`` matrices <-> SparseTensor, through DLPack.

CuPy is imported only here, and this module only for objects whose type lives in ``cupy*`` or
for ``to_package(t, "cupy")``. Every array crosses with ``torch.from_dlpack`` /
``cupy.from_dlpack`` (zero-copy, same device). The formats are SciPy's (see ``scipy_io``) minus
bsr, which cupyx lacks; a dense ``cupy.ndarray`` maps like a torch strided tensor.

CuPy's sparse constructors choose their own index dtype: ``coo_matrix`` always casts to int32
and ``csr/csc`` may cast int64 indices that fit to int32; such casts copy the index arrays
(the values are shared regardless).
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import InteropError
from ..sparse_tensor import SparseTensor
from ._common import check_value_dtype, classify, plain_values
from .scipy_io import check_kind, from_sparse_like, sparse_parts

__all__ = ["from_cupy", "to_cupy", "CUPY_FORMATS"]

CUPY_FORMATS = ("cupyx.scipy.sparse csr, csc, coo and dia (formats CSR, CSC, COO and DIA_J), and dense "
                "cupy.ndarray (dense formats)")
_CUPY_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def from_cupy(obj: Any, *, check: bool = True) -> SparseTensor:
    """Wrap a ``cupy.ndarray`` (dense) or a ``cupyx.scipy.sparse`` csr/csc/coo/dia matrix."""
    import cupy
    import cupyx.scipy.sparse as csp

    from .torch_io import from_strided

    if isinstance(obj, cupy.ndarray):
        t = torch.from_dlpack(obj)
        check_value_dtype(t.dtype, f"this {tuple(t.shape)} cupy array", "a.astype(cupy.float64)")
        return from_strided(t, check=check)
    if csp.issparse(obj):
        return from_sparse_like(obj, torch.from_dlpack, check=check, package="cupy")
    raise InteropError(
        f"{type(obj).__module__}.{type(obj).__qualname__} is neither a cupy.ndarray nor a cupyx.scipy.sparse "
        f"matrix; from_package takes {CUPY_FORMATS}"
    )


def to_cupy(t: SparseTensor, kind: str | None = None) -> Any:
    """``t`` as a cupyx sparse matrix/array (``kind`` "array" or "matrix"; default: array where
    this CuPy has it) or, for dense formats, a ``cupy.ndarray`` view."""
    if kind is not None:
        check_kind(kind)
    if t.device.type != "cuda":
        raise InteropError(f"this tensor is on {t.device}; CuPy works on CUDA devices. Move it first: "
                           f"t.cuda().to_package('cupy') (or use to_package('scipy') on the CPU)")
    import cupy
    import cupyx.scipy.sparse as csp

    from .torch_io import to_torch

    layout = classify(t.format)
    if layout is not None and layout.kind == "dense":
        return cupy.from_dlpack(plain_values(to_torch(t)))
    if t.dtype not in _CUPY_DTYPES:
        raise InteropError(f"cupyx sparse matrices hold float32/float64/complex64/complex128, not {t.dtype}; "
                           f"cast first: t.to(torch.float32).to_package('cupy')")
    if layout is not None and layout.kind == "bsr":
        raise InteropError("cupyx.scipy.sparse has no bsr; convert first: t.convert(sparsetorch.format.CSR)"
                           ".to_package('cupy')")
    name, parts = sparse_parts(t, "cupy", CUPY_FORMATS)
    arr = {k: cupy.from_dlpack(plain_values(v)) for k, v in parts.items() if isinstance(v, torch.Tensor)}
    if kind is None:
        kind = "array" if hasattr(csp, f"{name}_array") else "matrix"
    cls = getattr(csp, f"{name}_{kind}", None)
    if cls is None:
        raise InteropError(f"this CuPy ({cupy.__version__}) has no cupyx.scipy.sparse.{name}_{kind}; pass kind='matrix'")
    shape = tuple(t.shape)
    if name == "coo":
        if len(shape) != 2:
            raise InteropError(f"cupyx's coo is 2-D; this tensor has shape {shape}")
        row, col = (cupy.from_dlpack(plain_values(c)) for c in parts["coords"])
        A = cls((arr["data"], (row, col)), shape=shape, copy=False)
        A.has_canonical_format = parts["canonical"]
        return A
    if name == "dia":
        return cls((arr["data"], arr["offsets"]), shape=shape, copy=False)
    if not (t.format.is_unique and t.format.is_ordered):
        # unsorted or repeated indices: cupyx sorts / sums them in place, as SciPy does (scipy_io's docstring)
        arr = {k: (v.copy() if k in ("data", "indices", "indptr") else v) for k, v in arr.items()}
    return cls((arr["data"], arr["indices"], arr["indptr"]), shape=shape, copy=False)
