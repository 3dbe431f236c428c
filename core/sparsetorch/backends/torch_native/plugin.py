"""The torch backend's hook implementations (registered like any plugin, under the name "torch").

Offers, per request:

- ``matmul``: ``spmm`` on any device (torch sparse CSR kernels; other formats are converted
  to CSR once per pattern, and that conversion is costed).
- ``solve``: ``cg`` (SPD), ``minres`` (symmetric), ``bicgstab`` and ``gmres`` (any square A),
  with Jacobi, block-Jacobi or a user preconditioner; ``lu``/``cholesky`` on the dense matrix
  for small systems (up to ``dense_max`` unknowns, 4096 by default).

It declines, with the reason: methods whose structural needs are not met (CG without SPD,
MINRES without symmetry), ``amg`` and the sparse direct methods it does not have, and
dense fallbacks beyond the size limit.
"""

from __future__ import annotations

import math

import torch

from ..._version import __version__
from ..._markers import hookimpl
from ...dispatch.calibrate import rates
from ...dispatch.kit import hermitian, spd_ok
from ...dispatch.records import BackendInfo, Decline, Offer, Request
from ...format import CSR
from . import cost

DENSE_MAX = 4096
_ITERATIVE = ("cg", "minres", "bicgstab", "gmres")
_FULL = (torch.float32, torch.float64, torch.complex64, torch.complex128)
#: products only (accumulated in float32, see spmm.py); solves and spectral ops decline them
_HALF = (torch.float16, torch.bfloat16)


#: the ``backend_options`` keys this backend reads (``cuda_graph``: False replays no CUDA graphs in CG)
BACKEND_OPTIONS = ("cuda_graph", "ssor_omega", "poly_degree", "poly_ratio")


@hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    return BackendInfo(
        name="torch",
        version=__version__,
        description="built-in pure PyTorch: torch sparse kernels, Krylov methods, dense fallback",
        devices=("cpu", "cuda", "mps", "xpu"),
        dtypes=_FULL + _HALF,
        ops={"matmul": ("spmm",), "solve": (*_ITERATIVE, "lu", "cholesky"), "eigsh": ("dense", "lanczos", "lobpcg"),
             "eigs": ("dense",), "logdet": ("dense",), "lstsq": ("dense",)},
        formats=(CSR,),
        priority=0,
        distribution="sparsetorch",
        options=BACKEND_OPTIONS,
    )


@hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    A = request.A
    if A.dtype in _HALF and request.op != "matmul":
        return [Decline("torch", _half_reason(request.op, A.dtype))]
    if A.dtype not in _FULL + _HALF:
        return [Decline("torch", f"dtype {A.dtype} is not supported (float32/64, complex64/128; float16/bfloat16 "
                                 f"for matmul)")]
    r = rates(A.device)
    if request.op == "matmul":
        return [_matmul_offer(request, r)]
    if request.op == "solve":
        return _solve_offers(request, r)
    if request.op in ("eigsh", "eigs", "logdet"):
        from .spectral_offers import spectral_offers

        return spectral_offers(request, r)
    if request.op == "lstsq":
        return _lstsq_offers(request, r)
    return [Decline("torch", f"op {request.op!r} is not implemented by the torch backend")]


def _half_reason(op: str, dtype: torch.dtype) -> str:
    name = str(dtype).replace("torch.", "")
    return (f"{op} in {name} is not supported: its residual tests, pivots and orthogonalizations need more "
            f"digits than {name} keeps; run it in float32 or float64 (A.to(torch.float32), b.float()) and cast "
            f"the result back (mixed precision); {name} is supported for matmul")


def _needs_conversion(request: Request) -> bool:
    fmt = request.A.format
    return fmt is not None and fmt != CSR and fmt.num_batch_levels == 0


def _matmul_offer(request: Request, r) -> Offer:
    from .spmm import TorchSpmmPlan

    k = request.rhs_columns
    secs = cost.spmm_seconds(r, request, k)
    notes = "torch sparse CSR kernel"
    setup = 0.0
    if _needs_conversion(request):
        setup = cost.conversion_cost(r, request.A.nse or 0)
        secs += setup
        notes += f"; converts {request.A.format.name or 'the format'} to CSR once per pattern (costed)"
    nse = request.A.nse or 0
    return Offer("torch", "spmm", secs, int(nse * 16), lambda A, req: TorchSpmmPlan(A), notes, setup=setup)


