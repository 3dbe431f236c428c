"""``solve`` and the stateful ``Solver``: sparse linear systems through dispatch, with gradients."""

from __future__ import annotations

from dataclasses import replace

import dataclasses

import math
import threading

from typing import Any, Callable, Sequence

import torch

from ..autograd.solve import SolveHandle, register_solver_object, route_for, solve_call
from ..dispatch.plan import PlanState, call_options, obtain_plan
from ..dispatch.records import make_request
from ..dispatch import experience
from ..dispatch.options import SolveOptions, defaults
from ..dispatch.records import ExplainTable
from ..dispatch.select import backend_hint, check_backend_options, get_backends, unknown_method
from ..errors import (BackendError, IndefiniteMatrixError, InputError, NoBackendError, NotSymmetricError, SingularMatrixError,
                      SparseTorchError)
from ..tensor import SparseTensor, SparseTensorList
from ..tensor._compiling import compiling
from .accuracy import default_rtol
from ..tensor.sparse_tensor import is_plain, vmapped
from ..tensor.pattern import version_of
from ..tensor.validate import check_finite_rhs
from ._inputs import (as_rhs, check_finite as check_finite_values, check_matrix, describe_dense, describe_factored,
                      index_buffers_now, index_buffers_unchanged, restore_rhs)
from .info import SolveInfo
from .operator import solve_operator
from .properties import detect, normalize_tags, recall, remember

__all__ = ["solve", "Solver", "solve_request"]

_POLICIES = ("raise", "warn", "ignore")
#: How many solves a :class:`Solver` expects to serve when not told (``repeat=``).
SOLVER_REPEAT = 10


#: The keyword options of solve/Solver/explain("solve") with their defaults (the record's).
SOLVE_DEFAULTS: dict[str, Any] = defaults(SolveOptions)


def options_from_kwargs(where: str, options: dict[str, Any]) -> SolveOptions:
    """Validated solve options from keyword arguments (unknown names raise with the known ones)."""
    unknown = set(options) - set(SOLVE_DEFAULTS)
    if unknown:
        raise InputError(f"{where} got unknown options {sorted(unknown)}; known: {sorted(SOLVE_DEFAULTS)}")
    return _options(**{**SOLVE_DEFAULTS, **options})


def _options(
    backend, method, preconditioner, rtol, atol, maxiter, restart, block_size, dense_max, max_bytes, callback, check_every,
    backend_options=None, repeat=None,
) -> SolveOptions:
    """The validated record (dispatch/options.py holds the checks and the defaults)."""
    return SolveOptions(backend=backend, method=method, preconditioner=preconditioner, rtol=rtol, atol=atol,
                        maxiter=maxiter, restart=restart, block_size=block_size, dense_max=dense_max,
                        max_bytes=max_bytes, callback=callback, check_every=check_every,
                        backend_options=backend_options or {}, repeat=repeat)


def _progress_callback(progress: bool, callback: Callable | None, maxiter: int | None) -> tuple[Callable | None, Any]:
    if not progress:
        return callback, None
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise InputError("progress=True needs tqdm: pip install tqdm (or pass a callback)") from exc
    bar = tqdm(total=maxiter, desc="solve", unit="it")

    def cb(iteration: int, residual: float) -> None:
        bar.n = iteration
        bar.set_postfix(residual=f"{residual:.2e}")
        bar.refresh()
        if callback is not None:
            callback(iteration, residual)

    return cb, bar


def solve_request(A: SparseTensor, B: torch.Tensor | None, properties, options: dict[str, Any],
                  detected: list | None = None):
    """The dispatch request of a solve: detected (or given) properties, the tolerance resolved
    for A's dtype (the accuracy contract: ``rtol=None`` is 1e-10 in float64, 1e-5 in float32),
    and what iterative solves measured on A's pattern before. Properties detected on these very
    values before are recalled (``properties.recall``); ``detected``: a list that gets True
    appended when detection ran (the caller may then ``properties.remember`` them)."""
    tags = normalize_tags(properties)
    props = tags
    if props is None:
        props = recall(A)
        if props is None:
            props = detect(A)
            if detected is not None:
                detected.append(True)
    operands = (describe_factored(A, props),) + ((describe_dense(B),) if B is not None else ())
    if options.get("rtol") is None:
        rtol = default_rtol(A.dtype)
        options = options.trusted_replace(rtol=rtol) if isinstance(options, SolveOptions) else {**options, "rtol": rtol}
    return make_request("solve", operands, props, options, experience.measured_on(A))


