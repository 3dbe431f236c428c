"""Helpers shared by backend plugins: cost-model pieces and iterative-solve bookkeeping.

- :func:`sparsity_dimension`: the effective grid dimension (1..3) of A's sparsity, from nonzeros per
  row (``(nse / n - 1) / 2``: a 5-point stencil gives 2, a 7-point one 2.9) or from
  ``backend_options["dimension"]``; fill-in models of direct solvers interpolate between the
  2-D and 3-D fits with it.
- :func:`fill_dimension`: the same, raised above 3 (up to 4, "dense-like") for patterns whose
  graph grows like an expander's (measured by the core), for direct solvers' fill tables;
  :func:`lu_fill_flops`: those tables (``LU_FILL``, ``LU_FLOPS``), one copy for every backend.
- :func:`loglog_interp`: ``c n^a`` fits per dimension, interpolated in log space.
- :class:`Outcome` / :func:`combine`: per-system results of solvers that take one right-hand side
  at a time, reported as one :class:`IterationResult` (the worst case).
- :func:`cuda_matrix_decline`: the declines every CUDA-only matrix backend starts with (operand
  kind, device, mixed devices, dtype, matrix shape), with the reasons users see.
- :func:`weak_diagonal_fraction`: the share of diagonal entries below a pivot threshold of their
  row's or column's largest entry (whether an LU's symmetric mode, which pivots on the diagonal,
  suits the values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .results import IterationResult, Status
from .records import Request

__all__ = ["sparsity_dimension", "fill_dimension", "FILL_DIMENSION_MAX", "lu_fill_flops", "LU_FILL", "LU_FLOPS", "COLAMD_FILL",
           "COLAMD_FLOPS", "loglog_interp", "Outcome", "combine", "cuda_matrix_decline", "weak_diagonal_fraction",
           "SYMMETRIC_MODE_WEAK_MAX"]


def sparsity_dimension(request: Request) -> float:
    """Effective grid dimension of A's sparsity (1..3): ``backend_options["dimension"]`` or
    ``(nse / n - 1) / 2`` clamped."""
    bo = request.option("backend_options") or {}
    if bo.get("dimension") is not None:
        return min(3.0, max(1.0, float(bo["dimension"])))
    n = max(1, request.A.shape[-1])
    per_row = (request.A.nse or n) / n
    return min(3.0, max(1.0, (per_row - 1.0) / 2.0))


#: the dimension a direct solver's fill tables reach for graphs without small separators:
#: the tables' entry 4 is "dense-like" (a large fraction of n^2 factor entries)
FILL_DIMENSION_MAX = 4.0
#: growth dimensions from which a graph is priced as an expander, and the span over which its
#: fill dimension rises from 3 to 4 (measured g: meshes 1.6-2.3, circuits and power networks
#: <= 3, an LP basis 3.45 with cheap factors; G51 3.85, random sparse 4.3-5.0 with 0.5-0.65 n^2)
EXPANDER_FROM, EXPANDER_RAMP = 3.55, 0.3


def fill_dimension(request: Request) -> float:
    """The dimension (1..4) that direct solvers' fill-in and flop tables should be read at:
    :func:`sparsity_dimension` for a mesh-like pattern; for a graph whose growth dimension g
    (``OperandInfo.graph_dimension``, measured by the core) exceeds :data:`EXPANDER_FROM`,
    raised from 3 to 4, the tables' dense-like entry, over :data:`EXPANDER_RAMP` of g (G51, a
    random graph: g = 3.85 -> 4; random sparse patterns: g >= 4.3 -> 4). Below, the nonzeros
    per row decide as for meshes: graphs of small diameter that factor cheaply sit there
    (an LP basis with hub rows, bp_1200: g = 3.45, 0.03 n^2 factor entries; circuits and
    power networks: g <= 3). ``backend_options["dimension"]`` still overrides."""
    d = sparsity_dimension(request)
    bo = request.option("backend_options") or {}
    if bo.get("dimension") is not None:
        return d
    g = getattr(request.A, "graph_dimension", None)
    if g is None or g <= EXPANDER_FROM:
        return d
    return max(d, 3.0 + (FILL_DIMENSION_MAX - 3.0) * min(1.0, (float(g) - EXPANDER_FROM) / EXPANDER_RAMP))


#: nnz(L + U) - n ~ c * n^alpha per fill dimension, minimum degree on A^T + A (symmetric
#: orderings). 1-3: measured on Poisson with SuperLU (2-D 64²..512²: fill/n 30..63; 3-D
#: 16³..40³: fill/n 148..682); Eigen's SparseLU with AMD measured the same within 3 %.
#: 4 ("dense-like", graphs without small separators): SuperLU on G51 (0.65 n²), random
#: symmetric patterns of 12-25 entries per row at n = 500..3000 (0.53-0.64 n²).
LU_FILL = {1: (2.0, 1.0), 2: (6.7, 1.18), 3: (1.46, 1.555), 4: (0.6, 2.0)}
#: Multiply-adds of the factorization, sum over pivots of 2 |L col| |U row|, ~ c * n^beta
#: (2-D: counted; 3-D: n^2.28 counted on 16³..40³, raised to n^2.4 to follow the measured time to
#: 48³, where SuperLU's speed drops as supernodes outgrow the caches). 4 is not a count but the
#: work at the tables' rate that matches SuperLU's time on the dense-like patterns above (G51:
#: 110 ms, 3x a dense LU of the same n; random symmetric n = 3000: 1.7 s, 1.6x dense): a
#: sparse LU of a matrix without small separators runs far below its supernodal rate.
LU_FLOPS = {1: (3.0, 1.0), 2: (7.3, 1.6), 3: (0.26, 2.4), 4: (1.2, 3.0)}
#: COLAMD on unsymmetric patterns: measured 1.85x the fill and 2.5x the flops (2-D and 3-D).
COLAMD_FILL, COLAMD_FLOPS = 1.85, 2.5


def lu_fill_flops(request: Request, *, symmetric_ordering: bool) -> tuple[float, float]:
    """``(stored entries of L + U, multiply-adds)`` of a sparse LU of ``request.A`` (one matrix,
    the smaller side ``n``): the tables above read at :func:`fill_dimension`, times the COLAMD
    factors without a symmetric ordering; the fill at most a dense LU's ``n^2``. A matrix that
    falls apart into independent pieces (``OperandInfo.components``: block-diagonal) is priced
    piece by piece (:func:`_pieces_fill_flops`)."""
    A = request.A
    n = max(1, min(A.shape[-2], A.shape[-1]))
    pieces = getattr(A, "components", None)
    bo = request.option("backend_options") or {}
    if pieces and bo.get("dimension") is None:
        fill, flops = _pieces_fill_flops(pieces, getattr(A, "graph_dimension", None))
    else:
        d = fill_dimension(request)
        fill = loglog_interp(LU_FILL, d, n) + n
        flops = loglog_interp(LU_FLOPS, d, n)
    if not symmetric_ordering:
        fill, flops = fill * COLAMD_FILL, flops * COLAMD_FLOPS
    return min(fill, float(n) * n), flops


#: a piece whose stored share (entries per row / size) reaches DENSE_PIECE_FROM + DENSE_PIECE_RAMP is
#: priced at the tables' dense-like entry; from DENSE_PIECE_FROM its dimension rises towards it
DENSE_PIECE_FROM, DENSE_PIECE_RAMP = 0.1, 0.4


def _pieces_fill_flops(pieces: Sequence[tuple[int, float, int]], g: float | None) -> tuple[float, float]:
    """``(fill, multiply-adds)`` of an LU of a block-diagonal pattern (symmetric-ordering tables):
    the sum over its pieces, each read at its own size and dimension (entries per row as for
    :func:`sparsity_dimension`, raised towards the dense-like entry 4 as the piece's stored share
    grows from :data:`DENSE_PIECE_FROM`: a dense block's factors are dense), each piece's fill at
    most its size squared. The growth dimension ``g`` (measured on one piece) raises pieces of at
    least 128 rows as :func:`fill_dimension` does. Measured (SuperLU, COLAMD, n = 10^4): 200 dense
    blocks of 50: 0.5M factor entries (read here 0.59M with COLAMD's factor; the whole-matrix
    mesh model read 4.5M and 2.6 Gflop against ~17M multiply-adds)."""
    fill = flops = 0.0
    for size, per_row, count in pieces:
        size = max(1, int(size))
        d = min(3.0, max(1.0, (float(per_row) - 1.0) / 2.0))
        share = float(per_row) / size
        if share > DENSE_PIECE_FROM:
            d += (FILL_DIMENSION_MAX - d) * min(1.0, (share - DENSE_PIECE_FROM) / DENSE_PIECE_RAMP)
        if g is not None and g > EXPANDER_FROM and size >= 128:
            d = max(d, 3.0 + (FILL_DIMENSION_MAX - 3.0) * min(1.0, (float(g) - EXPANDER_FROM) / EXPANDER_RAMP))
        fill += count * min(loglog_interp(LU_FILL, d, size) + size, float(size) * size)
        flops += count * min(loglog_interp(LU_FLOPS, d, size), float(size) ** 3)
    return fill, flops


def loglog_interp(table: Mapping[int, tuple[float, float]], d: float, n: int) -> float:
    """``c n^a`` with ``(c, a) = table[dimension]``, interpolated in log space between the
    integer dimensions around ``d``."""
    lo, hi = int(math.floor(d)), int(math.ceil(d))
    n = max(n, 2)

    def at(k: int) -> float:
        c, a = table[k]
        return math.log(c) + a * math.log(n)

    w = d - lo
    return math.exp((1 - w) * at(lo) + w * at(hi))


_PRIORITY = (Status.NOT_FINITE, Status.INDEFINITE, Status.BREAKDOWN, Status.MAX_ITERATIONS)


@dataclass
class Outcome:
    """How one system ended. ``residual`` is the true relative residual ``||b - A x|| / ||b||``."""

    iterations: int
    residual: float
    status: Status
    reason: str = ""
    history: list[float] = field(default_factory=list)
    products: int = 0

    @property
    def converged(self) -> bool:
        return self.status is Status.CONVERGED


def combine(outcomes: Sequence[Outcome], label: str) -> IterationResult:
    """One IterationResult for all systems: the largest iteration count and residual,
    ``converged`` only if all converged, the first failure by priority (non-finite, indefinite,
    breakdown, maxiter); ``label`` names the solver."""
    worst_it = max((o.iterations for o in outcomes), default=0)
    worst_res = max((o.residual for o in outcomes), default=0.0)
    failed = [o for o in outcomes if not o.converged]
    status, reason = Status.CONVERGED, ""
    for s in _PRIORITY:
        hit = next((o for o in failed if o.status is s), None)
        if hit is not None:
            status, reason = s, hit.reason
            break
    products = sum(o.products for o in outcomes)
    systems = len(outcomes)
    if not failed:
        reason = f"{label}: converged in {worst_it} iterations" + (f" (max over {systems} systems)" if systems > 1 else "")
        reason += f", {products} products with A" if products else ""
    elif systems > 1:
        reason += f" ({len(failed)} of {systems} systems did not converge)"
    lead = max(outcomes, key=lambda o: o.iterations) if outcomes else None
    history = tuple(lead.history) if lead is not None else ()
    return IterationResult(worst_it, float(worst_res), not failed, status, reason, history)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def cuda_matrix_decline(request: Request, dtypes: Sequence, library: str, batch_levels: str) -> str | None:
    """The reason a CUDA-only backend built on ``library`` cannot take ``request``'s matrix, or
    None: A not one SparseTensor, not on CUDA (no CUDA device at all, or CPU tensors: such a
    backend never moves operands), operands on different devices, a dtype outside ``dtypes``, a
    format with BATCH levels (``batch_levels`` says what to use instead), a tensor that is not a
    (value-batched) matrix."""
    import torch  # noqa: PLC0415

    A = request.A
    if A.kind != "sparse":
        return f"needs one SparseTensor as A, got a {A.kind} operand"
    if A.device.type != "cuda":
        if not torch.cuda.is_available():
            return f"no CUDA device (A is on {A.device}); {library} runs on NVIDIA GPUs"
        return (f"runs on CUDA tensors only; A is on {A.device}: move A and b with .cuda() (this backend never moves "
                f"operands between devices), or use a backend for {A.device.type}")
    for op in request.operands[1:]:
        if op.device != A.device:
            return f"operands on different devices ({A.device} and {op.device}); put them on one GPU"
    if A.dtype not in dtypes:
        return (f"supports {', '.join(_dtype_name(d) for d in dtypes)}; A is {_dtype_name(A.dtype)} "
                f"(cast with .to(torch.float64) or .to(torch.float32))")
    if A.format is not None and A.format.num_batch_levels:
        return f"format {A.format.name or A.format} has BATCH levels (a pattern per batch member): {batch_levels}"
    if len(A.shape) - len(A.batch_shape) != 2:
        return f"handles matrices only; A has format shape {tuple(A.shape[len(A.batch_shape):])}"
    return None


#: an LU in symmetric mode (a symmetric ordering, pivots taken on the diagonal when they pass a
#: threshold of 0.1) suits values whose diagonal passes that threshold almost everywhere; above this
#: share of weak diagonal entries the backends use COLAMD with partial pivoting instead
SYMMETRIC_MODE_WEAK_MAX = 0.05


def weak_diagonal_fraction(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n: int,
                           threshold: float = 0.1) -> float:
    """The share of the ``n`` diagonal entries with ``|a_jj| < threshold * max |a|`` over their row or
    their column (a compressed square pattern, rows or columns major, and one value set).

    An LU's symmetric mode orders A^T + A and takes each pivot on the diagonal when it passes the
    threshold against its column; a diagonal that fails it (convection-dominated transport: central
    or upwind differences at a high Peclet number) sends the pivots off the diagonal, and the fill
    the symmetric ordering planned for explodes. Session 19, 3-D convection-diffusion of 8000
    unknowns, every diagonal entry at ~2.5 % of its column: SuperLU in symmetric mode 28.8 s, Eigen
    4.1 s, against COLAMD with partial pivoting 0.58 / 0.89 s; with a strong diagonal symmetric mode
    wins (0.16 against 0.53 s)."""
    if n == 0:
        return 0.0
    mag = np.abs(np.asarray(data))
    indptr = np.asarray(indptr, dtype=np.int64)
    minor = np.asarray(indices, dtype=np.int64)
    major = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    diag = np.zeros(n, dtype=mag.dtype)
    on = major == minor
    diag[major[on]] = mag[on]
    top = np.zeros(n, dtype=mag.dtype)
    np.maximum.at(top, major, mag)
    np.maximum.at(top, minor, mag)  # the larger of the row's and the column's largest entry
    return float(np.mean(diag < threshold * top))
