"""Non-uniform batches (``SparseTensorList``) through cuDSS's batch API: one analysis, one
factorization call and one solve call for matrices of different sizes and patterns.

cuDSS's batch matrices (``cudssMatrixCreateBatchCsr`` / ``cudssMatrixCreateBatchDn``) take the
members' sizes as host arrays and their buffers as device arrays of pointers; the plan keeps one
flat value buffer (members back to back, each in CSR order) and one flat right-hand-side /
solution buffer per call (each member column-major, ``n_i x k_i``), so pointers are computed,
not gathered. Phases and errors follow :mod:`sparsetorch_cudss.plan`. The adjoint re-uses the
factors for Hermitian types; for LU, cuDSS's transposed solve (``SOLVE_MODE``, 1.0) answers
NOT_SUPPORTED on batch matrices (measured with cuDSS 1.0.0 on the H200), so the members'
``A^H`` are factored on a second batch object built at the first backward pass (its analysis
once, then one factorization per value set), as on cuDSS 0.8.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Mapping, Sequence

import torch

from sparsetorch import InputError, IterationResult, SingularMatrixError, SparseTensorList, Status
from sparsetorch.format import CSR
from sparsetorch.backend import conversion

from . import _lib
from ._lib import DType, Layout, MatrixType, SolveMode, View
from .plan import _RESIDUAL_LIMIT, _VALUE_TYPES, _Factor, _settings, _transpose_map, check_factor, matrix_type

__all__ = ["CudssListPlan"]


class _BatchFactor(_Factor):
    """cuDSS objects for a list of CSR patterns (a cuDSS batch matrix over one flat value buffer)."""

    def __init__(self, lib: _lib.Library, device: torch.device, indptrs: list[torch.Tensor], indices: list[torch.Tensor],
                 values: torch.Tensor, offsets: list[int], ns: list[int], mtype: int, settings: Mapping[str, Any],
                 hybrid: bool) -> None:
        self.indptrs, self.indices_list, self.offsets, self.ns = indptrs, indices, offsets, ns
        self.index_dtype = indices[0].dtype
        # host size arrays and device pointer arrays: the batch matrix's (kept for its lifetime) and
        # those of the dense batch matrices of the current phase call (dropped after it)
        self._matrix_keep: list[Any] = []
        self._call_keep: list[Any] = []
        self._keep = self._matrix_keep
        super().__init__(lib, device, indptrs[0], indices[0], values, sum(ns), mtype, 1, settings, hybrid)

    def _ints(self, xs: Sequence[int]) -> Any:
        ctype = ctypes.c_int if self.index_dtype == torch.int32 else ctypes.c_int64
        arr = (ctype * len(xs))(*xs)
        self._keep.append(arr)
        return arr

    def _pointers(self, ptrs: Sequence[int]) -> torch.Tensor:
        t = torch.tensor(list(ptrs), dtype=torch.int64, device=self.device)
        self._keep.append(t)
        return t

    def _create_matrix(self, mtype: int) -> None:
        L = len(self.ns)
        isz = self.values.element_size()
        itype = DType.R_32I if self.index_dtype == torch.int32 else DType.R_64I
        nnz = [int(c.numel()) for c in self.indices_list]
        rows = self._pointers([p.data_ptr() for p in self.indptrs])
        cols = self._pointers([c.data_ptr() for c in self.indices_list])
        vals = self._pointers([self.values.data_ptr() + off * isz for off in self.offsets])
        self.lib.call("cudssMatrixCreateBatchCsr", ctypes.byref(self.matrix), L, self._ints(self.ns), self._ints(self.ns),
                      self._ints(nnz), rows.data_ptr(), None, cols.data_ptr(), vals.data_ptr(), itype, itype,
                      _VALUE_TYPES[self.values.dtype], mtype, View.FULL, _lib.Base.ZERO)

    def _dense(self, t: torch.Tensor, k: Any) -> ctypes.c_void_p:
        ks = [1] * len(self.ns) if isinstance(k, int) else list(k)
        isz = t.element_size()
        ptrs, off = [], 0
        for n, kk in zip(self.ns, ks):
            ptrs.append(t.data_ptr() + off * isz)
            off += n * kk
        keep = self._pointers(ptrs)
        mat = ctypes.c_void_p()
        itype = DType.R_32I if self.index_dtype == torch.int32 else DType.R_64I
        self.lib.call("cudssMatrixCreateBatchDn", ctypes.byref(mat), len(self.ns), self._ints(self.ns), self._ints(ks),
                      self._ints(self.ns), keep.data_ptr(), itype, _VALUE_TYPES[t.dtype], Layout.COL_MAJOR)
        return mat

    def execute(self, phase: int, x: torch.Tensor, b: torch.Tensor, k: Any) -> None:
        self._keep = self._call_keep
        try:
            super().execute(phase, x, b, k)
        finally:
            self._keep = self._matrix_keep
            self._call_keep.clear()

    def _scratch(self) -> tuple[torch.Tensor, Any]:
        return torch.zeros(sum(self.ns), dtype=self.values.dtype, device=self.device), [1] * len(self.ns)


class CudssListPlan:
    """One cuDSS batch factorization of a list of square matrices (different sizes and patterns)."""

    preconditioner = None

    def __init__(self, As: SparseTensorList, options: Mapping[str, Any], *, method: str, hermitian: bool,
                 hybrid: bool = False, backend: str = "cudss") -> None:
        if len(As) == 0:
            raise InputError(f"{backend}/{method}: an empty SparseTensorList")
        first = As[0]
        if first.device.type != "cuda":
            raise InputError(f"{backend}/{method} runs on CUDA tensors; the list is on {first.device}")
        self.backend, self.method, self.device, self.dtype = backend, method, first.device, first.dtype
        self.lib = _lib.load()
        self.settings = _settings(options, backend)
        self.ns = [int(a.format_shape[0]) for a in As]
        for i, a in enumerate(As):
            m, n = a.format_shape
            if m != n:
                raise InputError(f"{backend}/{method} needs square matrices; list item {i} is {m}x{n}")
            if a.batch_shape:
                raise InputError(f"{backend}/{method}: list item {i} has a value batch {tuple(a.batch_shape)}; "
                                 f"a SparseTensorList member must be one matrix")
        narrow = all(a.nse < 2**31 - 1 for a in As) and sum(self.ns) < 2**31 - 1
        idt = torch.int32 if narrow else torch.int64
        self._sources = [a for a in As]
        self._convs = [conversion(a, CSR, idt) for a in As]
        self._indptrs = [c.pos[1].to(idt).contiguous() for c in self._convs]
        self._indices = [c.crd[1].to(idt).contiguous() for c in self._convs]
        self._nnz = [int(c.numel()) for c in self._indices]
        self._offsets = [0]
        for z in self._nnz[:-1]:
            self._offsets.append(self._offsets[-1] + z)
        self.mtype = matrix_type(method, self.dtype.is_complex, hermitian, backend)
        self._values = torch.zeros(sum(self._nnz), dtype=self.dtype, device=self.device)
        self._fwd = _BatchFactor(self.lib, self.device, self._indptrs, self._indices, self._values, self._offsets,
                                 self.ns, self.mtype, self.settings, hybrid)
        self._adj: _BatchFactor | None = None
        self._adj_values: torch.Tensor | None = None
        self._adj_fresh = False
        self._t_maps: list | None = None
        #: cuDSS 1.0's transposed solve (SOLVE_MODE) answers NOT_SUPPORTED for batch matrices
        #: (H200, 2026-11-29): then A^H is factored as on cuDSS 0.8, and this stays False
        self._transposed_solve_ok = True
        self.factorizations = 0
        self.perturbed_pivots = 0
        self._loaded = False

    @property
    def hybrid(self) -> bool:
        return self._fwd.hybrid

    def set_values(self, values: Sequence[torch.Tensor]) -> None:
        if len(values) != len(self.ns):
            raise InputError(f"{self.backend}/{self.method}: {len(values)} value tensors for {len(self.ns)} matrices")
        for i, (conv, src, v) in enumerate(zip(self._convs, self._sources, values)):
            vals = conv.apply(src.with_values(v.detach())).values.reshape(-1)
            self._values[self._offsets[i]:self._offsets[i] + self._nnz[i]].copy_(vals)
        self._fwd.factor()
        self.factorizations += 1
        self._adj_fresh = False
        self.perturbed_pivots = check_factor(self._fwd, self.mtype, self.backend, self.method,
                                             f" (a member of the list of {len(self.ns)})")
        self._loaded = True

    def _flat(self, Bs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        ks = []
        parts = []
        for i, (B, n) in enumerate(zip(Bs, self.ns)):
            if B.dim() != 2 or B.shape[0] != n:
                raise InputError(f"{self.backend}/{self.method}: right-hand side {i} has shape {tuple(B.shape)}, "
                                 f"expected ({n}, k)")
            ks.append(int(B.shape[1]))
            parts.append(B.detach().to(self.dtype).mT.reshape(-1))  # column-major
        return torch.cat(parts).contiguous(), ks

    def _unflat(self, x: torch.Tensor, ks: list[int]) -> list[torch.Tensor]:
        out, off = [], 0
        for n, k in zip(self.ns, ks):
            out.append(x[off:off + n * k].reshape(k, n).mT.contiguous())
            off += n * k
        return out

    def solve(self, Bs: Sequence[torch.Tensor], *, adjoint: bool = False, options=None
              ) -> tuple[list[torch.Tensor], IterationResult]:
        if not self._loaded:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        rhs, ks = self._flat(Bs)
        conj_trick = adjoint and self.dtype.is_complex and self.mtype == MatrixType.SYMMETRIC
        if conj_trick:
            rhs = rhs.conj().resolve_conj()
        x = torch.empty_like(rhs)
        if adjoint and self.mtype == MatrixType.GENERAL:
            done = False
            if self.lib.transposed_solve and self._transposed_solve_ok:
                mode = SolveMode.CONJUGATE_TRANSPOSE if self.dtype.is_complex else SolveMode.TRANSPOSE
                try:
                    self._fwd.solve(rhs, x, ks, mode)
                    done = True
                except _lib.CudssError as exc:
                    if exc.status != 4:  # CUDSS_STATUS_NOT_SUPPORTED: cuDSS 1.0 has no transposed batch solve
                        raise
                    self._transposed_solve_ok = False
            if not done:
                self._adjoint_factor().solve(rhs, x, ks)
        else:
            self._fwd.solve(rhs, x, ks)
        if conj_trick:
            x = x.conj().resolve_conj()
        Xs = self._unflat(x, ks)
        if self.perturbed_pivots and self.settings.get("residual_check", "auto") is not False:
            self._residual_check(Bs, Xs, adjoint)
        reason = f"cuDSS {'.'.join(map(str, self.lib.version))} {self.method}, batch of {len(self.ns)}"
        return Xs, IterationResult(0, math.nan, True, Status.DIRECT, reason)

    def _transposes(self) -> list:
        if self._t_maps is None:
            self._t_maps = [_transpose_map(p, c, n) for p, c, n in zip(self._indptrs, self._indices, self.ns)]
        return self._t_maps

    def _adjoint_factor(self) -> _BatchFactor:
        """cuDSS 0.8: the members' A^H on a second batch object (analysis once, factorization per value set)."""
        maps = self._transposes()
        if self._adj is None:
            self._adj_values = torch.zeros_like(self._values)
            self._adj = _BatchFactor(self.lib, self.device, [m[1] for m in maps], [m[2] for m in maps], self._adj_values,
                                     self._offsets, self.ns, self.mtype, self.settings, self._fwd.hybrid)
        if not self._adj_fresh:
            for i, (order, _, _) in enumerate(maps):
                seg = self._values[self._offsets[i]:self._offsets[i] + self._nnz[i]][order]
                self._adj_values[self._offsets[i]:self._offsets[i] + self._nnz[i]].copy_(seg.conj() if seg.is_complex() else seg)
            self._adj.factor()
            check_factor(self._adj, self.mtype, self.backend, self.method, f" (a member of the list of {len(self.ns)})")
            self._adj_fresh = True
        return self._adj

    def _residual_check(self, Bs: Sequence[torch.Tensor], Xs: list[torch.Tensor], adjoint: bool) -> None:
        limit = _RESIDUAL_LIMIT[self.dtype]
        maps = self._transposes() if adjoint else None
        for i, (B, X, n) in enumerate(zip(Bs, Xs, self.ns)):
            seg = self._values[self._offsets[i]:self._offsets[i] + self._nnz[i]]
            if adjoint:
                order, tp, ti = maps[i]
                v = seg[order]
                A = torch.sparse_csr_tensor(tp, ti, v.conj().resolve_conj() if v.is_complex() else v, (n, n))
            else:
                A = torch.sparse_csr_tensor(self._indptrs[i], self._indices[i], seg, (n, n))
            r = torch.linalg.vector_norm(A @ X - B.to(self.dtype)) / torch.linalg.vector_norm(B).clamp_min(1e-300)
            rv = float(r)
            if not math.isfinite(rv) or rv > limit:
                raise SingularMatrixError(
                    f"{self.backend}/{self.method}: list item {i} is singular to working precision: cuDSS perturbed "
                    f"{self.perturbed_pivots} pivot(s) and the solution's relative residual is {rv:.1e}")

    def close(self) -> None:
        self._fwd.close()
        if self._adj is not None:
            self._adj.close()

    def __repr__(self) -> str:
        return f"CudssListPlan(method={self.method!r}, members={len(self.ns)}, n={sum(self.ns)}, nnz={sum(self._nnz)})"
