"""The cupy backend's hook implementations (the module named by the entry point ``cupy``).

Offers, per request (CUDA tensors; float32, float64, complex64, complex128):

- ``matmul``: ``spmm``, cuSPARSE SpMV/SpMM with the descriptors and workspace made once per
  plan (CSR and CSC as they are; other formats converted to CSR once per pattern).
- ``solve``: ``cg`` (SPD), ``minres`` (Hermitian), ``gmres`` and ``cgs`` (when this sparsetorch's
  method vocabulary has it) from ``cupyx.scipy.sparse.linalg``, on the same cuSPARSE products,
  with the preconditioners ``jacobi``, ``ilu`` (ILU(0), cuSPARSE) or a callable; ``qr``
  (cuSolverSp sparse QR) only when asked for with ``method="qr"``.
- ``eigsh``: ``lanczos`` (cupyx), which in LA/SA/LM, no ``sigma``, no ``M``.
- ``lstsq``: ``lsmr`` (cupyx).

It declines, with the reason: tensors not on CUDA (no operand is moved between devices), CuPy
not installed (with the install command), other dtypes, formats with BATCH levels, methods whose
structural needs are not met (as the torch backend), ILU under CG/MINRES, and methods cupyx
does not have.

This module imports only torch and sparsetorch: CuPy is imported when a plan is built.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from typing import Any, Callable

import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer, Request
from sparsetorch.backend import METHODS, conversion_note, cuda_matrix_decline, hermitian, rates, spd_ok

from . import __version__, cost

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "NAME", "KRYLOV", "SOLVE_METHODS", "DTYPES"]

NAME = "cupy"
#: cgs joins when the core's method vocabulary has the name (records.METHODS).
KRYLOV = ("cg", "gmres", "minres") + (("cgs",) if "cgs" in METHODS else ())
SOLVE_METHODS = (*KRYLOV, "qr")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
PRECONDITIONERS = ("jacobi", "ilu")
_INSTALL = ("not installed: pip install 'sparsetorch-cupy[cuda12]' or 'sparsetorch-cupy[cuda13]' "
            "(cupy-cuda12x / cupy-cuda13x: the one matching torch.version.cuda)")

_ELSEWHERE = {
    "lu": "cupyx has no sparse LU on the GPU (its splu runs SuperLU on the host); use method='qr' (cuSolverSp), "
          "an iterative method, or the scipy/cudss backends",
    "cholesky": "cupyx has no sparse Cholesky; use method='cg' (SPD) or the cudss backend",
    "ldlt": "cupyx has no sparse LDL^T; use method='minres' (symmetric indefinite)",
    "dense": "the cupy backend works on sparse matrices; use the torch backend's dense methods",
    "bicgstab": "cupyx has no BiCGStab; use method='gmres'" + (" or 'cgs'" if "cgs" in METHODS else ""),
    "lgmres": "cupyx has no LGMRES; use method='gmres'",
    "tfqmr": "cupyx has no TFQMR; use method='gmres'",
    "gcrotmk": "cupyx has no GCROT(m,k); use method='gmres'",
    "amg": "no algebraic multigrid in CuPy; use the scipy backend (PyAMG) or preconditioner='jacobi'",
    "lsqr": "least squares goes through op 'lstsq' (method 'lsmr'), not solve",
    "lsmr": "least squares goes through op 'lstsq' (method 'lsmr'), not solve",
}


@functools.lru_cache(maxsize=None)
def _cupy_distribution() -> str | None:
    """The installed CuPy distribution (cupy-cuda12x, cupy-cuda13x, cupy, ...), found without importing it."""
    if importlib.util.find_spec("cupy") is None:
        return None
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "cupy (unknown distribution)"


def _cupy_missing() -> str | None:
    return None if _cupy_distribution() is not None else _INSTALL


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description (cheap: CuPy is looked up, not imported)."""
    missing = {"cupy": why} if (why := _cupy_missing()) else {}
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="CuPy: cuSPARSE SpMV/SpMM with plan-time descriptors, cupyx Krylov (" + ", ".join(KRYLOV)
                    + "), Jacobi/ILU(0), cuSolverSp QR on request, Lanczos eigsh, LSMR; CUDA",
        devices=("cuda",),
        dtypes=DTYPES,
        ops={"matmul": ("spmm",), "solve": SOLVE_METHODS, "eigsh": ("lanczos",), "lstsq": ("lsmr",)},
        formats=(),  # takes CSR and CSC as they are; converts the rest once per pattern (costed)
        missing=missing,
        priority=0,
        options=(),  # reads no backend_options
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    """Offers (with cost) and declines (with reasons) for one request."""
    if request.op not in ("matmul", "solve", "eigsh", "lstsq"):
        return []
    general = _general_decline(request)
    if general is not None:
        return [Decline(NAME, general)]
    r = rates(request.device)
    if request.op == "matmul":
        seconds, peak = cost.spmm_cost(r, request)
        return [Offer(NAME, "spmm", seconds, peak, _spmm_factory,
                      "cuSPARSE SpMV/SpMM, descriptors and workspace made once per plan" + _conversion_note(request))]
    if request.op == "eigsh":
        return [_eigsh_answer(request, r)]
    if request.op == "lstsq":
        seconds, peak, its = cost.lsmr_cost(r, request)
        return [Offer(NAME, "lsmr", seconds, peak, _lsmr_factory, f"cupyx LSMR, ~{its} iterations estimated"
                      + _conversion_note(request))]
    return _solve_answers(request, r)


