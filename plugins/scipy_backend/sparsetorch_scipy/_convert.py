"""Zero-copy hand-off of CPU sparse tensors to SciPy.

A :class:`Handoff` is built once per sparsity pattern (in a plan's ``__init__``) and turns each
new set of values into SciPy compressed arrays:

- **CSR or CSC input** (the exact, ordered and unique formats): SciPy's ``indptr``/``indices``
  are NumPy views of A's own index buffers and ``data`` a view of A's values. Nothing is copied,
  for int32 and int64 indices alike (SciPy >= 1.12 keeps int64 indices as given).
- **Any other format** (COO, BSR, DIA, ELL, unordered CSR, ...): converted to CSR once per
  pattern (sparsetorch's conversion map, cached on the pattern); each set of values is then one
  gather into the CSR slots.
- **int32 required** (SuperLU, PyAMG): int64 indices are narrowed once, here, and kept; values
  still hand over without a copy. **int32 preferred** (``int32="auto"``: the Krylov, product and
  least-squares plans): the same when the sizes fit, since SciPy's 32-bit CSR product is faster
  (2-D Poisson 1000², one thread: 5.3 vs 7.5 ms per product, measured); indices stay shared
  (int64) otherwise.

The views are read-only, so a library that tried to write into the user's buffers (sorting
indices in place, summing duplicates) would raise instead of corrupting them. The transposed
matrix needs no copy either: the CSR buffers of ``A`` read as CSC are ``A^T``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sparsetorch import InputError, SparseTensor
from sparsetorch.format import CSC, CSR
from sparsetorch.backend import conversion

__all__ = ["Handoff", "numpy_view"]


def numpy_view(t: torch.Tensor, *, writeable: bool = False) -> np.ndarray:
    """A NumPy view of a CPU tensor (no copy), read-only unless ``writeable``.

    Conjugate and negative views are materialised first (NumPy cannot express them)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    arr = t.numpy()
    if not writeable:
        arr.flags.writeable = False
    return arr