def _solve_offers(request: Request, r) -> list[Offer | Decline]:
    from .dense import DenseLUPlan

    A = request.A
    props = request.properties
    n = A.shape[-1]
    out: list[Offer | Decline] = []
    pre = request.option("preconditioner")
    pre_name = pre if isinstance(pre, str) or pre is None else "user"
    if pre_name is None and request.option("method") is None:
        pre_name = "jacobi"  # a cheap default that never hurts much; explain shows it
    unknown = isinstance(pre_name, str) and pre_name not in ("jacobi", "block_jacobi", "none", "identity", "user",
                                                             *cost.PATTERN_PRECONDITIONERS)
    if unknown:
        # never offer what the plan would refuse: the iterative methods are declined, by name
        for method in _ITERATIVE:
            out.append(Decline("torch", f"preconditioner {pre_name!r} is not available here (jacobi, block_jacobi, "
                                        f"ic0, ilu0, ssor, polynomial, None or a callable)", method))
    for method in () if unknown else _ITERATIVE:
        asked = request.option("method") == method
        if pre_name == "ilu0" and method in ("cg", "minres"):
            out.append(Decline("torch", f"ILU(0) is not symmetric, which {method.upper()} needs: use "
                                        f"preconditioner='ic0' (or 'ssor', 'polynomial', 'jacobi')", method))
            continue
        if pre_name == "ic0" and not hermitian(request):
            out.append(Decline("torch", "IC(0) needs a Hermitian (symmetric) matrix" + _not_hermitian_note(request)
                               + "; use preconditioner='ilu0'", method))
            continue
        if method == "cg" and "spd" not in props and not (asked and hermitian(request)):
            out.append(Decline("torch", "CG needs a symmetric positive definite matrix (not detected; pass properties='spd' if it is)"
                               + _not_hermitian_note(request), method))
            continue
        if method == "minres" and not hermitian(request):
            out.append(Decline("torch", "MINRES needs a symmetric (Hermitian) matrix" + _not_hermitian_note(request), method))
            continue
        secs, peak, its = cost.krylov_cost(r, request, method, pre_name)
        conv = _needs_conversion(request)
        setup = cost.conversion_cost(r, A.nse or 0) if conv else 0.0
        secs += setup
        note = f"~{its} iterations estimated, preconditioner {pre_name or 'none'}" + ("; converts to CSR once" if conv else "")
        if method == "cg" and cost.cuda_graph(request, pre_name):
            note += f"; CUDA graph per {int(request.option('check_every') or 8)} iterations"
        opts = dict(request.options)
        opts["preconditioner"] = pre if pre is not None else (None if pre_name in (None, "none", "identity") else pre_name)
        out.append(Offer("torch", method, secs, peak, _krylov_factory(method, opts), note, pre_name, setup=setup,
                         iterations=max(1, int(its))))
    dense_max = int(request.option("dense_max") or DENSE_MAX)
    for method in ("lu", "cholesky"):
        if method == "cholesky" and not spd_ok(request, method):
            out.append(Decline("torch", "Cholesky needs a symmetric positive definite matrix (not detected; pass "
                                        "properties='spd' if it is)", method))
            continue
        if n > dense_max:
            out.append(Decline("torch", f"dense {method} only up to {dense_max} unknowns (n={n}); raise dense_max= to force", method))
            continue
        secs, peak = cost.dense_cost(r, request, method == "cholesky")
        chol = method == "cholesky"
        out.append(Offer("torch", method, secs, peak, lambda A, req, chol=chol: DenseLUPlan(A, cholesky=chol),
                         f"dense {'Cholesky' if chol else 'LU'} of a {n}x{n} matrix",
                         factor=min(secs, cost.dense_factor_share(r, request, chol))))
    for method in ("ldlt", "qr", "lgmres", "tfqmr", "lsqr", "lsmr", "amg"):
        if request.option("method") == method:
            out.append(Decline("torch", f"method {method!r} is not in the torch backend (try the scipy plugin)", method))
    return out


#: the dense least-squares SVD is offered while the smaller side is at most this and the matrix at most
#: LSTSQ_DENSE_MAX^2 entries (128 MiB in float64)
LSTSQ_DENSE_MAX = 4096


def _lstsq_offers(request: Request, r) -> list[Offer | Decline]:
    """``dense``: the SVD of the dense matrix (:class:`~.dense.DenseLstsqPlan`), any rank, any shape, damp. Its
    ``6 M N^2 + 20 N^3`` flops (M >= N the sides; the thin R-SVD's count) rank it after LSQR / LSMR and a sparse
    QR on all but small matrices; a Krylov choice that does not converge hands over to it."""
    from .dense import DenseLstsqPlan

    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    big, small = max(m, n), min(m, n)
    if small > LSTSQ_DENSE_MAX or m * n > LSTSQ_DENSE_MAX ** 2:
        return [Decline("torch", f"dense least squares only up to min(m, n) = {LSTSQ_DENSE_MAX} and "
                                 f"{LSTSQ_DENSE_MAX}^2 entries (A is {m}x{n}); use the scipy plugin's 'lsqr' / "
                                 f"'lsmr' or the eigen plugin's 'qr'", "dense")]
    batch = max(1, math.prod(A.batch_shape))
    vsize = cost._itemsize(A.dtype)
    k = request.rhs_columns
    flops = (6.0 * big * small * small + 20.0 * small ** 3) * batch
    factor = r.seconds(bytes=4 * m * n * vsize * batch, flops=flops, launches=20 * batch)
    solves = r.seconds(bytes=2 * (m + n) * small * vsize * batch, flops=4.0 * (m + n) * small * k * batch,
                       launches=6 * batch)
    return [Offer("torch", "dense", factor + solves, int(3 * m * n * vsize * batch), lambda A_, req: DenseLstsqPlan(A_),
                  f"SVD of the dense {m}x{n} matrix (minimum-norm, any rank)", factor=factor)]


def _krylov_factory(method: str, options: dict):
    from .iterative import KrylovPlan

    return lambda A, req: KrylovPlan(A, method, options, hermitian=_self_adjoint(req))


def _self_adjoint(request) -> bool:
    """A known (given or detected) to equal its conjugate transpose: adjoint solves are forward ones."""
    return hermitian(request)


def _not_hermitian_note(request: Request) -> str:
    """What a decline adds for a complex A tagged only ``"symmetric"`` (``A == A^T``, not ``A^H``)."""
    if request.dtype.is_complex and "symmetric" in request.properties and not hermitian(request):
        return ("; a complex symmetric A (A == A^T) is not Hermitian (A == A^H): use gmres / bicgstab or lu, or tag "
                "properties='hermitian' if A == A^H")
    return ""