def _general_decline(request: Request) -> str | None:
    common = cuda_matrix_decline(request, DTYPES, "CuPy", "cuSPARSE's descriptors here cannot hold them; use a SparseTensorList or the torch backend")
    if common is not None:
        return common
    missing = _cupy_missing()
    if missing:
        return f"cupy is {missing}"
    return None


def _conversion_note(request: Request) -> str:
    return conversion_note(request, per_call=", one value gather per call", name_unnamed=True, unknown_converts=True)


# --- solve ---------------------------------------------------------------------------------------
def _solve_answers(request: Request, r: Any) -> list[Offer | Decline]:
    method = request.option("method")
    pre = request.option("preconditioner")
    pre_name = None if pre is None else ("user" if callable(pre) else str(pre))
    if pre_name in ("none", "identity"):
        pre_name = "none"
    if pre_name is not None and pre_name not in (*PRECONDITIONERS, "user", "none"):
        return [Decline(NAME, f"preconditioner {pre!r} is not available in the cupy backend "
                              f"({', '.join(PRECONDITIONERS)}, None or a callable)")]
    m, n = request.A.shape[-2], request.A.shape[-1]
    if m != n:
        return [Decline(NAME, f"solve needs a square matrix, A is {m}x{n}")]
    out: list[Offer | Decline] = []
    if method in _ELSEWHERE:
        out.append(Decline(NAME, _ELSEWHERE[method], method))
    if method == "cgs" and "cgs" not in KRYLOV:
        out.append(Decline(NAME, "cgs is not in this sparsetorch's method vocabulary (records.METHODS)", method))
    for k in KRYLOV:
        out += _krylov_answers(request, r, k, pre, pre_name)
    out.append(_qr_answer(request, r, pre_name))
    return out