def solve(
    A: SparseTensor | SparseTensorList,
    B: torch.Tensor | Sequence[torch.Tensor],
    *,
    backend: str | None = None,
    method: str | None = None,
    preconditioner: str | Callable | None = None,
    rtol: float | None = None,
    atol: float = 0.0,
    maxiter: int | None = None,
    return_info: bool = False,
    properties: str | Sequence[str] | None = None,
    check_finite: bool = True,
    on_nonconvergence: str = "raise",
    callback: Callable[[int, float], None] | None = None,
    progress: bool = False,
    restart: int | None = None,
    block_size: int | None = None,
    dense_max: int | None = None,
    max_bytes: int | None = None,
    check_every: int | None = None,
    backend_options: dict[str, Any] | None = None,
    cache: bool = True,
    repeat: int | None = None,
    params: Sequence[torch.Tensor] | None = None,
):
    """Solve ``A X = B`` for sparse ``A``; differentiable in ``A``'s values and in ``B``.

    ``B`` is a vector ``(n,)``, a block of right-hand sides ``(n, k)``, or either with A's value
    batch in front; batch dimensions broadcast as in ``torch.linalg.solve`` (``B`` is a batch of
    vectors when ``B.ndim == 1`` or ``B.shape == A.shape[:-1]``, else of ``(n, k)`` blocks): an
    unbatched A solves a ``(*batch, n, k)`` B with one factorization (docs/lists.md). ``A`` may also
    be a :class:`SparseTensorList` (``B`` then a list, one per member, or a stacked tensor). The
    backend and method are chosen by estimated cost (``sparsetorch.explain("solve", A, B)`` shows
    the ranking); ``backend=``/``method=`` pin them. Method names: "lu",
    "cholesky", "cg", "bicgstab", "gmres", "minres" (more with plugins: "ldlt", "qr", "lgmres",
    "tfqmr", "lsqr", "lsmr", "amg"). ``preconditioner``: "jacobi", "block_jacobi", "amg"
    (plugins), None, or a callable applying ``M^-1``. Iterative methods stop when
    ``||b - A x|| <= max(rtol * ||b||, atol)`` per right-hand side; ``rtol=None`` is the accuracy
    contract: the answer of a backward-stable direct method in A's dtype (a relative residual of
    1e-10 in float64, 1e-5 in float32, and an answer short of a direct method's backward error
    refined on the same plan; docs/dispatch.md). Every answer is checked by the core (true residual,
    refinement, finiteness); a method dispatch chose that fails hands over to the next one
    (``info.attempts`` lists them; docs/dispatch.md, "Checked answers and fallback").

    Non-convergence raises :class:`~sparsetorch.NotConvergedError` (``on_nonconvergence="warn"``
    warns and returns, ``"ignore"`` returns quietly). ``properties`` ("spd", "symmetric",
    "hermitian", "general") skips detection. With ``return_info=True`` returns ``(X, info)``
    (:class:`SolveInfo`). ``backend_options`` is passed to the backends untouched (options
    only one backend knows, e.g. an ordering). The backward pass is one adjoint solve on the
    same plan.

    ``repeat``: how many solves this sparsity pattern is expected to serve (a training loop's
    step count). Methods with a one-time setup per pattern (cuDSS's analysis, a conversion to
    CSR) are priced with that setup spread over ``repeat`` calls. Without it, dispatch counts
    the calls it has seen on the pattern and expects as many again (so a loop of one-shot
    solves moves to a direct solver once its analysis pays off; ``explain`` shows the spread).

    Iteration controls (iterative methods; direct ones ignore them):

    - ``maxiter``: the iteration limit, counted as the method counts it: GMRES, LGMRES and
      GCROT(m,k) count *restart cycles* of ``restart`` inner iterations (SciPy's meaning, kept by
      every backend), the others single iterations; None: the backend's default. When dispatch
      chose the method (not pinned) it also bounds an attempt by what the next direct method
      would cost.
    - ``restart``: the inner iterations per GMRES cycle (None: the backend's default, 20-30).
    - ``callback(iteration, relative_residual)``: called as the method reports progress, every
      ``check_every`` iterations where the backend supports it (the torch backend and the cuda
      plugin check their residual on the host only then; SciPy's methods report every iteration);
      ``progress=True`` shows a tqdm bar through the same hook.
    - ``block_size``: the diagonal blocks' size of the torch backend's ``preconditioner="block_jacobi"``
      (default 4).
    - ``dense_max``: the largest n a dense factorization is offered for; ``max_bytes``: the memory
      an offer may need (offers above it are declined).
    - ``cache``: keep the plan in the plan cache (False: plan for this call only).

    Matrix-free ``A``: a callable ``x -> A x`` (called on vectors ``(n,)``) or a
    :class:`~sparsetorch.LinearOperator`, with ``B`` of shape ``(n,)`` or ``(n, k)``, is solved by the
    torch backend's Krylov methods ("cg", "minres", "gmres" (the default), "bicgstab"; "cg" / "minres"
    the default where ``properties`` say spd / symmetric); differentiable in ``B`` and in the tensors
    the operator closes over (``params=`` names them, else they are found by one probe product).
    docs/solve.md, "Matrix-free operators".
    """
    if callable(A) and not isinstance(A, (SparseTensor, SparseTensorList, torch.Tensor)):
        # a matrix-free operator: the torch backend's Krylov methods, no dispatch (ops/operator.py)
        if on_nonconvergence not in _POLICIES:
            raise InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
        cb, bar = _progress_callback(progress, callback, maxiter)
        try:
            return solve_operator(A, B, backend=backend, method=method, preconditioner=preconditioner, rtol=rtol,
                                  atol=atol, maxiter=maxiter, restart=restart, return_info=return_info,
                                  properties=properties, check_finite=check_finite,
                                  on_nonconvergence=on_nonconvergence, callback=cb, check_every=check_every,
                                  params=params, block_size=block_size, dense_max=dense_max, max_bytes=max_bytes,
                                  backend_options=backend_options, repeat=repeat)
        finally:
            if bar is not None:
                bar.close()
    if params is not None:
        raise InputError("solve: params= names the tensors a matrix-free A (a callable or LinearOperator) closes over; "
                         f"A is a {type(A).__name__}, whose gradient goes to its values")
    if compiling():
        # under torch.compile: one opaque custom op (sparsetorch::spsolve) whose kernel runs this
        # function at run time, outside the trace (locks, checks and fallback included)
        from ..autograd.compiled import traced_solve  # noqa: PLC0415 - the compiled path only

        return traced_solve(A, B, backend=backend, method=method, preconditioner=preconditioner, rtol=rtol,
                            atol=atol, maxiter=maxiter, return_info=return_info, properties=properties,
                            check_finite=check_finite, on_nonconvergence=on_nonconvergence, callback=callback,
                            progress=progress, restart=restart, block_size=block_size, dense_max=dense_max,
                            max_bytes=max_bytes, check_every=check_every, backend_options=backend_options,
                            cache=cache, repeat=repeat)
    if on_nonconvergence not in _POLICIES:
        raise InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
    if isinstance(A, SparseTensorList):
        Bs = list(B) if not isinstance(B, torch.Tensor) else list(B.unbind(0))
        if len(Bs) != len(A):
            raise InputError(f"a SparseTensorList of {len(A)} matrices needs {len(A)} right-hand sides, got {len(Bs)}")
        # A backend that solves the whole list at once (op "solve_list") takes it when it is
        # pinned or cheaper than the members one by one; otherwise member by member.
        from .solve_list import solve_list_entry  # noqa: PLC0415

        listed = solve_list_entry(A, Bs, properties=properties, check_finite=check_finite, return_info=return_info,
                                  cache=cache, options=_options(backend, method, preconditioner, rtol, atol, maxiter,
                                                                restart, block_size, dense_max, max_bytes, callback,
                                                                check_every, backend_options, repeat))
        if listed is not None:
            return listed
        kw = dict(backend=backend, method=method, preconditioner=preconditioner, rtol=rtol, atol=atol, maxiter=maxiter,
                  return_info=return_info, properties=properties, check_finite=check_finite,
                  on_nonconvergence=on_nonconvergence, callback=callback, progress=progress, restart=restart,
                  block_size=block_size, dense_max=dense_max, max_bytes=max_bytes, check_every=check_every,
                  backend_options=backend_options, cache=cache, repeat=repeat)
        outs = []
        for i, (a, b) in enumerate(zip(A, Bs)):
            try:
                outs.append(solve(a, b, **kw))
            except SparseTorchError as exc:
                # which member: the error keeps its type and fields, its message says where
                if exc.args and isinstance(exc.args[0], str):
                    exc.args = (f"SparseTensorList member {i} of {len(A)}: {exc.args[0]}",) + exc.args[1:]
                raise
        if return_info:
            return [o[0] for o in outs], [o[1] for o in outs]
        return outs
    A = check_matrix(A, "solve", square=True)
    folded = _broadcast_rhs(A, B)
    if folded is not None:
        # batch dimensions of A and B that broadcast (torch.linalg.solve's rules): one solve on the
        # folded system, unfolded after (docs/solve.md, "Broadcasting")
        A2, B2, unfold = folded
        got = solve(A2, B2, backend=backend, method=method, preconditioner=preconditioner, rtol=rtol, atol=atol,
                    maxiter=maxiter, return_info=return_info, properties=properties, check_finite=check_finite,
                    on_nonconvergence=on_nonconvergence, callback=callback, progress=progress, restart=restart,
                    block_size=block_size, dense_max=dense_max, max_bytes=max_bytes, check_every=check_every,
                    backend_options=backend_options, cache=cache, repeat=repeat)
        return (unfold(got[0]), got[1]) if return_info else unfold(got)
    if A.dtype in _HALF and isinstance(B, torch.Tensor) and B.dtype == A.dtype:
        return _half_solve(A, B, return_info, dict(
            backend=backend, method=method, preconditioner=preconditioner, rtol=rtol, atol=atol, maxiter=maxiter,
            properties=properties, check_finite=check_finite, on_nonconvergence=on_nonconvergence, callback=callback,
            progress=progress, restart=restart, block_size=block_size, dense_max=dense_max, max_bytes=max_bytes,
            check_every=check_every, backend_options=backend_options, cache=cache, repeat=repeat))
    Bn, vector = as_rhs(A, B, "solve", rows=A.format_shape[0])
    # NaN/Inf in A or B: checked once, here, before property detection reads the values. Only
    # under torch.func transforms (no storage to read here) is it left to the handle, which runs
    # inside the autograd Function on the tensors the transform hands over.
    checked_here = check_finite and is_plain(A.values) and is_plain(Bn)
    if checked_here:
        check_finite_values(A, Bn, "solve")
    cb, bar = _progress_callback(progress, callback, maxiter)
    options = _options(backend, method, preconditioner, rtol, atol, maxiter, restart, block_size, dense_max, max_bytes, cb,
                       check_every, backend_options, repeat)
    Ap = A
    if vmapped(A.values):
        # torch.func.vmap over A's values: detection and planning cannot read a batched tensor (a
        # data-dependent branch; a plan holding it "escapes" the vmap; session 21's sweep). They see the
        # pattern (properties as given, else general), and the Function's vmap rule solves member by
        # member with plain values
        Ap = A.detach().with_values(torch.zeros(A.values.shape, dtype=A.dtype, device=A.device))
        if properties is None:
            properties = "general"
    detected: list = []
    request = solve_request(Ap, Bn, properties, options, detected)
    state, offer, table = obtain_plan("solve", Ap, request, cache=cache)
    checks = state.checks
    try:
        # Always through the autograd Function: under torch.func transforms it is what unwraps
        # the operands (and its vmap rule batches right-hand sides into one solve). The route and
        # the handle get A detached (its pattern); the values go through the Function.
        X, handle = solve_call("solve", Ap.detach(), request, table, offer, state, A.values, Bn, cache=cache,
                               policy=on_nonconvergence, check_finite=check_finite and not checked_here)
    finally:
        if bar is not None:
            bar.close()
    if detected and Ap is A:
        remember(A, request.properties, state, checks)
    X = restore_rhs(X, vector)
    if not return_info:
        return X
    return X, _info(A, Bn, restore_rhs(X, False) if not vector else X.unsqueeze(-1), handle)



