"""Assembling matrices from coordinate lists whose pattern stays fixed while values change.

``CooAssembler(rows, cols, shape)`` builds the (duplicate-summed) CSR pattern once; ``values(v)``
maps a value list in the same order as ``rows``/``cols`` to that pattern's value slots with one
``index_add``. The pattern tensor keeps its ``pattern_key``, so solver plans built on it are
reused for every new value list (the shifted and bordered systems of the eigen-solvers).
"""

from __future__ import annotations

import torch

from ..format import CSR
from ..tensor import SparseTensor

__all__ = ["CooAssembler"]


class CooAssembler:
    def __init__(self, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> None:
        rows = rows.to(torch.int64)
        cols = cols.to(torch.int64)
        ones = torch.ones(rows.numel(), dtype=dtype, device=rows.device)
        self.pattern = SparseTensor.from_coo(ones, rows, cols, shape=shape, format=CSR, check=False)
        coords, slot = self.pattern.entries()
        lin_slots = coords[0] * shape[1] + coords[1]
        order = torch.argsort(lin_slots)
        pos = torch.searchsorted(lin_slots[order], rows * shape[1] + cols)
        self._map = slot[order][pos]
        self._nslots = self.pattern.values.shape[-1]

    def values(self, v: torch.Tensor) -> torch.Tensor:
        out = v.new_zeros(*v.shape[:-1], self._nslots)
        return out.index_add(-1, self._map, v)

    def tensor(self, v: torch.Tensor) -> SparseTensor:
        return self.pattern.with_values(self.values(v))
