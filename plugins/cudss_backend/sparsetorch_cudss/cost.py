"""Cost and memory model of the cudss backend (metadata only: shapes, nse, dtype, properties).

cuDSS runs three phases with very different costs, and plan reuse decides which ones a call pays.
All three are fitted to the H200 measurements of 2026-11-29 (cuDSS 0.8 and 1.0, float64 Poisson,
Cholesky; benchmarks/results/cudss_h200_cudss08.json), as ``c n^a`` per sparsity dimension and
interpolated in log space with the dimension estimated from nonzeros per row
(:func:`sparsetorch.backend.sparsity_dimension`):

- analysis (reordering + symbolic factorization, mostly on the host): once per pattern;
  2-D 6.1 s at 1M unknowns, 32 s at 4M; 3-D 15.8 s at 100³;
- numeric factorization: 2-D 24 ms at 1M, 96 ms at 4M; 3-D 0.42 s at 100³ (Cholesky; LU about
  twice, LDL^T 1.2x), scaled by the device's calibrated flop rate against the H200's;
- solves: a latency floor (the triangular solves are level-scheduled: 3.1 ms at 1M) plus the
  factors read twice per right-hand side over the calibrated bandwidth.

Factor entries (``LU_NNZ`` as cuDSS reports it) likewise: 2-D 3.6e7 at 1M, 1.66e8 at 4M; 3-D
9.2e8 at 100³. Peak device memory (cuDSS's own estimate, which it
reports after the analysis) fits ``1.08 fill + 60 n`` values.
The first call's cost (analysis included) is what the offer reports; the notes give the cost of a
call that re-uses the plan (refactorization + solve), which is what a training loop pays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsetorch import Request
from sparsetorch.backend import Rates, batch_size, itemsize, loglog_interp, sparsity_dimension

__all__ = ["Estimate", "estimate", "factor_entries", "free_device_bytes"]

#: factor entries ~ c n^a per sparsity dimension (measured: see the module docstring)
_FILL = {1: (3.0, 1.0), 2: (10.6, 1.083), 3: (9.2, 1.333)}
#: analysis seconds ~ c n^a (host-side reordering; measured on the H200's host)
_ANALYSIS = {1: (2.0e-7, 1.1), 2: (4.07e-7, 1.196), 3: (1.0e-6, 1.2)}
#: Cholesky factorization seconds on the H200 ~ c n^a (measured; scaled by flop rate elsewhere)
_FACTOR = {1: (2.0e-9, 1.0), 2: (2.4e-8, 1.0), 3: (4.2e-10, 1.5)}
#: the analysis with cuDSS's OpenMP threading layer loaded (16 host cores): 1.69 s instead of 6.1 s
#: at 1M unknowns (2-D), measured on the H200 machine (benchmarks/results/cudss_h200_threads.json)
THREADED_ANALYSIS_FACTOR = 0.28
#: the calibrated dense float64 rate of the H200 the factorization fits were taken with
REFERENCE_FLOPS = 5.0e13
#: factorization work relative to Cholesky: LU factors L and U; LDL^T pivots (diagonal / 2x2 blocks)
_METHOD_FLOPS = {"cholesky": 1.0, "ldlt": 1.2, "lu": 2.0}
#: solve latency floor at 1M unknowns (measured), growing like n^0.7 (4M: 10 ms measured)
SOLVE_SECONDS_1M = 3.1e-3
#: fixed host work of one cuDSS phase call (stream set, execute, info read), in launch units
CALL_LAUNCHES = 40
#: cuDSS's peak device memory (its MEMORY_ESTIMATES after the analysis, H200 runs) fits
#: ``1.08 fill val + 60 n val``: the factors' values, 8 %, and per-row structures/workspace
WORKSPACE_FACTOR = 0.08
ROW_BYTES_PER_VALUE = 60
#: a hybrid-mode factorization/solve streams the factors over PCIe/NVLink-C2C: slowdown factor
HYBRID_SLOWDOWN = 4.0


@dataclass(frozen=True)
class Estimate:
    fill: float  # stored factor entries per matrix (L, or L and U)
    analysis: float  # seconds, once per pattern
    factor: float  # seconds per value set (the whole value batch)
    solve: float  # seconds for the request's right-hand sides
    device_bytes: int  # factors + workspace on the device (whole value batch)
    hybrid: bool  # the plan runs in hybrid memory mode (asked for, or the factors would not fit)
    fits: bool  # the factors and workspace fit in 80 % of the free GPU memory (True when unknown)

    @property
    def first_call(self) -> float:
        return self.analysis + self.factor + self.solve

    @property
    def reuse_call(self) -> float:
        return self.factor + self.solve


def factor_entries(n: int, nse: int, d: float, method: str) -> float:
    fill = loglog_interp(_FILL, d, n) + n
    fill = max(fill, float(nse) / (1 if method == "lu" else 2))
    return 2 * fill - n if method == "lu" else fill


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (cudaMemGetInfo) plus what torch's caching allocator holds unused."""
    try:
        free, _total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(reserved, 0))
    except Exception:  # noqa: BLE001 - no CUDA (CPU-side tests): unknown
        return None


def estimate(r: Rates, request: Request, method: str, *, free: int | None = None, hybrid: bool | None = None,
             threaded: bool = False) -> Estimate:
    A = request.A
    n = int(A.shape[-1])
    nse = int(A.nse or n)
    d = sparsity_dimension(request)
    batch = batch_size(request)
    vsize = itemsize(A.dtype)
    isz = 4 if nse < 2**31 - 1 else 8
    fill = factor_entries(n, nse, d, method)
    work = _METHOD_FLOPS[method] * (4.0 if A.dtype.is_complex else 1.0) * (vsize / 8 if not A.dtype.is_complex else vsize / 16)
    device_bytes = int(batch * (fill * (1 + WORKSPACE_FACTOR) + ROW_BYTES_PER_VALUE * n) * vsize
                       + batch * nse * vsize + 2 * nse * isz)
    fits = free is None or device_bytes <= 0.8 * free
    if hybrid is None:
        hybrid = not fits
    k = max(1, request.rhs_columns)
    analysis = (loglog_interp(_ANALYSIS, d, n) * (THREADED_ANALYSIS_FACTOR if threaded else 1.0)
                + r.seconds(launches=CALL_LAUNCHES))
    factor = (batch * loglog_interp(_FACTOR, d, n) * work * (REFERENCE_FLOPS / r.flops)
              + r.seconds(launches=CALL_LAUNCHES))
    solve = (SOLVE_SECONDS_1M * (n / 1.0e6) ** 0.7 * max(1.0, k / 16) + r.seconds(bytes=2 * fill * vsize * k)
             + r.seconds(launches=CALL_LAUNCHES))
    if hybrid:
        factor *= HYBRID_SLOWDOWN
        solve *= HYBRID_SLOWDOWN
        device_bytes = int(min(device_bytes, 0.5 * free)) if free else device_bytes
    return Estimate(fill, analysis, factor, solve, device_bytes, bool(hybrid), fits)
