"""The scipy backend's hook implementations (the module named by the entry point ``scipy``).

Offers, per request (CPU tensors, float32/float64/complex64/complex128):

- ``solve``: ``lu`` (SuperLU, the factorization kept in the plan for new right-hand sides and
  the adjoint solve); ``cg`` (SPD), ``minres`` (Hermitian), ``bicgstab``, ``gmres``, ``lgmres``,
  ``gcrotmk``, ``tfqmr`` (SciPy's Krylov methods) with the preconditioners ``jacobi``, ``ilu`` (``spilu``),
  ``amg`` (PyAMG) or a callable; ``amg`` (PyAMG's multigrid as the solver, SPD).
  With nothing pinned, each Krylov method is offered with Jacobi, and CG also with AMG;
  ``tfqmr`` only when pinned (SciPy's TFQMR has no breakdown test and stagnates on problems
  the others solve).
- ``matmul``: ``spmm`` (SciPy's CSR/CSC kernels on zero-copy views).
- ``lstsq``: ``lsqr``, ``lsmr`` (SciPy's LSQR and LSMR, any m x n, damped or not).
- ``eigsh``: ``arpack`` (``eigsh``: extreme or shift-invert with sigma, generalized with M),
  ``lobpcg``; ``eigs``: ``arpack`` (left eigenvectors by shifted inverse iteration);
  ``logdet``: ``lu`` (SuperLU: slogdet in log space, solves from the same factors).

It declines, with the reason: other devices and dtypes, formats with BATCH levels, methods whose
structural needs are not met (CG and AMG without SPD, MINRES without symmetry, exactly as the
torch backend), ``cholesky`` (SciPy has no sparse Cholesky), preconditioners a method cannot use
(ILU under CG/MINRES), and everything AMG when PyAMG is not installed.

This module imports only torch and sparsetorch: SciPy and PyAMG are imported when a plan is built.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Callable

import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer, Request
from sparsetorch.backend import (
    batch_size, conversion_note, cpu_matrix_decline, dtype_name, hermitian, rates, spd_ok,
)

from . import __version__, cost

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "NAME", "KRYLOV", "SOLVE_METHODS", "DTYPES"]

#: The backend's name; the entry point (pyproject.toml) has the same one.
NAME = "scipy"
KRYLOV = ("cg", "bicgstab", "gmres", "lgmres", "gcrotmk", "minres", "tfqmr")
SOLVE_METHODS = ("lu", *KRYLOV, "amg")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
PRECONDITIONERS = ("jacobi", "ilu", "amg")

_INSTALL = {
    "scipy": "not installed: pip install scipy",
    "pyamg": "not installed: pip install 'sparsetorch-scipy[amg]' (or pip install pyamg); method 'amg' and "
             "preconditioner 'amg' need it",
}
#: Methods of the shared vocabulary this backend does not have, and why (said when pinned).
_ELSEWHERE = {
    "cholesky": "SciPy has no sparse Cholesky (SuperLU is LU only); use method='lu' (symmetric patterns get "
                "SuperLU's symmetric mode, half the fill of a general LU) or 'cg'",
    "ldlt": "SciPy has no sparse LDL^T; use method='lu' or 'minres' (symmetric indefinite)",
    "qr": "SciPy has no sparse QR; use method='lu' or the torch backend",
    "dense": "the scipy backend factors sparse matrices only; use method='lu' or the torch backend's dense LU",
    "lsqr": "lsqr is a least-squares method: call sparsetorch.ops.lstsq.lstsq(A, B, method='lsqr') (op 'lstsq'); for a "
            "square system use method='lu' or a Krylov method",
    "lsmr": "lsmr is a least-squares method: call sparsetorch.ops.lstsq.lstsq(A, B, method='lsmr') (op 'lstsq'); for a "
            "square system use method='lu' or a Krylov method",
}
LSTSQ_METHODS = ("lsqr", "lsmr")
EIGSH_METHODS = ("arpack", "lobpcg")


@functools.lru_cache(maxsize=None)
def _installed(module: str) -> bool:
    # find_spec locates the package without importing it (import sparsetorch must stay light).
    return importlib.util.find_spec(module) is not None


def _missing(module: str) -> str | None:
    return None if _installed(module) else _INSTALL[module]


#: the ``backend_options`` keys this backend reads (README, "backend_options"); the core's own
#: ``allow_transfer`` and ``dimension`` are read here too
BACKEND_OPTIONS = ("link_bandwidth", "permc_spec", "diag_pivot_thresh", "symmetric_mode", "panel_size", "relax",
                   "check_pivots", "reuse_ordering", "ilu_drop_tol", "ilu_fill_factor", "amg", "amg_cycle", "amg_reuse",
                   "curvature_check", "lobpcg_preconditioner")


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description (cheap: no SciPy import)."""
    missing = {m: why for m in ("scipy", "pyamg") if (why := _missing(m)) is not None}
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="SciPy: SuperLU, Krylov methods (cg, bicgstab, gmres, lgmres, gcrotmk, minres, tfqmr), "
                    "Jacobi/ILU/AMG (PyAMG) preconditioners, sparse @ dense; CPU",
        devices=("cpu",),
        dtypes=DTYPES,
        ops={"solve": SOLVE_METHODS, "matmul": ("spmm",), "lstsq": LSTSQ_METHODS, "eigsh": EIGSH_METHODS,
             "eigs": ("arpack",), "logdet": ("lu",)},
        formats=(),  # consumes CSR and CSC without a copy; other formats are converted once (costed)
        missing=missing,
        priority=0,
        options=BACKEND_OPTIONS,
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    """Offers (with cost) and declines (with reasons) for one request."""
    if request.op not in ("solve", "matmul", "lstsq", "eigsh", "eigs", "logdet"):
        return []
    general = _general_decline(request)
    if general is not None:
        return [Decline(NAME, general)]
    if request.device.type != "cpu":  # allowed by _general_decline: run on the host, copies costed
        return _with_transfer(request, _answers(request, rates(torch.device("cpu"))))
    return _answers(request, rates(request.device))