def _broadcast_rhs(A: SparseTensor, B: object) -> tuple[SparseTensor, torch.Tensor, Callable] | None:
    """torch.linalg.solve's broadcasting of ``A X = B`` where :func:`as_rhs` does not read ``B`` as it is:
    ``(A2, B2, unfold)`` with ``solve(A2, B2)`` one system of A's own batch (or none) whose columns hold
    every right-hand side, and ``unfold`` mapping its answer to the broadcast shape; None where ``B`` is
    read as it is (or is no tensor of A's dtype and device: :func:`as_rhs` names what is wrong).

    torch's rules: ``B`` is a batch of vectors when ``B.ndim == 1`` or ``B.shape == A.shape[:-1]``, else a
    batch of ``(n, k)`` matrices; the batch dimensions of A and B broadcast. Both vector readings and an
    unbatched ``B`` over a batched A are :func:`as_rhs`'s own, so what comes here is a matrix ``B``. The
    batch dimensions where A has size 1 (or none) are folded into the columns: one factorization per
    member of A serves them all (A's values are never expanded); those where A has its own members are
    kept (``B`` expanded over them where its size is 1)."""
    if not isinstance(B, torch.Tensor) or B.layout != torch.strided or B.dtype != A.dtype or B.device != A.device:
        return None
    vb = tuple(A.batch_shape)
    nb, n = len(vb), A.format_shape[0]
    shape = tuple(B.shape)
    if B.dim() == nb + 1 and shape == vb + (n,):
        return None  # a batch of vectors (torch's reading of B.shape == A.shape[:-1])
    if B.dim() == nb + 2 and shape[:nb] == vb and shape[-2] == n:
        return None  # A's batch exactly
    if nb and B.dim() in (1, 2) and shape[0] == n:
        return None  # an unbatched vector or block over A's batch
    batch = vb + (n, n)
    if B.dim() < 2 or shape[-2] != n:
        vectors = f"{vb + (n,)}, ({n},)" if nb else f"({n},)"
        raise InputError(
            f"solve: the right-hand side has shape {shape}; for A of shape {batch} it must be {vectors} or "
            f"(*batch, {n}, k) with a batch that broadcasts against A's batch {vb} (torch.linalg.solve's rules: B is "
            f"a batch of vectors only when B.ndim == 1 or B.shape == A.shape[:-1], else its last two dims are (n, k))")
    bb, k = shape[:-2], shape[-1]
    try:
        full = tuple(torch.broadcast_shapes(vb, bb))
    except RuntimeError:
        raise InputError(f"solve: the right-hand side has shape {shape}, whose batch {bb} does not broadcast against "
                         f"A's batch {vb} (A of shape {batch}); torch.linalg.solve's broadcasting rules apply") from None
    va = (1,) * (len(full) - nb) + vb
    kept = [i for i, s in enumerate(va) if s != 1]
    fold = [i for i, s in enumerate(va) if s == 1]
    kept_shape = tuple(full[i] for i in kept)
    fold_shape = tuple(full[i] for i in fold)
    L = len(full)
    A2 = A if tuple(vb) == kept_shape else A.with_values(A.values.reshape(kept_shape + (A.values.shape[-1],)))
    perm = kept + [L] + fold + [L + 1]
    B2 = B.expand(full + (n, k)).permute(perm).reshape(kept_shape + (n, math.prod(fold_shape) * k))
    inverse = [0] * len(perm)
    for j, p in enumerate(perm):
        inverse[p] = j

    def unfold(X: torch.Tensor) -> torch.Tensor:
        return X.reshape(kept_shape + (n,) + fold_shape + (k,)).permute(inverse)

    return A2, B2, unfold


