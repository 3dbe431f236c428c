"""The cuda backend's hook implementations (the module named by the entry point ``cuda``).

Offers ``matmul`` (method ``spmm``) on CUDA tensors in float16, bfloat16, float32 and float64,
with this distribution's own kernels compiled at run time by NVRTC: CSR, DIA, ELL,
DELTA(b) (b in 1, 2, 4, 8, 16; bit-packed), NM(n, m) (positions bit-packed) and BSR(bh, bw) as
they are stored, every other 2-D format through a CSR made once from its pattern. Backward: the adjoint product runs on the transposed pattern;
the plan's ``sddmm`` gives the value gradient on the pattern.

Also offers ``solve`` method ``cg`` (fused CG / Jacobi PCG, krylov.py) for SPD matrices in float32
and float64.

Declines, with the reason: no CUDA device or CPU tensors, complex dtypes, formats with BATCH
levels, cuda.bindings / NVRTC not importable (with the install command), other ops; for solve:
a matrix not known to be SPD, half dtypes, value batches, other methods and preconditioners.

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

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "NAME", "DTYPES"]

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
        ops={"matmul": ("spmm",), "solve": ("cg",)},
        formats=(),  # CSR, DIA, ELL, DELTA(b), NM(n, m), BSR as they are; the rest through a CSR made once per pattern
        missing=missing,
        priority=0,
    )


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
    """The fused CG (krylov.py) for an SPD matrix, or the declines that say why not."""
    method = request.option("method")
    if method not in (None, "cg"):
        return [Decline(NAME, f"solve has only method 'cg' here (fused CG for SPD matrices), not {method!r}", method)]
    why = cuda_matrix_decline(request, (torch.float32, torch.float64), "sparsetorch-cuda",
                              "one pattern per plan here; use the torch backend")
    if why is None and request.A.batch_shape:
        why = f"one matrix per solve here; A has value batches {tuple(request.A.batch_shape)} (use the torch backend)"
    if why is None and request.A.shape[-1] != request.A.shape[-2]:
        why = f"CG needs a square matrix, A is {tuple(request.A.shape)}"
    if why is None and "spd" not in request.properties:
        why = "CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)"
    if why is None:
        why = _bindings_missing()
    pre = request.option("preconditioner")
    pre_name = pre if isinstance(pre, str) or pre is None else "user"
    if pre_name is None and method is None:
        pre_name = "jacobi"  # the torch backend's default, so that both price the same iteration
    if why is None and pre_name not in (None, *_SOLVE_PRECONDITIONERS):
        why = f"preconditioner {pre_name!r} is not available in the fused CG (jacobi or None)"
    if why is not None:
        return [Decline(NAME, why, "cg")]
    from . import krylov  # noqa: PLC0415 - imports only torch and sparsetorch at module level

    jacobi = pre_name == "jacobi"
    seconds, peak, its, kind, setup = krylov.cg_cost(rates(request.device), request, jacobi)
    every = request.option("check_every")
    note = (f"fused CG{' + Jacobi' if jacobi else ''}: 3 kernels per iteration, scalars on the device, "
            f"~{its} iterations estimated; " + ("DIA, no index arrays" if kind == "dia" else
                                                "CSR" if kind == "csr" else "a CSR made once from the pattern"))

    def build(A: sparsetorch.SparseTensor, req: Request, jacobi: bool = jacobi):
        return krylov.CudaCGPlan(A, preconditioner="jacobi" if jacobi else None,
                                 check_every=int(every) if every else None)

    return [Offer(NAME, "cg", seconds, peak, build, note, "jacobi" if jacobi else None, setup=setup,
                  iterations=max(1, int(its)))]
