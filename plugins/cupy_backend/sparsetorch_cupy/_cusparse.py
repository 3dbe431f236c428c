"""cuSPARSE SpMV/SpMM with descriptors and workspace created once, through CuPy's bindings.

:class:`CusparseMatrix` is built once per sparsity pattern (in a plan's ``__init__``):

- **Storage.** CSR is handed to cuSPARSE as it is (A's own index buffers, no copy); CSC too when
  the CuPy build binds ``cusparseCreateCsc``. Every other format (COO, BSR, DIA, ELL, N:M, ...)
  is converted to CSR once per pattern with sparsetorch's conversion map, after which each new
  set of values is one gather. (CuPy does not bind cuSPARSE's BSR descriptor; its COO SpMV was
  slower than CSR on the benchmark matrix.)
- **Descriptors.** The sparse-matrix descriptor, the dense vector/matrix descriptors and the
  workspace are created on first use and kept; a call only swaps pointers
  (``cusparseSpMatSetValues`` for a value-batch member, ``cusparseDnVecSetValues`` /
  ``DnMatSetValues`` for ``x`` and ``y``) and calls ``cusparseSpMV`` / ``cusparseSpMM``. This is
  what nvmath-python's UST ``Matmul`` does; CuPy's ``A @ x`` and torch's ``A @ x`` create the
  descriptors and query the workspace size on every call.
- **Adjoint.** ``A^H`` is a CSR descriptor of the transposed pattern, built once per pattern
  (a CSC input's own buffers are that CSR already; otherwise one sort of the entries by column),
  with A's values gathered into it (and conjugated for complex dtypes) once per value set. No
  transposed-operation kernel (``CUSPARSE_OPERATION_TRANSPOSE`` on CSR is the slow atomic path).

All calls run on torch's current stream (the handle's stream is set before each call).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import torch

from sparsetorch import InputError, SparseTensor
from sparsetorch.format import CSC, CSR
from sparsetorch.backend import conversion

from ._cuda import cuda_major_mismatch, cupy, numpy_dtype

__all__ = ["CusparseMatrix", "native_kind", "has_csc"]


@functools.lru_cache(maxsize=None)
def _cs() -> Any:
    """CuPy's cuSPARSE bindings (and, once, a warning when CuPy and torch use different CUDA majors)."""
    cupy()
    from cupy_backends.cuda.libs import cusparse as cs  # noqa: PLC0415

    msg = cuda_major_mismatch()
    if msg:
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return cs


def has_csc() -> bool:
    """Whether this CuPy binds ``cusparseCreateCsc`` (CSC handed over without conversion)."""
    return hasattr(_cs(), "createCsc")


def native_kind(fmt: Any, *, csc_bound: bool | None = None) -> str | None:
    """"csr" or "csc" when cuSPARSE takes ``fmt`` as it is, else None (converted to CSR once).

    COO is converted too: cuSPARSE's COO SpMV was slower than its CSR SpMV on the same matrix
    (H200, 1.48M-row stencil, float64: 83 us against 66 us), and the conversion is pattern work
    done once per plan (each new value set is one gather)."""
    if fmt == CSR:
        return "csr"
    if fmt == CSC and (has_csc() if csc_bound is None else csc_bound):
        return "csc"
    return None


def _cuda_dtype(dtype: torch.dtype) -> int:
    cupy()
    from cupy._core import _dtype  # noqa: PLC0415

    return _dtype.to_cuda_dtype(numpy_dtype(dtype))


class _Descriptor:
    """A cuSPARSE descriptor handle and its destroyer (called when the plan is dropped)."""

    def __init__(self, handle: int, destroy: Any) -> None:
        self.handle, self._destroy = handle, destroy

    def __del__(self) -> None:
        try:
            if self.handle:
                self._destroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown or a dead context: nothing to free
            pass
        self.handle = 0


class _Side:
    """One direction (A or A^H): its sparse descriptor, dense descriptors per width, workspaces."""

    def __init__(self, spmat: _Descriptor, rows: int, cols: int) -> None:
        self.spmat, self.rows, self.cols = spmat, rows, cols
        self.vec: tuple[_Descriptor, _Descriptor, torch.Tensor] | None = None
        self.mats: dict[int, tuple[_Descriptor, _Descriptor, torch.Tensor]] = {}
        self.values_ptr = 0