_HALF = (torch.float16, torch.bfloat16)


def _half_solve(A: SparseTensor, B: torch.Tensor, return_info: bool, kw: dict[str, Any]):
    """A float16/bfloat16 system, solved in float32 (mixed precision: no backend factors or
    iterates in half, whose 11 or 8 significant bits would leave a Krylov method or a pivot
    without accuracy) and rounded back to A's dtype: the answer is as accurate as that dtype can
    hold (float32's contract, 1e-5, unless ``rtol`` says otherwise). Differentiable through the
    casts; the backward solve runs in float32 too."""
    half = A.dtype
    X, info = solve(A.with_values(A.values.to(torch.float32)), B.to(torch.float32), return_info=True, **kw)
    X = X.to(half)
    if not return_info:
        return X
    note = f"solved in float32 (the inputs are {str(half).removeprefix('torch.')}), the answer rounded back"
    return X, dataclasses.replace(info, reason=f"{info.reason}; {note}" if info.reason else note)


def _info(A: SparseTensor, Bn: torch.Tensor, Xn: torch.Tensor, handle: SolveHandle) -> SolveInfo:
    res = handle.results[-1]
    route = handle.route
    offer, state = route.offer, route.state
    last = route.attempts[-1] if route.attempts else None
    # the answer may come from outside the route's plans (a least-squares solution in A's range)
    backend, method = (last.backend, last.method) if last is not None and last.succeeded else (offer.backend, offer.method)
    # The route checked the answer it returned by its true residual (worst column and member of
    # ||b - A x|| / ||b||, a power-of-two scaling of b aside, which leaves the ratio unchanged):
    # that is the info's residual. Only an answer without that number is measured here.
    true_res = res.residual if isinstance(res.residual, float) and math.isfinite(res.residual) else None
    if true_res is None:
        from .matmul import matmul_exact

        with torch.no_grad():
            r = Bn - matmul_exact(A.detach(), Xn.detach())
            bn = torch.linalg.vector_norm(Bn, dim=-2)
            rel = torch.linalg.vector_norm(r, dim=-2) / torch.where(bn > 0, bn, torch.ones_like(bn))
            true_res = float(rel.max()) if rel.numel() else 0.0
    return SolveInfo(
        backend=backend, method=method, iterations=res.iterations, residual=true_res,
        converged=res.converged, status=res.status, reason=res.reason, residual_history=tuple(res.history),
        preconditioner=offer.preconditioner, plan_reused=state.reused,
        extra={"estimated_seconds": offer.seconds, "estimated_bytes": offer.bytes,
               "estimated_iterations": offer.iterations},
        attempts=tuple(route.attempts),
    )


