"""The eigen backend's hook implementations (the module named by the entry point ``eigen``).

Offers, per request (CPU tensors; float32, float64, complex64, complex128; int32/int64 indices):

- ``solve``: ``cholesky`` (SimplicialLLT, SPD), ``ldlt`` (SimplicialLDLT, symmetric/Hermitian; both
  read one triangle and assume ``A^H = A``, so a complex symmetric A, ``A == A^T``, gets neither),
  ``lu`` (SparseLU), ``qr`` (SparseQR), each analysed once per pattern and refactored on new
  values; ``cg`` (SPD) with ``jacobi``/``ichol`` (IncompleteCholesky), ``bicgstab`` with
  ``jacobi``/``ilu`` (IncompleteLUT). With nothing pinned, CG is offered with Jacobi and IC,
  BiCGSTAB with Jacobi and ILUT; a pinned method without ``preconditioner=`` runs without one.
- ``logdet``: ``cholesky``, ``ldlt``, ``lu`` (slogdet from the factors; solves from them too).
- ``lstsq``: ``qr`` (SparseQR, minimum-norm for rank-deficient and wide A), ``lsqr`` (Eigen's
  LeastSquaresConjugateGradient loop, CGLS: the same Krylov iterates as LSQR in exact arithmetic).

Declines, with the reason: other devices and dtypes, formats with BATCH levels, method needs not
met (cholesky/cg without SPD, ldlt without symmetry), preconditioners on direct methods or a
method that cannot use them, callables (the loops run in C++), QR with ``damp``, ``lsqr`` with a
non-default ``conlim`` (CGLS has no condition estimate).

Also offers the core one compiled conversion step (``sparsetorch_conversion_kernels``):
``csr_to_bsr``, CSR -> BSR with sorted blocks on the CPU (:mod:`sparsetorch_eigen.convert`).

This module imports only torch and sparsetorch: the compiled extension is loaded with a plan.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Callable

import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer, Request
from sparsetorch.backend import conversion_note, cpu_matrix_decline, hermitian, rates, spd_ok

from . import __version__, cost

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "sparsetorch_conversion_kernels", "NAME", "SOLVE_METHODS",
           "DTYPES"]

NAME = "eigen"
DIRECT = ("cholesky", "ldlt", "lu", "qr")
KRYLOV = ("cg", "bicgstab")
SOLVE_METHODS = DIRECT + KRYLOV
LOGDET_METHODS = ("cholesky", "ldlt", "lu")
LSTSQ_METHODS = ("qr", "lsqr")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
#: preconditioner names (sparsetorch's) each Krylov method takes here
PRECONDITIONERS = {"cg": ("jacobi", "ichol"), "bicgstab": ("jacobi", "ilu")}
_ALIASES = {"ic": "ichol", "ilut": "ilu", "identity": "none"}
DEFAULT_CONLIM = 1e8

_ELSEWHERE = {
    "dense": "the eigen backend factors sparse matrices only; use method='lu' or the torch backend's dense LU",
    "gmres": "Eigen's GMRES is in unsupported/ (not built here); use method='bicgstab' or another backend's gmres",
    "minres": "Eigen's MINRES is in unsupported/ (not built here); use method='ldlt' or another backend's minres",
    "lsmr": "Eigen has no LSMR; use method='lsqr' (least-squares CG) or 'qr' with lstsq",
    "lsqr": "least-squares CG ('lsqr') is offered for lstsq, not for square solves; use lstsq(A, B, method='lsqr')",
}


@functools.lru_cache(maxsize=None)
def _built() -> bool:
    return importlib.util.find_spec("sparsetorch_eigen._eigen") is not None


#: the ``backend_options`` keys this backend reads (README); the core's ``dimension`` too
BACKEND_OPTIONS = ("ordering", "pivot_threshold", "symmetric_mode", "qr_threshold", "check_pivots", "ilu_drop_tol",
                   "ilu_fill_factor", "ichol_shift")


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description (cheap: the extension is not imported)."""
    missing = {} if _built() else {"sparsetorch_eigen._eigen": "not built: reinstall with pip install ./plugins/eigen_backend"}
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="Eigen: SimplicialLLT/LDLT, SparseLU, SparseQR (pattern analysed once, refactored on new values), "
                    "CG/BiCGSTAB/least-squares CG with diagonal, IncompleteCholesky, IncompleteLUT; CPU",
        devices=("cpu",),
        dtypes=DTYPES,
        ops={"solve": SOLVE_METHODS, "logdet": LOGDET_METHODS, "lstsq": LSTSQ_METHODS},
        formats=(),  # reads CSR and CSC in place; other formats are converted once per pattern (costed)
        missing=missing,
        priority=0,
        options=BACKEND_OPTIONS,
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    """Offers (with cost) and declines (with reasons) for one request."""
    if request.op not in ("solve", "logdet", "lstsq"):
        return []
    general = _general_decline(request)
    if general is not None:
        return [Decline(NAME, general)]
    r = rates(request.device)
    if request.op == "logdet":
        return _logdet_answers(request, r)
    if request.op == "lstsq":
        return _lstsq_answers(request, r)
    return _solve_answers(request, r)


