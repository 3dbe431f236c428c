"""Cost and memory model of the cudss backend (metadata only: shapes, nse, dtype, properties).

cuDSS runs three phases with very different costs, and plan reuse decides which ones a call pays:

- analysis (reordering + symbolic factorization, mostly on the host): once per pattern.
  ``ANALYSIS_SECONDS_1M`` measured for a 1M-unknown 2-D Poisson matrix (nse 5M), scaled like
  ``nse^1.1``;
- numeric factorization: flops of a nested-dissection Cholesky, ``c n^a`` per sparsity dimension
  (2-D ~ n^1.5, 3-D ~ n^2; LU twice that), over the device's calibrated flop rate times
  ``FLOP_EFFICIENCY``, plus reading and writing the factors;
- solves: the factors read twice per right-hand side, plus a latency floor
  (``SOLVE_SECONDS_1M`` measured, the triangular solves are level-scheduled).

Factor entries (``nnz(L)``; LU stores L and U) follow nested-dissection fill, ``c n^a`` per
dimension fitted to ``1.7 n log2 n`` (2-D) and ``3 n^(4/3)`` (3-D), interpolated with the
sparsity dimension from nonzeros per row (:func:`sparsetorch.dispatch.helpers.sparsity_dimension`).
The first call's cost (analysis included) is what the offer reports; the notes give the cost of a
call that re-uses the plan (refactorization + solve), which is what a training loop pays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sparsetorch import Request
from sparsetorch.dispatch.calibrate import Rates
from sparsetorch.dispatch.helpers import loglog_interp, sparsity_dimension

__all__ = ["Estimate", "estimate", "factor_entries", "free_device_bytes"]

#: nnz(L) ~ c n^a per sparsity dimension (nested dissection).
_FILL = {1: (2.0, 1.0), 2: (10.6, 1.083), 3: (3.0, 1.333)}
#: Cholesky multiply-adds ~ c n^a per dimension (nested dissection: 2-D n^1.5, 3-D n^2).
_FLOPS = {1: (10.0, 1.0), 2: (30.0, 1.5), 3: (2.0, 2.0)}
#: factorization work relative to Cholesky: LU factors L and U; LDL^T pivots (diagonal / 2x2 blocks)
_METHOD_FLOPS = {"cholesky": 1.0, "ldlt": 1.2, "lu": 2.0}
#: Measured on the H200 (2026-11-29, cuDSS 0.8 through nvmath-python): 1M-unknown 2-D Poisson.
ANALYSIS_SECONDS_1M = 5.5
SOLVE_SECONDS_1M = 3.3e-3
#: cuDSS's sustained share of the calibrated dense flop rate on supernodal factorizations
FLOP_EFFICIENCY = 0.05
#: fixed host work of one cuDSS phase call (stream set, execute, info read), in launch units
CALL_LAUNCHES = 40
#: cuDSS working memory beyond the factors (update buffers, permutations), as a factor of them
WORKSPACE_FACTOR = 0.5
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


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


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


def estimate(r: Rates, request: Request, method: str, *, free: int | None = None, hybrid: bool | None = None) -> Estimate:
    A = request.A
    n = int(A.shape[-1])
    nse = int(A.nse or n)
    d = sparsity_dimension(request)
    batch = max(1, math.prod(A.batch_shape))
    vsize = _itemsize(A.dtype)
    isz = 4 if nse < 2**31 - 1 else 8
    fill = factor_entries(n, nse, d, method)
    flops = loglog_interp(_FLOPS, d, n) * _METHOD_FLOPS[method] * (4.0 if A.dtype.is_complex else 1.0)
    device_bytes = int(batch * fill * (vsize + isz) * (1 + WORKSPACE_FACTOR) + batch * nse * vsize + 2 * nse * isz)
    fits = free is None or device_bytes <= 0.8 * free
    if hybrid is None:
        hybrid = not fits
    k = max(1, request.rhs_columns)
    analysis = ANALYSIS_SECONDS_1M * (nse / 5.0e6) ** 1.1 + r.seconds(launches=CALL_LAUNCHES)
    factor = batch * (flops / (r.flops * FLOP_EFFICIENCY) + r.seconds(bytes=3 * fill * vsize)) + r.seconds(launches=CALL_LAUNCHES)
    solve = (SOLVE_SECONDS_1M * (n / 1.0e6) ** 0.7 * max(1.0, k / 16) + r.seconds(bytes=2 * fill * (vsize + isz) * k)
             + r.seconds(launches=CALL_LAUNCHES))
    if hybrid:
        factor *= HYBRID_SLOWDOWN
        solve *= HYBRID_SLOWDOWN
        device_bytes = int(min(device_bytes, 0.5 * free)) if free else device_bytes
    return Estimate(fill, analysis, factor, solve, device_bytes, bool(hybrid), fits)
