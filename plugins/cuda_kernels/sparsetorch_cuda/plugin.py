"""The cuda backend's hook implementations (the module named by the entry point ``cuda``).

Offers ``matmul`` (method ``spmm``) on CUDA tensors in float16, bfloat16, float32 and float64,
with this distribution's own kernels compiled at run time by NVRTC: CSR, DIA, ELL,
DELTA(b) (b in 1, 2, 4, 8, 16; bit-packed), NM(n, m) (positions bit-packed) and BSR(bh, bw) as
they are stored, every other 2-D format through a CSR made once from its pattern. Backward: the adjoint product runs on the transposed pattern;
the plan's ``sddmm`` gives the value gradient on the pattern.

Also offers ``solve`` method ``cg`` (fused CG / Jacobi PCG, krylov.py) for SPD matrices and method
``bicgstab`` (fused BiCGStab, optionally right-Jacobi, krylov.py) for any square matrix, in float32
and float64.

Declines, with the reason: no CUDA device or CPU tensors, complex dtypes, formats with BATCH
levels, cuda.bindings / NVRTC not importable (with the install command), other ops; for solve:
a matrix not known to be SPD (CG), a non-square one, half dtypes, value batches, other methods and preconditioners.

This module imports only torch and sparsetorch: NVRTC and the driver bindings are looked up
here (find_spec), imported when a plan is built.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

import sparsetorch
from sparsetorch.backend import BackendInfo, Decline, Offer, Request, cuda_matrix_decline, rates

from . import __version__, cost

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "sparsetorch_conversion_kernels", "NAME", "DTYPES"]

NAME = "cuda"
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INSTALL = "pip install cuda-bindings nvidia-cuda-nvrtc (or pip install sparsetorch-cuda, which depends on them)"


@functools.lru_cache(maxsize=None)
def _bindings_missing() -> str | None:
    try:
        found = importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"cuda.bindings is not installed: {_INSTALL}"


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description (cheap: nothing CUDA is imported)."""
    missing = {"cuda-bindings": why} if (why := _bindings_missing()) else {}
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="native CUDA kernels compiled with NVRTC: SpMV/SpMM and SDDMM in CSR (stream, vector, load balanced), "
                    "DIA, ELL, bit-packed DELTA(b), N:M (packed positions), BSR; float16/bfloat16 (float32 accumulation), "
                    "float32, float64",
        devices=("cuda",),
        dtypes=DTYPES,
        ops={"matmul": ("spmm",), "solve": ("cg", "bicgstab")},
        formats=(),  # CSR, DIA, ELL, DELTA(b), NM(n, m), BSR as they are; the rest through a CSR made once per pattern
        missing=missing,
        priority=0,
        options=("cuda_graph",),  # the fused CG's CUDA graphs (False: none)
    )


@sparsetorch.hookimpl
def sparsetorch_conversion_kernels() -> dict:
    """The conversion steps in this plugin's kernels (convert.py): none without cuda.bindings."""
    if _bindings_missing():
        return {}
    from .convert import KERNELS  # noqa: PLC0415 - imports the launcher (cuda.bindings) on first use

    return dict(KERNELS)


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    """One offer (method "spmm") or the decline that says why not."""
    if request.op == "solve":
        return _solve_offers(request)
    if request.op != "matmul":
        return []
    why = cuda_matrix_decline(request, DTYPES, "sparsetorch-cuda",
                              "one pattern per plan here; use a SparseTensorList or the torch backend")
    if why is not None:
        return [Decline(NAME, why)]
    missing = _bindings_missing()
    if missing:
        return [Decline(NAME, missing)]
    method = request.option("method")
    if method not in (None, "spmm"):
        return [Decline(NAME, f"matmul has only method 'spmm' here, not {method!r}", method)]
    seconds, peak, setup, kind = cost.spmm_cost(rates(request.device), request)
    bits = None
    if kind == "delta":
        from .layout import delta_bits  # noqa: PLC0415

        bits = delta_bits(request.A.format)
    return [Offer(NAME, "spmm", seconds, peak, _build, cost.describe(kind, bits), setup=setup)]


