"""The cuDSS solve plan: analysis once per pattern, refactorization per value set, many solves.

Phases (docs/backend-authors.md, "Plans"):

- ``__init__`` (pattern): A's pattern as CSR with int32 indices (narrowed once from int64 when
  the sizes allow, int64 otherwise), a persistent value buffer the cuDSS matrix points at, the
  cuDSS handle / config / data objects, and the configuration (matrix type from the method:
  GENERAL for ``lu``, SPD/HPD for ``cholesky``, SYMMETRIC/HERMITIAN for ``ldlt``; uniform batch
  size for a value-batched A; reordering, pivoting, hybrid memory from ``backend_options``).
- ``set_values`` (numeric): the values are gathered into the buffer (one copy on the device),
  then ANALYSIS + FACTORIZATION the first time; afterwards REFACTORIZATION for Cholesky (no
  pivoting: the first factorization's structures are re-used as they are) and FACTORIZATION
  for LU / LDL^T (pivots are chosen again for the new values), either way without a new
  analysis, the expensive, mostly host-side phase (``backend_options={"refactorization":
  True/False}`` overrides). cuDSS's error
  indicator is read after each factorization (one host synchronization: the only one the plan
  adds) and becomes :class:`SingularMatrixError` / :class:`IndefiniteMatrixError` with the row.
- ``solve(B, adjoint)``: all columns of all batch members in one SOLVE call. ``adjoint=True``
  (the backward pass) re-uses the same factors: for SPD/HPD/symmetric/Hermitian types ``A^H =
  A`` (complex symmetric: ``A^H x = b`` is ``conj(A conj(x)) = b``); for LU, cuDSS >= 1.0 solves
  with ``A^T`` / ``A^H`` from the same factors (``CUDSS_CONFIG_SOLVE_MODE``), while cuDSS 0.8,
  which has no transposed solve, factors ``A^H`` once per value set on a second cuDSS object
  built lazily on the transposed pattern (its analysis runs once, at the first backward pass).

Everything runs on torch's current CUDA stream (``cudssSetStream`` before each phase); cuDSS
allocates its own device memory (outside torch's caching allocator).
"""

from __future__ import annotations

import ctypes
import math
import time
import weakref
from typing import Any, Mapping

import torch

from sparsetorch import IndefiniteMatrixError, InputError, IterationResult, SingularMatrixError, SparseTensor, Status
from sparsetorch.format import CSR
from sparsetorch.backend import conversion

from . import _lib
from ._lib import Config, Data, DType, Layout, MatrixType, Phase, SolveMode, View

__all__ = ["CudssPlan", "BACKEND_OPTIONS", "check_factor", "matrix_type"]

_VALUE_TYPES = {torch.float32: DType.R_32F, torch.float64: DType.R_64F,
                torch.complex64: DType.C_32F, torch.complex128: DType.C_64F}
#: the backend_options keys this plan reads (declared in the plugin's BackendInfo)
BACKEND_OPTIONS = _lib.BACKEND_OPTIONS
#: relative residual above which a solve on a factorization with perturbed pivots is refused
_RESIDUAL_LIMIT = {torch.float64: 1e-6, torch.complex128: 1e-6, torch.float32: 1e-2, torch.complex64: 1e-2}


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