class CusparseMatrix:
    """A fixed pattern on one CUDA device: :meth:`set_values`, then :meth:`apply` (torch tensors),
    :meth:`matvec_ptr` / :meth:`matmat_ptr` (raw pointers) or :meth:`cupy_matvec` (CuPy arrays)."""

    def __init__(self, A: SparseTensor) -> None:
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels:
            raise InputError(f"the cupy backend takes sparse matrices (2 format dimensions, no BATCH levels), "
                             f"got format {A.format} of shape {tuple(A.shape)}")
        if A.device.type != "cuda":
            raise InputError(f"the cupy backend runs on CUDA tensors; A is on {A.device} (move it with .cuda())")
        if A.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
            raise InputError(f"cuSPARSE SpMV here takes float32/float64/complex64/complex128, got {A.dtype}")
        self.shape = (int(fs[0]), int(fs[1]))
        self.device = A.device
        self.dtype = A.dtype
        self._source = A
        kind = native_kind(A.format)
        self._conv: Any = None
        if kind == "csr" or kind == "csc":
            pos, crd = A.pos(1), A.crd(1)
        else:
            self._conv = conversion(A, CSR, A.index_dtype)
            kind, pos, crd = "csr", self._conv.pos[1], self._conv.crd[1]
        if pos.dtype != crd.dtype:
            pos, crd = pos.to(torch.int64), crd.to(torch.int64)
        if pos.dtype == torch.int64 and crd.numel() < 2**31 - 1 and max(int(fs[0]), int(fs[1])) < 2**31 - 1:
            # cuSPARSE's 32-bit index kernels move less data: narrow once per plan (a copy of the
            # index buffers, pattern-time), never per call
            pos, crd = pos.to(torch.int32), crd.to(torch.int32)
        self.kind = kind
        self.converted = self._conv is not None
        self._pos, self._crd = pos.contiguous(), crd.contiguous()
        self.nnz = int(self._crd.numel())
        self.index_dtype = self._pos.dtype
        nslots = A.values.shape[-1]
        if not self.converted and nslots != self.nnz:
            raise InputError(f"A has {nslots} value slots for {self.nnz} stored entries; expected one per entry")
        self._cs = _cs()
        self._ctype = _cuda_dtype(self.dtype)
        npdt = numpy_dtype(self.dtype)
        self._one, self._zero = np.ones((), npdt), np.zeros((), npdt)
        self._values: torch.Tensor | None = None  # (members, nnz), contiguous
        self._values_h: torch.Tensor | None = None  # conjugated values for A^H (complex only)
        self._fwd: _Side | None = None
        self._adj: _Side | None = None
        self._t_csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None  # A^T as CSR (+ slot map)
        self.members = 0
        #: why cuSPARSE's SpMM was not usable here (then several columns run as SpMVs), or ""
        self._spmm_unsupported = ""

    # Values --------------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        """New values (A.values of a tensor on this pattern): a view for CSR/CSC, else one gather."""
        values = values.detach()
        if self._conv is not None:
            values = self._conv.apply(self._source.with_values(values)).values
        if values.is_conj():
            values = values.resolve_conj()
        self._values = values.reshape(-1, self.nnz).contiguous()
        self._values_h = None
        self.members = self._values.shape[0]

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            raise RuntimeError("CusparseMatrix used before set_values()")
        return self._values

    def _member_values(self, adjoint: bool) -> torch.Tensor:
        """The values the descriptor of A (or of A^H, in its CSR order, conjugated) points at."""
        vals = self.values
        if not adjoint:
            return vals
        if self._values_h is None:
            perm = self._transposed_csr()[2]
            vh = vals if perm is None else vals[:, perm]
            if vh.is_complex():
                vh = vh.conj().resolve_conj()
            self._values_h = vh.contiguous()
        return self._values_h

    # Descriptors ---------------------------------------------------------------------------------
    def _index_type(self) -> int:
        cs = self._cs
        return cs.CUSPARSE_INDEX_32I if self.index_dtype == torch.int32 else cs.CUSPARSE_INDEX_64I

    def _side(self, adjoint: bool) -> _Side:
        side = self._adj if adjoint else self._fwd
        if side is not None:
            return side
        cs = self._cs
        m, n = self.shape
        it, base, ct = self._index_type(), cs.CUSPARSE_INDEX_BASE_ZERO, self._ctype
        vptr = self._member_values(adjoint).data_ptr()
        if not adjoint:
            if self.kind == "csr":
                h = cs.createCsr(m, n, self.nnz, self._pos.data_ptr(), self._crd.data_ptr(), vptr, it, it, base, ct)
            else:
                h = cs.createCsc(m, n, self.nnz, self._pos.data_ptr(), self._crd.data_ptr(), vptr, it, it, base, ct)
            side = _Side(_Descriptor(h, cs.destroySpMat), m, n)
            self._fwd = side
        else:
            indptr, indices, _ = self._transposed_csr()
            h = cs.createCsr(n, m, self.nnz, indptr.data_ptr(), indices.data_ptr(), vptr, it, it, base, ct)
            side = _Side(_Descriptor(h, cs.destroySpMat), n, m)
            self._adj = side
        side.values_ptr = vptr
        return side

    def coordinates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A's (row, col) per stored entry, in this matrix's storage order (int64)."""
        counts = (self._pos[1:] - self._pos[:-1]).to(torch.int64)
        major = torch.repeat_interleave(torch.arange(len(self._pos) - 1, device=self.device), counts)
        minor = self._crd.to(torch.int64)
        return (major, minor) if self.kind == "csr" else (minor, major)

    def _transposed_csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A^T as CSR: (indptr, indices, slot map from A's storage order or None). Pattern work, once."""
        if self._t_csr is None:
            m, n = self.shape
            if self.kind == "csc":  # A's column pointers and row indices are A^T's CSR
                self._t_csr = (self._pos, self._crd, None)
            else:
                rows, cols = self.coordinates()
                perm = torch.argsort(cols * max(m, 1) + rows, stable=True)
                indptr = torch.zeros(n + 1, dtype=torch.int64, device=self.device)
                indptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n), 0)
                idt = self.index_dtype
                self._t_csr = (indptr.to(idt).contiguous(), rows[perm].to(idt).contiguous(), perm)
        return self._t_csr

    def _set_member(self, side: _Side, adjoint: bool, member: int) -> None:
        vals = self._member_values(adjoint)
        ptr = vals[member].data_ptr() if vals.shape[0] > 1 else vals.data_ptr()
        if ptr != side.values_ptr:
            self._cs.spMatSetValues(side.spmat.handle, ptr)
            side.values_ptr = ptr

    # Products ------------------------------------------------------------------------------------
    def matvec_ptr(self, x_ptr: int, y_ptr: int, *, adjoint: bool = False, member: int = 0, stream: int) -> None:
        """``y = op(A) x`` for contiguous vectors at ``x_ptr`` (cols) and ``y_ptr`` (rows)."""
        cs = self._cs
        side = self._side(adjoint)
        self._set_member(side, adjoint, member)
        handle = cupy().cuda.device.get_cusparse_handle()
        cs.setStream(handle, stream)
        op = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        alpha, beta = self._one.ctypes.data, self._zero.ctypes.data
        if side.vec is None:
            dx = _Descriptor(cs.createDnVec(side.cols, x_ptr, self._ctype), cs.destroyDnVec)
            dy = _Descriptor(cs.createDnVec(side.rows, y_ptr, self._ctype), cs.destroyDnVec)
            size = cs.spMV_bufferSize(handle, op, alpha, side.spmat.handle, dx.handle, beta, dy.handle, self._ctype, 0)
            side.vec = (dx, dy, torch.empty(max(int(size), 1), dtype=torch.uint8, device=self.device))
        else:
            dx, dy, _ = side.vec
            cs.dnVecSetValues(dx.handle, x_ptr)
            cs.dnVecSetValues(dy.handle, y_ptr)
        dx, dy, work = side.vec
        cs.spMV(handle, op, alpha, side.spmat.handle, dx.handle, beta, dy.handle, self._ctype, 0, work.data_ptr())

    def matmat_ptr(self, x_ptr: int, y_ptr: int, k: int, *, adjoint: bool = False, member: int = 0, stream: int) -> None:
        """``Y = op(A) X`` for row-major ``X`` (cols x k) and ``Y`` (rows x k)."""
        cs = self._cs
        side = self._side(adjoint)
        self._set_member(side, adjoint, member)
        handle = cupy().cuda.device.get_cusparse_handle()
        cs.setStream(handle, stream)
        op = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        alpha, beta = self._one.ctypes.data, self._zero.ctypes.data
        got = side.mats.get(k)
        if got is None:
            order = cs.CUSPARSE_ORDER_ROW
            dx = _Descriptor(cs.createDnMat(side.cols, k, k, x_ptr, self._ctype, order), cs.destroyDnMat)
            dy = _Descriptor(cs.createDnMat(side.rows, k, k, y_ptr, self._ctype, order), cs.destroyDnMat)
            size = cs.spMM_bufferSize(handle, op, op, alpha, side.spmat.handle, dx.handle, beta, dy.handle, self._ctype, 0)
            got = (dx, dy, torch.empty(max(int(size), 1), dtype=torch.uint8, device=self.device))
            side.mats[k] = got
        else:
            cs.dnMatSetValues(got[0].handle, x_ptr)
            cs.dnMatSetValues(got[1].handle, y_ptr)
        dx, dy, work = got
        cs.spMM(handle, op, op, alpha, side.spmat.handle, dx.handle, beta, dy.handle, self._ctype, 0, work.data_ptr())

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        """``op(A) @ X`` for torch ``X`` of shape ``(*batch, cols, k)`` on this device."""
        m, n = self.shape
        rows, cols = (n, m) if adjoint else (m, n)
        k = X.shape[-1]
        Xc = X.detach()
        if Xc.is_conj():
            Xc = Xc.resolve_conj()
        Xc = Xc.reshape(-1, cols, k).contiguous()
        members = self.members
        if members not in (1, Xc.shape[0]):
            raise InputError(f"cupy/spmm: X has {Xc.shape[0]} batch members for {members} matrices")
        Y = torch.empty((Xc.shape[0], rows, k), dtype=self.dtype, device=self.device)
        if self.nnz == 0:
            Y.zero_()
            return Y.reshape(*X.shape[:-2], rows, k)
        # Only cuSPARSE runs here (no CuPy kernels): no CuPy stream context is needed, just the
        # handle's stream set to torch's current one (matvec_ptr does that), on A's device.
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(index).cuda_stream
        with torch.cuda.device(index):
            for i in range(Xc.shape[0]):
                member = i if members > 1 else 0
                if k == 1:
                    self.matvec_ptr(Xc[i].data_ptr(), Y[i].data_ptr(), adjoint=adjoint, member=member, stream=stream)
                elif not self._spmm_unsupported:
                    try:
                        self.matmat_ptr(Xc[i].data_ptr(), Y[i].data_ptr(), k, adjoint=adjoint, member=member, stream=stream)
                        continue
                    except Exception as exc:  # noqa: BLE001 - a layout/format cuSPARSE's SpMM lacks: columns instead
                        self._spmm_unsupported = f"{type(exc).__name__}: {exc}"
                if k > 1 and self._spmm_unsupported:
                    Xt, Yt = Xc[i].T.contiguous(), torch.empty((k, rows), dtype=self.dtype, device=self.device)
                    for j in range(k):
                        self.matvec_ptr(Xt[j].data_ptr(), Yt[j].data_ptr(), adjoint=adjoint, member=member, stream=stream)
                    Y[i] = Yt.T
        return Y.reshape(*X.shape[:-2], rows, k)

    # CuPy arrays (the solvers) ---------------------------------------------------------------------
    def cupy_matvec(self, *, adjoint: bool = False, member: int = 0, stream: int) -> Any:
        """``x -> op(A) x`` on 1-D CuPy arrays (for cupyx LinearOperators), on ``stream``."""
        cp = cupy()
        m, n = self.shape
        rows = n if adjoint else m
        dtype = numpy_dtype(self.dtype)

        def mv(x: Any) -> Any:
            x = cp.ascontiguousarray(x.reshape(-1), dtype=dtype)
            y = cp.empty(rows, dtype=dtype)
            if self.nnz == 0:
                y.fill(0)
                return y
            self.matvec_ptr(x.data.ptr, y.data.ptr, adjoint=adjoint, member=member, stream=stream)
            return y

        return mv

    def traffic(self, k: int = 1) -> int:
        """Bytes one product moves: values and indices once, X read, Y written."""
        m, n = self.shape
        vs = torch.empty((), dtype=self.dtype).element_size()
        isz = 4 if self.index_dtype == torch.int32 else 8
        idx = self.nnz * isz + len(self._pos) * isz
        return self.nnz * vs + idx + (m + n) * k * vs