#: methods that need A == A^H: a pinned one refuses new values that are not (Solver.update_values)
_HERMITIAN_METHODS = frozenset({"cg", "minres", "cholesky", "ldlt", "amg", "lobpcg", "lanczos"})


class Solver:
    """A solver bound to one matrix pattern: plan once, refactorize on new values, solve many.

    ::

        with Solver(A, method="cg", rtol=1e-8) as s:
            s.plan()                 # choose the backend, pattern-dependent work
            s.factorize()            # numeric phase (factorization / preconditioner)
            x = s.solve(b)           # differentiable in b and in A's values
            s.update_values(v2)      # new values, same pattern: numeric phase only
            x2 = s.solve(b)

    ``plan()`` and ``factorize()`` run on first ``solve`` if not called. Keyword options are
    those of :func:`solve`.
    """

    def __init__(self, A: SparseTensor, *, properties=None, on_nonconvergence: str = "raise", cache: bool = False,
                 check_finite: bool = True, **options: Any) -> None:
        A = check_matrix(A, "Solver", square=True)
        #: NaN / Inf in the values (once per values tensor and version) or in b raise an InputError, as
        #: in solve (a NaN b went to every backend and ended as NotConvergedError, NaN values as a
        #: zero pivot; session 21's sweep)
        self._check_finite = bool(check_finite)
        self._finite_values: tuple | None = None
        # The matrix is its pattern (fixed) plus its values (new ones per update_values); the
        # SparseTensor ``A`` is made from them only when asked for, not on every update.
        self._pattern = A.detach()
        self._values = A.values
        self._A: SparseTensor | None = A
        if on_nonconvergence not in _POLICIES:
            raise InputError(f"on_nonconvergence must be one of {_POLICIES}, got {on_nonconvergence!r}")
        self._policy = on_nonconvergence
        self._properties = properties
        self._options = options_from_kwargs("Solver", options)
        # a backend_options key no backend in reach reads is named now, not at the first solve
        check_backend_options(get_backends(), self._options.backend_options, self._options.backend)
        # an unknown backend or method is named now, not at the first solve
        want = self._options.backend
        if want is not None and want not in get_backends().names:
            raise NoBackendError(f"Solver: backend={want!r} is not loaded{backend_hint(want, get_backends().names)}; "
                                 f"loaded backends: {sorted(get_backends().names)}. "
                                 f"Install its plugin (pip install sparsetorch-<name>) or check SPARSETORCH_PLUGINS")
        bad = unknown_method("solve", self._options.method)
        if bad:
            raise InputError(f"Solver: {bad}")
        if self._options.repeat is None:
            # a Solver is made to be reused: one-time setup is priced over SOLVER_REPEAT solves
            self._options = self._options.replace(repeat=SOLVER_REPEAT)
        self._cache = cache
        #: this Solver's handle in compiled graphs (sparsetorch::solver_solve)
        self._handle = register_solver_object(self)
        self._state: PlanState | None = None
        self._offer = None
        self._table: ExplainTable | None = None
        self._planned_bufs: tuple | None = None
        self._ready_lock = threading.RLock()
        self.results: list = []

    @property
    def A(self) -> SparseTensor:
        """The matrix with its current values (differentiable in them)."""
        if self._A is None:
            self._A = self._pattern.with_values(self._values)
        return self._A

    def plan(self) -> ExplainTable:
        """Choose the backend and method and do the pattern-dependent work."""
        with self._ready_lock:
            return self._plan()

    def _plan(self) -> ExplainTable:
        if self._check_finite and is_plain(self._values):
            # NaN / Inf values named now: dispatch reads the values (symmetry, definiteness), and a pinned method
            # met them as "CG needs a symmetric positive definite matrix" or a zero pivot (session 26's sweep)
            self._check_values(self._values)
        self._request = solve_request(self.A, None, self._properties, self._options)
        repeat = self._options.repeat
        if isinstance(repeat, int) and repeat > 1:
            # a Solver solves many right-hand sides per set of values: its factorization is priced over them too
            self._request = replace(self._request, same_values=repeat)
        self._state, self._offer, self._table = obtain_plan("solve", self.A, self._request, cache=self._cache)
        self._planned_bufs = index_buffers_now(self._pattern)  # the pattern planned for (see _pattern_moved)
        self._call = call_options(self._request)  # the same for every solve of this Solver
        self._state.build()
        return self._table

    def factorize(self) -> "Solver":
        """Numeric phase for the current values (factorization or preconditioner setup).

        A failure that a fallback can answer (a zero pivot of a method without pivoting, an
        indefinite matrix under Cholesky) is left to the next :meth:`solve`, which moves to the
        next method; with a pinned method it raises here."""
        with self._ready_lock:  # (plan, state and values read together: see _ready)
            if self._state is None or self._pattern_moved():
                self._plan()
            elif self._check_finite and is_plain(self._values):
                self._check_values(self._values)  # once per values tensor and version (plan() checked them above)
            state, values = self._state, self._values
            assert state is not None
            try:
                state.load(values)
            except (SingularMatrixError, IndefiniteMatrixError, NotSymmetricError, BackendError):
                if self._options["method"] is not None:
                    raise
        return self

    setup = factorize

    def update_values(self, values: torch.Tensor) -> "Solver":
        """New values on the same pattern (shape, dtype and device of ``A.values``); keeps the plan."""
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != tuple(self._values.shape):
            raise InputError(
                f"update_values needs a tensor of shape {tuple(self._values.shape)}, got "
                f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}"
            )
        if values.dtype != self._values.dtype:
            raise InputError(f"update_values got {values.dtype} values; the plan is for {self._values.dtype} (cast "
                             f"with values.to({self._values.dtype}) or make a new Solver for the other dtype)")
        if values.device != self._values.device:
            raise InputError(f"update_values got values on {values.device}; the matrix is on {self._values.device}")
        if values.layout != torch.strided:
            raise InputError(f"update_values needs dense (strided) values, got layout {values.layout}")
        with self._ready_lock:
            if self._check_finite and is_plain(values) and self._state is not None:
                self._check_values(values)  # before the factorization meets them
            lost = self._state is not None and self._symmetry_lost(values)
            if lost and self._options.method in _HERMITIAN_METHODS:  # refused before the Solver holds them
                raise NotSymmetricError(
                    f"Solver(method={self._options.method!r}) was planned for symmetric (Hermitian) values, and the "
                    f"new values are not symmetric; {self._options.method} needs A == A^H. Make a Solver without "
                    f"method= (dispatch then picks LU or a nonsymmetric Krylov method) or pass method='lu' / 'gmres' / "
                    f"'bicgstab'")
            self._values, self._A = values, None
            if lost:
                # planned again, on these values' properties, by the next solve or factorize (a plan made for a
                # Hermitian A may also answer adjoint solves, the backward pass, with the forward operator)
                self._state = None
            if self._state is not None:
                self.factorize()
        return self

    def _symmetry_lost(self, values: torch.Tensor) -> bool:
        """Whether the plan was chosen for detected symmetric values and the new ones are not (O(nnz) on the
        pattern's cached transpose map): a Solver of CG on an SPD matrix given nonsymmetric values ran 1,440
        iterations to a NotConvergedError (session 32's sweep). Properties the caller gave are not re-checked."""
        request = getattr(self, "_request", None)
        if request is None or self._properties is not None or not {"symmetric", "hermitian", "spd"} & request.properties:
            return False
        from .properties import symmetric_values  # noqa: PLC0415

        return not symmetric_values(self._pattern.with_values(values))

    def solve(self, B: torch.Tensor, *, return_info: bool = False):
        """``X`` with ``A X = B`` (checked, with fallback when dispatch chose the method).

        Safe to call from several threads at once: calls on one plan are serialized by its lock,
        each with its own values and options. ``update_values`` from one thread while another
        solves gives the solving thread either the old or the new values, never a mix."""
        if compiling():
            if return_info:
                raise InputError("Solver.solve under torch.compile does not take return_info=True (a Python object a "
                                 "graph cannot carry); call it outside the compiled region for the info")
            from ..autograd.compiled import traced_solver_solve  # noqa: PLC0415 - the compiled path only

            return traced_solver_solve(self, self._handle, self._values, B)
        self._pattern.ensure_valid()  # index buffers written in place since construction are re-checked
        state, offer, table = self._ready(factorize=is_plain(self._values))
        Bn, vector = as_rhs(self._pattern, B, "Solver.solve", rows=self._pattern.format_shape[0])
        values = self._values
        if self._check_finite and is_plain(values) and is_plain(Bn):
            self._check_inputs(values, Bn)
        X, handle = solve_call("solve", self._pattern, self._request, table, offer, state, values, Bn,
                               cache=self._cache, policy=self._policy, call=self._call)
        route = handle.route
        self.results.extend(handle.results)
        self._keep(state, route)
        out = restore_rhs(X, vector)
        info = _info(self._pattern.with_values(values), Bn, X, handle) if return_info else None
        return (out, info) if return_info else out

    def _keep(self, state: PlanState, route: Any) -> None:
        """After a solve on ``state``: where dispatch fell back, the method that worked is kept for the next
        solves, unless this Solver was planned again meanwhile (an index write: the route's plan is of the
        old pattern); the plan that answered is marked reused."""
        if route.offer is not None and route.offer is not self._offer:
            with self._ready_lock:
                if self._state is state:
                    self._state, self._offer = route.state, route.offer
        (route.state if route.state is not None else state).reused = True

    def _ready(self, factorize: bool) -> tuple:
        """``(state, offer, table)`` of a plan made on A's pattern as it is now: planned (and factorized, where
        ``factorize``) first if not yet, or again after a write to A's index buffers. Under this Solver's lock,
        so that two threads solving right after such a write neither plan twice nor read the state half
        replaced (one of them read None); the values load itself is serialized by the plan's own lock."""
        with self._ready_lock:
            if self._state is None or self._pattern_moved():
                if factorize:
                    self.factorize()
                else:  # a torch.func transform's values: loaded inside the autograd Function, which unwraps them
                    self._plan()
            assert self._state is not None and self._table is not None
            return self._state, self._offer, self._table

    def _pattern_moved(self) -> bool:
        """Whether A's index buffers were written in place (or swapped) since the plan was made: then the plan,
        made on the old pattern, is dropped (True; the caller plans again). A write ``ensure_valid`` accepted
        left the Solver on its old factorization (a singular-matrix error, or the old matrix's answer, where
        ``st.solve`` and ``Matmul`` saw the new pattern; session 27's sweep)."""
        if self._planned_bufs is None or index_buffers_unchanged(self._planned_bufs, self._pattern):
            return False
        self._state, self._offer, self._table, self._planned_bufs = None, None, None, None
        self._finite_values = None
        return True

    def _check_values(self, values: torch.Tensor) -> None:
        key = (id(values), version_of(values))
        if self._finite_values != key:
            check_finite_values(self._pattern.with_values(values.detach()), None, "Solver")
            self._finite_values = key

    def _check_inputs(self, values: torch.Tensor, Bn: torch.Tensor) -> None:
        self._check_values(values)
        check_finite_rhs(Bn, "Solver.solve")

    def _run(self, values: torch.Tensor, Bn: torch.Tensor, adjoint: bool) -> torch.Tensor:
        """The compiled op's kernel: ``X`` with ``A(values) X = Bn`` (``A^H`` when ``adjoint``),
        ``Bn`` ``(*batch, n, k)``, on this Solver's plan and fallback route, no gradient recorded
        (the op's autograd formula is the adjoint rule)."""
        self._pattern.ensure_valid()
        state, offer, table = self._ready(factorize=True)
        route = route_for("solve", self._pattern, self._request, table, offer, state, cache=self._cache)
        handle = SolveHandle(state, self._pattern, adjoint, self._policy, [], call_options=self._call, route=route)
        with torch.no_grad():
            X = handle.run(values, Bn)
        self._keep(state, route)
        return X

    def explain(self) -> ExplainTable:
        if self._table is None:
            self.plan()
        return self._table

    @property
    def backend(self) -> str | None:
        return self._offer.backend if self._offer else None

    @property
    def method(self) -> str | None:
        return self._offer.method if self._offer else None

    def free(self) -> None:
        self._state = None

    def __enter__(self) -> "Solver":
        return self

    def __exit__(self, *exc) -> None:
        self.free()


# the eager kernel of the compiled path's custom op calls this module's solve (the autograd layer
# may not import the ops layer)
from ..autograd._compile_hooks import register_solver  # noqa: E402

register_solver(solve)
