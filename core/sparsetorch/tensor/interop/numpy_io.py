"""NumPy ndarrays <-> SparseTensor (dense formats only).

``from_numpy``: a C-contiguous array is DENSE / DENSE_ND(n) and a Fortran-contiguous matrix is
DENSE_COL, both zero-copy (``torch.from_numpy``); any array whose strides are a permutation of
row-major keeps that level order, zero-copy; other strides (negative, broadcast) are copied.
``to_numpy``: a dense format's values as an ndarray view in the tensor's dimension order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import InteropError
from ..sparse_tensor import SparseTensor
from ._common import classify, format_label, plain_values

__all__ = ["from_numpy", "to_numpy", "np_tensor", "numpy_of"]

NUMPY_FORMATS = "dense arrays only (DENSE, DENSE_COL, DENSE_ND and other dense level orders)"


def np_tensor(arr: Any) -> torch.Tensor:
    """``torch.from_numpy`` that also takes non-native byte order and negative strides (copying)."""
    arr = np.asarray(arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if any(s < 0 for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    try:
        return torch.from_numpy(arr)
    except TypeError as e:
        raise InteropError(f"NumPy dtype {arr.dtype} has no torch counterpart ({e}); cast it first, "
                           f"e.g. a.astype(numpy.float64)") from e


def from_numpy(arr: np.ndarray, *, check: bool = True) -> SparseTensor:
    """Wrap a dense ndarray (see the module docstring)."""
    from .torch_io import from_strided

    if isinstance(arr, np.ma.MaskedArray):
        raise InteropError("a masked array would lose its mask; fill it first: a.filled(0)")
    if arr.dtype.kind not in "fc":
        raise InteropError(
            f"this {arr.shape} array has dtype {arr.dtype}; sparsetorch stores floating point or complex "
            f"values. Cast first: a.astype(numpy.float64)"
        )
    if arr.ndim == 0:
        raise InteropError("a 0-d array has no storage format; reshape it first, e.g. a.reshape(1)")
    return from_strided(np_tensor(arr), check=check)


def numpy_of(v: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data as an ndarray (shared memory; detached)."""
    if v.dtype == torch.bfloat16:
        raise InteropError("NumPy has no bfloat16; cast the values first: t.to(torch.float32)")
    return plain_values(v).numpy()


def to_numpy(t: SparseTensor) -> np.ndarray:
    """A dense-format tensor's values as an ndarray view in dimension order (batch dims first)."""
    if t.device.type != "cpu":
        raise InteropError(f"this tensor is on {t.device}; NumPy arrays live in host memory. "
                           f"Move it first: t.cpu().to_package('numpy')")
    layout = classify(t.format)
    if layout is None or layout.kind != "dense":
        raise InteropError(
            f"format {format_label(t.format)} has no counterpart in numpy, which holds {NUMPY_FORMATS}. "
            f"Convert first: t.convert(sparsetorch.format.DENSE).to_package('numpy') for a matrix, or "
            f"t.to_dense().numpy()"
        )
    nvb = len(t.batch_shape)
    sizes = t.format.level_sizes(t.format_shape)
    inverse = [layout.order.index(d) for d in range(len(layout.order))]
    arr = numpy_of(t.values).reshape(*t.batch_shape, *sizes)
    return arr.transpose(*range(nvb), *(nvb + k for k in inverse))
