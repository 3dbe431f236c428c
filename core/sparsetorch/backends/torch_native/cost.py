"""Cost model of the torch backend (documented in docs/dispatch.md).

Every estimate is ``bytes / bandwidth + flops / flop_rate + launches * launch_overhead`` with the
device's calibrated rates. Iterative methods multiply a per-iteration cost by an iteration
estimate: for an SPD matrix of ``n`` unknowns from a second-order PDE, CG needs about
``c * sqrt(n) * ln(2 / rtol)`` iterations (the condition number grows like ``n`` in 2-D); we use
``c = 0.12``, which matches 2-D Poisson (1000², rtol 1e-6: 1,650 measured, 1,750 estimated).
The estimate is rough by nature; it only has to rank methods, not predict wall time.
"""

from __future__ import annotations

import math

from ...dispatch.calibrate import Rates
from ...dispatch.records import Request
from ...format import CSR
from .spmm import TorchSpmmPlan

__all__ = ["spmm_seconds", "per_call_seconds", "iterations", "krylov_cost", "dense_cost", "conversion_cost", "cuda_graph"]

# Vector operations per iteration (axpy, dot, norm) and products per iteration, per method.
_VECTOR_OPS = {"cg": 6, "minres": 9, "bicgstab": 10, "gmres": 0}
#: torch operator dispatches per iteration of this backend's Krylov loops (counted with the torch
#: profiler, top-level aten ops, 2-D Poisson; GMRES per inner iteration at restart 20): each
#: costs the calibrated launch overhead on the host, which bounds an iteration on a GPU (H200,
#: 1M unknowns: 274 us per CG iteration measured, 41 dispatches)
_DISPATCHES = {"cg": 41, "minres": 156, "bicgstab": 173, "gmres": 281}
#: CG on one real system takes a lean step (krylov/cg.py): 25 dispatches per iteration
_DISPATCHES_CG_ONE = 25
_PRECOND_DISPATCHES = 4
#: ... unless those 25 are replayed as a CUDA graph (krylov/_graph.py; CUDA, no preconditioner
#: or Jacobi; here one real system): the host then launches one graph per check_every iterations and
#: runs the check (about 25 small ops per 8 iterations); on the device each of the 16 kernels of
#: an iteration costs about 1 us of scheduling. In launch units (8 us): ~3 + ~2. H200, 2-D
#: Poisson 1000^2: 104 us per iteration measured (profile_cg.json), 105 us estimated.
_GRAPH_LAUNCHES_CG_ONE = 5
#: the masked step (several columns, batches, complex) in a graph: ~45 kernels per iteration
_GRAPH_LAUNCHES_CG = 9
_GRAPH_PRECOND_LAUNCHES = 0.25
_PRODUCTS = {"cg": 1, "minres": 1, "bicgstab": 2, "gmres": 1}
# Iteration count relative to CG for the same problem class (BiCGStab does 2 products/iter).
_ITER_FACTOR = {"cg": 1.0, "minres": 1.05, "bicgstab": 0.75, "gmres": 1.3}


def _sizes(request: Request) -> tuple[int, int, int, int, int]:
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    vsize = _itemsize(A.dtype)
    isize = 8 if A.format is None or A.format.index_dtype in (None,) else (4 if str(A.format.index_dtype).endswith("32") else 8)
    return m, n, int(A.nse or 0), vsize, isize


def _itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def conversion_cost(rates: Rates, nse: int) -> float:
    """Converting a pattern to CSR: about 20 passes over the entries (sort, gathers, scans)."""
    return rates.seconds(bytes=20 * 8 * nse, launches=40)


#: host work of building the torch CSR tensor object the plan makes per new value buffer
#: (spmm.py: "construction costs tens of us"), in launch units
_CSR_OBJECT_LAUNCHES = 3