def _with_transfer(request: Request, answers: list[Offer | Decline]) -> list[Offer | Decline]:
    from ._transfer import TransferPlan, transfer_seconds

    seconds, nbytes = transfer_seconds(request)
    out: list[Offer | Decline] = []
    for a in answers:
        if isinstance(a, Decline):
            out.append(a)
            continue

        def build(A: sparsetorch.SparseTensor, req: Request, _inner: Callable[..., Any] = a.build) -> Any:
            return TransferPlan(_inner, A, req)

        note = (f"{a.notes}; on the host: copies {nbytes / 1e6:.3g} MB between {request.device} and the CPU "
                f"(A's values and pattern, B, X; costed at backend_options link_bandwidth)")
        out.append(Offer(a.backend, a.method, a.seconds + seconds, a.bytes + int(nbytes), build, note, a.preconditioner,
                         setup=a.setup, iterations=a.iterations))
    return out


def _answers(request: Request, r: Any) -> list[Offer | Decline]:
    if request.op == "matmul":
        seconds, peak = cost.spmm_cost(r, request)
        return [Offer(NAME, "spmm", seconds, peak, _spmm_factory, "SciPy CSR/CSC kernel on zero-copy views"
                      + conversion_note(request))]
    if request.op == "lstsq":
        return _lstsq_answers(request, r)
    if request.op in ("eigsh", "eigs"):
        return _eigen_answers(request, r)
    if request.op == "logdet":
        return [_logdet_answer(request, r)]
    return _solve_answers(request, r)


def _general_decline(request: Request) -> str | None:
    from ._transfer import allowed

    host_copies = request.A.device.type != "cpu" and allowed(request)
    common = cpu_matrix_decline(request, DTYPES, "SciPy", "which SciPy cannot hold; use a SparseTensorList or the torch "
                                "backend", host_copies=host_copies, same_device=True)
    if common is not None:
        return common
    scipy_missing = _missing("scipy")
    if scipy_missing:
        return f"scipy is {scipy_missing}"
    return None


