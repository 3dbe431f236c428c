"""The cudss backend's hook implementations (the module named by the entry point ``cudss``).

Offers, for ``solve`` on CUDA tensors (float32, float64, complex64, complex128):

- ``cholesky`` (cuDSS SPD / HPD) when A is known or detected SPD, or asked for on a symmetric A;
- ``ldlt`` (cuDSS symmetric / Hermitian indefinite) when A is symmetric (Hermitian);
- ``lu`` (cuDSS general) always.

Each offer's cost is the first call's (analysis + factorization + solve, + the adjoint solve when
a gradient is needed) unless a cuDSS plan of the same signature (shape, nse, dtype, device,
method) is alive, in which case it is a re-using call's (refactorization + solve): the notes give
both. When the factors would not fit in free GPU memory the offer says so and the plan runs in
cuDSS's hybrid memory mode (factors in host memory), priced accordingly. The plan checks again
with cuDSS's own estimate after the analysis and switches to hybrid mode if that does not fit;
with
``backend_options={"hybrid_memory": False}`` the backend declines instead, so dispatch moves to
an iterative method rather than into an out-of-memory error.

It declines, with the reason: tensors not on CUDA (no operand is moved), no CUDA device, cuDSS
library not found (with the install command), other dtypes, formats with BATCH levels,
non-square A, preconditioners, and the iterative method names.

This module imports only torch and sparsetorch; libcudss is located without loading it here
and loaded when a plan is built.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer, Request
from sparsetorch.backend import OperandInfo, cuda_matrix_decline, dtype_name, itemsize, rates, spd_ok

from . import __version__, _lib, cost

__all__ = ["sparsetorch_backend_info", "sparsetorch_offers", "NAME", "METHODS", "DTYPES"]

NAME = "cudss"
METHODS = ("lu", "cholesky", "ldlt")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)

#: plans alive, by signature: their analysis is paid (the cost model prices re-using calls)
_live: "weakref.WeakValueDictionary[tuple, Any]" = weakref.WeakValueDictionary()


@functools.lru_cache(maxsize=None)
def _missing() -> str | None:
    path, how = _lib.find_library()
    if path is None:
        return (f"cuDSS library not found ({how}): pip install 'sparsetorch-cudss[cu13]' or 'sparsetorch-cudss[cu12]' "
                f"(the one matching torch.version.cuda), or set {_lib.ENV}")
    return None


@functools.lru_cache(maxsize=None)
def _threaded() -> bool:
    """cuDSS's OpenMP threading layer ships next to the library found (used unless
    host_threads=False; the analysis is then ~3.6x faster, measured)."""
    import glob  # noqa: PLC0415
    import os  # noqa: PLC0415

    path, _ = _lib.find_library()
    return bool(path) and bool(glob.glob(os.path.join(os.path.dirname(path), "libcudss_mtlayer_gomp.so*")))


def _transposed_solve() -> bool:
    """The library found is cuDSS >= 1.0 (``libcudss.so.1``, or not the 0.8 soname): transposed
    solves from the same factors. Read from the file name, without loading the library."""
    path, _ = _lib.find_library()
    return path is None or not path.endswith(".so.0")


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    """Static description (cheap: libcudss is looked for, not loaded)."""
    why = _missing()
    path, how = _lib.find_library()
    return BackendInfo(
        name=NAME,
        version=__version__,
        description="cuDSS sparse direct solver: LU, Cholesky, LDL^T with plan reuse (analysis once per pattern, "
                    "refactorization per value set), uniform value batches, hybrid memory; CUDA"
                    + (f" ({path})" if path else ""),
        devices=("cuda",),
        dtypes=DTYPES,
        ops={"solve": METHODS, "solve_list": METHODS},
        formats=(),
        missing={"cudss": why} if why else {},
        priority=0,
        options=_lib.BACKEND_OPTIONS,
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    if request.op == "solve_list":
        return _list_answers(request)
    if request.op != "solve":
        return []
    general = _general_decline(request)
    if general is not None:
        return [Decline(NAME, general)]
    method = request.option("method")
    if method is not None and method not in METHODS:
        return [Decline(NAME, f"cuDSS is a direct solver ({', '.join(METHODS)}); method {method!r} is iterative or "
                              f"elsewhere: use the torch or cupy backends for it", method)] + [
            Decline(NAME, f"not the requested method {method!r}", m) for m in METHODS]
    pre = request.option("preconditioner")
    if pre is not None and not (isinstance(pre, str) and pre in ("none", "identity")):
        return [Decline(NAME, "a preconditioner was requested, but cuDSS solves directly; drop preconditioner= to use it")]
    r = rates(request.device)
    free = cost.free_device_bytes(request.device)
    # All three are answered whatever the pinned method: the core filters by method and lists
    # the others as "not the requested method".
    return [_answer(request, r, m, free) for m in METHODS]


def _general_decline(request: Request) -> str | None:
    common = cuda_matrix_decline(request, DTYPES, "cuDSS", "cuDSS's uniform batch needs one pattern: use a value-batched "
                                                           "SparseTensor or a SparseTensorList")
    if common is not None:
        return common
    A = request.A
    m, n = A.shape[-2], A.shape[-1]
    if m != n:
        return f"solve needs a square matrix, A is {m}x{n} (use lstsq for least squares)"
    missing = _missing()
    if missing:
        return missing
    return None


def _signature(request: Request, method: str) -> tuple:
    A = request.A
    return (tuple(A.shape), int(A.nse or 0), A.dtype, str(A.device), method)


def _fmt_bytes(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def _answer(request: Request, r: Any, method: str, free: int | None) -> Offer | Decline:
    props = request.properties
    # LDL^T takes a complex symmetric A (cuDSS's SYMMETRIC type) as well as a Hermitian one: any symmetry tag
    symmetric = bool({"symmetric", "hermitian", "spd"} & props)
    if method == "cholesky" and not spd_ok(request, method):
        return Decline(NAME, "Cholesky needs a symmetric positive definite matrix (not detected; pass properties='spd' "
                             "if it is)", method)
    if method == "ldlt" and not symmetric:
        return Decline(NAME, "LDL^T needs a symmetric (Hermitian) matrix", method)
    bo = request.option("backend_options") or {}
    hm = bo.get("hybrid_memory", "auto")
    threaded = _threaded() and bo.get("host_threads", "auto") not in (False, 0)
    est = cost.estimate(r, request, method, free=free, hybrid=None if hm == "auto" else bool(hm), threaded=threaded)
    if not est.fits and hm is False:
        return Decline(NAME, f"the factors need ~{_fmt_bytes(est.device_bytes)} of GPU memory, "
                             f"{_fmt_bytes(free or 0)} is free, and hybrid_memory=False; use an iterative method or "
                             f"allow cuDSS's hybrid memory mode", method)
    live = _signature(request, method) in _live
    call = est.reuse_call if live else est.first_call
    setup = 0.0 if live else est.analysis  # once per pattern: spread by dispatch over expected calls
    if request.requires_grad:
        call += est.solve
        if method == "lu" and not _transposed_solve():  # cuDSS 0.8: the backward factors A^H too
            call += est.factor + (0.0 if live else est.analysis)
            setup += 0.0 if live else est.analysis
    note = (f"cuDSS {method}: analysis ~{est.analysis:.3g} s once per pattern, then ~{est.reuse_call * 1e3:.3g} ms per "
            f"call with new values (refactorization + solve){'; plan alive: priced as a re-using call' if live else ''}"
            f"; factors ~{_fmt_bytes(est.fill * itemsize(request.dtype))}")
    if est.hybrid:
        note += (f"; factors and workspace ~{_fmt_bytes(est.device_bytes)} exceed free GPU memory "
                 f"({_fmt_bytes(free or 0)}): hybrid memory mode (factors in host memory, ~{cost.HYBRID_SLOWDOWN:g}x slower)")
    self_adjoint = bool({"hermitian", "spd"} & props) or not request.dtype.is_complex
    # the numeric factorization(s) of this call: kept by the plan while A's values stay the same
    factor = est.factor * (2.0 if request.requires_grad and method == "lu" and not _transposed_solve() else 1.0)
    return Offer(NAME, method, call, est.device_bytes, _factory(method, self_adjoint, est.hybrid, _signature(request, method)), note,
                 setup=setup, factor=max(0.0, min(factor, call - setup)))


def _factory(method: str, hermitian: bool, hybrid: bool, signature: tuple):
    def build(A: sparsetorch.SparseTensor, request: Request) -> Any:
        from .plan import CudssPlan  # noqa: PLC0415

        plan = CudssPlan(A, request.options, method=method, hermitian=hermitian, hybrid=hybrid, backend=NAME)
        _live[signature] = plan
        return plan

    return build


# --- non-uniform batches (SparseTensorList): cuDSS's batch API --------------------------------------
def _member_request(request: Request, n: int, nse: int, k: int) -> Request:
    A = request.A
    ops = (OperandInfo("sparse", (n, n), A.dtype, A.device, None, nse),
           OperandInfo("dense", (n, k), A.dtype, A.device))
    return Request("solve", ops, request.properties, request.options, request.requires_grad)


def _list_answers(request: Request) -> list[Offer | Decline]:
    A = request.A
    if A.kind != "sparse_list":
        return [Decline(NAME, f"solve_list needs a SparseTensorList, got a {A.kind} operand")]
    if A.device.type != "cuda":
        return [Decline(NAME, f"runs on CUDA tensors only; the list is on {A.device}" if torch.cuda.is_available()
                        else f"no CUDA device (the list is on {A.device}); cuDSS runs on NVIDIA GPUs")]
    if A.dtype not in DTYPES:
        return [Decline(NAME, f"supports {', '.join(dtype_name(d) for d in DTYPES)}; the list is {dtype_name(A.dtype)}")]
    for op in request.operands[1:]:
        if op.device != A.device:
            return [Decline(NAME, f"operands on different devices ({A.device} and {op.device}); put them on one GPU")]
    missing = _missing()
    if missing:
        return [Decline(NAME, missing)]
    pre = request.option("preconditioner")
    if pre is not None and not (isinstance(pre, str) and pre in ("none", "identity")):
        return [Decline(NAME, "a preconditioner was requested, but cuDSS solves directly; drop preconditioner= to use it")]
    sizes = request.option("list_sizes") or ()
    r = rates(request.device)
    free = cost.free_device_bytes(request.device)
    out: list[Offer | Decline] = []
    for method in METHODS:
        first = _answer(_member_request(request, *sizes[0]), r, method, free) if sizes else None
        if isinstance(first, Decline):
            out.append(first)
            continue
        ests = [cost.estimate(r, _member_request(request, n, nse, k), method, threaded=_threaded())
                for n, nse, k in sizes]
        saved = (len(ests) - 1) * 3 * r.seconds(launches=cost.CALL_LAUNCHES)  # one call per phase for all
        seconds = max(0.0, sum(e.first_call for e in ests) - saved)
        if request.requires_grad:
            seconds += sum(e.solve for e in ests)
        device_bytes = sum(e.device_bytes for e in ests)
        if free is not None and device_bytes > 0.8 * free:
            out.append(Decline(NAME, f"the list's factors need ~{_fmt_bytes(device_bytes)}, {_fmt_bytes(free)} free: "
                                     f"solve the members one by one", method))
            continue
        hermitian = bool({"hermitian", "spd"} & request.properties) or not request.dtype.is_complex
        note = (f"cuDSS batch API, {len(sizes)} matrices ({sum(s[0] for s in sizes)} unknowns): one analysis, one "
                f"factorization and one solve call for all; ~{sum(e.reuse_call for e in ests) * 1e3:.3g} ms per call "
                f"with new values")
        out.append(Offer(NAME, method, seconds, int(device_bytes), _list_factory(method, hermitian), note))
    return out


def _list_factory(method: str, hermitian: bool):
    def build(As: sparsetorch.SparseTensorList, request: Request) -> Any:
        from .batch import CudssListPlan  # noqa: PLC0415

        return CudssListPlan(As, request.options, method=method, hermitian=hermitian, backend=NAME)

    return build