def spmm_seconds(rates: Rates, request: Request, k: int) -> float:
    """One product. A ``matmul`` request (one product per value set: ``Matmul.execute``,
    ``SparseLinear``) also pays what the plan redoes per call (:func:`per_call_seconds`); the
    iterative solvers and eigensolvers set the values once and repeat the product alone."""
    m, n, nse, vsize, isize = _sizes(request)
    batch = max(1, math.prod(request.A.batch_shape))
    if _itemsize(request.A.dtype) == 2:  # half types run in float32 (spmm.py): the kernel moves float32
        vsize_k = 4
    else:
        vsize_k = vsize
    traffic = TorchSpmmPlan.traffic(nse, m, n, k, vsize_k, isize) * batch
    secs = rates.seconds(bytes=traffic, flops=2 * nse * k * batch, launches=batch)
    if request.op == "matmul":
        secs += per_call_seconds(rates, request, k)
    return secs


def per_call_seconds(rates: Rates, request: Request, k: int) -> float:
    """What TorchSpmmPlan does per call beyond the kernel: for float16 / bfloat16 the float32 copy
    of the values (a fresh buffer per value set, so the CSR tensor object is rebuilt too), X
    upcast and Y cast back; for formats converted to CSR, the gather of the values into CSR order."""
    m, n, nse, vsize, isize = _sizes(request)
    batch = max(1, math.prod(request.A.batch_shape))
    nbytes = 0.0
    launches = 0.0
    fmt = request.A.format
    if fmt is not None and fmt != CSR and fmt.num_batch_levels == 0:
        nbytes += nse * (2 * vsize + 8) * batch  # values gathered through an int64 map
        launches += 1
    if vsize == 2 and not request.dtype.is_complex:
        nbytes += (nse * (2 + 4) + n * k * (2 + 4) + m * k * (4 + 2)) * batch
        launches += 3 + _CSR_OBJECT_LAUNCHES
    return rates.seconds(bytes=nbytes, launches=launches) if launches else 0.0


#: preconditioners built from A's pattern and values (krylov/incomplete.py; torch-sla's names)
PATTERN_PRECONDITIONERS = ("ic0", "ilu0", "ssor", "polynomial")
#: the Chebyshev preconditioner's degree (backend_options "poly_degree")
POLY_DEGREE = 4
#: iterations relative to Jacobi's (the polynomial's: 1.1 / degree) and the products one application costs: a
#: sparse triangular solve counted as two products on the CPU (MKL; 2-D Poisson 300^2, one thread: CG 880 iterations
#: with Jacobi, 264 with ic0, 312 with ssor, 240 with polynomial of degree 4; BiCGStab 640 / 192 with ilu0) and as
#: _GPU_TRIANGULAR products on a GPU (torch's CUDA sparse triangular solve through cuSPARSE, its analysis per call:
#: H100, 2-D Poisson 300^2, CG with ic0 7.0 ms an iteration against 0.08 ms with Jacobi, ~3.5 ms a solve;
#: results/preconditioners_h100_s31.json)
_PRECOND_ITERS = {"ic0": 0.3, "ilu0": 0.3, "ssor": 0.35}
_TRIANGULAR_PRODUCTS = 2.0
_GPU_TRIANGULAR = 300.0


def iterations(method: str, n: int, rtol: float, maxiter: int | None, restart: int = 30) -> int:
    base = 0.12 * math.sqrt(max(n, 1)) * math.log(2.0 / max(rtol, 1e-16)) + 10
    est = int(math.ceil(base * _ITER_FACTOR[method]))
    cap = maxiter if maxiter is not None else 10 * max(n, 1)
    return max(1, min(est, cap))


