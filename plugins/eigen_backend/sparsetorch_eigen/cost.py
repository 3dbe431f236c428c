"""Cost model of the eigen backend: seconds and peak bytes from the machine's calibrated rates.

Every estimate is ``bytes / bandwidth + flops / flop_rate + launches * launch`` with
``sparsetorch.backend.rates("cpu")`` (docs/backend-authors.md, "Cost estimates"), so
it ranks against the other backends' estimates. Estimates count the **numeric phase and the
solves** of one call: the pattern analysis (ordering, symbolic factorization) runs once per
pattern and is reused by every later call with new values, which is this backend's point.

**Fill and flops.** The core's shared tables (:func:`sparsetorch.backend.lu_fill_flops`, as the
scipy backend): read at the fill dimension, from nonzeros per row ``d = (nse / n - 1) / 2`` clamped
to [1, 3] (5-point: 2, 7-point: 2.9; ``backend_options={"dimension": ...}`` overrides), raised
towards 4 ("dense-like": ~0.6 n^2 factor entries) for graphs the core measured to grow like
expanders (random graphs, Gset's G51); for an LU with a symmetric ordering
``nnz(L+U) ~ c n^alpha`` (2-D: 6.7 n^1.18, 3-D: 1.46 n^1.555) and flops ``~ c' n^beta`` (2-D: 7.3
n^1.6, 3-D: 0.26 n^2.4). Eigen's SparseLU with AMD on ``A^T + A`` (what a structurally symmetric
pattern gets here) measured the same fill within 3 % (2-D 64²: 148k, 3-D 16³: 595k, 24³: 3.77M);
COLAMD (unsymmetric patterns): 1.85x the fill, 2.5x the flops. SimplicialLLT/LDLT hold L only:
half the fill and half the flops.

**Speed** (fit on 2-D 64², 3-D 16³ and 24³ Poisson / convection-diffusion, this 2-core VM, one
thread, measured against the default rates' 2e10 flop/s and 5e9 B/s): SparseLU, built with
``-march=native`` (AVX-512 here), runs its flops at ~70 % of the GEMM rate plus ~200 bytes of
traffic per factor entry (3-D 24³: 0.29 s measured, 0.31 s estimated; 32³: 1.7 s, 1.9 s); the simplicial
Cholesky/LDL^T (no supernodes) at ~25 % plus ~100 bytes per
entry (2-D 64²: 1.4 ms measured, 1.9 ms estimated; 3-D 16³: 21 ms, 18 ms), degrading with the size
of L (``simplicial_efficiency``: 3-D 40³ took 26-31 s, ~3x its small-L rate). SparseQR was not fit:
R's fill is estimated at 3x the LU's and its work at 6x (an upper bound on Poisson-like
patterns), so QR ranks behind LU/Cholesky for square systems, as it should.

**Krylov.** Iterations as the scipy backend: CG with Jacobi ``0.11 n^(1/d) ln(2/rtol) + 10``,
BiCGSTAB 1.5x the products; IncompleteCholesky and IncompleteLUT cut them to ~40 % and ~30 %.
Per product: Eigen's CSR/CSC kernel (A's buffers once) plus about 10 vector passes over n for CG,
8 per product for BiCGSTAB, all in C++ (no per-iteration Python), at the streaming rate measured
for SciPy's kernels (4.7x the default bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


from sparsetorch import Request
from sparsetorch.backend import Rates, batch_size, index_size, itemsize
from sparsetorch.backend import lu_fill_flops, sparsity_dimension as dimension

__all__ = ["Estimate", "direct_estimate", "krylov_cost", "lscg_cost", "dimension", "fill_flops"]

#: flop efficiency (of the calibrated GEMM rate) and traffic per factor entry (bytes, float64)
_SPEED = {"lu": (0.7, 200.0), "cholesky": (0.25, 100.0), "ldlt": (0.25, 100.0), "qr": (0.3, 200.0)}
#: factor size and work relative to an LU with the same ordering
_SIZE = {"lu": (1.0, 1.0), "cholesky": (0.5, 0.5), "ldlt": (0.5, 0.5), "qr": (3.0, 6.0)}
_NAMES = {"cholesky": "SimplicialLLT", "ldlt": "SimplicialLDLT", "lu": "SparseLU", "qr": "SparseQR"}
#: fixed cost of one plan call (Python wrapper, C++ entry), launch units
CALL_LAUNCHES = 20
STREAM_FACTOR = 4.7
_PASSES = {"cg": 10.0, "bicgstab": 8.0, "lscg": 8.0}
_PRECOND_ITERS = {None: 1.0, "jacobi": 1.0, "ichol": 0.4, "ilu": 0.3}
_PRODUCTS = {"cg": 1.0, "bicgstab": 1.5}


@dataclass(frozen=True)
class Estimate:
    seconds: float
    bytes: int
    note: str
    factor: float = 0.0  # the numeric factorizations' part of seconds (paid once per set of values)


def fill_flops(request: Request, method: str) -> tuple[float, float]:
    """(stored factor entries, flops) of one factorization with ``method``."""
    A = request.A
    n = min(A.shape[-2], A.shape[-1])
    # The plan picks AMD for structurally symmetric patterns with a stored diagonal, which the
    # request does not show: COLAMD (the shared tables' factors) is the worst case, and what a
    # zero diagonal gets.
    symmetric_ordering = ((bool({"symmetric", "hermitian", "spd"} & request.properties)
                           and "zero_diagonal" not in request.properties) or method in ("cholesky", "ldlt"))
    fill, flops = lu_fill_flops(request, symmetric_ordering=symmetric_ordering)
    sf, sw = _SIZE[method]
    fill, flops = fill * sf, flops * sw
    if A.dtype.is_complex:
        flops *= 4.0
    if A.shape[-2] != A.shape[-1]:  # QR of a rectangular A: scale by the longer side
        fill *= max(A.shape[-2], A.shape[-1]) / max(1, n)
    return fill, flops


#: SimplicialLLT/LDLT work column by column without supernodes: fast while L is small, ~3x slower
#: per flop once L is hundreds of MB (3-D Poisson 40³: L 2.2e7 entries, 264 MB, 26-31 s per
#: factorization on a quiet machine, against 9 s at the small-L rate and SparseLU's 7.9 s on the
#: same matrix). The efficiency is log-interpolated from 25 % at 20 MB of factor (2-D 256²: 0.11 s
#: measured, 0.075 s estimated) to 8 % at 264 MB.
SIMPLICIAL_EFF = (0.25, 0.08)
SIMPLICIAL_BYTES = (2e7, 2.64e8)


def simplicial_efficiency(factor_bytes: float) -> float:
    """Flop efficiency of SimplicialLLT/LDLT for a factor of ``factor_bytes``."""
    lo, hi = SIMPLICIAL_BYTES
    fast, slow = SIMPLICIAL_EFF
    if factor_bytes <= lo:
        return fast
    if factor_bytes >= hi:
        return slow * (hi / factor_bytes) ** 0.25  # beyond the measurement: keep degrading, gently
    w = math.log(factor_bytes / lo) / math.log(hi / lo)
    return math.exp((1 - w) * math.log(fast) + w * math.log(slow))


def direct_estimate(r: Rates, request: Request, method: str, op: str) -> Estimate:
    """Numeric factorization per value-batch member + the solves for the request's columns."""
    A = request.A
    fill, flops = fill_flops(request, method)
    vsize = itemsize(A.dtype)
    eff, per_entry = _SPEED[method]
    if method in ("cholesky", "ldlt"):
        eff = simplicial_efficiency(fill * (vsize + 4))
    batch = batch_size(request)
    k = request.rhs_columns if op != "logdet" else 0
    factor = flops / (r.flops * eff) + r.seconds(bytes=per_entry * fill * vsize / 8, launches=CALL_LAUNCHES)
    rows = max(A.shape[-2], A.shape[-1])
    solve = r.seconds(bytes=2 * fill * (vsize + 4) * k + 2 * rows * vsize * k, flops=4 * fill * k, launches=2 * batch)
    seconds = batch * factor + solve + _conversion(r, request)
    peak = batch * fill * (vsize + 4) + (A.nse or 0) * 4 + rows * vsize * max(k, 1)
    what = {"solve": "solves", "logdet": "slogdet", "lstsq": "least squares"}[op]
    note = (f"{_NAMES[method]}: numeric factorization on the pattern analysed once (reused for new values), "
            f"~{fill / 1e6:.3g}M factor entries, ~{flops / 1e9:.3g} Gflop, then {what}")
    return Estimate(seconds, int(peak), note, min(batch * factor, seconds))


