"""Fused CG / PCG (Jacobi) on this backend's kernels (kernels/krylov.cu): op ``solve``, method ``cg``.

One iteration is three kernels, every scalar stays on the device:

1. ``q = A p`` with ``p.q`` fused (block partial sums, the last block adds them in a fixed order
   and sets ``alpha``): CSR (``cg_csr_spmv_dot``, 32 rows per warp, int32 or int64 indices) or DIA
   with at most 8 diagonals (``cg_dia_spmv_dot``: no index arrays at all); any other format runs
   on a CSR made once from its pattern (one value gather per value set);
2. ``r -= alpha q`` with ``r.r`` (and ``r.D^-1 r``) fused; the last block sets ``beta``, counts the
   iteration and decides whether to stop;
3. ``x += alpha p; p = D^-1 r + beta p``.

The stopping test runs on the device every iteration; the host polls the scalars once per block of
``check_every`` iterations (default 32), replayed as one CUDA graph, with the next block already
queued (kernels after the stop return at once, so the overrun costs a few microseconds). Work
memory: ``x, r, p, q`` (and ``D^-1`` with Jacobi, unless the diagonal is constant): 4 (5) vectors,
32 (40) bytes per unknown in float64. ``x`` is the solution handed back (never copied): the graph
finds it through a device word holding its address. ``r, p, q`` (and the captured graph) stay with
the plan between calls for systems up to :data:`KEEP_BYTES` of them; larger systems allocate them
per call and free them at the end.

Compiled with NVRTC like the other sources (cached in memory and on disk under the same directory,
keyed by the sha256 of the text, the options and NVRTC's version), for float32 and float64.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from sparsetorch import IndefiniteMatrixError, InputError, SparseTensor
from sparsetorch.backend import IterationResult, Rates, Request, Status

from . import compile as _compile
from . import launch as _launch
from .layout import _check_cols, _check_rowptr

__all__ = ["CudaCGPlan", "cg_cost", "compile_cubin", "KERNELS", "DTYPES", "KEEP_BYTES",
           "bytes_per_iteration"]

DTYPES = (torch.float32, torch.float64)
#: the kernels krylov.cu exports (the host compile test checks them)
KERNELS = ("cg_init", "cg_csr_spmv_dot", "cg_dia_spmv_dot", "cg_update_r", "cg_update_xp", "cg_csr_diag_inv")
#: threads per block (KB in krylov.cu)
BLOCK = 256
#: iterations per polled block (a CUDA graph) when the call gives no check_every
CHECK_EVERY = 32
#: work vectors up to this size stay with the plan (with the captured graph) between calls
KEEP_BYTES = 1 << 28
#: DIA diagonals the fused product takes (offsets are kernel parameters)
DIA_MAX = 8
#: fraction of the copy bandwidth the fused iteration reaches, until measured (cost model)
EFFICIENCY = 0.7
#: launch units (the core's host launch cost) per iteration: 3 kernels in a graph (~1 us each
#: of scheduling) and the poll once per block
LAUNCHES_PER_ITERATION = 0.4

_S = 16  # device scalars (S_* in krylov.cu)
_DONE, _ITERS, _MAXIT, _RTOL, _ATOL, _RR, _RR0, _MINPAP, _MINRZ = 8, 9, 10, 12, 13, 4, 14, 5, 6
_VAL = {torch.float32: "float32", torch.float64: "float64"}
_IDX = {torch.int32: "int32", torch.int64: "int64"}


# Compilation and loading: compile.py's (krylov is one of its PARTIAL_SOURCES: float32 / float64) -------------
def compile_cubin(value: str, index: str, arch: str) -> bytes:
    """krylov.cu compiled by NVRTC (no cache): the cubin. Needs NVRTC only (no driver, no GPU)."""
    return _compile.compile_cubin("krylov", value, index, arch)


_NARGS = {"cg_init": 9, "cg_csr_spmv_dot": 9, "cg_dia_spmv_dot": 16, "cg_update_r": 7, "cg_update_xp": 6,
          "cg_csr_diag_inv": 5}


def _resident(k: _launch.Kernel) -> int:
    """Blocks of BLOCK threads of ``k`` resident per SM (the driver's occupancy calculator; 4 if it cannot say)."""
    cu = k._cu
    try:
        err, blocks = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(k._fn, BLOCK, 0)
        if int(err) == 0 and int(blocks) > 0:
            return int(blocks)
    except Exception:  # noqa: BLE001 - only a launch-size hint
        pass
    return 4


def _kernel(name: str, dtype: torch.dtype, index: torch.dtype, device: int) -> _launch.Kernel:
    return _launch.kernel("krylov", name, dtype, index, device, _NARGS[name])


# Cost ---------------------------------------------------------------------------------------------------
def bytes_per_iteration(n: int, matrix_bytes: int, vsize: int, jacobi: bool) -> int:
    """What the three kernels move per iteration: the matrix once, 10 vector passes (12 with Jacobi)."""
    return int(matrix_bytes + (12 if jacobi else 10) * n * vsize)


def _matrix_bytes(request: Request, kind: str) -> int:
    A = request.A
    m = int(A.shape[-2])
    vsize = torch.empty((), dtype=A.dtype).element_size()
    nse = int(A.nse or 0)
    if kind == "dia":
        return nse * vsize
    isize = 4 if max(nse, m) < 2**31 - 1024 else 8
    return nse * (vsize + isize) + (m + 1) * isize


def cg_cost(rates_: Rates, request: Request, jacobi: bool) -> tuple[float, int, int, str, float]:
    """(seconds, peak bytes, estimated iterations, kind, setup seconds) of the fused CG on ``request``."""
    from sparsetorch.backend import cg_iterations as iterations  # noqa: PLC0415 - the core's CG iteration model

    from .cost import bandwidth_scale  # noqa: PLC0415

    A = request.A
    n = int(A.shape[-1])
    vsize = torch.empty((), dtype=A.dtype).element_size()
    kind = _kind_of(A.format, _dia_count(request))
    its = iterations("cg", n, float(request.option("rtol", 1e-6) or 1e-6), request.option("maxiter"))
    k = max(1, int(request.rhs_columns))
    per = rates_.seconds(bytes=bytes_per_iteration(n, _matrix_bytes(request, kind), vsize, jacobi)
                         / (bandwidth_scale() * EFFICIENCY), launches=LAUNCHES_PER_ITERATION)
    setup = 0.0
    if kind == "generic":  # the pattern's CSR, once (a sort of the entries)
        setup = rates_.seconds(bytes=int(A.nse or 0) * 48, launches=20)
    peak = (5 + (1 if jacobi else 0)) * n * vsize
    return per * its * k + setup, int(peak), its, kind, setup


def _dia_count(request: Request) -> int | None:
    try:
        return int(request.A.pos(0)[-1]) if request.A.format is not None and _is_dia(request.A.format) else None
    except Exception:  # noqa: BLE001 - a lazy or unusual operand: priced as generic
        return None


def _is_dia(fmt: Any) -> bool:
    from sparsetorch.format import DIA  # noqa: PLC0415

    return fmt == DIA


def _kind_of(fmt: Any, ndiag: int | None = None) -> str:
    from sparsetorch.format import CSR, DIA  # noqa: PLC0415

    if fmt == CSR:
        return "csr"
    if fmt == DIA and (ndiag is None or ndiag <= DIA_MAX):
        return "dia"
    return "generic"


# The plan ------------------------------------------------------------------------------------------------
class CudaCGPlan:
    """CG (``preconditioner=None``) or Jacobi PCG on one SPD matrix's pattern; values by
    :meth:`set_values`; :meth:`solve` per right-hand side. A must be symmetric positive definite
    (the offer requires the ``spd`` property): ``adjoint`` solves are forward ones."""

    backend = "cuda"
    method = "cg"
    reload_cheap = True
    #: the kernels this plan loads, its kept work vectors besides x, its name in messages and graphs
    _names: tuple[str, ...] = KERNELS
    _nwork = 3
    _title = "CG"

    def __init__(self, A: SparseTensor, *, preconditioner: str | None = None, check_every: int | None = None,
                 cuda_graph: bool = True) -> None:
        fs = A.format_shape
        if len(fs) != 2 or A.format.num_batch_levels or A.batch_shape:
            raise InputError(f"cuda/cg: one matrix per plan (no batch); got format {A.format} with batch {tuple(A.batch_shape)}")
        if fs[0] != fs[1]:
            raise InputError(f"cuda/cg: needs a square matrix, got {tuple(fs)}")
        if A.device.type != "cuda":
            raise InputError(f"cuda/cg: runs on CUDA tensors; A is on {A.device}")
        if A.dtype not in DTYPES:
            raise InputError(f"cuda/cg: float32 and float64 only; A is {A.dtype}")
        if preconditioner not in (None, "jacobi"):
            raise InputError(f"cuda/cg: preconditioner must be None or 'jacobi', got {preconditioner!r}")
        self.preconditioner = preconditioner
        #: blocks of iterations replayed as CUDA graphs (backend_options cuda_graph=False: launched one by one)
        self.cuda_graph = bool(cuda_graph)
        self.check_every = check_every
        self.n = n = int(fs[0])
        self.dtype = A.dtype
        self.device = A.device
        self.dev = A.device.index if A.device.index is not None else torch.cuda.current_device()
        self.slots = int(A.values.shape[-1])
        self.gather: torch.Tensor | None = None
        ndiag = int(A.pos(0)[-1]) if _is_dia(A.format) else None
        self.kind = _kind_of(A.format, ndiag)
        if self.kind == "csr":
            rowptr, col = A.pos(1), A.crd(1)
            if rowptr.dtype != col.dtype:
                rowptr, col = rowptr.to(torch.int64), col.to(torch.int64)
            self.nnz = int(col.numel())
            _check_rowptr(rowptr, n, self.nnz, "cuda/cg CSR")
            _check_cols(col, n, "cuda/cg CSR")
            if rowptr.dtype == torch.int64 and max(self.nnz, n) < 2**31 - 1024:
                rowptr, col = rowptr.to(torch.int32), col.to(torch.int32)
            self.rowptr, self.col = rowptr.contiguous(), col.contiguous()
        elif self.kind == "dia":
            offs = A.crd(0).to(torch.int64)
            self.ndiag = int(offs.numel())
            if self.ndiag and (int(offs.min()) <= -n or int(offs.max()) >= n):
                raise InputError(f"cuda/cg DIA: offsets must lie in (-{n}, {n}), got {int(offs.min())} .. {int(offs.max())}")
            if self.slots != self.ndiag * n:
                raise InputError(f"cuda/cg DIA: {self.slots} value slots for {self.ndiag} diagonals of {n} rows")
            self.offs = [int(o) for o in offs.tolist()]
            self.nnz = self.slots
        else:
            coords, slot = A.entries()
            rows, cols = coords[0].to(torch.int64), coords[1].to(torch.int64)
            self.nnz = int(rows.numel())
            if self.nnz and (int(rows.min()) < 0 or int(rows.max()) >= n):
                raise InputError(f"cuda/cg: entry rows outside [0, {n})")
            _check_cols(cols, n, "cuda/cg")
            order = torch.argsort(rows * max(n, 1) + cols, stable=True)
            idx = torch.int32 if max(self.nnz, n) < 2**31 - 1024 else torch.int64
            rowptr = torch.zeros(n + 1, dtype=torch.int64, device=A.device)
            rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
            self.rowptr, self.col = rowptr.to(idx), cols[order].to(idx).contiguous()
            self.gather = slot.to(torch.int64)[order].contiguous()
            del coords, rows, cols, order
            self.kind = "csr"
        self.idx = self.rowptr.dtype if self.kind == "csr" else torch.int32
        sms = int(torch.cuda.get_device_properties(self.dev).multi_processor_count)
        self._k = {name: _kernel(name, self.dtype, self.idx, self.dev) for name in self._names}  # loaded before any capture
        #: blocks of each kernel: as many as are resident at once (grid-stride loops), a fixed grid,
        #: so that the partial sums are added in a fixed order
        need = max(1, -(-n // BLOCK))
        self.grids = {name: max(1, min(sms * _resident(k), need)) for name, k in self._k.items()}
        self.grid = max(self.grids.values())
        self._values: torch.Tensor | None = None
        self._dinv: torch.Tensor | None = None  # D^-1 as the kernels read it (None: no Jacobi, or a constant diagonal)
        self._dinv_buf: torch.Tensor | None = None
        self.jacobi_constant = False
        self._work: dict[str, torch.Tensor] | None = None
        self._graph: Any = None
        self._graph_key: tuple | None = None
        self._host = torch.empty((2, _S), dtype=torch.float64, pin_memory=True)
        self._events = [torch.cuda.Event(), torch.cuda.Event()]
        #: kept work vectors between calls (CG: r, p, q: n * itemsize * 3 <= KEEP_BYTES)
        self.keep = self._nwork * n * torch.empty((), dtype=self.dtype).element_size() <= KEEP_BYTES

    # Values ------------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        values = values.detach()
        if values.shape != (self.slots,) or values.dtype != self.dtype or values.device != self.device:
            raise InputError(f"cuda/cg: values of shape {tuple(values.shape)}, {values.dtype} on {values.device}; this plan "
                             f"takes ({self.slots},) {self.dtype} on {self.device}")
        v = values.index_select(0, self.gather) if self.gather is not None else values.contiguous()
        old = self._values
        self._values = v
        if old is None or old.data_ptr() != v.data_ptr():
            self._graph = None  # the graph holds the values' address
        if self.preconditioner == "jacobi":
            self._set_jacobi(v)

    def _set_jacobi(self, v: torch.Tensor) -> None:
        n = self.n
        if self.kind == "dia":
            if 0 not in self.offs:
                raise IndefiniteMatrixError("cuda/cg: Jacobi needs a positive diagonal; this DIA matrix stores no main diagonal")
            d = v[self.offs.index(0) * n:(self.offs.index(0) + 1) * n]
            bad = bool((d <= 0).any())
            dinv = self._dinv_buf if self._dinv_buf is not None else torch.empty(n, dtype=self.dtype, device=self.device)
            torch.reciprocal(d, out=dinv)
        else:
            dinv = self._dinv_buf if self._dinv_buf is not None else torch.empty(n, dtype=self.dtype, device=self.device)
            self._k["cg_csr_diag_inv"]((self.grids["cg_csr_diag_inv"], 1), BLOCK, (n, self.rowptr.data_ptr(), self.col.data_ptr(), v.data_ptr(),
                                                               dinv.data_ptr()), device=self.dev)
            bad = bool((dinv <= 0).any())
        if bad:
            raise IndefiniteMatrixError("cuda/cg: Jacobi needs a positive diagonal (CG needs a symmetric positive definite "
                                        "matrix); some diagonal entries are <= 0 or missing")
        #: a constant diagonal makes Jacobi a scaling by one number, under which CG's iterates (x, r)
        #: are exactly those of plain CG: the kernels then run without D^-1 (two vector passes less)
        self.jacobi_constant = bool(n == 0 or bool((dinv == dinv[0]).all()))
        self._dinv_buf = None if self.jacobi_constant else dinv
        new = None if self.jacobi_constant else dinv
        if (self._dinv is None) != (new is None) or (new is not None and self._dinv.data_ptr() != new.data_ptr()):
            self._graph = None
        self._dinv = new

    # Solve -------------------------------------------------------------------------------------
    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``B`` of shape ``(*batch, n, k)``); every column is its own CG."""
        if self._values is None:
            raise RuntimeError("cuda/cg: solve() before set_values()")
        o = dict(options or {})
        n = self.n
        if B.dtype != self.dtype or B.device != self.device or B.dim() < 2 or B.shape[-2] != n:
            raise InputError(f"cuda/cg: B of shape {tuple(B.shape)}, {B.dtype} on {B.device}; expected (*batch, {n}, k) "
                             f"{self.dtype} on {self.device}")
        rtol = float(o.get("rtol") if o.get("rtol") is not None else 1e-6)
        atol = float(o.get("atol") or 0.0)
        maxiter = int(o["maxiter"]) if o.get("maxiter") is not None else 10 * n
        every = int(o.get("check_every") or self.check_every or CHECK_EVERY)
        every = max(1, every)
        callback = o.get("callback")
        cols = B.movedim(-2, 0).reshape(n, -1)  # (n, batch * k)
        X = torch.empty_like(cols) if cols.shape[1] > 1 else None
        results = []
        x_last = None
        for c in range(cols.shape[1]):
            x, res = self._solve_one(cols[:, c].contiguous(), rtol, atol, maxiter, every, callback,
                                     graph=self.cuda_graph and (o.get("backend_options") or {}).get("cuda_graph", True)
                                     is not False)
            results.append(res)
            if X is not None:
                X[:, c] = x
            else:
                x_last = x
        out = (X if X is not None else x_last.reshape(n, 1))
        out = out.reshape(n, *B.shape[:-2], B.shape[-1]).movedim(0, -2)
        worst = max(results, key=lambda r: (not r.converged, r.residual))
        return out, IterationResult(
            iterations=max(r.iterations for r in results), residual=worst.residual, converged=all(r.converged for r in results),
            status=worst.status, reason=worst.reason, history=worst.history)

    def _buffers(self) -> dict[str, torch.Tensor]:
        if self._work is not None:
            return self._work
        n, dt, dev = self.n, self.dtype, self.device
        w = {name: torch.empty(n, dtype=dt, device=dev) for name in ("r", "p", "q")}
        w["xptr"] = torch.zeros(1, dtype=torch.int64, device=dev)  # the address of this call's x (K3 reads it)
        w["S"] = torch.zeros(_S, dtype=torch.float64, device=dev)
        w["partial"] = torch.zeros(2 * self.grid, dtype=torch.float64, device=dev)
        w["ticket"] = torch.zeros(4, dtype=torch.int32, device=dev)
        if self.keep:
            self._work = w
        return w

    def _iteration(self, w: dict[str, torch.Tensor]) -> None:
        """One CG iteration: three launches on torch's current stream (capturable)."""
        n, dev, gr = self.n, self.dev, self.grids
        S, part, tk = w["S"].data_ptr(), w["partial"].data_ptr(), w["ticket"].data_ptr()
        p, q, r, xp = w["p"].data_ptr(), w["q"].data_ptr(), w["r"].data_ptr(), w["xptr"].data_ptr()
        dinv = self._dinv.data_ptr() if self._dinv is not None else 0
        vals = self._values.data_ptr()
        if self.kind == "dia":
            offs = [o & 0xFFFFFFFFFFFFFFFF for o in (self.offs + [0] * DIA_MAX)[:DIA_MAX]]  # two's complement words
            self._k["cg_dia_spmv_dot"]((gr["cg_dia_spmv_dot"], 1), BLOCK, (n, self.ndiag, *offs, vals, p, q, S, part, tk), device=dev)
        else:
            self._k["cg_csr_spmv_dot"]((gr["cg_csr_spmv_dot"], 1), BLOCK, (n, self.rowptr.data_ptr(), self.col.data_ptr(), vals, p, q, S, part, tk),
                                       device=dev)
        self._k["cg_update_r"]((gr["cg_update_r"], 1), BLOCK, (n, q, r, dinv, S, part, tk), device=dev)
        self._k["cg_update_xp"]((gr["cg_update_xp"], 1), BLOCK, (n, xp, p, r, dinv, S), device=dev)

    def _block_runner(self, w: dict[str, torch.Tensor], every: int, graph: bool):
        """A callable running ``every`` iterations: a CUDA graph replay where possible."""
        from sparsetorch.backend import BlockGraph, graph_usable as usable  # noqa: PLC0415

        def block() -> None:
            for _ in range(every):
                self._iteration(w)

        if not graph or not usable(w["r"]):
            return block
        key = (every, w["r"].data_ptr(), self._values.data_ptr(), self._dinv.data_ptr() if self._dinv is not None else 0)
        if self._work is not None and self._graph is not None and self._graph_key == key:
            return self._graph
        g = BlockGraph(block, self.device, f"{every} fused {self._title} iterations")
        if self._work is not None:
            self._graph, self._graph_key = g, key
        return g

    def _solve_one(self, b: torch.Tensor, rtol: float, atol: float, maxiter: int, every: int, callback: Any, *,
                   graph: bool) -> tuple[torch.Tensor, IterationResult]:
        w = self._buffers()
        x = torch.empty(self.n, dtype=self.dtype, device=self.device)  # the solution: handed back as it is
        w["xptr"].fill_(x.data_ptr())
        S = w["S"]
        init = torch.zeros(_S, dtype=torch.float64)
        init[_MAXIT], init[_RTOL], init[_ATOL] = float(maxiter), rtol, atol
        S.copy_(init, non_blocking=False)
        dinv = self._dinv.data_ptr() if self._dinv is not None else 0
        self._k["cg_init"]((self.grids["cg_init"], 1), BLOCK, (self.n, b.data_ptr(), x.data_ptr(), w["r"].data_ptr(),
                                                   w["p"].data_ptr(), dinv, S.data_ptr(), w["partial"].data_ptr(),
                                                   w["ticket"].data_ptr()), device=self.dev)
        run = self._block_runner(w, every, graph)
        host, events = self._host, self._events
        history: list[float] = []
        stream = torch.cuda.current_stream(self.device)

        def queue(slot: int) -> None:
            run()
            host[slot].copy_(S, non_blocking=True)
            events[slot].record(stream)

        # the start's scalars first (a solve that is done at once runs no block)
        host[0].copy_(S, non_blocking=True)
        events[0].record(stream)
        events[0].synchronize()
        s = host[0].tolist()
        rr0 = s[_RR0]
        blocks = -(-maxiter // every) + 1
        if s[_DONE] == 0.0:
            queue(0)
            if blocks > 1:
                queue(1)
            slot, queued = 0, min(2, blocks)
            while True:
                events[slot].synchronize()
                s = host[slot].tolist()
                rel = math.sqrt(max(s[_RR], 0.0) / rr0) if rr0 > 0 else 0.0
                history.append(rel)
                if callback is not None:
                    callback(int(s[_ITERS]), rel)
                if s[_DONE] != 0.0 or queued >= blocks:
                    break
                queue(slot)
                queued += 1
                slot = 1 - slot
            torch.cuda.current_stream(self.device).synchronize()  # a block queued after the stop has run (no-ops)
        if self._work is None:
            w.clear()
        return x, self._result(s, rr0, history)

    def _result(self, s: list[float], rr0: float, history: list[float]) -> IterationResult:
        it = int(s[_ITERS])
        rel = math.sqrt(max(s[_RR], 0.0) / rr0) if rr0 > 0 else 0.0
        done = int(s[_DONE])
        if rr0 == 0.0:
            return IterationResult(0, 0.0, True, Status.CONVERGED, "", tuple(history))
        if done == 1:
            return IterationResult(it, rel, True, Status.CONVERGED, "", tuple(history))
        if done == 2:
            return IterationResult(it, rel, False, Status.INDEFINITE,
                                   f"CG found p^T A p = {s[_MINPAP]:.1e} <= 0 by iteration {it + 1}: the matrix is not "
                                   f"positive definite; use minres for a symmetric indefinite matrix, or gmres/bicgstab",
                                   tuple(history))
        if done == 5:
            return IterationResult(it, rel, False, Status.INDEFINITE,
                                   f"CG found r^T M^-1 r = {s[_MINRZ]:.1e} <= 0 by iteration {it}: the Jacobi "
                                   f"preconditioner is not positive definite", tuple(history))
        if done == 3:
            return IterationResult(it, rel, False, Status.NOT_FINITE,
                                   f"cuda/cg: NaN or Inf appeared by iteration {it + 1} (in A, b, or from overflow)",
                                   tuple(history))
        return IterationResult(it, rel, False, Status.MAX_ITERATIONS,
                               f"cuda/cg reached maxiter ({it}) with relative residual {rel:.2e} above the tolerance: "
                               f"raise maxiter, or use a preconditioner", tuple(history))


# BiCGStab ------------------------------------------------------------------------------------------------
#: the kernels of the fused BiCGStab (krylov.cu's second part); cg_csr_diag_inv gives its Jacobi diagonal
BICGSTAB_KERNELS = ("bicg_init", "bicg_csr_spmv_v", "bicg_dia_spmv_v", "bicg_csr_spmv_t", "bicg_dia_spmv_t",
                    "bicg_update_xr", "bicg_update_p", "cg_csr_diag_inv")
#: launch units per BiCGStab iteration: 4 kernels in a graph and the poll once per block
BICGSTAB_LAUNCHES_PER_ITERATION = 0.55
_NARGS.update({"bicg_init": 8, "bicg_csr_spmv_v": 11, "bicg_dia_spmv_v": 18, "bicg_csr_spmv_t": 11,
               "bicg_dia_spmv_t": 18, "bicg_update_xr": 10, "bicg_update_p": 5})
_SB = 24  # device scalars of BiCGStab (B_* in krylov.cu)
_B_RHO, _B_RR, _B_RHV, _B_VAL, _B_DONE, _B_ITERS, _B_MAXIT, _B_RTOL, _B_ATOL, _B_RR0, _B_EPS = 0, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15
__all__ += ["CudaBiCGStabPlan", "bicgstab_cost", "bicgstab_bytes_per_iteration", "BICGSTAB_KERNELS"]


def bicgstab_bytes_per_iteration(n: int, matrix_bytes: int, vsize: int, jacobi: bool) -> int:
    """What the four kernels move per iteration: the matrix twice, 18 vector passes (21 with Jacobi)."""
    return int(2 * matrix_bytes + (21 if jacobi else 18) * n * vsize)


def bicgstab_cost(rates_: Rates, request: Request, jacobi: bool) -> tuple[float, int, int, str, float]:
    """(seconds, peak bytes, estimated iterations, kind, setup seconds) of the fused BiCGStab on ``request``."""
    from sparsetorch.backend import cg_iterations as iterations  # noqa: PLC0415 - the core's iteration model

    from .cost import bandwidth_scale  # noqa: PLC0415

    A = request.A
    n = int(A.shape[-1])
    vsize = torch.empty((), dtype=A.dtype).element_size()
    kind = _kind_of(A.format, _dia_count(request))
    its = iterations("bicgstab", n, float(request.option("rtol", 1e-6) or 1e-6), request.option("maxiter"))
    k = max(1, int(request.rhs_columns))
    per = rates_.seconds(bytes=bicgstab_bytes_per_iteration(n, _matrix_bytes(request, kind), vsize, jacobi)
                         / (bandwidth_scale() * EFFICIENCY), launches=BICGSTAB_LAUNCHES_PER_ITERATION)
    setup = 0.0
    if kind == "generic":
        setup = rates_.seconds(bytes=int(A.nse or 0) * 48, launches=20)
    peak = (5 + (1 if jacobi else 0)) * n * vsize  # x, r, p, v, t (+ D^-1); the shadow residual is b itself
    return per * its * k + setup, int(peak), its, kind, setup


class CudaBiCGStabPlan(CudaCGPlan):
    """Right-preconditioned BiCGStab (``preconditioner=None`` or ``"jacobi"``) on one square
    matrix's pattern, any (non-symmetric) real matrix; values by :meth:`set_values`; :meth:`solve`
    per right-hand side. Four kernels per iteration (krylov.cu): ``v = A p`` with ``rh.v``;
    ``t = A s`` with ``s.s, t.s, t.t`` (``s = r - alpha v`` formed inside the product, never
    stored); ``x, r`` with ``r.r, rh.r``; ``p``. The shadow residual ``rh`` is ``r0 = b`` itself
    (read in place). Work memory: ``x, r, p, v, t`` (and ``D^-1``): 40 (48) bytes per unknown in
    float64. Adjoint solves (``A^T x = b``, the backward pass) run a second plan on the
    transposed pattern, built on first use."""

    method = "bicgstab"
    _names = BICGSTAB_KERNELS
    _nwork = 4
    _title = "BiCGStab"

    def __init__(self, A: SparseTensor, *, preconditioner: str | None = None, check_every: int | None = None,
                 cuda_graph: bool = True) -> None:
        super().__init__(A, preconditioner=preconditioner, check_every=check_every, cuda_graph=cuda_graph)
        self._raw: torch.Tensor | None = None  # the values as A stores them (for the adjoint plan)
        self._adj: CudaBiCGStabPlan | None = None
        self._adj_gather: torch.Tensor | None = None
        self._host = torch.empty((2, _SB), dtype=torch.float64, pin_memory=True)

    # Values ------------------------------------------------------------------------------------
    def set_values(self, values: torch.Tensor) -> None:
        super().set_values(values)
        self._raw = values.detach()
        if self._adj is not None and self._adj_gather is not None:
            self._adj.set_values(self._raw.index_select(0, self._adj_gather))

    def _set_jacobi(self, v: torch.Tensor) -> None:
        from sparsetorch import SingularMatrixError  # noqa: PLC0415

        n = self.n
        dinv = self._dinv_buf if self._dinv_buf is not None else torch.empty(n, dtype=self.dtype, device=self.device)
        if self.kind == "dia":
            if 0 not in self.offs:
                raise SingularMatrixError("cuda/bicgstab: Jacobi needs a nonzero diagonal; this DIA matrix stores no main "
                                          "diagonal: use preconditioner=None")
            d = v[self.offs.index(0) * n:(self.offs.index(0) + 1) * n]
            torch.reciprocal(d, out=dinv)
            bad = ~torch.isfinite(dinv)
        else:
            self._k["cg_csr_diag_inv"]((self.grids["cg_csr_diag_inv"], 1), BLOCK,
                                       (n, self.rowptr.data_ptr(), self.col.data_ptr(), v.data_ptr(), dinv.data_ptr()),
                                       device=self.dev)
            bad = (dinv == 0) | ~torch.isfinite(dinv)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise SingularMatrixError(f"cuda/bicgstab: diagonal entry {row} is zero (or missing), so the Jacobi "
                                      f"preconditioner would divide by zero: use preconditioner=None", row=row)
        #: a constant diagonal c makes right Jacobi a scaling of p and s by 1/c under which BiCGStab's
        #: iterates x, r are those of plain BiCGStab: the kernels then run without D^-1
        self.jacobi_constant = bool(n == 0 or bool((dinv == dinv[0]).all()))
        self._dinv_buf = None if self.jacobi_constant else dinv
        new = None if self.jacobi_constant else dinv
        if (self._dinv is None) != (new is None) or (new is not None and self._dinv.data_ptr() != new.data_ptr()):
            self._graph = None
        self._dinv = new

    # Adjoint ------------------------------------------------------------------------------------
    def _pattern_entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, cols, slots into A.values) of every entry this plan's product reads."""
        n, dev = self.n, self.device
        if self.kind == "dia":
            rows, cols, slots = [], [], []
            for d, o in enumerate(self.offs):
                i = torch.arange(max(0, -o), min(n, n - o), device=dev)
                rows.append(i)
                cols.append(i + o)
                slots.append(i + d * n)
            return torch.cat(rows), torch.cat(cols), torch.cat(slots)
        counts = (self.rowptr[1:] - self.rowptr[:-1]).to(torch.int64)
        rows = torch.repeat_interleave(torch.arange(n, device=dev), counts)
        slots = self.gather if self.gather is not None else torch.arange(int(self.col.numel()), device=dev)
        return rows, self.col.to(torch.int64), slots

    def _adjoint_plan(self) -> "CudaBiCGStabPlan":
        if self._adj is None:
            from sparsetorch.format import CSR  # noqa: PLC0415

            n = self.n
            rows, cols, slots = self._pattern_entries()
            order = torch.argsort(cols * max(n, 1) + rows, stable=True)
            idx = torch.int32 if max(int(rows.numel()), n) < 2**31 - 1024 else torch.int64
            rowptr = torch.zeros(n + 1, dtype=torch.int64, device=self.device)
            rowptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n), 0)
            gather = slots[order].contiguous()
            assert self._raw is not None
            AT = SparseTensor(CSR, (n, n), [None, rowptr.to(idx)], [None, rows[order].to(idx).contiguous()],
                              self._raw.index_select(0, gather), check=False)
            adj = CudaBiCGStabPlan(AT, preconditioner=self.preconditioner, check_every=self.check_every,
                                   cuda_graph=self.cuda_graph)
            adj.set_values(AT.values)
            self._adj, self._adj_gather = adj, gather
        return self._adj

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, IterationResult]:
        """``X`` with ``A X = B`` (``A^T X = B`` with ``adjoint``; ``B`` of shape ``(*batch, n, k)``);
        every column is its own BiCGStab."""
        if self._values is None:
            raise RuntimeError("cuda/bicgstab: solve() before set_values()")
        if adjoint:
            return self._adjoint_plan().solve(B, options=options)
        return super().solve(B, options=options)

    # Iteration ----------------------------------------------------------------------------------
    def _buffers(self) -> dict[str, torch.Tensor]:
        if self._work is not None:
            return self._work
        n, dt, dev = self.n, self.dtype, self.device
        w = {name: torch.empty(n, dtype=dt, device=dev) for name in ("r", "p", "v", "t")}
        w["ptrs"] = torch.zeros(2, dtype=torch.int64, device=dev)  # this call's x and b (the shadow residual)
        w["S"] = torch.zeros(_SB, dtype=torch.float64, device=dev)
        w["partial"] = torch.zeros(3 * self.grid, dtype=torch.float64, device=dev)
        w["ticket"] = torch.zeros(4, dtype=torch.int32, device=dev)
        if self.keep:
            self._work = w
        return w

    def _iteration(self, w: dict[str, torch.Tensor]) -> None:
        """One BiCGStab iteration: four launches on torch's current stream (capturable)."""
        n, dev, gr, k = self.n, self.dev, self.grids, self._k
        S, part, tk = w["S"].data_ptr(), w["partial"].data_ptr(), w["ticket"].data_ptr()
        r, p, v, t, ptrs = (w[name].data_ptr() for name in ("r", "p", "v", "t", "ptrs"))
        dinv = self._dinv.data_ptr() if self._dinv is not None else 0
        vals = self._values.data_ptr()
        if self.kind == "dia":
            offs = [o & 0xFFFFFFFFFFFFFFFF for o in (self.offs + [0] * DIA_MAX)[:DIA_MAX]]
            head = (n, self.ndiag, *offs, vals)
            k["bicg_dia_spmv_v"]((gr["bicg_dia_spmv_v"], 1), BLOCK, (*head, p, dinv, v, ptrs, S, part, tk), device=dev)
            k["bicg_dia_spmv_t"]((gr["bicg_dia_spmv_t"], 1), BLOCK, (*head, r, v, dinv, t, S, part, tk), device=dev)
        else:
            head = (n, self.rowptr.data_ptr(), self.col.data_ptr(), vals)
            k["bicg_csr_spmv_v"]((gr["bicg_csr_spmv_v"], 1), BLOCK, (*head, p, dinv, v, ptrs, S, part, tk), device=dev)
            k["bicg_csr_spmv_t"]((gr["bicg_csr_spmv_t"], 1), BLOCK, (*head, r, v, dinv, t, S, part, tk), device=dev)
        k["bicg_update_xr"]((gr["bicg_update_xr"], 1), BLOCK, (n, ptrs, p, v, t, r, dinv, S, part, tk), device=dev)
        k["bicg_update_p"]((gr["bicg_update_p"], 1), BLOCK, (n, p, r, v, S), device=dev)

    def _solve_one(self, b: torch.Tensor, rtol: float, atol: float, maxiter: int, every: int, callback: Any, *,
                   graph: bool) -> tuple[torch.Tensor, IterationResult]:
        w = self._buffers()
        x = torch.empty(self.n, dtype=self.dtype, device=self.device)  # the solution: handed back as it is
        w["ptrs"][0].fill_(x.data_ptr())
        w["ptrs"][1].fill_(b.data_ptr())  # b stays alive and unchanged for the whole call (the caller's column)
        S = w["S"]
        init = torch.zeros(_SB, dtype=torch.float64)
        init[_B_MAXIT], init[_B_RTOL], init[_B_ATOL] = float(maxiter), rtol, atol
        init[_B_EPS] = float(torch.finfo(self.dtype).eps)
        S.copy_(init, non_blocking=False)
        self._k["bicg_init"]((self.grids["bicg_init"], 1), BLOCK, (self.n, b.data_ptr(), x.data_ptr(), w["r"].data_ptr(),
                                                         w["p"].data_ptr(), S.data_ptr(), w["partial"].data_ptr(),
                                                         w["ticket"].data_ptr()), device=self.dev)
        run = self._block_runner(w, every, graph)
        host, events = self._host, self._events
        history: list[float] = []
        stream = torch.cuda.current_stream(self.device)

        def queue(slot: int) -> None:
            run()
            host[slot].copy_(S, non_blocking=True)
            events[slot].record(stream)

        host[0].copy_(S, non_blocking=True)
        events[0].record(stream)
        events[0].synchronize()
        s = host[0].tolist()
        rr0 = s[_B_RR0]
        blocks = -(-maxiter // every) + 1
        if s[_B_DONE] == 0.0:
            queue(0)
            if blocks > 1:
                queue(1)
            slot, queued = 0, min(2, blocks)
            while True:
                events[slot].synchronize()
                s = host[slot].tolist()
                rel = math.sqrt(max(s[_B_RR], 0.0) / rr0) if rr0 > 0 else 0.0
                history.append(rel)
                if callback is not None:
                    callback(int(s[_B_ITERS]), rel)
                if s[_B_DONE] != 0.0 or queued >= blocks:
                    break
                queue(slot)
                queued += 1
                slot = 1 - slot
            stream.synchronize()  # a block queued after the stop has run (no-ops)
        if self._work is None:
            w.clear()
        return x, self._result_b(s, rr0, history)

    def _result_b(self, s: list[float], rr0: float, history: list[float]) -> IterationResult:
        it = int(s[_B_ITERS])
        rel = math.sqrt(max(s[_B_RR], 0.0) / rr0) if rr0 > 0 else 0.0
        done = int(s[_B_DONE])
        h = tuple(history)
        if rr0 == 0.0:
            return IterationResult(0, 0.0, True, Status.CONVERGED, "", h)
        if done == 1:
            return IterationResult(it, rel, True, Status.CONVERGED, "", h)
        if done == 3:
            return IterationResult(it, rel, False, Status.NOT_FINITE,
                                   f"cuda/bicgstab: NaN or Inf appeared by iteration {it + 1} (in A, b, or from overflow)", h)
        if done == 6:
            return IterationResult(it, rel, False, Status.BREAKDOWN,
                                   f"BiCGStab broke down at iteration {it}: |rho| = |rh^T r| = {s[_B_VAL]:.1e} is zero "
                                   f"relative to the norms (the residual became orthogonal to the shadow residual rh = b); "
                                   f"use gmres", h)
        if done == 7:
            return IterationResult(it, rel, False, Status.BREAKDOWN,
                                   f"BiCGStab broke down at iteration {it + 1}: |rh^T A M^-1 p| = {s[_B_VAL]:.1e} is zero "
                                   f"relative to the norms, so alpha is undefined; use gmres", h)
        if done == 8:
            return IterationResult(it, rel, False, Status.BREAKDOWN,
                                   f"BiCGStab broke down at iteration {it}: omega = t^T s / t^T t = {s[_B_VAL]:.1e} (the "
                                   f"stabilising step made no progress, typical of a matrix with a strongly imaginary "
                                   f"spectrum); use gmres", h)
        return IterationResult(it, rel, False, Status.MAX_ITERATIONS,
                               f"cuda/bicgstab reached maxiter ({it}) with relative residual {rel:.2e} above the "
                               f"tolerance: raise maxiter, or use a preconditioner", h)
