"""The example backend's hook implementations (the module named by the entry point).

sparsetorch asks every backend two questions (the hooks; docs/backend-authors.md):

1. :func:`sparsetorch_backend_info` -- once per process: who are you and what can you do, in
   general? (devices, dtypes, ops and their methods, missing optional dependencies)
2. :func:`sparsetorch_offers` -- for each concrete request: can you do *this*, and at what
   estimated cost? Answer with an :class:`~sparsetorch.Offer` (method, seconds, peak bytes, plan
   factory) or a :class:`~sparsetorch.Decline` (with a reason a user can act on). Never raise,
   never return None: the core turns both into declines marked as plugin bugs.

This backend offers one thing: ``solve`` by dense LU (SciPy/LAPACK), on the CPU, in float64, for
systems of up to ``MAX_N`` unknowns (``dense_max=`` overrides the limit). The module imports only
torch and sparsetorch: SciPy is looked up here, imported by ``plan.py`` when a plan is built.
"""

from __future__ import annotations

import importlib.util
import math

import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer, Request
from sparsetorch.backend import dtype_name, rates  # the backend-author API: docs/backend-authors.md

from . import __version__

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "lu_cost", "NAME", "MAX_N"]

#: The name this module calls itself. The core renames a backend to its entry-point name, so keep
#: the two equal (pyproject.toml: ``example = "sparsetorch_example.plugin"``).
NAME = "example"
#: Largest system offered by default: dense LU needs n^2 * 8 bytes and (2/3) n^3 flops.
MAX_N = 2048
#: Fixed cost per matrix, in units of ``rates.launch`` (one small library call): the Python and
#: SciPy wrapper overhead of scatter + getrf + getrs + checks. Measured: ~70 us for n = 20 on a
#: CPU whose calibrated launch cost is ~2.5 us. Check yours with the snippet in README.md.
CALL_OVERHEAD_LAUNCHES = 24


def _scipy_missing() -> str | None:
    # find_spec locates the package without importing it (import sparsetorch must stay light).
    return None if importlib.util.find_spec("scipy") is not None else "not installed: pip install scipy"


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description. Method names must come from ``sparsetorch.backend.METHODS``."""
    missing = _scipy_missing()
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="example: dense LU through SciPy (CPU, float64); a template for backend authors",
        devices=("cpu",),
        dtypes=(torch.float64,),
        ops={"solve": ("lu",)},
        formats=(),  # consumes any format: the plan scatters the entries itself
        missing={"scipy": missing} if missing else {},
        priority=0,
        # distribution is left out on purpose: the core fills it from the entry point's distribution.
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    """One offer (method "lu") or the declines that say why not."""
    if request.op != "solve":
        return []  # not declared in backend_info, so the core never asks; [] means "not mine"
    A = request.A
    if A.device.type != "cpu":
        return [Decline(NAME, f"runs on the CPU only; A is on {A.device} (move A and b with .to('cpu'))")]
    if A.dtype != torch.float64:
        return [Decline(NAME, f"supports float64 only; A is {dtype_name(A.dtype)} (cast with .to(torch.float64))")]
    if A.kind != "sparse":
        return [Decline(NAME, f"needs one SparseTensor as A, got a {A.kind} operand")]
    answers: list[Offer | Decline] = []
    method = request.option("method")
    if method is not None and method != "lu":
        # Decline the pinned method with the reason; still answer for "lu" below (the dispatcher
        # turns that offer into "not the requested method", so explain lists every candidate).
        answers.append(Decline(NAME, f"has only method 'lu', not method={method!r}", method))
    answers.append(_lu_answer(request))
    return answers


def _lu_answer(request: Request) -> Offer | Decline:
    missing = _scipy_missing()
    if missing:
        return Decline(NAME, f"scipy is {missing}", "lu")
    if request.option("preconditioner") is not None:
        return Decline(NAME, "a preconditioner was requested, but LU is a direct method; "
                             "drop preconditioner= to use it", "lu")
    n = request.A.shape[-1]
    limit = int(request.option("dense_max") or MAX_N)
    if n > limit:
        return Decline(NAME, f"dense LU only up to {limit} unknowns (n={n}); pass dense_max={n} to force it", "lu")
    seconds, peak = lu_cost(request)
    return Offer(NAME, "lu", seconds, peak, _build, notes=f"dense LU (SciPy getrf, in place) of a {n}x{n} matrix")


def lu_cost(request: Request) -> tuple[float, int]:
    """(estimated seconds, peak extra bytes) of set_values + one solve, from the calibrated rates.

    Counted: gathering the values into the dense buffer (nse value + index reads), writing the
    n x n buffer, LAPACK getrf reading and writing it (2/3 n^3 flops), getrs for the k
    right-hand sides (2 n^2 k flops, B read, X written), and a fixed per-matrix call overhead.
    Peak: the LU factors (the buffer, factored in place), the pivots and the gathered values.
    """
    r = rates(request.device)
    A = request.A
    n = A.shape[-1]
    batch = math.prod(A.batch_shape) if A.batch_shape else 1
    k = request.rhs_columns  # right-hand sides summed over the value batch
    nse = A.nse or 0
    dense = n * n * 8
    flops = batch * (2 * n**3 / 3) + 2 * n * n * k
    traffic = batch * (nse * 16 + 3 * dense) + 2 * n * k * 8
    seconds = r.seconds(bytes=traffic, flops=flops, launches=batch * CALL_OVERHEAD_LAUNCHES)
    peak = batch * (dense + 4 * n) + nse * 8
    return seconds, int(peak)


def _build(A: sparsetorch.SparseTensor, request: Request):
    """The plan factory: the core calls it once per pattern (it caches the plan)."""
    from .plan import DenseLUPlan  # imports SciPy: only now, when a plan is really needed

    return DenseLUPlan(A, backend=NAME)
