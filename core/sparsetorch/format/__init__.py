"""The format DSL: dimensions, level formats and properties, level expressions, TensorFormat.

>>> from sparsetorch.format import TensorFormat
>>> str(TensorFormat.parse("(i, j) -> (j : dense, i : compressed)"))
'(i, j) -> (j : dense, i : compressed)'
"""

from .expr import Add, Dimension, FloorDiv, LevelExpr, Mod, Sub
from .level import LevelFormat, LevelProperty, LevelType
from .named import (
    BATCHED_CSC, BATCHED_CSR, BSC, BSR, COO, COO_ND, CSC, CSR, DCSC, DCSR, DELTA, DENSE, DENSE_COL,
    DENSE_ND, DIA, DIA_J, ELL, NM, batched, named_formats,
)
from .tensor_format import Level, Recovery, TensorFormat

__all__ = [
    "Add", "Dimension", "FloorDiv", "LevelExpr", "Mod", "Sub",
    "LevelFormat", "LevelProperty", "LevelType", "Level", "Recovery", "TensorFormat",
    "BATCHED_CSC", "BATCHED_CSR", "BSC", "BSR", "COO", "COO_ND", "CSC", "CSR", "DCSC", "DCSR",
    "DELTA", "DENSE", "DENSE_COL", "DENSE_ND", "DIA", "DIA_J", "ELL", "NM", "batched", "named_formats",
]
