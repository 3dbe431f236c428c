"""Helpers shared by backend plugins: cost-model pieces and iterative-solve bookkeeping.

- :func:`sparsity_dimension`: the effective grid dimension (1..3) of A's sparsity, from nonzeros per
  row (``(nse / n - 1) / 2``: a 5-point stencil gives 2, a 7-point one 2.9) or from
  ``backend_options["dimension"]``; fill-in models of direct solvers interpolate between the
  2-D and 3-D fits with it.
- :func:`loglog_interp`: ``c n^a`` fits per dimension, interpolated in log space.
- :class:`Outcome` / :func:`combine`: per-system results of solvers that take one right-hand side
  at a time, reported as one :class:`IterationResult` (the worst case).
- :func:`cuda_matrix_decline`: the declines every CUDA-only matrix backend starts with (operand
  kind, device, mixed devices, dtype, matrix shape), with the reasons users see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .results import IterationResult, Status
from .records import Request

__all__ = ["sparsity_dimension", "loglog_interp", "Outcome", "combine", "cuda_matrix_decline"]


def sparsity_dimension(request: Request) -> float:
    """Effective grid dimension of A's sparsity (1..3): ``backend_options["dimension"]`` or
    ``(nse / n - 1) / 2`` clamped."""
    bo = request.option("backend_options") or {}
    if bo.get("dimension") is not None:
        return min(3.0, max(1.0, float(bo["dimension"])))
    n = max(1, request.A.shape[-1])
    per_row = (request.A.nse or n) / n
    return min(3.0, max(1.0, (per_row - 1.0) / 2.0))


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
