"""sparsetorch: sparse tensors in any storage format, and sparse linear algebra, for PyTorch.

``import sparsetorch`` loads torch and the core only; optional packages (SciPy, CuPy, PyAMG)
are imported when an operation needs them.
"""

from . import format
from ._version import __version__
from .errors import (
    ConversionError, FormatError, FormatParseError, InteropError, SparseTorchError, SparseTorchWarning,
    ValidationError,
)
from .format import Dimension, LevelFormat, LevelProperty, TensorFormat
from .tensor import PatternKey, SparseTensor, SparseTensorList, Tensor, from_package

__all__ = [
    "__version__", "format",
    "ConversionError", "FormatError", "FormatParseError", "InteropError", "SparseTorchError",
    "SparseTorchWarning", "ValidationError",
    "Dimension", "LevelFormat", "LevelProperty", "TensorFormat",
    "PatternKey", "SparseTensor", "SparseTensorList", "Tensor", "from_package",
]