# --- solve ---------------------------------------------------------------------------------------
def _solve_answers(request: Request, r: Any) -> list[Offer | Decline]:
    method = request.option("method")
    pre = request.option("preconditioner")
    pre_name = None if pre is None else ("user" if callable(pre) else str(pre))
    if pre_name in ("none", "identity"):
        pre_name = "none"
    if pre_name is not None and pre_name not in (*PRECONDITIONERS, "user", "none"):
        return [Decline(NAME, f"preconditioner {pre!r} is not available in the scipy backend "
                              f"({', '.join(PRECONDITIONERS)}, None or a callable)")]
    out: list[Offer | Decline] = []
    if method in _ELSEWHERE:
        out.append(Decline(NAME, _ELSEWHERE[method], method))
    out.append(_lu_answer(request, r, pre_name))
    for m in KRYLOV:
        out += _krylov_answers(request, r, m, pre, pre_name)
    out.append(_amg_answer(request, r, pre_name))
    return out


def _lu_answer(request: Request, r: Any, pre_name: str | None) -> Offer | Decline:
    if pre_name not in (None, "none"):
        return Decline(NAME, "a preconditioner was requested, but LU is a direct method; drop preconditioner= to use it", "lu")
    est = cost.lu_estimate(r, request)
    # the ordering follows the pattern: a complex symmetric A (not Hermitian) gets the symmetric mode too
    symmetric = bool({"symmetric", "hermitian", "spd"} & request.properties)
    mode = ("symmetric mode, min. degree on A^T+A" if symmetric and "zero_diagonal" not in request.properties
            else "COLAMD, partial pivoting")
    pieces = getattr(request.A, "components", None)
    shape = (f"{sum(c for _, _, c in pieces)} independent pieces (block-diagonal)" if pieces
             else f"{cost.fill_dimension(request):.1f}-D sparsity")
    note = (f"SuperLU ({mode}): ~{est.fill / 1e6:.3g}M factor entries, ~{est.flops / 1e9:.3g} Gflop estimated "
            f"for {shape}" + conversion_note(request))
    return Offer(NAME, "lu", est.seconds, est.bytes, _lu_factory, note, factor=est.factor)


def _krylov_answers(request: Request, r: Any, method: str, pre: Any, pre_name: str | None) -> list[Offer | Decline]:
    if method == "cg" and not spd_ok(request, "cg"):
        return [Decline(NAME, "CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)", method)]
    if method == "minres" and not hermitian(request):
        return [Decline(NAME, "MINRES needs a symmetric (Hermitian) matrix", method)]
    if method == "tfqmr" and request.option("method") != "tfqmr":
        return [Decline(NAME, "offered only when asked for (method='tfqmr'): SciPy's TFQMR has no breakdown test and "
                              "stagnated on convection-diffusion where BiCGStab and GMRES converge (measured)", method)]
    if pre_name is not None:
        candidates = [None if pre_name == "none" else pre_name]
    elif request.option("method") is None:
        candidates = ["jacobi"] + (["amg"] if method == "cg" and _installed("pyamg") else [])
    else:
        candidates = [None]  # a pinned method without a preconditioner runs without one (as in the torch backend)
    restart = int(request.option("restart") or 30)
    out: list[Offer | Decline] = []
    for cand in candidates:
        why = _preconditioner_problem(request, method, cand)
        if why is not None:
            out.append(Decline(NAME, why, method))
            continue
        seconds, peak, its = cost.krylov_cost(r, request, method, cand, restart)
        opts = dict(request.options)
        opts["preconditioner"] = pre if cand == "user" else cand
        note = f"~{its} iterations estimated, preconditioner {cand or 'none'}" + conversion_note(request)
        out.append(Offer(NAME, method, seconds, peak, _krylov_factory(method, opts), note, cand,
                         iterations=max(1, int(its))))
    return out