class Handoff:
    """A's pattern as SciPy ``indptr``/``indices``, and its values as ``data``, per value set.

    ``kind`` is ``"csr"`` or ``"csc"`` (the layout the buffers describe for ``A``);
    ``shares_indices`` tells whether they are A's own buffers, ``converted`` whether values
    need a gather (A was in another format). ``kinds`` restricts the layouts a consumer takes
    (PyAMG takes CSR only: a CSC input is then converted like any other format).
    """

    def __init__(self, A: SparseTensor, *, int32: bool | str = False, kinds: tuple[str, ...] = ("csr", "csc")) -> None:
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels:
            raise InputError(f"the scipy backend takes sparse matrices (2 format dimensions, no BATCH levels), "
                             f"got format {A.format} of shape {tuple(A.shape)}")
        if A.device.type != "cpu":
            raise InputError(f"the scipy backend runs on the CPU; A is on {A.device} (move it with .cpu())")
        self.shape = (int(fs[0]), int(fs[1]))
        self.batch_shape = tuple(A.batch_shape)
        self._source = A
        fmt = A.format
        self._conv: Any = None
        if fmt == CSR and "csr" in kinds:
            kind, pos, crd = "csr", A.pos(1), A.crd(1)
        elif fmt == CSC and "csc" in kinds:
            kind, pos, crd = "csc", A.pos(1), A.crd(1)
        else:
            self._conv = conversion(A, CSR, A.index_dtype)
            kind, pos, crd = "csr", self._conv.pos[1], self._conv.crd[1]
        self.kind = kind
        self.nnz = int(pos[-1]) if pos.numel() else 0
        indptr, indices = numpy_view(pos), numpy_view(crd)
        self.shares_indices = self._conv is None
        fits = self.nnz < 2**31 - 1 and max(self.shape) < 2**31 - 1
        if int32 == "auto":  # products: 32-bit indices when they fit (SpMV 7.5 -> 5.3 ms on 2-D Poisson 1000²)
            int32 = fits
        if int32 and indices.dtype != np.int32:
            if not fits:
                raise InputError(f"{self.nnz} stored entries do not fit the int32 indices SuperLU/PyAMG need")
            indptr, indices = indptr.astype(np.int32), indices.astype(np.int32)  # once per pattern
            indptr.flags.writeable = False
            indices.flags.writeable = False
            self.shares_indices = False
        self.indptr, self.indices = indptr, indices
        self.converted = self._conv is not None
        nslots = A.values.shape[-1]
        if not self.converted and nslots != self.nnz:
            raise InputError(f"A has {nslots} value slots for {self.nnz} stored entries; expected one per entry")
        self._transpose_perm: np.ndarray | None = None
        self._perm_known = False

    # Values --------------------------------------------------------------------------------------
    def values(self, values: torch.Tensor) -> np.ndarray:
        """``(members, nnz)`` data arrays for A's value sets: views of ``values`` when A is CSR/CSC."""
        values = values.detach()
        if self._conv is not None:
            values = self._conv.apply(self._source.with_values(values)).values
        flat = numpy_view(values)
        # (members, nnz); with no stored entries NumPy cannot infer the member count from -1
        members = int(np.prod(values.shape[:-1])) if values.dim() > 1 else 1
        data = flat.reshape(members, self.nnz)
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        return data

    # Matrices ------------------------------------------------------------------------------------
    def matrix(self, data: np.ndarray, *, transpose: bool = False) -> Any:
        """``A`` (or ``A^T`` when ``transpose``) as a SciPy array on these buffers, without a copy.

        ``A^T`` is the same buffers read in the other layout (CSR of A = CSC of A^T)."""
        import scipy.sparse as sp

        m, n = self.shape
        as_csr = (self.kind == "csr") != transpose
        cls = sp.csr_array if as_csr else sp.csc_array
        shape = (n, m) if transpose else (m, n)
        mat = cls((data, self.indices, self.indptr), shape=shape, copy=False)
        mat.has_canonical_format = True  # ordered and unique by construction: no O(nnz) re-check
        return mat

    def csc(self, data: np.ndarray) -> tuple[Any, bool]:
        """A CSC array without a copy, and whether it holds ``A^T`` (True for CSR buffers)."""
        transposed = self.kind == "csr"
        return self.matrix(data, transpose=transposed), transposed

    def structurally_symmetric(self) -> bool:
        """Whether the pattern equals its transpose (pattern work: once per plan)."""
        return self.transpose_perm() is not None

    def full_diagonal(self) -> bool:
        """Whether every diagonal position is stored (pattern work)."""
        m, n = self.shape
        if m != n:
            return False
        counts = np.diff(self.indptr)
        major = np.repeat(np.arange(m, dtype=np.int64), counts)
        hits = np.zeros(m, dtype=bool)
        hits[major[self.indices == major]] = True
        return bool(hits.all())

    def transpose_perm(self) -> np.ndarray | None:
        """For a structurally symmetric pattern, ``perm`` such that ``data[perm]`` is the data of
        ``A^T`` in this layout (``A`` is Hermitian iff ``data == conj(data[perm])``); else None."""
        if not self._perm_known:
            import scipy.sparse as sp

            m, n = self.shape
            perm = None
            if m == n:
                ids = np.arange(self.nnz, dtype=np.int64)
                cls = sp.csr_array if self.kind == "csr" else sp.csc_array
                P = cls((ids, self.indices, self.indptr), shape=(m, n), copy=False)
                T = P.T.asformat(self.kind)  # the conversion sorts the indices
                if np.array_equal(T.indptr, self.indptr) and np.array_equal(T.indices, self.indices):
                    perm = np.ascontiguousarray(T.data, dtype=np.int64)
            self._transpose_perm, self._perm_known = perm, True
        return self._transpose_perm

    def is_hermitian(self, data: np.ndarray) -> bool:
        """Whether the matrix with ``data`` equals its conjugate transpose (O(nnz))."""
        perm = self.transpose_perm()
        if perm is None:
            return False
        other = data[perm]
        return bool(np.array_equal(data, np.conj(other) if np.iscomplexobj(data) else other))
