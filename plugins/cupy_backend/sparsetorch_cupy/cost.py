"""Cost model of the cupy backend: bytes, flops and launch units over ``rates(request.device)``.

- ``spmm``: cuSPARSE reads the values and indices once and ``X``, writes ``Y``: per value set
  ``nse (val + idx) + ptr + (m + n) k val`` bytes, ``2 nse k`` flops, and ``CALL_LAUNCHES``
  launch units of host work per call (pointer swaps and the cuSPARSE call; CuPy and torch build
  descriptors and query the workspace on every call, this backend once per plan). Formats
  this backend converts (COO, BSR, DIA, ELL, ...) add one gather of the values per call and the
  once-per-pattern conversion (``160 nse`` bytes, as the torch backend charges it).
- Krylov methods: per iteration the products plus the vector operations cupyx runs (it
  allocates a new vector for most of them: about ``3 n val`` bytes each) and one host
  synchronization (cupyx checks the residual norm on the host every iteration). Iterations: the
  CG bound for a condition number growing like ``n``, ``0.12 sqrt(n) ln(2 / rtol) + 10``, the
  torch backend's estimate, scaled per method, capped by ``maxiter``.
- ``qr``: cuSolverSp re-factors per right-hand side; ``QR_SECONDS_90K`` seconds measured for a
  90k-unknown 2-D Poisson system, scaled like nested-dissection fill (``n^1.5``).
- ``lanczos`` / ``lsmr``: products and orthogonalization against the Lanczos basis / two
  products and eight vector operations per LSMR iteration.
"""

from __future__ import annotations

import math


from sparsetorch import Request
from sparsetorch.backend import Rates, batch_size, index_size, itemsize

__all__ = ["spmm_cost", "krylov_cost", "iterations", "qr_cost", "lanczos_cost", "lsmr_cost", "native"]

#: Host work of one SpMV/SpMM call in launch units (setStream, two pointer swaps, cusparseSpMV).
CALL_LAUNCHES = 3
#: Measured on the H200 (2026-11-29): cuSolverSp QR, 2-D Poisson 300², one right-hand side.
QR_SECONDS_90K = 2.9
_ITER_FACTOR = {"cg": 1.0, "minres": 1.05, "gmres": 1.3, "cgs": 0.75}
_PRODUCTS = {"cg": 1, "minres": 1, "gmres": 1, "cgs": 2}
#: vector passes per iteration (cupyx's loops, read + write of fresh arrays), and small kernels
_VECTOR_OPS = {"cg": 10, "minres": 14, "gmres": 4, "cgs": 16}
_KERNELS = {"cg": 12, "minres": 20, "gmres": 6, "cgs": 18}
#: a host synchronization per iteration, in launch units
_SYNC = 2


def native(request: Request) -> bool:
    from sparsetorch.format import CSC, CSR

    fmt = request.A.format
    return fmt is not None and (fmt == CSR or fmt == CSC)


def _sizes(request: Request) -> tuple[int, int, int, int, int, int]:
    A = request.A
    m, n = int(A.shape[-2]), int(A.shape[-1])
    return m, n, int(A.nse or 0), itemsize(A.dtype), index_size(request), batch_size(request)


def _product(rates: Rates, request: Request, k: int) -> float:
    m, n, nse, vs, isz, batch = _sizes(request)
    traffic = nse * (vs + isz) + (m + 1) * isz + (m + n) * k * vs
    gather = 0 if native(request) else nse * (2 * vs + 8)
    return batch * rates.seconds(bytes=traffic + gather, flops=2 * nse * k, launches=CALL_LAUNCHES)


def spmm_cost(rates: Rates, request: Request) -> tuple[float, int]:
    """(seconds, peak extra bytes) of one product with the request's right-hand sides."""
    m, n, nse, vs, isz, batch = _sizes(request)
    k = max(1, request.rhs_columns // batch)
    seconds = _product(rates, request, k)
    peak = 0 if native(request) else nse * (vs + 2 * isz)
    if not native(request):
        seconds += rates.seconds(bytes=20 * 8 * nse, launches=40)
    return seconds, int(peak + m * k * vs * batch)


def iterations(method: str, n: int, rtol: float, maxiter: int | None, restart: int = 30) -> int:
    base = 0.12 * math.sqrt(max(n, 1)) * math.log(2.0 / max(rtol, 1e-16)) + 10
    est = int(math.ceil(base * _ITER_FACTOR[method]))
    cap = (maxiter * (restart if method == "gmres" else 1)) if maxiter is not None else 10 * max(n, 1)
    return max(1, min(est, cap))


def krylov_cost(rates: Rates, request: Request, method: str, preconditioner: str | None,
                restart: int = 30) -> tuple[float, int, int]:
    """(seconds, peak bytes, estimated iterations) for all right-hand sides."""
    m, n, nse, vs, isz, batch = _sizes(request)
    systems = max(1, request.rhs_columns)
    its = iterations(method, n, request.option("rtol") or 1e-6, request.option("maxiter"), restart)
    vec = n * vs
    ops = _VECTOR_OPS[method] + (restart + 4 if method == "gmres" else 0)
    per = _PRODUCTS[method] * _product(rates, request, 1) / batch
    per += rates.seconds(bytes=3 * vec * ops, launches=_KERNELS[method] + _SYNC)
    if method == "cg":
        per += rates.seconds(bytes=2 * 2 * vec, launches=4)  # the curvature check (two dots)
    if preconditioner == "jacobi":
        per += rates.seconds(bytes=3 * vec, launches=1)
    elif preconditioner == "ilu":
        # two triangular solves (cuSPARSE SpSM, analysis included: cupyx redoes it per call)
        per += rates.seconds(bytes=4 * nse * (vs + isz), launches=40)
    setup = rates.seconds(bytes=0 if native(request) else 20 * 8 * nse, launches=20)
    if preconditioner == "ilu":
        setup += rates.seconds(bytes=10 * nse * (vs + isz), launches=60) * batch
    work = {"cg": 6, "minres": 10, "gmres": restart + 6, "cgs": 10}[method]
    return setup + per * its * systems, int(work * vec), its


def qr_cost(rates: Rates, request: Request) -> tuple[float, int]:
    m, n, nse, vs, isz, batch = _sizes(request)
    per = QR_SECONDS_90K * (n / 9.0e4) ** 1.5
    systems = max(1, request.rhs_columns)
    fill = int(10 * nse * math.log2(max(n, 2)))  # factors of a 2-D-like pattern, rough
    return per * systems, fill * (vs + 4)


def lanczos_cost(rates: Rates, request: Request, k: int, ncv: int | None) -> tuple[float, int]:
    m, n, nse, vs, isz, batch = _sizes(request)
    ncv = ncv or max(2 * k + 1, 20)
    products = 10 * ncv
    per = _product(rates, request, 1) / batch + rates.seconds(bytes=3 * n * vs * ncv, launches=8)
    return batch * products * per, int(ncv * n * vs)


def lsmr_cost(rates: Rates, request: Request) -> tuple[float, int, int]:
    m, n, nse, vs, isz, batch = _sizes(request)
    systems = max(1, request.rhs_columns)
    maxiter = request.option("maxiter")
    its = int(min(maxiter or min(m, n), 0.5 * math.sqrt(max(m, n)) * math.log(1e8) + 20))
    per = 2 * _product(rates, request, 1) / batch + rates.seconds(bytes=8 * 3 * (m + n) * vs, launches=20)
    return per * its * systems, int(8 * (m + n) * vs), its
