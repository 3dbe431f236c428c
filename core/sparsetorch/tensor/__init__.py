"""The universal sparse tensor, its kinds, conversion and package interop."""

from .construct import build, convert, from_coo, from_dense
from .sparse_tensor import PatternKey, SparseTensor, Tensor

__all__ = ["PatternKey", "SparseTensor", "Tensor", "build", "convert", "from_coo", "from_dense"]