def _conversion(r: Rates, request: Request) -> float:
    from sparsetorch.format import CSC, CSR

    fmt = request.A.format
    if fmt is None or fmt == CSR or fmt == CSC:
        return 0.0
    return r.seconds(bytes=20 * 8 * (request.A.nse or 0), launches=40)


def _spmv(r: Rates, request: Request) -> float:
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    nse = A.nse or 0
    vsize, isize = itemsize(A.dtype), index_size(request)
    traffic = nse * (vsize + isize) + (m + 1) * isize + (n + m) * vsize
    return r.seconds(bytes=traffic / STREAM_FACTOR, flops=(8 if A.dtype.is_complex else 2) * nse)


def _iterations(request: Request, rtol: float) -> float:
    n = max(1, request.A.shape[-1])
    d = dimension(request)
    return 0.11 * n ** (1.0 / max(d, 2.0)) * math.log(2.0 / max(rtol, 1e-16)) + 10


def krylov_cost(r: Rates, request: Request, method: str, pre: str | None) -> tuple[float, int, int]:
    """(seconds, peak bytes, iterations) of CG/BiCGSTAB over every (member, column)."""
    A = request.A
    n, nse = A.shape[-1], A.nse or 0
    vsize = itemsize(A.dtype)
    rtol = float(request.option("rtol") or 1e-6)
    products = _iterations(request, rtol) * _PRODUCTS[method] * _PRECOND_ITERS[pre]
    per_it = 2.0 if method == "bicgstab" else 1.0
    maxiter = request.option("maxiter")
    if maxiter is not None:
        products = min(products, maxiter * per_it)
    products = max(1.0, products)
    per = _spmv(r, request) + r.seconds(bytes=_PASSES[method] * n * vsize / STREAM_FACTOR)
    setup = 0.0
    peak = 10 * n * vsize
    batch = batch_size(request)
    if pre == "jacobi":
        per += r.seconds(bytes=3 * n * vsize / STREAM_FACTOR)
        setup = batch * r.seconds(bytes=nse * (vsize + 8))
        peak += n * vsize
    elif pre in ("ichol", "ilu"):
        # An incomplete factorization with about nnz(A) (IC) / 10 nnz(A) (ILUT's fill factor 10,
        # dropping most) entries: a sorted copy of A and an elimination pass; a triangular
        # solve pair per product.
        fill = nse * (1.0 if pre == "ichol" else 3.0)
        setup = batch * r.seconds(bytes=60 * fill * vsize, launches=5)
        per += r.seconds(bytes=2 * fill * (vsize + 4) / STREAM_FACTOR)
        peak += int(batch * fill * (vsize + 4)) + nse * (vsize + 4)
    seconds = setup + request.rhs_columns * (products * per + r.seconds(launches=CALL_LAUNCHES)) + _conversion(r, request)
    return seconds, int(peak), int(math.ceil(products / per_it))


def lscg_cost(r: Rates, request: Request) -> tuple[float, int, int]:
    """Least-squares CG: two products (A and A^H) per iteration, ~CG's count on A^H A (squared
    condition number: 2x the iterations of CG on A, a rough guess)."""
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    vsize = itemsize(A.dtype)
    its = 2.0 * _iterations(request, float(request.option("atol") or 1e-6))
    maxiter = request.option("maxiter")
    if maxiter is not None:
        its = min(its, float(maxiter))
    its = max(1.0, its)
    per = 2 * _spmv(r, request) + r.seconds(bytes=_PASSES["lscg"] * (m + n) * vsize / STREAM_FACTOR)
    seconds = request.rhs_columns * (its * per + r.seconds(launches=CALL_LAUNCHES)) + _conversion(r, request)
    return seconds, int(6 * (m + n) * vsize), int(math.ceil(its))