@sparsetorch.hookimpl
def sparsetorch_conversion_kernels() -> dict[str, Callable[..., Any]]:
    """The compiled conversion steps for the core (contracts: ``CONVERSION_KERNELS`` in
    ``sparsetorch.backend``); none without the compiled extension. Cheap: the
    extension is loaded on the first call."""
    if not _built():
        return {}
    from .convert import csr_to_bsr

    return {"csr_to_bsr": csr_to_bsr}


def _general_decline(request: Request) -> str | None:
    common = cpu_matrix_decline(request, DTYPES, "Eigen", "which an Eigen map cannot hold; use a SparseTensorList or the "
                                "torch backend")
    if common is not None:
        return common
    if not _built():
        return "the compiled extension sparsetorch_eigen._eigen is missing: reinstall with pip install ./plugins/eigen_backend"
    return None


def _square(request: Request) -> bool:
    return request.A.shape[-2] == request.A.shape[-1]


#: what a decline for a method that assumes ``A^H = A`` adds for complex A
_NOT_COMPLEX_SYMMETRIC = ("; for complex A that means Hermitian (A == A^H): a complex symmetric matrix (A == A^T, "
                          "properties='symmetric') is not, use method='lu'")


def _pinned_on_complex_symmetric(request: Request, method: str) -> bool:
    """``method`` (Cholesky, LDL^T: they assume ``A^H = A``) pinned on a complex A tagged ``"symmetric"``
    only, which says ``A == A^T``, not Hermitian: the pin is taken and the plan checks on the values
    that A is Hermitian (a Hermitian A tagged "symmetric" is factored; a complex symmetric one
    raises NotSymmetricError naming method='lu' instead of a wrong answer)."""
    return (request.option("method") == method and request.dtype.is_complex and "symmetric" in request.properties
            and not hermitian(request))


def _requirement(request: Request, method: str) -> str | None:
    cplx = _NOT_COMPLEX_SYMMETRIC if request.dtype.is_complex else ""
    if method == "cholesky" and not (spd_ok(request, "cholesky") or _pinned_on_complex_symmetric(request, method)):
        return ("Cholesky (SimplicialLLT) needs a symmetric positive definite matrix (not detected; pass "
                f"properties='spd' if it is){cplx}")
    if method == "cg" and not spd_ok(request, "cg"):
        return f"CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is){cplx}"
    if method == "ldlt" and not (hermitian(request) or _pinned_on_complex_symmetric(request, method)):
        return ("LDL^T (SimplicialLDLT) needs a symmetric (Hermitian) matrix (not detected; pass "
                f"properties='{'hermitian' if cplx else 'symmetric'}' if it is){cplx}")
    if method == "ldlt" and "zero_diagonal" in request.properties and request.option("method") != "ldlt":
        # SimplicialLDLT does not pivot: a zero on the diagonal (saddle-point / KKT systems, graphs
        # without self-loops) meets a zero pivot or a fill explosion (hangGlider_2: 60 ms against
        # SparseLU's 32 ms, ~10x the estimated factor entries)
        return ("LDL^T without pivoting is not offered for a matrix with zeros on its diagonal (detected); use 'lu', or "
                "pin method='ldlt' to try it anyway")
    if method == "ldlt" and "zero_minor" in request.properties and request.option("method") != "ldlt":
        # every edge of a unit-valued graph matrix is a singular 2x2 minor: without pivoting the
        # elimination meets an exact zero pivot (bcspwr03/06, dwt_878, jagmesh7: LDL^T failed, then
        # LU, at twice the cost)
        return ("LDL^T without pivoting is not offered for a matrix with an exactly singular 2x2 principal minor "
                "(a_ii a_jj = a_ij^2, detected: an elimination without pivoting meets a zero pivot); use 'lu', or pin "
                "method='ldlt' to try it anyway")
    return None


# --- solve -----------------------------------------------------------------------------------------
def _solve_answers(request: Request, r: Any) -> list[Offer | Decline]:
    method = request.option("method")
    pre = request.option("preconditioner")
    out: list[Offer | Decline] = []
    if method in _ELSEWHERE:
        out.append(Decline(NAME, _ELSEWHERE[method], method))
    if callable(pre):
        return out + [Decline(NAME, "callable preconditioners are not supported: the Krylov loops run in C++ without "
                                    "the GIL; use 'jacobi', 'ichol' (cg) or 'ilu' (bicgstab), or the scipy/torch backends")]
    pre_name = None if pre is None else _ALIASES.get(str(pre), str(pre))
    known = {"jacobi", "ichol", "ilu", "none"}
    if pre_name is not None and pre_name not in known:
        return out + [Decline(NAME, f"preconditioner {pre!r} is not available in the eigen backend (jacobi, ichol, ilu "
                                    f"or None)")]
    for m in DIRECT:
        out.append(_direct_answer(request, r, m, pre_name, "solve"))
    for m in KRYLOV:
        out += _krylov_answers(request, r, m, pre_name)
    return out