def _krylov_answers(request: Request, r: Any, method: str, pre: Any, pre_name: str | None) -> list[Offer | Decline]:
    if method == "cg" and not spd_ok(request, "cg"):
        return [Decline(NAME, "CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)", method)]
    if method == "minres" and not hermitian(request):
        return [Decline(NAME, "MINRES needs a symmetric (Hermitian) matrix", method)]
    if pre_name is not None:
        candidates = [None if pre_name == "none" else pre_name]
    elif request.option("method") is None:
        candidates = ["jacobi"]
    else:
        candidates = [None]  # a pinned method without a preconditioner runs without one (as the torch backend)
    restart = int(request.option("restart") or 30)
    out: list[Offer | Decline] = []
    for cand in candidates:
        if cand == "ilu" and method in ("cg", "minres"):
            out.append(Decline(NAME, f"ILU(0) is not symmetric, and {method.upper()} needs a symmetric positive definite "
                                     f"preconditioner: use 'jacobi', or gmres with 'ilu'", method))
            continue
        if cand == "ilu" and (request.A.nse or 0) >= 2**31 - 1:
            out.append(Decline(NAME, f"ILU(0) through cuSPARSE needs int32 indices; A has {request.A.nse} entries", method))
            continue
        seconds, peak, its = cost.krylov_cost(r, request, method, cand, restart)
        opts = dict(request.options)
        opts["preconditioner"] = pre if cand == "user" else cand
        note = f"cupyx {method}: ~{its} iterations estimated, preconditioner {cand or 'none'}" + _conversion_note(request)
        out.append(Offer(NAME, method, seconds, peak, _krylov_factory(method, opts), note, cand,
                         iterations=max(1, int(its))))
    return out


def _qr_answer(request: Request, r: Any, pre_name: str | None) -> Offer | Decline:
    if request.option("method") != "qr":
        return Decline(NAME, "offered only when asked for (method='qr'): cuSolverSp's sparse QR re-factors per right-hand "
                             "side and is slower than a CPU LU (measured: 2.9 s on a 90k-unknown 2-D Poisson system where "
                             "SciPy takes 0.8 s)", "qr")
    if pre_name not in (None, "none"):
        return Decline(NAME, "a preconditioner was requested, but QR is a direct method; drop preconditioner= to use it", "qr")
    if (request.A.nse or 0) >= 2**31 - 1:
        return Decline(NAME, f"cuSolverSp needs int32 indices; A has {request.A.nse} entries", "qr")
    seconds, peak = cost.qr_cost(r, request)
    return Offer(NAME, "qr", seconds, peak, _qr_factory, "cuSolverSp sparse QR (csrlsvqr), re-factored per right-hand side"
                 + _conversion_note(request))


# --- eigsh ---------------------------------------------------------------------------------------
def _eigsh_answer(request: Request, r: Any) -> Offer | Decline:
    method = request.option("method")
    if method not in (None, "lanczos"):
        return Decline(NAME, f"eigsh has only method 'lanczos' (cupyx) here, not {method!r}", method)
    if len(request.operands) > 1:
        return Decline(NAME, "cupyx's eigsh has no mass matrix M (generalized problem); use the scipy backend (ARPACK)", "lanczos")
    if request.option("sigma") is not None:
        return Decline(NAME, "cupyx's eigsh has no shift-invert mode (sigma); use which='SA'/'LA' or the scipy backend", "lanczos")
    which = request.option("which") or "LA"
    if which not in ("LA", "SA", "LM"):
        return Decline(NAME, f"cupyx's eigsh supports which='LA', 'SA' or 'LM', not {which!r}", "lanczos")
    if not hermitian(request):
        return Decline(NAME, "eigsh needs a symmetric (Hermitian) matrix", "lanczos")
    k = int(request.option("k") or 6)
    seconds, peak = cost.lanczos_cost(r, request, k, request.option("ncv"))
    return Offer(NAME, "lanczos", seconds, peak, _lanczos_factory, f"cupyx thick-restart Lanczos, k={k}, which={which}"
                 + _conversion_note(request))


# --- plan factories (CuPy is imported here, when a plan is built) --------------------------------------
def _spmm_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .matmul import SpmmPlan

    return SpmmPlan(A, backend=NAME)


def _krylov_factory(method: str, options: dict) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .iterative import KrylovPlan

        return KrylovPlan(A, method, options, backend=NAME)

    return build


def _qr_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .direct import QRPlan

    return QRPlan(A, backend=NAME)


def _lanczos_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .spectral import LanczosPlan

    return LanczosPlan(A, backend=NAME)


def _lsmr_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .lstsq import LsmrPlan

    return LsmrPlan(A, request.options, backend=NAME)
