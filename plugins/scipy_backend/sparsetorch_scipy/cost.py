"""Cost model of the scipy backend: seconds and peak bytes from the machine's calibrated rates.

Every estimate is ``bytes / bandwidth + flops / flop_rate + launches * launch`` with
``sparsetorch.backend.rates("cpu")`` (docs/backend-authors.md, "Cost estimates").
The constants below were fit by measurement on 2-D and 3-D Poisson (``benchmarks/crossover.py``;
the table is in the README), so that auto-dispatch ranks SuperLU, AMG-preconditioned CG, plain
CG and PyAMG as they rank on the clock.

**Sparsity "dimension".** Fill-in of a sparse LU and Krylov iteration counts depend on how the
graph of A grows: like a 2-D grid (fill ~ n^1.2 with minimum degree, LU flops ~ n^1.6, CG
iterations ~ n^(1/2)) or a 3-D one (fill ~ n^1.55, flops ~ n^2.3, iterations ~ n^(1/3)). A
request carries no pattern, only ``nse`` and ``n``; grid stencils have about ``2 d`` neighbours
per row, so ``d = (nse / n - 1) / 2`` clamped to [1, 3] (5-point: 2.0, 7-point: 2.9). Rows with
many entries (FEM, 9-/27-point stencils) read as 3-D, which overestimates LU for 2-D problems:
``backend_options={"dimension": 2}`` says otherwise. Between integer dimensions the models are
interpolated in log space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


from sparsetorch import Request
from sparsetorch.backend import Rates, batch_size, index_size, itemsize
from sparsetorch.backend import fill_dimension, lu_fill_flops, sparsity_dimension as dimension

__all__ = [
    "dimension", "fill_dimension", "lu_estimate", "LUEstimate", "krylov_cost", "amg_solver_cost", "spmm_cost", "spmv_seconds",
    "conversion_seconds", "krylov_iterations", "amg_iterations", "amg_levels", "lstsq_cost", "arpack_cost", "lobpcg_cost",
]

# --- SuperLU -------------------------------------------------------------------------------------
#: The fill and flop tables (nnz(L + U) and multiply-adds by fill dimension, COLAMD factors) are the
#: core's, shared with every backend: :func:`sparsetorch.backend.lu_fill_flops`.
#: SuperLU's (single-threaded, supernodal) speed relative to the calibrated dense GEMM rate.
LU_FLOP_EFFICIENCY = 0.7
#: Memory traffic per stored factor entry (allocation, ordering, supernode bookkeeping), bytes.
LU_BYTES_PER_ENTRY = 320
#: Fixed cost of one splu call with its checks, in launch units.
LU_CALL_LAUNCHES = 30

# --- streaming kernels ----------------------------------------------------------------------------
#: SciPy's CSR kernel and NumPy's vector expressions read memory about this many times faster
#: than the bandwidth the default rates assume (5 GB/s, a copy): measured 23.5 GB/s effective for
#: products with A (n = 4k..262k) on the benchmark machine. Applied to the bytes of every
#: streaming kernel below (products, vector updates), not to SuperLU.
STREAM_FACTOR = 4.7

# --- Krylov ----------------------------------------------------------------------------------------
#: Products with A relative to CG's iteration count on the same problem (SPD Poisson; on
#: convection-diffusion all need ~2.5x CG's count, in the same order).
_PRODUCTS = {"cg": 1.0, "minres": 1.05, "bicgstab": 1.5, "gmres": 1.3, "lgmres": 1.4, "gcrotmk": 1.3, "tfqmr": 1.5}
#: Products with A per SciPy iteration (what ``maxiter`` and the reported iterations count);
#: LGMRES does ``inner_m`` (= restart) per outer iteration, GCROT(m, k) about ``m`` (= restart).
PRODUCTS_PER_ITERATION = {"bicgstab": 2.0}
#: Vector traffic per product with A, in units of n * itemsize (SciPy's NumPy expressions with
#: their temporaries), measured: CG 17, MINRES 37, TFQMR 28 (its residual watch included),
#: BiCGStab 33 per iteration (2 products); GMRES/LGMRES: modified Gram-Schmidt against half the
#: basis on average, ~3.5 passes per basis vector.
_VECTOR_PASSES = {"cg": 17.0, "minres": 37.0, "bicgstab": 16.5, "tfqmr": 28.0}
#: Work vectors held, in units of n * itemsize.
_WORK = {"cg": 5, "minres": 9, "bicgstab": 9, "tfqmr": 10}
#: Fixed cost of a solve call on top of its iterations (plan wrappers, the true-residual check),
#: launch units.
KRYLOV_CALL_LAUNCHES = 40

# --- AMG ------------------------------------------------------------------------------------------
#: Setup and one V-cycle in units of one product with A (smoothed aggregation, symmetric
#: Gauss-Seidel smoothing), plus a Python overhead per level (launch units). Fit on 2-D/3-D
#: Poisson n = 4k..262k: setup 350-590 products (+-30 %), a cycle 35-60 products.
AMG_SETUP_PRODUCTS, AMG_SETUP_LEVEL_LAUNCHES = 450, 300
AMG_CYCLE_PRODUCTS, AMG_CYCLE_LEVEL_LAUNCHES = 38, 12
#: Operator complexity (stored entries of all levels / nnz(A)): 1.35 in 2-D, 1.55 in 3-D.
AMG_COMPLEXITY = 1.5


@dataclass(frozen=True)
class LUEstimate:
    fill: float  # stored factor entries, nnz(L + U), per matrix
    flops: float  # per factorization
    seconds: float  # factorizations (whole value batch) + solves for the request's columns
    bytes: int  # peak extra memory
    factor: float = 0.0  # the factorizations' part of seconds (paid once per set of values)


def lu_estimate(r: Rates, request: Request) -> LUEstimate:
    """SuperLU: ordering + factorization per value-batch member, then the triangular solves."""
    A = request.A
    n = A.shape[-1]
    # the plan uses COLAMD unless the pattern is symmetric with its diagonal stored
    symmetric_ordering = bool({"symmetric", "hermitian", "spd"} & request.properties) and "zero_diagonal" not in request.properties
    fill, flops = lu_fill_flops(request, symmetric_ordering=symmetric_ordering)
    vsize = itemsize(A.dtype)
    if A.dtype.is_complex:
        flops *= 4.0
    batch = batch_size(request)
    k = request.rhs_columns  # columns over the whole value batch
    factor = (flops / (r.flops * LU_FLOP_EFFICIENCY)
              + r.seconds(bytes=LU_BYTES_PER_ENTRY * fill * vsize / 8, launches=LU_CALL_LAUNCHES))
    solve = r.seconds(bytes=2 * fill * (vsize + 4) * k + 2 * n * vsize * k, flops=4 * fill * k, launches=4 * batch)
    seconds = batch * factor + solve + _conversion(r, request)
    # The factors (values + int32 indices), int32 copies of A's indices, the solution.
    peak = batch * fill * (vsize + 4) + (A.nse or 0) * 4 + n * vsize * k
    return LUEstimate(fill, flops, seconds, int(peak), min(batch * factor, seconds))


# --- products ------------------------------------------------------------------------------------
def spmv_seconds(r: Rates, request: Request, k: int = 1) -> float:
    """One product with A (k columns) by SciPy's kernel: A's buffers once, X read and Y written."""
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    nse = A.nse or 0
    vsize, isize = itemsize(A.dtype), index_size(request)
    traffic = nse * (vsize + isize) + (m + 1) * isize + (n + m) * k * vsize
    flops = (8 if A.dtype.is_complex else 2) * nse * k
    return r.seconds(bytes=traffic / STREAM_FACTOR, flops=flops, launches=1)


def _stream(r: Rates, nbytes: float, launches: float = 0.0) -> float:
    return r.seconds(bytes=nbytes / STREAM_FACTOR, launches=launches)


def conversion_seconds(r: Rates, nse: int) -> float:
    """Converting a pattern to CSR (the core's conversion map, as the torch backend costs it)."""
    return r.seconds(bytes=20 * 8 * nse, launches=40)


def _conversion(r: Rates, request: Request) -> float:
    from sparsetorch.format import CSC, CSR

    fmt = request.A.format
    if fmt is None or fmt == CSR or fmt == CSC:
        return 0.0
    return conversion_seconds(r, request.A.nse or 0)


#: SciPy's csr_matvecs against torch's CPU kernel with k = 8..64 columns: 1.06-2.81x the time,
#: median 1.36 (9 cases, one thread; one case 0.27x, where torch's kernel falls off a cliff at
#: k = 64 on a 5-point stencil); k = 1: 0.58-0.72x (benchmarks/results/spmm_columns.json)
MULTI_COLUMN_FACTOR = 1.35


def spmm_cost(r: Rates, request: Request) -> tuple[float, int]:
    """``A @ X`` for ``matmul``: one SciPy product per value-batch member.

    Counted like the torch backend's product (A once, X gathered once per stored entry and
    column, Y written; docs/dispatch.md) so the two compare like for like, plus SciPy's call
    overhead: the estimates agree within 1 % for large products, and the tie-break (lower peak
    bytes) picks this plan, which allocates only Y. Measured on the benchmark machine (2 busy
    cores): SciPy's single-threaded kernel took 0.55-1.4x the time of torch's two-threaded one for
    n = 16k..262k, k = 1 and 8, torch varying most from run to run. Several columns are charged
    ``MULTI_COLUMN_FACTOR`` more (measured with one thread each, below)."""
    A = request.A
    batch = batch_size(request)
    k = max(1, request.rhs_columns // batch)
    m = A.shape[-2]
    nse = A.nse or 0
    vsize, isize = itemsize(A.dtype), index_size(request)
    traffic = nse * (vsize + isize) + (m + 1) * isize + nse * k * vsize + m * k * vsize
    flops = (8 if A.dtype.is_complex else 2) * nse * k
    per = r.seconds(bytes=traffic, flops=flops, launches=3)
    if k > 1:
        per *= MULTI_COLUMN_FACTOR
    return batch * per + _conversion(r, request), int(m * k * batch * vsize)


# --- iteration counts -------------------------------------------------------------------------------
def krylov_iterations(request: Request, d: float) -> float:
    """Unpreconditioned (or Jacobi) CG iterations on a 2nd-order PDE matrix of dimension d:
    the condition number grows like n^(2/d), so CG needs ~ c n^(1/d) ln(2/rtol) + 10, c = 0.11
    (measured at rtol 1e-6: 101/204/411/829 on 2-D 64²..512², 33/49/64/96 on 3-D 16³..48³;
    the formula gives 112/223/444/877 and 36/48/61/87)."""
    n = max(1, request.A.shape[-1])
    rtol = max(float(request.option("rtol") or 1e-6), 1e-16)
    return 0.11 * n ** (1.0 / max(d, 2.0)) * math.log(2.0 / rtol) + 10


def amg_iterations(request: Request, accelerated: bool) -> float:
    """AMG convergence is nearly independent of n: CG with one V-cycle per iteration needs
    ~0.45 ln(2/rtol) + 1.5 iterations (8 at rtol 1e-6; measured 5-9 on Poisson 2-D/3-D), plain
    cycles ~0.85 ln(2/rtol) + 1 (13; measured 8-16)."""
    rtol = max(float(request.option("rtol") or 1e-6), 1e-16)
    return (0.45 * math.log(2.0 / rtol) + 1.5) if accelerated else (0.85 * math.log(2.0 / rtol) + 1)


def amg_levels(n: int, d: float) -> int:
    """Levels of a smoothed-aggregation hierarchy down to PyAMG's coarse size (10): each level
    is ~4.5x smaller in 2-D, ~9x in 3-D (measured 4/6/6 levels on 2-D 64²/256²/512², 4 on 3-D)."""
    coarsening = 4.5 * 2.0 ** (min(max(d, 2.0), 3.0) - 2.0)
    return max(1, math.ceil(math.log(max(n, 20) / 10.0) / math.log(coarsening)))


def _amg_setup_seconds(r: Rates, request: Request, d: float) -> float:
    n = request.A.shape[-1]
    return AMG_SETUP_PRODUCTS * spmv_seconds(r, request) + amg_levels(n, d) * r.seconds(launches=AMG_SETUP_LEVEL_LAUNCHES)


def _amg_cycle_seconds(r: Rates, request: Request, d: float) -> float:
    n = request.A.shape[-1]
    return AMG_CYCLE_PRODUCTS * spmv_seconds(r, request) + amg_levels(n, d) * r.seconds(launches=AMG_CYCLE_LEVEL_LAUNCHES)


def _amg_bytes(request: Request) -> int:
    A = request.A
    nse, n = A.nse or 0, A.shape[-1]
    vsize = itemsize(A.dtype)
    return int((AMG_COMPLEXITY * nse * (vsize + 4) + 3 * n * vsize) + nse * 4)  # levels, P/R, vectors, int32 copy


# --- Krylov ------------------------------------------------------------------------------------------
def krylov_cost(r: Rates, request: Request, method: str, preconditioner: str | None, restart: int) -> tuple[float, int, int]:
    """(seconds, peak bytes, estimated iterations in SciPy's units) of one SciPy solve per
    (value-batch member, column), with the preconditioner's setup per member."""
    A = request.A
    n, nse = A.shape[-1], A.nse or 0
    vsize = itemsize(A.dtype)
    d = dimension(request)
    batch = batch_size(request)
    systems = request.rhs_columns  # every (member, column) pair is one SciPy solve
    if preconditioner == "amg":
        products = amg_iterations(request, accelerated=True) * _PRODUCTS[method]
    else:
        products = krylov_iterations(request, d) * _PRODUCTS[method]
        if preconditioner == "ilu":
            products = max(3.0, 0.25 * products)
    per_iteration = restart if method in ("lgmres", "gcrotmk") else PRODUCTS_PER_ITERATION.get(method, 1.0)
    maxiter = request.option("maxiter")
    if maxiter is not None:
        products = min(products, maxiter * (restart if method == "gmres" else per_iteration))
    products = max(1.0, products)
    vec = n * vsize
    if method in ("gmres", "lgmres", "gcrotmk"):
        # Gram-Schmidt against half the basis (~3.5 passes per vector); GCROT also against its
        # k = m recycled vectors
        passes = 3.5 * min(restart, products) + 5 + (2.0 * restart if method == "gcrotmk" else 0.0)
    else:
        passes = _VECTOR_PASSES[method]
    per = spmv_seconds(r, request) + _stream(r, passes * vec)
    setup = 0.0
    # GCROT(m, k) keeps k = m recycled (c, u) pairs beside its m + 1 Arnoldi vectors
    basis = {"gmres": restart + 4, "lgmres": restart + 4, "gcrotmk": 3 * restart + 4}
    peak = basis.get(method, _WORK.get(method, 5)) * vec
    if preconditioner == "jacobi":
        per += _stream(r, 4.5 * vec)
        setup = batch * _stream(r, nse * (vsize + 8), launches=4)
        peak += 2 * vec
    elif preconditioner == "amg":
        per += _amg_cycle_seconds(r, request, d)
        setup = batch * _amg_setup_seconds(r, request, d)
        peak += _amg_bytes(request) * batch
    elif preconditioner == "ilu":
        lu = lu_estimate(r, request)
        ilu_fill = min(lu.fill, 10.0 * nse)  # spilu's default fill_factor=10
        setup = lu.seconds * (ilu_fill / lu.fill) ** 1.5
        per += _stream(r, 2 * ilu_fill * (vsize + 4), launches=2)
        peak += int(batch * ilu_fill * (vsize + 4))
    elif preconditioner == "user":
        per += _stream(r, 3 * vec, launches=10)
    call = spmv_seconds(r, request) + r.seconds(launches=KRYLOV_CALL_LAUNCHES)  # wrappers, true residual
    seconds = setup + systems * (products * per + call) + _conversion(r, request)
    return seconds, int(peak), int(math.ceil(products / per_iteration))


def lstsq_cost(r: Rates, request: Request, method: str) -> tuple[float, int, int]:
    """LSQR/LSMR: per iteration one product with A and one with A^H, plus the vector updates
    (LSQR ~ 3 passes over n and 2 over m, LSMR ~ 5 over n and 2 over m); iterations as CG on the
    normal equations of a d-dimensional operator, capped by ``maxiter`` (default 4n + 20)."""
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    vsize = itemsize(A.dtype)
    d = dimension(request)
    its = 2.0 * krylov_iterations(request, d)
    its = max(1.0, min(its, request.option("maxiter") or 4 * n + 20))
    passes = (3 if method == "lsqr" else 5) * n + 2 * m
    per = 2 * spmv_seconds(r, request) + _stream(r, passes * vsize)
    call = r.seconds(launches=KRYLOV_CALL_LAUNCHES)
    seconds = request.rhs_columns * (its * per + call) + _conversion(r, request)
    peak = ((5 if method == "lsqr" else 7) * n + 2 * m) * vsize + (A.nse or 0) * (vsize if A.dtype.is_complex else 0)
    return seconds, int(peak), int(math.ceil(its))


#: ARPACK (ncv = max(2k + 1, 20)) regular-mode products for k = 4, measured: smallest end
#: (which "SA") 140 / 293 / 625 / 1566 on the 2-D Laplacian n = 100..6400, 505 / 2678 / 22765 on
#: the 1-D one n = 100..1000, 126,604 on 494_bus (SPD, condition 2.4e6); largest end 139 / 260 /
#: 532 / 1175 on the 2-D Laplacian. Fit: ``SMALL_END_COEF * kappa^SMALL_END_EXP`` at the small
#: end, ``LARGE_END_COEF * sqrt(kappa)`` at the large one, with kappa the spread of the spectrum
#: a request does not carry, estimated as a PDE operator's ``0.4 n^(2/d)`` (d: sparsity dimension).
SMALL_END_COEF, SMALL_END_EXP = 12.0, 0.63
LARGE_END_COEF = 20.0
#: Python round trips per ARPACK product (reverse communication through a LinearOperator),
#: launch units: 24 us per product measured on 494_bus against ~8 us of kernel and Gram-Schmidt.
ARPACK_PRODUCT_LAUNCHES = 3
#: SciPy LOBPCG's Python overhead per iteration, launch units (1.8 ms per iteration measured at
#: n = 494, k = 4, most of it Rayleigh-Ritz bookkeeping).
LOBPCG_ITERATION_LAUNCHES = 300


def condition_estimate(request: Request) -> float:
    """The spread of the spectrum (``lambda_max / gap`` at the wanted end) when nothing else is
    known: a second-order PDE operator's ``0.4 n^(2/d)`` (2-D Laplacians n = 100..1600 have
    48..680; d from the pattern's entries per row, 494_bus reads as 1-D)."""
    n = max(2, request.A.shape[-1])
    return max(4.0, 0.4 * n ** (2.0 / dimension(request)))


def arpack_products(request: Request, ncv: int, which: str) -> float:
    """Products ARPACK's regular mode needs: the small end of the spectrum converges like
    ``kappa^0.63`` (restarted Lanczos with a small basis; measured), the large end like
    ``sqrt(kappa)``; capped by ARPACK's maxiter (restarts of about ncv / 2 products)."""
    kappa = condition_estimate(request)
    small = which in ("SA", "SM")
    products = SMALL_END_COEF * kappa ** SMALL_END_EXP if small else LARGE_END_COEF * math.sqrt(kappa)
    n = request.A.shape[-1]
    maxiter = request.option("maxiter") or 10 * n
    return max(2.0 * ncv, min(products, float(maxiter) * ncv / 2))


def arpack_cost(r: Rates, request: Request, k: int, shift_invert: bool) -> tuple[float, int, str]:
    """ARPACK (implicitly restarted Lanczos/Arnoldi), ``ncv = max(2k + 1, 20)`` basis vectors:
    regular mode :func:`arpack_products` products with Gram-Schmidt against the basis;
    shift-invert one SuperLU factorization and ~3 restarts of solves.

    ``eigsh`` with ``which="SA"`` on a symmetric matrix not known to be SPD: the plan first
    factors A with diagonal pivots (an LU whose pivot signs are A's inertia); if they are all
    positive, A is SPD and that factorization runs shift-invert at 0 (494_bus: converged at
    once). Priced as that probe plus shift-invert: when the probe fails, the regular mode that
    follows is bounded by the core's fallback budget."""
    A = request.A
    n = A.shape[-1]
    vsize = itemsize(A.dtype) * (1 if request.op == "eigsh" or A.dtype.is_complex else 2)
    ncv = min(n, max(2 * k + 1, 20))
    batch = batch_size(request)
    gs = _stream(r, 2.0 * ncv * n * vsize)
    which = request.option("which") or ("LA" if request.op == "eigsh" else "LM")
    probe = (not shift_invert and request.op == "eigsh" and which == "SA" and request.option("sigma") is None
             and bool({"symmetric", "hermitian"} & request.properties))
    if shift_invert or probe:
        lu = lu_estimate(r, request)
        per = r.seconds(bytes=2 * lu.fill * (vsize + 4), flops=4 * lu.fill) + gs
        products = 3 * ncv
        seconds = batch * (lu.seconds + products * per)
        peak = lu.bytes + ncv * n * vsize
        what = ("ARPACK shift-invert at 0 if A's pivots prove it SPD (else regular mode)" if probe
                else "ARPACK shift-invert (SuperLU)")
        return seconds, int(peak), f"{what}: ~{products} solves estimated, ncv={ncv}"
    products = arpack_products(request, ncv, which)
    per = spmv_seconds(r, request) + gs + r.seconds(launches=ARPACK_PRODUCT_LAUNCHES)
    seconds = batch * products * per
    return seconds, int(ncv * n * vsize), (f"ARPACK: ~{int(products)} products estimated (kappa ~ "
                                           f"{condition_estimate(request):.3g}), ncv={ncv}")


def lobpcg_cost(r: Rates, request: Request, k: int) -> tuple[float, int, str]:
    """LOBPCG: ``0.5 sqrt(kappa) ln(2 / tol)`` block iterations (block CG-like), capped by the
    plan's maxiter (500 by default: an estimate above it is an attempt that will stop short), each
    a block of k products, a 3k x 3k Rayleigh-Ritz (dense work ~ 30 n k^2) and Python bookkeeping."""
    from .spectral import LOBPCG_MAXITER

    A = request.A
    n = A.shape[-1]
    vsize = itemsize(A.dtype)
    cap = int(request.option("maxiter") or LOBPCG_MAXITER)
    its = min(cap, int(0.5 * math.sqrt(condition_estimate(request)) * 25) + 20)
    per = k * spmv_seconds(r, request) + r.seconds(bytes=12 * n * k * vsize, flops=30.0 * n * k * k,
                                                   launches=LOBPCG_ITERATION_LAUNCHES)
    return batch_size(request) * its * per, int(12 * n * k * vsize), f"LOBPCG: ~{its} block iterations estimated"


def amg_solver_cost(r: Rates, request: Request) -> tuple[float, int, int]:
    """PyAMG V-cycles as the solver: setup per member, cycles per column (each cycle also
    computes the residual and checks the correction's curvature: two products)."""
    A = request.A
    d = dimension(request)
    batch = batch_size(request)
    its = amg_iterations(request, accelerated=False)
    maxiter = request.option("maxiter")
    if maxiter is not None:
        its = min(its, maxiter)
    its = max(1.0, its)
    vec = A.shape[-1] * itemsize(A.dtype)
    per = _amg_cycle_seconds(r, request, d) + 2 * spmv_seconds(r, request) + _stream(r, 8 * vec, launches=2)
    call = r.seconds(launches=KRYLOV_CALL_LAUNCHES)
    seconds = batch * _amg_setup_seconds(r, request, d) + request.rhs_columns * (its * per + call) + _conversion(r, request)
    return seconds, _amg_bytes(request) * batch, int(math.ceil(its))