def _build(A: sparsetorch.SparseTensor, request: Request):
    from .plan import CudaSpmmPlan  # noqa: PLC0415 - imports the driver bindings only when a plan is built

    return CudaSpmmPlan(A, backend=NAME)


_SOLVE_PRECONDITIONERS = ("jacobi", "none", "identity")


def _solve_offers(request: Request) -> list[Offer | Decline]:
    """The fused CG (SPD) and the fused BiCGStab (any square matrix; krylov.py), or the declines
    that say why not. No method given: both (CG declined without SPD); else the one asked for."""
    method = request.option("method")
    if method not in (None, "cg", "bicgstab"):
        return [Decline(NAME, f"solve has only methods 'cg' (fused CG for SPD matrices) and 'bicgstab' (fused "
                              f"BiCGStab for any square matrix) here, not {method!r}", method)]
    why = cuda_matrix_decline(request, (torch.float32, torch.float64), "sparsetorch-cuda",
                              "one pattern per plan here; use the torch backend")
    if why is None and request.A.batch_shape:
        why = f"one matrix per solve here; A has value batches {tuple(request.A.batch_shape)} (use the torch backend)"
    square = None
    if why is None and request.A.shape[-1] != request.A.shape[-2]:
        square = f"needs a square matrix, A is {tuple(request.A.shape)}"
    if why is None:
        why = _bindings_missing()
    pre = request.option("preconditioner")
    pre_name = pre if isinstance(pre, str) or pre is None else "user"
    if pre_name is None and method is None:
        pre_name = "jacobi"  # the torch backend's default, so that both price the same iteration
    out: list[Offer | Decline] = []
    for m in (("cg", "bicgstab") if method is None else (method,)):
        title = "CG" if m == "cg" else "BiCGStab"
        reason = why or (f"{title} {square}" if square else None)
        if reason is None and m == "cg" and "spd" not in request.properties:
            reason = "CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)"
        if reason is None and pre_name not in (None, *_SOLVE_PRECONDITIONERS):
            reason = f"preconditioner {pre_name!r} is not available in the fused {title} (jacobi or None)"
        out.append(Decline(NAME, reason, m) if reason is not None else _krylov_offer(request, m, pre_name == "jacobi"))
    return out


def _krylov_offer(request: Request, method: str, jacobi: bool) -> Offer:
    from . import krylov  # noqa: PLC0415 - imports only torch and sparsetorch at module level

    every = request.option("check_every")
    if method == "cg":
        seconds, peak, its, kind, setup = krylov.cg_cost(rates(request.device), request, jacobi)
        head = f"fused CG{' + Jacobi' if jacobi else ''}: 3 kernels per iteration"
    else:
        seconds, peak, its, kind, setup = krylov.bicgstab_cost(rates(request.device), request, jacobi)
        head = f"fused BiCGStab{' + Jacobi' if jacobi else ''}: 4 kernels per iteration (2 products)"
    note = (f"{head}, scalars on the device, ~{its} iterations estimated; "
            + ("DIA, no index arrays" if kind == "dia" else "CSR" if kind == "csr" else "a CSR made once from the pattern"))
    plan_type = krylov.CudaCGPlan if method == "cg" else krylov.CudaBiCGStabPlan

    def build(A: sparsetorch.SparseTensor, req: Request, jacobi: bool = jacobi):
        graph = (req.option("backend_options") or {}).get("cuda_graph", True) is not False
        return plan_type(A, preconditioner="jacobi" if jacobi else None, check_every=int(every) if every else None,
                         cuda_graph=graph)

    return Offer(NAME, method, seconds, peak, build, note, "jacobi" if jacobi else None, setup=setup,
                 iterations=max(1, int(its)))
