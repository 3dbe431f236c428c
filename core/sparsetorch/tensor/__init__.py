"""The universal sparse tensor, its kinds, conversion and package interop."""

from .construct import build, convert, from_coo, from_dense
from .interop import from_package
from .sparse_tensor import PatternKey, SparseTensor, Tensor
from .tensor_list import SparseTensorList

__all__ = [
    "PatternKey", "SparseTensor", "SparseTensorList", "Tensor", "build", "convert", "from_coo", "from_dense",
    "from_package",
]