def krylov_cost(rates: Rates, request: Request, method: str, preconditioner: str | None) -> tuple[float, int, int]:
    """(seconds, peak bytes, estimated iterations)."""
    m, n, nse, vsize, _ = _sizes(request)
    k = request.rhs_columns
    it = iterations(method, n, request.option("rtol", 1e-6), request.option("maxiter"), request.option("restart") or 30)
    per = _PRODUCTS[method] * spmm_seconds(rates, request, max(1, k // max(1, math.prod(request.A.batch_shape))))
    vec = n * k * vsize
    vector_ops = _VECTOR_OPS[method]
    if method == "gmres":
        restart = request.option("restart") or 30
        vector_ops = 4 + restart  # Gram-Schmidt against half the basis on average, twice
    one = method == "cg" and k == 1 and not request.A.batch_shape and not request.dtype.is_complex
    graph = method == "cg" and cuda_graph(request, preconditioner)
    if graph:
        launches = _GRAPH_LAUNCHES_CG_ONE if one else _GRAPH_LAUNCHES_CG
    else:
        launches = _DISPATCHES_CG_ONE if one else _DISPATCHES[method]
    per += rates.seconds(bytes=3 * vec * vector_ops, launches=launches)
    if preconditioner in ("jacobi", "block_jacobi"):
        per += rates.seconds(bytes=3 * vec, launches=_GRAPH_PRECOND_LAUNCHES if graph else _PRECOND_DISPATCHES)
    elif preconditioner in PATTERN_PRECONDITIONERS:
        if preconditioner == "polynomial":
            degree = (request.option("backend_options") or {}).get("poly_degree", POLY_DEGREE)
            # a degree that is not a number is refused by the preconditioner's build, with what to pass
            degree = float(degree) if isinstance(degree, (int, float)) and not isinstance(degree, bool) else POLY_DEGREE
            extra, fewer = degree - 1, 1.1 / max(degree, 1.0)
        else:
            tri = _GPU_TRIANGULAR if request.device.type == "cuda" else _TRIANGULAR_PRODUCTS
            extra, fewer = 2 * tri, _PRECOND_ITERS[preconditioner]
        per += extra * spmm_seconds(rates, request, max(1, k // max(1, math.prod(request.A.batch_shape))))
        it = max(1, int(math.ceil(it * fewer)))
    work = {"cg": 4, "minres": 7, "bicgstab": 8, "gmres": (request.option("restart") or 30) + 4}[method]
    if graph:
        work += 2  # x kept at the last two checks
    peak = work * vec
    return per * it, int(peak), it


def cuda_graph(request: Request, preconditioner: str | None) -> bool:
    """Whether this backend's CG replays CUDA graphs for the request (see krylov/_graph.py):
    a CUDA operand, no preconditioner, Jacobi or the polynomial, graphs not turned off (SPARSETORCH_CUDA_GRAPHS,
    backend_options={"cuda_graph": False})."""
    from .krylov._graph import graphs_enabled

    if request.device.type != "cuda" or preconditioner not in (None, "none", "identity", "jacobi", "polynomial"):
        return False
    return graphs_enabled() and (request.option("backend_options") or {}).get("cuda_graph", True) is not False


def dense_cost(rates: Rates, request: Request, cholesky: bool) -> tuple[float, int]:
    m, n, nse, vsize, _ = _sizes(request)
    batch = max(1, math.prod(request.A.batch_shape))
    k = request.rhs_columns
    flops = (n**3 / 3 if cholesky else 2 * n**3 / 3) * batch + 2 * n * n * k
    nbytes = n * n * vsize * batch
    # ~20 launches: scatter to dense, factor, pivot checks, solve (measured 170-200 us at n=20-50)
    return rates.seconds(bytes=3 * nbytes, flops=flops, launches=20 * batch), int(2 * nbytes)


def dense_factor_share(rates: Rates, request: Request, cholesky: bool) -> float:
    """The factorization's part of :func:`dense_cost` (paid once per set of values: the plan keeps
    the factors while A's values stay the same): everything but the triangular solves."""
    _, n, _, vsize, _ = _sizes(request)
    batch = max(1, math.prod(request.A.batch_shape))
    total, _ = dense_cost(rates, request, cholesky)
    solves = rates.seconds(bytes=n * n * vsize * batch, flops=2 * n * n * request.rhs_columns, launches=2 * batch)
    return max(0.0, total - solves)
