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

__all__ = ["Handoff", "plain", "TransposeMap"]


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


class TransposeMap:
    """Where each stored entry's transposed entry is stored (pattern work, once per plan), to test
    values for ``A == A^H`` in O(nnz) per value set: Eigen's SimplicialLLT / SimplicialLDLT read one
    triangle and take the other to be its conjugate transpose, so a matrix that is not Hermitian
    (a complex symmetric one, ``A == A^T``) is factored as another matrix, without an error."""

    def __init__(self, h: Handoff) -> None:
        n = h.shape[0]
        outer = h.indptr.to(torch.int64)
        major = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), outer[1:] - outer[:-1])
        minor = h.indices.to(torch.int64)
        rows, cols = (major, minor) if h.csr else (minor, major)
        key = rows * n + cols
        order = None
        if key.numel() > 1 and not bool((key[1:] >= key[:-1]).all()):
            key, order = torch.sort(key)
        tkey = cols * n + rows
        pos = torch.searchsorted(key, tkey).clamp_(max=max(key.numel() - 1, 0))
        found = key[pos] == tkey if key.numel() else torch.zeros(0, dtype=torch.bool)
        #: the slot of each entry's transpose (meaningless where ``found`` is False), its row and column
        self.slot = pos if order is None else order[pos]
        self.found = found
        self.rows, self.cols = rows, cols

    def defect(self, data: torch.Tensor) -> tuple[int, int, bool] | None:
        """The first ``(member, slot, complex_symmetric)`` where ``data`` (``(members, nnz)``) is not
        Hermitian, or None. An entry ``a`` passes when ``|a - conj(t)|^2 <= max(eps, 1e-8) max(|a|^2, |t|^2) +
        (100 eps max|A|)^2`` for its transposed entry ``t`` (0 where none is stored): within
        ``max(sqrt(eps), 1e-4)`` of it relative to the larger of the two, or at rounding level of A's largest
        entry (the assembly of a Hermitian matrix). ``complex_symmetric``: the values equal their
        unconjugated transposes by the same test, so A is complex symmetric. Squared magnitudes of
        the real and imaginary parts: complex ``abs`` costs several times more (1.2M entries)."""
        if data.numel() == 0:
            return None
        t = data.index_select(-1, self.slot)
        if data.is_complex():
            ar, ai, tr, ti = data.real, data.imag, t.real, t.imag
        else:
            ar, ai, tr, ti = data, None, t, None
        zero = torch.zeros((), dtype=ar.dtype)
        tr = torch.where(self.found, tr, zero)
        ti = torch.where(self.found, ti, zero) if ti is not None else None
        m2a = ar * ar if ai is None else ar * ar + ai * ai
        m2t = tr * tr if ti is None else tr * tr + ti * ti
        eps = torch.finfo(ar.dtype).eps
        # within max(sqrt(eps), 1e-4) of the larger entry: values assembled in single precision and solved in
        # double differ from their transposes by ~1e-7, and the factorization plus the core's refinement answers them
        bound = max(eps, 1e-8) * torch.maximum(m2a, m2t) + (100 * eps) ** 2 * m2a.amax(-1, keepdim=True)
        dr = (ar - tr).square_()
        d2 = dr if ai is None or ti is None else dr + (ai + ti).square_()  # a - conj(t)
        bad = d2 > bound
        if not bool(bad.any()):
            return None
        member, slot = (int(i) for i in torch.nonzero(bad)[0])
        symmetric = ai is not None and ti is not None and bool((dr[member] + (ai[member] - ti[member]).square()
                                                                  <= bound[member]).all())
        return member, slot, symmetric