def _preconditioner_problem(request: Request, method: str, pre: str | None) -> str | None:
    if pre == "ilu" and method in ("cg", "minres"):
        return (f"ILU (SuperLU's spilu) is not symmetric, and {method.upper()} needs a symmetric positive definite "
                f"preconditioner: use 'jacobi' or 'amg', or gmres/bicgstab with 'ilu'")
    if pre == "amg":
        missing = _missing("pyamg")
        if missing:
            return f"preconditioner 'amg' needs pyamg, which is {missing}"
        if method == "minres" and "spd" not in request.properties:
            return "MINRES needs a symmetric positive definite preconditioner; an AMG cycle is one only for SPD A (pass properties='spd' if it is)"
        why = _amg_options_problem(request)
        if why is not None:
            return why
    return None


def _amg_options_problem(request: Request) -> str | None:
    bo = request.option("backend_options") or {}
    kind = bo.get("amg", "smoothed_aggregation")
    kind = {"sa": "smoothed_aggregation", "rs": "ruge_stuben", "classical": "ruge_stuben"}.get(kind, kind)
    if kind not in ("smoothed_aggregation", "ruge_stuben"):
        return f"backend_options amg={bo.get('amg')!r} is not a PyAMG solver; use 'smoothed_aggregation' or 'ruge_stuben'"
    if kind == "ruge_stuben" and request.dtype.is_complex:
        return f"PyAMG's ruge_stuben is real only; A is {dtype_name(request.dtype)} (use amg='smoothed_aggregation')"
    reuse = bo.get("amg_reuse", "values")
    if not (reuse in ("values", "pattern") or (isinstance(reuse, (int, float)) and not isinstance(reuse, bool)
                                               and reuse >= 0)):
        return (f"backend_options amg_reuse={reuse!r} is not a reuse policy; use 'values' (the default), 'pattern' or "
                f"a relative tolerance >= 0 such as 0.05")
    return None


def _amg_answer(request: Request, r: Any, pre_name: str | None) -> Offer | Decline:
    missing = _missing("pyamg")
    if missing:
        return Decline(NAME, f"pyamg is {missing}", "amg")
    if not spd_ok(request, "amg"):
        return Decline(NAME, "AMG (PyAMG as the solver) needs a symmetric positive definite matrix (not detected; pass "
                             "properties='spd' if it is)", "amg")
    if pre_name not in (None, "none"):
        return Decline(NAME, "method 'amg' is the multigrid solver itself; for AMG-preconditioned Krylov use "
                             "method='cg' (or gmres, ...) with preconditioner='amg'", "amg")
    why = _amg_options_problem(request)
    if why is not None:
        return Decline(NAME, why, "amg")
    if (request.option("backend_options") or {}).get("amg_reuse", "values") != "values":
        from .amg import SOLVER_REUSE  # no SciPy/PyAMG import: amg.py imports them lazily

        return Decline(NAME, SOLVER_REUSE, "amg")
    seconds, peak, its = cost.amg_solver_cost(r, request)
    kind = (request.option("backend_options") or {}).get("amg", "smoothed_aggregation")
    return Offer(NAME, "amg", seconds, peak, _amg_factory, f"PyAMG {kind}: ~{its} V-cycles estimated" + conversion_note(request),
                 iterations=max(1, int(its)))


# --- lstsq -----------------------------------------------------------------------------------------
def _lstsq_answers(request: Request, r: Any) -> list[Offer | Decline]:
    out: list[Offer | Decline] = []
    asked = request.option("method")
    if asked is not None and asked not in LSTSQ_METHODS:
        out.append(Decline(NAME, f"least squares in the scipy backend is {' or '.join(LSTSQ_METHODS)}; method {asked!r} is "
                                 f"not a least-squares method here", asked))
    for method in LSTSQ_METHODS:
        seconds, peak, its = cost.lstsq_cost(r, request, method)
        note = f"SciPy {method.upper()}: ~{its} iterations estimated (2 products each)" + conversion_note(request)
        out.append(Offer(NAME, method, seconds, peak, _lstsq_factory(method), note))
    return out


