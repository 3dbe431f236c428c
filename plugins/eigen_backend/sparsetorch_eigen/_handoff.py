"""Zero-copy hand-off of CPU sparse tensors to Eigen maps.

A :class:`Handoff` is built once per pattern (a plan's ``__init__``). The C++ side receives raw
addresses (``data_ptr()``) of torch buffers and wraps them in ``Eigen::Map<SparseMatrix>``:

- **CSR or CSC input** (ordered, unique): the map reads A's own ``pos``/``crd`` buffers and its
  values tensor: no copy of values or indices, int32 or int64 (the iterative solvers take both).
  CSR is a RowMajor map of A, CSC a ColMajor one; the same buffers in the other layout are A^T.
- **Other formats** (COO, BSR, DIA, ELL, ...): converted to CSR once per pattern (sparsetorch's
  conversion map, cached on the pattern); each value set is then one gather.
- **The direct solvers** (Eigen's Simplicial*, SparseLU, SparseQR) are compiled for int32 indices
  only (to keep the build small): int64 indices are narrowed once per pattern and kept here.
  Those solvers copy A into their own permuted storage in every factorization anyway.

The plan keeps this object (and so the tensors) alive while C++ holds maps of the buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from sparsetorch import InputError, SparseTensor
from sparsetorch.format import CSC, CSR
from sparsetorch.backend import conversion

__all__ = ["Handoff", "plain"]


def plain(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor without lazy conjugate/negative bits (what a raw pointer can read)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


class Handoff:
    """A's pattern as compressed buffers for Eigen, and its values per value set."""

    def __init__(self, A: SparseTensor, *, int32: bool = False, backend: str = "eigen") -> None:
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels:
            raise InputError(f"the {backend} backend takes sparse matrices (2 format dimensions, no BATCH levels), "
                             f"got format {A.format} of shape {tuple(A.shape)}")
        if A.device.type != "cpu":
            raise InputError(f"the {backend} backend runs on the CPU; A is on {A.device} (move it with .cpu())")
        self.shape = (int(fs[0]), int(fs[1]))
        self.batch_shape = tuple(A.batch_shape)
        self.members = 1
        for s in self.batch_shape:
            self.members *= int(s)
        self._source = A
        self._conv: Any = None
        fmt = A.format
        if fmt == CSR:
            kind, pos, crd = "csr", A.pos(1), A.crd(1)
        elif fmt == CSC:
            kind, pos, crd = "csc", A.pos(1), A.crd(1)
        else:
            self._conv = conversion(A, CSR, A.index_dtype)
            kind, pos, crd = "csr", self._conv.pos[1], self._conv.crd[1]
        self.kind = kind
        self.nnz = int(pos[-1]) if pos.numel() else 0
        self.shares_indices = self._conv is None
        pos, crd = pos.detach(), crd.detach()
        if int32 and (pos.dtype != torch.int32 or crd.dtype != torch.int32):
            if self.nnz >= 2**31 - 1 or max(self.shape) >= 2**31 - 1:
                raise InputError(f"{self.nnz} stored entries do not fit the int32 indices of Eigen's direct solvers here")
            pos, crd = pos.to(torch.int32), crd.to(torch.int32)  # once per pattern
            self.shares_indices = False
        if not (pos.is_contiguous() and crd.is_contiguous()):
            pos, crd = pos.contiguous(), crd.contiguous()
            self.shares_indices = False
        if pos.dtype != crd.dtype or pos.dtype not in (torch.int32, torch.int64):
            pos, crd = pos.to(torch.int64), crd.to(torch.int64)
            self.shares_indices = False
        self.indptr, self.indices = pos, crd
        self.index64 = pos.dtype == torch.int64
        nslots = A.values.shape[-1]
        if self._conv is None and nslots != self.nnz:
            raise InputError(f"A has {nslots} value slots for {self.nnz} stored entries; expected one per entry")

    @property
    def csr(self) -> bool:
        return self.kind == "csr"

    @property
    def converted(self) -> bool:
        return self._conv is not None

    def values(self, values: torch.Tensor) -> torch.Tensor:
        """``(members, nnz)`` contiguous values (A's own tensor when it is CSR/CSC and contiguous)."""
        values = values.detach()
        if self._conv is not None:
            values = self._conv.apply(self._source.with_values(values)).values
        return plain(values).reshape(self.members, self.nnz)


def structurally_symmetric(h: Handoff) -> bool:
    """Whether the pattern equals its transpose (pattern work: once per plan)."""
    m, n = h.shape
    if m != n:
        return False
    if h.nnz == 0:
        return True
    outer = h.indptr.to(torch.int64)
    counts = outer[1:] - outer[:-1]
    major = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), counts)
    minor = h.indices.to(torch.int64)
    key = major * n + minor  # ordered formats: already sorted
    tkey, _ = torch.sort(minor * n + major)
    return bool(torch.equal(key, tkey))


def full_diagonal(h: Handoff) -> bool:
    """Whether every diagonal position of the square pattern is stored (pattern work)."""
    m, n = h.shape
    if m != n:
        return False
    outer = h.indptr.to(torch.int64)
    major = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), outer[1:] - outer[:-1])
    on = h.indices.to(torch.int64) == major
    hits = torch.zeros(n, dtype=torch.bool)
    hits[major[on]] = True
    return bool(hits.all())