def _direct_answer(request: Request, r: Any, method: str, pre_name: str | None, op: str) -> Offer | Decline:
    if op != "lstsq" and not _square(request):
        m, n = request.A.shape[-2], request.A.shape[-1]
        return Decline(NAME, f"{op} needs a square matrix, got {m}x{n}", method)
    if pre_name not in (None, "none"):
        return Decline(NAME, f"a preconditioner was requested, but {method} is a direct method; drop preconditioner= to "
                             f"use it", method)
    why = _requirement(request, method)
    if why is not None:
        return Decline(NAME, why, method)
    if method == "qr" and op == "lstsq" and float(request.option("damp") or 0.0) != 0.0:
        return Decline(NAME, f"QR factors A itself, so damp={request.option('damp')} is not supported; use method='lsqr'",
                       method)
    est = cost.direct_estimate(r, request, method, op)
    return Offer(NAME, method, est.seconds, est.bytes, _direct_factory(method, op), est.note + conversion_note(request),
                 factor=est.factor)


def _krylov_answers(request: Request, r: Any, method: str, pre_name: str | None) -> list[Offer | Decline]:
    if not _square(request):
        return [Decline(NAME, f"{method} needs a square matrix", method)]
    why = _requirement(request, method)
    if why is not None:
        return [Decline(NAME, why, method)]
    allowed = PRECONDITIONERS[method]
    if pre_name is not None:
        candidates = [None if pre_name == "none" else pre_name]
    elif request.option("method") is None:
        candidates = list(allowed)
    else:
        candidates = [None]
    out: list[Offer | Decline] = []
    for cand in candidates:
        if cand is not None and cand not in allowed:
            other = "bicgstab" if method == "cg" else "cg"
            need = ("IncompleteLUT is not symmetric, and CG needs a symmetric positive definite preconditioner"
                    if cand == "ilu" else "IncompleteCholesky needs a symmetric positive definite matrix")
            out.append(Decline(NAME, f"preconditioner {cand!r} does not fit {method}: {need}; use "
                                     f"{' or '.join(repr(a) for a in allowed)}, or {other} with {cand!r}", method))
            continue
        seconds, peak, its = cost.krylov_cost(r, request, method, cand)
        opts = dict(request.options)
        opts["preconditioner"] = cand
        note = f"~{its} iterations estimated, preconditioner {cand or 'none'}" + conversion_note(request)
        out.append(Offer(NAME, method, seconds, peak, _krylov_factory(method, opts), note, cand,
                         iterations=max(1, int(its))))
    return out


# --- logdet / lstsq ----------------------------------------------------------------------------------
def _logdet_answers(request: Request, r: Any) -> list[Offer | Decline]:
    method = request.option("method")
    out: list[Offer | Decline] = []
    if method is not None and method not in LOGDET_METHODS:
        out.append(Decline(NAME, f"logdet is offered with {', '.join(LOGDET_METHODS)} (from the factors); "
                                 f"{method!r} is not one of them", method))
    for m in LOGDET_METHODS:
        out.append(_direct_answer(request, r, m, None, "logdet"))
    return out


def _lstsq_answers(request: Request, r: Any) -> list[Offer | Decline]:
    method = request.option("method")
    out: list[Offer | Decline] = []
    if method is not None and method not in LSTSQ_METHODS:
        out.append(Decline(NAME, f"lstsq is offered with 'qr' (SparseQR) and 'lsqr' (least-squares CG); {method!r} is "
                                 f"not one of them", method))
    out.append(_direct_answer(request, r, "qr", None, "lstsq"))
    conlim = request.option("conlim")
    if conlim is not None and float(conlim) != DEFAULT_CONLIM:
        out.append(Decline(NAME, f"conlim={conlim:g} cannot be honoured: least-squares CG keeps no condition-number "
                                 f"estimate (only the default {DEFAULT_CONLIM:g} is accepted, and not enforced); use "
                                 f"method='qr' or the scipy backend's lsqr", "lsqr"))
    else:
        seconds, peak, its = cost.lscg_cost(r, request)
        out.append(Offer(NAME, "lsqr", seconds, peak, _lscg_factory(dict(request.options)),
                         f"least-squares CG (CGLS; LSQR's iterates in exact arithmetic), ~{its} iterations estimated"
                         + conversion_note(request)))
    return out


# --- plan factories (the compiled extension is loaded here) --------------------------------------------
def _direct_factory(method: str, op: str) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .direct import DirectPlan

        return DirectPlan(A, method, request.options, backend=NAME, op=op, properties=request.properties)

    return build


def _krylov_factory(method: str, options: dict) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .iterative import KrylovPlan

        return KrylovPlan(A, method, options, backend=NAME)

    return build


def _lscg_factory(options: dict) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .iterative import LeastSquaresCGPlan

        return LeastSquaresCGPlan(A, "lsqr", options, backend=NAME)

    return build
