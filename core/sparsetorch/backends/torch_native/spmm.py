"""Sparse @ dense with torch's own kernels (MKL on CPU, cuSPARSE on CUDA).

The plan converts the matrix to CSR once (a pattern-only conversion map, so new values cost a
gather), builds the transposed CSR for adjoint products on first use, and keeps the entry
coordinates for the SDDMM of the backward pass. Formats with BATCH levels (different patterns
per batch) run a gather/scatter product over their entries instead.

Half precision (float16, bfloat16): torch's CPU kernel has no half CSR product, and a product
summed in half loses digits with every term (float16 keeps 11 bits: a 4096-term dot product of
unit terms is off by ~1 % before rounding its result). So the plan keeps the values in float32,
upcasts ``X`` per product, accumulates in float32 and casts the result back to the input dtype;
the SDDMM of the backward pass does the same. Every other dtype runs as it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...autograd.sddmm import sddmm as core_sddmm
from ...format import CSR
from ...tensor import SparseTensor
from ...tensor.construct import conversion
from ...tensor.interop.torch_io import compressed_tensor
from ...tensor._serial import SerialCsr, serial_ok

__all__ = ["TorchSpmmPlan", "HALF_DTYPES", "compute_dtype"]

#: dtypes whose products run in float32 (upcast, accumulate, cast back)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype products of ``dtype`` accumulate in: float32 for the half dtypes, else itself."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    return compressed_tensor("csr", crow, col, values, shape)


class TorchSpmmPlan:
    """``Y = A @ X`` and ``Y = A^H @ X`` for a fixed pattern; values set by :meth:`set_values`.

    ``X`` has shape ``(*batch, n, k)`` where ``batch`` is A's value batch (or empty).
    """

    backend = "torch"
    method = "spmm"

    def __init__(self, A: SparseTensor) -> None:
        fs = A.format_shape
        if len(fs) != 2:
            raise ValueError(f"matmul needs a matrix (2 format dims), got format shape {fs}")
        self.shape = (int(fs[0]), int(fs[1]))
        self.batch_shape = tuple(A.batch_shape)
        self.device = A.device
        self._source = A
        self.gather_scatter = A.format.num_batch_levels > 0
        if not self.gather_scatter:
            idx = A.index_dtype
            # torch's CPU kernel and cuSPARSE accept int32 and int64; keep the tensor's own.
            self._conv = None if A.format == CSR else conversion(A, CSR, idx)
            csr = A if self._conv is None else self._conv.apply(A.detach())
            self._crow, self._col = _narrow(csr.pos(1), csr.crd(1))
            self._conv_t = None
        self._values: torch.Tensor | None = None
        self._values_t: torch.Tensor | None = None
        self._mat: torch.Tensor | None = None
        self._mat_t: torch.Tensor | None = None
        # small CPU products: NumPy, serially (tensor/_serial.py: torch's CSR kernel opens a parallel
        # region whatever the size, which stalls on a busy machine); per pattern, made on first use
        self._serial: SerialCsr | None = None
        self._serial_t: SerialCsr | None = None

    # Values -------------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """New values (``A.values`` of a tensor on this plan's pattern)."""
        new = self._to_csr_values(values.detach())
        if new.dtype in HALF_DTYPES:
            # a float32 copy (nse elements, made per value set): the kernels accumulate in it.
            # A fresh buffer every time, so in-place writes to the half values are always seen.
            new = new.float()
        self._values_t = None
        self._mat_t = None
        old = self._values
        if (old is not None and self._mat is not None and new.data_ptr() == old.data_ptr()
                and new.shape == old.shape and new.stride() == old.stride() and new.dtype == old.dtype):
            # the same buffer (a Matmul re-executed on unchanged operands): the CSR tensor already
            # reads it, written in place or not; only the transposed values above must be redone
            self._values = new
            return
        self._values = new
        # torch CSR tensor objects, built once per value set (construction costs tens of us).
        self._mat = _csr(self._crow, self._col, self._values, self.shape) if (
            not self.gather_scatter and self._values.dim() == 1) else None

    def _to_csr_values(self, values: torch.Tensor) -> torch.Tensor:
        if self.gather_scatter:
            return values
        if self._conv is None:
            return values
        # no BATCH levels here: the values are already linear (what _linear_buffers would give)
        return self._conv.values(values)

    def _adjoint_values(self) -> torch.Tensor:
        if self._values_t is None:
            if self._conv_t is None:
                csr = SparseTensor(CSR, self.shape, [None, self._crow], [None, self._col],
                                   self._values[..., :0].new_zeros(self._col.numel()), check=False)
                t = csr.T  # CSC view of A^T's pattern
                self._conv_t = conversion(t, CSR, self._crow.dtype)
                self._csr_t_src = t
                probe = self._conv_t.apply(t)
                self._crow_t, self._col_t = _narrow(probe.pos(1), probe.crd(1))
            vt = self._conv_t.apply(self._csr_t_src.with_values(self._values)).values
            # conjugated in memory, not as a lazy conj view: a kernel that reads the storage (the serial SciPy
            # product, torch's CSR kernel) met the unconjugated numbers where the Conjugate dispatch key was not
            # active, as when a compiled graph runs (torch.compile of A.T @ X, complex: A^H X came back; session
            # 32's sweep)
            self._values_t = torch.conj_physical(vt) if vt.is_complex() else vt
        return self._values_t

    # Products -----------------------------------------------------------------------------------
    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        if self._values is None:
            raise RuntimeError("TorchSpmmPlan.apply before set_values")
        if X.dtype in HALF_DTYPES:
            return self._apply(X.float(), adjoint).to(X.dtype)
        return self._apply(X, adjoint)

    def _apply(self, X: torch.Tensor, adjoint: bool) -> torch.Tensor:
        if self.gather_scatter:
            return self._gather_scatter(X, adjoint)
        m, n = self.shape
        if adjoint:
            vals = self._adjoint_values()
            crow, col, shape = self._crow_t, self._col_t, (n, m)
        else:
            vals, crow, col, shape = self._values, self._crow, self._col, (m, n)
        if vals.dim() == 1:
            if serial_ok(vals, X):
                return self._serial_product(adjoint, crow, col, shape)(vals, X)
            if adjoint:
                if self._mat_t is None:
                    self._mat_t = _csr(crow, col, vals, shape)
                mat = self._mat_t
            else:
                mat = self._mat
            if X.dim() == 2 and X.shape[-1] == 1:  # the vector kernel is faster than a 1-column SpMM
                return (mat @ X[:, 0])[:, None]
            return mat @ X
        # A value batch: one product per member (they share crow/col).
        flat_v = vals.reshape(-1, vals.shape[-1])
        flat_x = X.reshape(flat_v.shape[0], *X.shape[-2:])
        out = torch.stack([_csr(crow, col, v, shape) @ x for v, x in zip(flat_v, flat_x)])
        return out.reshape(*X.shape[:-2], shape[0], X.shape[-1])

    def _serial_product(self, adjoint: bool, crow: torch.Tensor, col: torch.Tensor, shape: tuple[int, int]) -> SerialCsr:
        got = self._serial_t if adjoint else self._serial
        if got is None:
            got = SerialCsr(crow, col, shape)
            if adjoint:
                self._serial_t = got
            else:
                self._serial = got
        return got

    def _gather_scatter(self, X: torch.Tensor, adjoint: bool) -> torch.Tensor:
        """BATCH-level formats: Y[b, i] += v * X[b, j] over the entries (b, i, j)."""
        coords, slot = self._source.entries()
        vals = self._values[..., slot]
        fs = self._source.format_shape
        lead = coords[:-2]
        bflat = torch.zeros_like(coords[0]) if lead.numel() == 0 else _ravel(lead, fs[:-2])
        m, n = fs[-2], fs[-1]
        rows, cols = coords[-2], coords[-1]
        if adjoint:
            rows, cols, m, n = cols, rows, n, m
            vals = vals.conj() if vals.is_complex() else vals
        nb = math.prod(fs[:-2])
        vb = X.shape[: X.dim() - 2 - len(fs[:-2])]
        Xf = X.reshape(*vb, nb * n, X.shape[-1])
        contrib = vals[..., :, None] * Xf[..., bflat * n + cols, :]
        Y = Xf.new_zeros(*vb, nb * m, X.shape[-1]).index_add(-2, bflat * m + rows, contrib)
        return Y.reshape(*vb, *fs[:-2], m, X.shape[-1])

    # Bound product (Matmul.execute's and the one-shot matmul's per-call path) ----------------------
    def bind(self, values: torch.Tensor, X: torch.Tensor) -> "_BoundCsr | None":
        """``Y = A X`` bound to ``values`` (this pattern's value slots, 1-D, read where they lie at each
        call) for right-hand sides of ``X``'s dtype and device: torch's CSR kernel (``mv`` / ``mm``
        with ``out=``) on a CSR tensor made once, over this plan's index buffers and those values. None
        where a product needs per-call work on the values (a format reached by a conversion: its values
        are gathered per call; half precision: a float32 copy; BATCH-level formats) or the operands do
        not match the plan. The core checks grad mode, transforms and A's index versions before each
        call (``dispatch.plans.Bindable``)."""
        m, n = self.shape
        if self.gather_scatter or values.dtype in HALF_DTYPES:
            return None
        if not (type(values) is torch.Tensor and type(X) is torch.Tensor and values.dim() == 1
                and values.shape[0] == self._col.shape[0] and values.device == self.device and X.dtype == values.dtype
                and X.device == values.device and X.dim() == 2 and X.shape[0] == n and values.layout == torch.strided
                and values.is_contiguous()):
            return None
        serial = self._serial_product(False, self._crow, self._col, self.shape) if values.device.type == "cpu" else None
        if self._conv is not None:
            return _BoundGathered(self._conv, self._crow, self._col, self.shape, values, serial)
        return _BoundCsr(_csr(self._crow, self._col, values, self.shape), values, serial)

    # Backward helper ---------------------------------------------------------------------------
    def sddmm(self, dY: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """Gradient of ``<dY, A X>`` w.r.t. A's values: ``dY[row] . conj(X[col])`` per entry,
        placed in A's (linearized) value slots; padding slots get zero. Half inputs are summed in
        float32 and the result cast back."""
        if dY.dtype in HALF_DTYPES or X.dtype in HALF_DTYPES:
            out_dtype = dY.dtype
            return self.sddmm(dY.float(), X.float()).to(out_dtype)
        if not self.gather_scatter:
            # a matrix without BATCH levels: the core's kernel (one vector on CSR without an entry
            # list; many columns on a not-too-sparse matrix by one GEMM; chunked gathers otherwise),
            # which the gather below, unchunked, was up to 8x slower than (benchmarks/bench_llm.py)
            return core_sddmm(self._source, dY, X)
        coords, slot = self._source.entries()
        fs = self._source.format_shape
        m, n = fs[-2], fs[-1]
        rows, cols = coords[-2], coords[-1]
        if coords.shape[0] > 2:
            bflat = _ravel(coords[:-2], fs[:-2])
            rows, cols = bflat * m + rows, bflat * n + cols
            nb = math.prod(fs[:-2])
            vb = dY.shape[: dY.dim() - 2 - len(fs[:-2])]
            dY = dY.reshape(*vb, nb * m, dY.shape[-1])
            X = X.reshape(*vb, nb * n, X.shape[-1])
        Xc = X.conj() if X.is_complex() else X
        per_entry = (dY[..., rows, :] * Xc[..., cols, :]).sum(-1)
        nlin = self._source._linear_buffers()[2].shape[-1]
        out = per_entry.new_zeros(*per_entry.shape[:-1], nlin)
        return out.index_add(-1, slot, per_entry)

    # Cost ---------------------------------------------------------------------------------------
    @staticmethod
    def traffic(A_nse: int, m: int, n: int, k: int, vsize: int, isize: int) -> float:
        """Bytes moved by one product: the matrix once, X gathered once per stored entry and
        column (an upper bound; caches help), Y written once."""
        return A_nse * (vsize + isize) + (m + 1) * isize + A_nse * k * vsize + m * k * vsize


class _BoundCsr:
    """``bound(X, Y)``: ``Y = A X`` by torch's CSR kernel into ``Y`` (``(m,)`` for a vector or a one-column
    ``X``, else ``(m, k)``); False, computing nothing, when the values no longer lie where they were
    bound (``.data`` swapped) or ``X`` / ``Y`` are not what the kernel takes. Stateless per call: safe from
    several threads at once (the CSR tensor is only read)."""

    __slots__ = ("mat", "values", "_vp", "serial")

    def __init__(self, mat: torch.Tensor, values: torch.Tensor, serial: SerialCsr | None = None) -> None:
        self.mat, self.values, self._vp, self.serial = mat, values, values.data_ptr(), serial

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> bool:
        if self.values.data_ptr() != self._vp or X.layout is not torch.strided or Y.layout is not torch.strided:
            return False
        if self.serial is not None and Y.is_contiguous() and serial_ok(self.values, X):
            # a small product: serially, into Y (a one-column X gives Y of shape (m,))
            if Y.dim() == 1 and X.dim() == 2:
                X = X[:, 0]
            if Y.dim() == X.dim():
                self.serial(self.values, X, out=Y)
                return True
        if Y.dim() == 1:  # a vector: the vector kernel (faster than a one-column product)
            torch.mv(self.mat, X if X.dim() == 1 else X[:, 0], out=Y)
        elif X.dim() == 2:
            torch.mm(self.mat, X, out=Y)
        else:
            return False
        return True


class _BoundGathered:
    """``bound(X, Y)`` for a matrix in a format reached by a conversion (COO in any order, CSC, DIA, ...): its
    values are gathered into the CSR order at each call (read where they lie then, so in-place writes are
    seen), into a tensor of the call's own (several threads at once each gather their own), then the serial
    kernel or torch's CSR kernel. What the one-shot ``A @ x`` on a COO matrix took the general path for
    (146 against 14.5 us on CSR, 2-D Poisson 40^2; session 23)."""

    __slots__ = ("conv", "crow", "col", "shape", "values", "_vp", "serial")

    def __init__(self, conv: Any, crow: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], values: torch.Tensor,
                 serial: SerialCsr | None) -> None:
        self.conv, self.crow, self.col, self.shape, self.serial = conv, crow, col, shape, serial
        self.values, self._vp = values, values.data_ptr()

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> bool:
        if self.values.data_ptr() != self._vp or X.layout is not torch.strided or Y.layout is not torch.strided:
            return False
        if Y.dim() == 1 and X.dim() == 2:
            X = X[:, 0]
        if Y.dim() != X.dim() or X.dim() not in (1, 2):
            return False
        vals = self.conv.values(self.values)
        if self.serial is not None and Y.is_contiguous() and serial_ok(vals, X):
            self.serial(vals, X, out=Y)
            return True
        mat = _csr(self.crow, self.col, vals, self.shape)
        if Y.dim() == 1:
            torch.mv(mat, X, out=Y)
        else:
            torch.mm(mat, X, out=Y)
        return True


def _narrow(crow: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 indices when they fit: torch's CPU kernel runs about 1.5x faster with them (measured
    on 2-D Poisson 300², one thread), and cuSPARSE prefers them too."""
    if crow.dtype == torch.int64 and int(crow[-1]) < 2**31 - 1 and crow.numel() < 2**31 - 1:
        return crow.to(torch.int32), col.to(torch.int32)
    return crow, col


def _ravel(coords: torch.Tensor, sizes) -> torch.Tensor:
    lin = torch.zeros_like(coords[0])
    for k, s in enumerate(sizes):
        lin = lin * int(s) + coords[k]
    return lin