# --- eigsh / eigs / logdet ---------------------------------------------------------------------------
def _eigen_answers(request: Request, r: Any) -> list[Offer | Decline]:
    n = request.A.n
    k = int(request.option("k") or 6)
    sigma = request.option("sigma")
    which = request.option("which") or ("LA" if request.op == "eigsh" else "LM")
    out: list[Offer | Decline] = []
    asked = request.option("method")
    methods = EIGSH_METHODS if request.op == "eigsh" else ("arpack",)
    if asked is not None and asked not in methods:
        out.append(Decline(NAME, f"{request.op} in the scipy backend is {' or '.join(methods)}; not {asked!r}", asked))
    limit = n - 1 if request.op == "eigsh" else n - 2
    if k > limit:
        out.append(Decline(NAME, f"ARPACK needs k <= {'n - 1' if request.op == 'eigsh' else 'n - 2'} (k={k}, n={n}); use "
                                 f"method='dense' (torch backend) for all eigenvalues of a small matrix", "arpack"))
    else:
        seconds, peak, note = cost.arpack_cost(r, request, k, sigma is not None or which == "SM"
                                               or (which == "SA" and "spd" in request.properties))
        factory = _eigsh_factory("arpack") if request.op == "eigsh" else _eigs_factory
        out.append(Offer(NAME, "arpack", seconds, peak, factory, note + conversion_note(request)))
    if request.op == "eigsh":
        if sigma is not None or which not in ("LA", "SA"):
            out.append(Decline(NAME, f"LOBPCG finds the largest or smallest eigenvalues (which 'LA'/'SA', no sigma); got "
                                     f"which={which!r}, sigma={sigma!r}: use method='arpack'", "lobpcg"))
        elif n < 5 * k:
            out.append(Decline(NAME, f"LOBPCG needs n >= 5k (n={n}, k={k}; SciPy would switch to a dense solver): use "
                                     f"method='arpack' or 'dense'", "lobpcg"))
        else:
            seconds, peak, note = cost.lobpcg_cost(r, request, k)
            out.append(Offer(NAME, "lobpcg", seconds, peak, _eigsh_factory("lobpcg"), note + conversion_note(request)))
    return out


def _logdet_answer(request: Request, r: Any) -> Offer | Decline:
    if request.A.shape[-1] != request.A.shape[-2]:
        return Decline(NAME, f"logdet needs a square matrix, got {request.A.shape[-2]}x{request.A.shape[-1]}", "lu")
    est = cost.lu_estimate(r, request)
    seconds = est.seconds + r.seconds(bytes=est.fill * 12 * batch_size(request) / cost.STREAM_FACTOR)  # U's diagonal: a copy of U
    note = (f"SuperLU: slogdet from U's diagonal and the permutations' signs (log space); ~{est.fill / 1e6:.3g}M factor "
            f"entries estimated" + conversion_note(request))
    return Offer(NAME, "lu", seconds, est.bytes, _logdet_factory, note, factor=est.factor)


# --- plan factories (SciPy/PyAMG are imported here, when a plan is built) --------------------------
def _lu_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .lu import SuperLUPlan

    return SuperLUPlan(A, request.options, backend=NAME)


def _krylov_factory(method: str, options: dict) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .iterative import KrylovPlan

        return KrylovPlan(A, method, options, backend=NAME)

    return build


def _amg_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .amg import AMGPlan

    return AMGPlan(A, request.options, backend=NAME)


def _eigsh_factory(method: str) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .spectral import EigshPlan

        return EigshPlan(A, method, request.options, request.properties, backend=NAME)

    return build


def _eigs_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .eigs import EigsPlan

    return EigsPlan(A, request.options, backend=NAME)


def _logdet_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .logdet import LogdetPlan

    return LogdetPlan(A, request.options, backend=NAME)


def _lstsq_factory(method: str) -> Callable[..., Any]:
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .lstsq import LstsqPlan

        return LstsqPlan(A, method, request.options, backend=NAME)

    return build


def _spmm_factory(A: sparsetorch.SparseTensor, request: Request) -> Any:
    from .matmul import SpmmPlan

    return SpmmPlan(A, backend=NAME)