class _Factor:
    """cuDSS objects for one CSR pattern (handle, config, data, the matrix over our buffers)."""

    def __init__(self, lib: _lib.Library, device: torch.device, indptr: torch.Tensor, indices: torch.Tensor,
                 values: torch.Tensor, n: int, mtype: int, batch: int, settings: Mapping[str, Any], hybrid: bool) -> None:
        self.lib, self.device, self.n, self.batch = lib, device, n, batch
        self.indptr, self.indices, self.values = indptr, indices, values  # kept alive: cuDSS points at them
        self.handle = ctypes.c_void_p()
        self.config = ctypes.c_void_p()
        self.data = ctypes.c_void_p()
        self.matrix = ctypes.c_void_p()
        self.analysed = False
        self.hybrid = hybrid
        self.analysis_seconds = 0.0
        #: later value sets: REFACTORIZATION (re-uses the first factorization's structures) or a full
        #: FACTORIZATION (pivots chosen again); see CudssPlan
        self.refactorization = bool(settings.get("refactorization", mtype in (MatrixType.SPD, MatrixType.HPD)))
        #: check cuDSS's memory estimate after the analysis and switch to hybrid mode if needed
        self.auto_hybrid = settings.get("hybrid_memory", "auto") == "auto"
        self.hybrid_limit = settings.get("hybrid_device_memory_limit")
        self.switched_to_hybrid = False
        call = lib.call
        try:
            with torch.cuda.device(device):
                call("cudssCreate", ctypes.byref(self.handle))
                call("cudssConfigCreate", ctypes.byref(self.config))
                call("cudssDataCreate", self.handle, ctypes.byref(self.data))
            self.threading = self._threading(settings.get("host_threads", "auto"))
            if batch > 1:
                self.set_config(Config.UBATCH_SIZE, batch)
            for key, param in (("reordering", Config.REORDERING_ALG), ("pivot_type", Config.PIVOT_TYPE),
                               ("pivot_threshold", Config.PIVOT_THRESHOLD), ("pivot_epsilon", Config.PIVOT_EPSILON),
                               ("ir_steps", Config.IR_N_STEPS), ("deterministic", Config.DETERMINISTIC_MODE),
                               ("nd_nlevels", Config.ND_NLEVELS)):
                value = settings.get(key)
                if value is None:
                    continue
                if key == "reordering":
                    value = _lib.REORDERING[value]
                elif key == "pivot_type":
                    value = _lib.PIVOT_TYPE[value]
                self.set_config(param, value)
            if hybrid:
                self.enable_hybrid(settings.get("hybrid_device_memory_limit"))
            self._create_matrix(mtype)
        except BaseException:
            _destroy(lib, device, self.handle.value, self.config.value, self.data.value, [self.matrix.value])
            raise
        self._finalizer = weakref.finalize(self, _destroy, lib, device, self.handle.value, self.config.value,
                                           self.data.value, [self.matrix.value])

    def _threading(self, host_threads: Any) -> str | None:
        """Multithreaded host phases (the analysis' reordering) through cuDSS's OpenMP layer, when
        the wheel ships it and it loads (it needs libgomp); ``host_threads``: "auto" (OpenMP's
        default), an int, or False (single-threaded)."""
        if host_threads is False or host_threads == 0:
            return None
        layer = self.lib.threading_layer
        if layer is None:
            return None
        status = self.lib.cdll.cudssSetThreadingLayer(self.handle, layer.encode())
        if status != 0:
            return None  # libgomp missing or another failure: cuDSS stays single-threaded
        if isinstance(host_threads, int) and not isinstance(host_threads, bool):
            self.set_config(Config.HOST_NTHREADS, host_threads)
        return layer

    def _create_matrix(self, mtype: int) -> None:
        itype = DType.R_32I if self.indices.dtype == torch.int32 else DType.R_64I
        self.lib.call("cudssMatrixCreateCsr", ctypes.byref(self.matrix), self.n, self.n, self.indices.numel(),
                      self.indptr.data_ptr(), None, self.indices.data_ptr(), self.values.data_ptr(), itype, itype,
                      _VALUE_TYPES[self.values.dtype], mtype, View.FULL, _lib.Base.ZERO)

    # --- configuration and data ------------------------------------------------------------------
    def set_config(self, param: int, value: Any) -> None:
        ctype = _lib.CONFIG_CTYPE.get(param, ctypes.c_int)
        v = ctype(value)
        self.lib.call("cudssConfigSet", self.config, param, ctypes.byref(v), ctypes.sizeof(v))

    def enable_hybrid(self, limit: int | None) -> None:
        self.set_config(Config.HYBRID_MEMORY_MODE, 1)
        if limit is not None:
            self.set_config(Config.HYBRID_DEVICE_MEMORY_LIMIT, int(limit))
        self.hybrid = True

    def get_data(self, param: int, ctype: Any, count: int = 1) -> list:
        buf = (ctype * count)()
        written = ctypes.c_size_t(0)
        self.lib.call("cudssDataGet", self.handle, self.data, param, buf, ctypes.sizeof(buf), ctypes.byref(written))
        got = max(1, min(count, written.value // ctypes.sizeof(ctype))) if written.value else count
        return list(buf[:got])

    # --- phases ----------------------------------------------------------------------------------------
    def _dense(self, t: torch.Tensor, k: int) -> ctypes.c_void_p:
        mat = ctypes.c_void_p()
        self.lib.call("cudssMatrixCreateDn", ctypes.byref(mat), self.n, k, self.n, t.data_ptr(),
                      _VALUE_TYPES[t.dtype], Layout.COL_MAJOR)
        return mat

    def execute(self, phase: int, x: torch.Tensor, b: torch.Tensor, k: int) -> None:
        X, B = self._dense(x, k), self._dense(b, k)
        try:
            self.lib.call("cudssSetStream", self.handle, ctypes.c_void_p(_stream(self.device)))
            self.lib.call("cudssExecute", self.handle, phase, self.config, self.data, self.matrix, X, B)
        finally:
            self.lib.call("cudssMatrixDestroy", X)
            self.lib.call("cudssMatrixDestroy", B)

    def _scratch(self) -> tuple[torch.Tensor, Any]:
        """Placeholder x / b for the phases that take them (one column per member)."""
        return torch.zeros(self.batch * self.n, dtype=self.values.dtype, device=self.device), 1

    def factor(self) -> None:
        scratch, one = self._scratch()
        if not self.analysed:
            t0 = time.perf_counter()
            self.execute(Phase.ANALYSIS, scratch, scratch, one)
            if self.auto_hybrid and not self.hybrid and not self._fits():
                # cuDSS's own estimate says the factorization would not fit: hybrid memory mode
                # (set before an analysis, so the analysis runs again), never an out-of-memory error
                self.enable_hybrid(self.hybrid_limit)
                self.switched_to_hybrid = True
                self.execute(Phase.ANALYSIS, scratch, scratch, one)
            self.analysed = True
            self.analysis_seconds = time.perf_counter() - t0
            self.execute(Phase.FACTORIZATION, scratch, scratch, one)
        else:
            self.execute(Phase.REFACTORIZATION if self.refactorization else Phase.FACTORIZATION, scratch, scratch, one)

    def peak_device_bytes(self) -> int | None:
        """cuDSS's estimate of the peak device memory of the factorization (after the analysis)."""
        try:
            return int(self.get_data(Data.MEMORY_ESTIMATES, ctypes.c_int64, 16)[1])
        except _lib.CudssError:
            return None

    def _fits(self) -> bool:
        peak = self.peak_device_bytes()
        if peak is None:
            return True
        free, _ = torch.cuda.mem_get_info(self.device)
        spare = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return peak <= 0.95 * (free + max(spare, 0))

    def info(self) -> int:
        """cuDSS's error indicator (one int, also for a uniform batch; a host synchronization)."""
        return int(self.get_data(Data.INFO, ctypes.c_int)[0])

    def solve(self, b: torch.Tensor, x: torch.Tensor, k: int, mode: int = SolveMode.NORMAL) -> None:
        if mode != SolveMode.NORMAL:
            self.set_config(Config.SOLVE_MODE, mode)
        try:
            self.execute(Phase.SOLVE, x, b, k)
        finally:
            if mode != SolveMode.NORMAL:
                self.set_config(Config.SOLVE_MODE, SolveMode.NORMAL)

    def close(self) -> None:
        self._finalizer()


def _destroy(lib: _lib.Library, device: torch.device, handle: int, config: int, data: int, matrices: list) -> None:
    """Release the cuDSS objects (also at interpreter exit; errors are ignored there)."""
    try:
        with torch.cuda.device(device):
            for m in matrices:
                if m:
                    lib.cdll.cudssMatrixDestroy(ctypes.c_void_p(m))
            if data:
                lib.cdll.cudssDataDestroy(ctypes.c_void_p(handle), ctypes.c_void_p(data))
            if config:
                lib.cdll.cudssConfigDestroy(ctypes.c_void_p(config))
            if handle:
                lib.cdll.cudssDestroy(ctypes.c_void_p(handle))
    except Exception:  # noqa: BLE001 - teardown
        pass


def check_factor(fac: _Factor, mtype: int, backend: str, method: str, where: str) -> int:
    """Read cuDSS's error indicator after a factorization: a named error with the failing row, or
    the number of perturbed pivots (0 for SPD/HPD)."""
    code = fac.info()
    if code == 0:
        if mtype in (MatrixType.SPD, MatrixType.HPD):
            return 0
        try:
            return int(fac.get_data(Data.NPIVOTS, ctypes.c_int)[0])
        except _lib.CudssError:
            return 0
    row = code - 1 if code > 0 else None
    at = f" at row {row}" if row is not None else f" (cuDSS info {code})"
    if mtype in (MatrixType.SPD, MatrixType.HPD):
        raise IndefiniteMatrixError(
            f"{backend}/cholesky: A{where} is not positive definite: the factorization met a non-positive pivot"
            f"{at}; use method='ldlt' (symmetric indefinite) or 'lu'")
    raise SingularMatrixError(
        f"{backend}/{method}: A{where} is singular: cuDSS met a zero pivot{at}; check A for zero "
        f"rows/columns, or use a least-squares method", row)


def matrix_type(method: str, complex_: bool, hermitian: bool, backend: str) -> int:
    if method == "lu":
        return MatrixType.GENERAL
    if method == "cholesky":
        return MatrixType.HPD if complex_ else MatrixType.SPD
    if method == "ldlt":
        return MatrixType.HERMITIAN if (complex_ and hermitian) else MatrixType.SYMMETRIC
    raise InputError(f"{backend}: unknown method {method!r} (lu, cholesky, ldlt)")


def _settings(options: Mapping[str, Any], backend: str) -> dict[str, Any]:
    bo = dict(options.get("backend_options") or {})
    out: dict[str, Any] = {}
    if bo.get("reordering") is not None:
        if bo["reordering"] not in _lib.REORDERING:
            raise InputError(f"{backend}: backend_options reordering={bo['reordering']!r} is not one of {tuple(_lib.REORDERING)}")
        out["reordering"] = bo["reordering"]
    if bo.get("pivot_type") is not None:
        if bo["pivot_type"] not in _lib.PIVOT_TYPE:
            raise InputError(f"{backend}: backend_options pivot_type={bo['pivot_type']!r} is not one of {tuple(_lib.PIVOT_TYPE)}")
        out["pivot_type"] = bo["pivot_type"]
    for key in ("pivot_threshold", "pivot_epsilon"):
        if bo.get(key) is not None:
            v = float(bo[key])
            if not (v >= 0 and math.isfinite(v)):
                raise InputError(f"{backend}: backend_options {key}={bo[key]!r} must be a finite number >= 0")
            out[key] = v
    for key in ("ir_steps", "nd_nlevels", "hybrid_device_memory_limit"):
        if bo.get(key) is not None:
            v = bo[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"{backend}: backend_options {key}={v!r} must be an int >= 0")
            out[key] = v
    ht = bo.get("host_threads", "auto")
    if not (ht == "auto" or ht is False or (isinstance(ht, int) and not isinstance(ht, bool) and ht >= 0)):
        raise InputError(f"{backend}: backend_options host_threads={ht!r} must be 'auto', False or an int >= 0")
    out["host_threads"] = ht
    if bo.get("refactorization") is not None:
        out["refactorization"] = bool(bo["refactorization"])
    if bo.get("deterministic") is not None:
        out["deterministic"] = int(bool(bo["deterministic"]))
    hm = bo.get("hybrid_memory", "auto")
    if hm not in ("auto", True, False):
        raise InputError(f"{backend}: backend_options hybrid_memory={hm!r} must be 'auto', True or False")
    out["hybrid_memory"] = hm
    out["residual_check"] = bo.get("residual_check", "auto")
    return out


def _transpose_map(indptr: torch.Tensor, indices: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR of A^T: (slot permutation from A's CSR slots, indptr, indices), in A's index dtype."""
    idt = indices.dtype
    counts = (indptr[1:] - indptr[:-1]).to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(n, device=indices.device), counts)
    cols = indices.to(torch.int64)
    order = torch.argsort(cols * n + rows)
    t_indices = rows[order].to(idt).contiguous()
    ptr = torch.zeros(n + 1, dtype=torch.int64, device=indices.device)
    ptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n), 0)
    return order, ptr.to(idt).contiguous(), t_indices


class CudssPlan:
    """Sparse LU / Cholesky / LDL^T of a (value-batched) square matrix on a fixed pattern, on CUDA."""

    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, method: str, hermitian: bool,
                 hybrid: bool = False, backend: str = "cudss") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        if A.device.type != "cuda":
            raise InputError(f"{backend}/{method} runs on CUDA tensors; A is on {A.device}")
        self.backend, self.method, self.n, self.device, self.dtype = backend, method, int(n), A.device, A.dtype
        self.lib = _lib.load()
        self.settings = _settings(options, backend)
        self.batch_shape = tuple(A.batch_shape)
        self.batch = max(1, math.prod(self.batch_shape))
        narrow = A.nse < 2**31 - 1 and n < 2**31 - 1
        self.index_dtype = torch.int32 if narrow else torch.int64
        self._source = A
        self._conv = conversion(A, CSR, self.index_dtype)
        self._indptr = self._conv.pos[1].to(self.index_dtype).contiguous()
        self._indices = self._conv.crd[1].to(self.index_dtype).contiguous()
        self.nnz = int(self._indices.numel())
        self.mtype = matrix_type(method, A.dtype.is_complex, hermitian, backend)
        self._values = torch.zeros((self.batch, self.nnz), dtype=A.dtype, device=A.device)
        self._fwd = _Factor(self.lib, self.device, self._indptr, self._indices, self._values, self.n, self.mtype,
                            self.batch, self.settings, hybrid)
        self._adj: _Factor | None = None  # cuDSS 0.8: the factorization of A^H, for adjoint LU solves
        self._adj_values: torch.Tensor | None = None
        self._adj_fresh = False
        self._t_map: tuple | None = None
        #: numeric factorizations run so far (analysis excluded), and the (host) analysis time
        self.factorizations = 0
        self.perturbed_pivots = 0
        self.factor_nnz: int | None = None
        self.memory_estimates: list[int] | None = None
        self._loaded = False

    # --- numeric phase -------------------------------------------------------------------------------
    @property
    def hybrid(self) -> bool:
        return self._fwd.hybrid

    @property
    def analysis_seconds(self) -> float:
        return self._fwd.analysis_seconds

    def set_values(self, values: torch.Tensor) -> None:
        vals = self._conv.apply(self._source.with_values(values.detach())).values
        self._values.copy_(vals.reshape(self.batch, self.nnz))
        first = not self._fwd.analysed
        self._fwd.factor()
        self.factorizations += 1
        self._adj_fresh = False
        if first:
            self._after_analysis()
        self._check(self._fwd)
        self._loaded = True

    def _after_analysis(self) -> None:
        try:
            self.factor_nnz = int(self._fwd.get_data(Data.LU_NNZ, ctypes.c_int64)[0])
            self.memory_estimates = [int(v) for v in self._fwd.get_data(Data.MEMORY_ESTIMATES, ctypes.c_int64, 16)]
        except _lib.CudssError:  # informative only
            pass

    def _check(self, fac: _Factor) -> None:
        where = f" (a member of the value batch of {self.batch})" if self.batch > 1 else ""
        self.perturbed_pivots = check_factor(fac, self.mtype, self.backend, self.method, where)

    # --- solves --------------------------------------------------------------------------------------
    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, IterationResult]:
        if not self._loaded:
            raise RuntimeError(f"{self.backend}/{self.method}: solve() before set_values()")
        n = self.n
        k = int(B.shape[-1])
        Bm = B.detach().reshape(-1, n, k)
        members = Bm.shape[0]
        if members != self.batch:
            if self.batch == 1:  # one matrix, several right-hand-side batches: fold them into columns
                Bm = Bm.permute(1, 0, 2).reshape(1, n, members * k)
            else:
                raise InputError(f"{self.backend}/{self.method}: B has {members} batch members for {self.batch} matrices")
        kk = int(Bm.shape[-1])
        conj_trick = adjoint and self.dtype.is_complex and self.mtype == MatrixType.SYMMETRIC
        # column-major per member: (batch, k, n) contiguous
        rhs = Bm.mT.contiguous()
        if rhs.dtype != self.dtype:
            rhs = rhs.to(self.dtype)
        if conj_trick:
            rhs = rhs.conj().resolve_conj()
        x = torch.empty_like(rhs)
        if adjoint and self.mtype == MatrixType.GENERAL:
            self._adjoint_solve(rhs, x, kk)
        else:
            self._fwd.solve(rhs, x, kk)
        if conj_trick:
            x = x.conj().resolve_conj()
        X = x.mT
        if members != self.batch:
            X = X.reshape(n, members, k).permute(1, 0, 2)
        X = X.reshape(B.shape).contiguous()
        if self.perturbed_pivots and self.settings.get("residual_check", "auto") is not False:
            self._residual_check(B, X, adjoint)
        reason = f"cuDSS {'.'.join(map(str, self.lib.version))} {self.method}" + (" (hybrid memory)" if self.hybrid else "")
        return X, IterationResult(0, math.nan, True, Status.DIRECT, reason)

    def _adjoint_solve(self, rhs: torch.Tensor, x: torch.Tensor, k: int) -> None:
        if self.lib.transposed_solve:
            mode = SolveMode.CONJUGATE_TRANSPOSE if self.dtype.is_complex else SolveMode.TRANSPOSE
            self._fwd.solve(rhs, x, k, mode)
            return
        # cuDSS 0.8: factor A^H on a second cuDSS object (analysis once, refactorization per value set)
        if self._t_map is None:
            self._t_map = _transpose_map(self._indptr, self._indices, self.n)
        order, t_indptr, t_indices = self._t_map
        if self._adj is None:
            self._adj_values = torch.zeros_like(self._values)
            self._adj = _Factor(self.lib, self.device, t_indptr, t_indices, self._adj_values, self.n, self.mtype,
                                self.batch, self.settings, self._fwd.hybrid)
        if not self._adj_fresh:
            vals = self._values[:, order]
            self._adj_values.copy_(vals.conj() if vals.is_complex() else vals)
            self._adj.factor()
            self._check(self._adj)
            self._adj_fresh = True
        self._adj.solve(rhs, x, k)

    def _residual_check(self, B: torch.Tensor, X: torch.Tensor, adjoint: bool) -> None:
        """After cuDSS perturbed pivots (near-singular A): refuse a solution that does not solve."""
        n = self.n
        limit = _RESIDUAL_LIMIT[self.dtype]
        Xm = X.reshape(self.batch, n, -1)
        Bm = B.reshape(self.batch, n, -1).to(self.dtype)
        if adjoint and self._t_map is None:
            self._t_map = _transpose_map(self._indptr, self._indices, n)
        for i in range(self.batch):
            if adjoint:  # A^H as the CSR of the transposed pattern with conjugated values
                order, tp, ti = self._t_map
                v = self._values[i][order]
                A = torch.sparse_csr_tensor(tp, ti, v.conj().resolve_conj() if v.is_complex() else v, (n, n))
            else:
                A = torch.sparse_csr_tensor(self._indptr, self._indices, self._values[i], (n, n))
            AX = A @ Xm[i]
            r = torch.linalg.vector_norm(AX - Bm[i]) / torch.linalg.vector_norm(Bm[i]).clamp_min(1e-300)
            rv = float(r)
            if not math.isfinite(rv) or rv > limit:
                raise SingularMatrixError(
                    f"{self.backend}/{self.method}: A{' (value-batch member %d)' % i if self.batch > 1 else ''} is singular "
                    f"to working precision: cuDSS perturbed {self.perturbed_pivots} pivot(s) and the solution's relative "
                    f"residual is {rv:.1e}; check A for zero rows/columns, or use a least-squares method")

    def close(self) -> None:
        self._fwd.close()
        if self._adj is not None:
            self._adj.close()

    def __repr__(self) -> str:
        return (f"CudssPlan(method={self.method!r}, n={self.n}, nnz={self.nnz}, batch={self.batch}, "
                f"cuDSS {'.'.join(map(str, self.lib.version))}{', hybrid' if self.hybrid else ''})")
