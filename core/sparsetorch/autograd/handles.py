"""Handles: a plan plus what the adjoint rules need (the pattern's entries, the direction).

A handle makes sure the plan holds the values it is asked to use: plans are shared through
the cache, so between a forward solve and its backward another solve on the same pattern may
have loaded other values; the handle notices (by the values' identity and version) and reloads.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import BackendError, IndefiniteMatrixError, NotConvergedError, NotConvergedWarning, SparseTorchError
from ..ops.info import IterationResult, Status
from ..tensor import SparseTensor
from ..tensor.sparse_tensor import is_plain

__all__ = ["PlanState", "SolveHandle", "MatmulHandle", "sddmm", "vmap_columns", "guarded"]


def _token(values: torch.Tensor) -> tuple:
    return (values.data_ptr(), values._version, tuple(values.shape), values.dtype, values.device)


@dataclass
class PlanState:
    """A plan and the values it currently holds.

    Values are recognised by identity and torch's version counter, and, when those match, by
    comparing with a snapshot (O(nnz), far cheaper than a refactorization): writes through
    ``.data`` or a NumPy view keep the version unchanged and must still be seen.

    Plans are shared (the plan cache hands one plan to every call on a pattern), calls are not:
    a caller holds :attr:`lock` from loading its values to the end of its solve or product, so
    another thread can neither swap the values in between nor run the plan concurrently (a plan
    need not be thread safe itself). Per-call options travel as arguments, never on the plan.
    Exceptions a plan raises that are not sparsetorch errors come out as :class:`BackendError`
    naming the backend, method and phase, with the cause chained.
    """

    plan: Any
    token: tuple | None = None
    reused: bool = False
    snapshot: torch.Tensor | None = None
    factory: Any = None
    #: products: set_values is a pointer swap or a gather, no dearer than the comparison, which
    #: on a GPU would also synchronize with the host on every call: always reload, no snapshot.
    #: A plan may say the same of itself with a ``reload_cheap = True`` attribute (Krylov plans:
    #: new values are a pointer swap and a diagonal, and the snapshot would cost an nnz copy).
    reload_always: bool = False
    #: "backend/method", for error messages
    label: str = "plan"
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)

    def build(self) -> Any:
        """Run the plan factory if it has not run yet (pattern-dependent work)."""
        if self.plan is None:
            with self.lock:
                if self.plan is None:
                    self.plan = guarded(self.factory, self.label, "build")
                    self.factory = None
        return self.plan

    def load(self, values: torch.Tensor) -> None:
        with self.lock:
            self._load(values)

    def _load(self, values: torch.Tensor) -> None:
        self.build()
        v = values.detach()
        tok = _token(v)
        if self.reload_always or getattr(self.plan, "reload_cheap", False):
            self.token = None
            guarded(lambda: self.plan.set_values(v), self.label, "set_values")
            self.token = tok
            return
        if tok == self.token and self.snapshot is not None and torch.equal(self.snapshot, v):
            return
        self.token = None  # a set_values that raises leaves no values the plan is known to hold
        guarded(lambda: self.plan.set_values(v), self.label, "set_values")
        self.token = tok
        snap = self.snapshot
        if (snap is not None and snap.shape == v.shape and snap.dtype == v.dtype and snap.device == v.device
                and is_plain(snap) and is_plain(v) and not _overlaps(snap, v)):
            # Refill the snapshot's buffer: a copy into memory already mapped costs a fraction of a
            # new allocation's first touch (measured 3 vs 13 ms for 5M doubles).
            snap.copy_(v)
        else:
            self.snapshot = v.clone()


def guarded(fn: Callable[[], Any], label: str, phase: str) -> Any:
    """``fn()``, with an exception that is not a sparsetorch error (a plugin bug, a library's own
    error type) turned into :class:`BackendError` naming the plan and phase, cause chained."""
    try:
        return fn()
    except SparseTorchError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
        raise BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label=label,
                           phase=phase) from exc


def vmap_columns(apply, info, in_dims, values: torch.Tensor, X: torch.Tensor, handle):
    """The ``vmap`` rule shared by the sparse Functions ``apply(values, X, handle)`` whose ``X`` is
    ``(*batch, n, k)``: a mapped ``X`` alone is folded into the columns (one call for all), a
    mapped ``values`` runs one call per member (each needs its own factorization)."""
    vd, xd, _ = in_dims
    if vd is None and xd is not None:
        Xm = X.movedim(xd, -1)  # (..., n, k, V)
        shape = Xm.shape
        Y = apply(values, Xm.reshape(*shape[:-2], shape[-2] * shape[-1]), handle)
        return Y.reshape(*Y.shape[:-1], shape[-2], shape[-1]), len(shape) - 1
    size = info.batch_size
    vs = [values.select(vd, i) if vd is not None else values for i in range(size)]
    xs = [X.select(xd, i) if xd is not None else X for i in range(size)]
    return torch.stack([apply(v, x, handle) for v, x in zip(vs, xs)]), 0


def sddmm(A: SparseTensor, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """``sum_c P[..., row, c] * conj(Q[..., col, c])`` for every stored entry of ``A``, in A's value
    slots (padding slots get zero). Differentiable in ``P`` and ``Q`` (second derivatives).

    One column (the common case: a vector right-hand side) skips the reduction over columns; many
    columns on a matrix that is not too sparse take one dense product and keep its stored entries;
    otherwise the per-entry gathers run in chunks. A pattern whose entries fill its value slots in
    order (CSR, CSC, COO: no padding) skips the scatter into the slots."""
    Qc = Q.conj() if Q.is_complex() else Q
    if _plain_csr(A) and P.dim() == 2 and Q.dim() == 2 and P.shape[-1] == 1 and Q.shape[-1] == 1:
        # One vector on a CSR matrix (the backward of most solves): rows by repeating P along
        # crow, the column index used as it is: no entry list (rows, columns and slots, three
        # nnz-long int64 tensors kept in the pattern cache) and one gather instead of two.
        crow, col = A.pos(1), A.crd(1)
        rep = torch.repeat_interleave(P[:, 0], crow.diff(), output_size=col.numel())
        return rep * Qc[:, 0].index_select(0, col)
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    k = P.shape[-1]
    if k == 1 and Q.shape[-1] == 1:
        per = P[..., 0].index_select(-1, rows) * Qc[..., 0].index_select(-1, cols)
    elif _dense_sampling(A, P, rows.numel()):
        # many columns on a not-too-sparse matrix (a sparse layer's batch): one GEMM for every
        # (i, j), then the stored ones. Gathering both factors per entry moved 2 nnz k values
        # and was 50x a dense layer's backward at 50 % density (benchmarks/results/nn_cpu.json).
        G = P @ Qc.mT
        per = G.reshape(*G.shape[:-2], -1).index_select(-1, _linear_index(A, rows, cols))
    else:
        # per entry gathers, in chunks that keep the (chunk, k) temporaries near _SDDMM_CHUNK_BYTES;
        # rows must be contiguous (a transposed X, a layer's batch, made each gather 20x slower)
        P, Qc = P.contiguous(), Qc.contiguous()
        budget = _SDDMM_CHUNK_BYTES if P.device.type == "cpu" else _SDDMM_CHUNK_BYTES_DEVICE
        step = max(1, budget // max(1, k * P.element_size() * max(1, P[..., 0, 0].numel())))
        per = torch.cat([(P.index_select(-2, rows[s:s + step]) * Qc.index_select(-2, cols[s:s + step])).sum(-1)
                         for s in range(0, rows.numel(), step)], -1) if rows.numel() else \
            P.new_zeros(*P.shape[:-2], 0)
    nlin = A.values.shape[-1]
    if _slots_in_order(A, slot, nlin):
        return per
    out = per.new_zeros(*per.shape[:-1], nlin)
    return out.index_add(-1, slot, per)


#: the dense sampled product is used up to this many bytes for the (m, n) product...
_SDDMM_DENSE_BYTES = 256 * 2**20
#: ... and when at least this fraction of the (i, j) are stored. Measured (CPU, one thread,
#: 4096 x 4096, k = 64): the dense product 52-91 ms; chunked gathers 216 ms at 50 % density,
#: 36.5 ms at 10 %, 11.8 ms at 3 %, 4.3 ms at 1 %: the crossover is near 12 %
_SDDMM_DENSE_DENSITY = 0.12
#: per-entry gathers work in chunks of about this many bytes of temporaries: small enough for the
#: allocator to reuse them (64 MB chunks were 16x slower, from fresh pages on every chunk)
_SDDMM_CHUNK_BYTES = 4 * 2**20
#: on a GPU (a caching allocator, launch-bound small kernels) the chunks are larger
_SDDMM_CHUNK_BYTES_DEVICE = 256 * 2**20


def _linear_index(A: SparseTensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rows * n + cols`` (entry positions in a row-major (m, n) buffer), kept on the pattern."""
    cache = A._cache
    lin = cache.get("sddmm_linear_index")
    if lin is None:
        lin = rows * A.format_shape[-1] + cols
        if is_plain(lin):
            cache["sddmm_linear_index"] = lin
    return lin


def _dense_sampling(A: SparseTensor, P: torch.Tensor, nnz: int) -> bool:
    if P.shape[-1] < 8:
        return False
    m, n = A.format_shape[-2], A.format_shape[-1]
    batch = P[..., 0, 0].numel()
    return (len(A.format_shape) == 2 and m * n * batch * P.element_size() <= _SDDMM_DENSE_BYTES
            and nnz >= _SDDMM_DENSE_DENSITY * m * n)


def _plain_csr(A: SparseTensor) -> bool:
    """A 2-D CSR matrix with one set of values, stored in entry order (no padding)."""
    from ..format import CSR

    return A.format == CSR and A.values.dim() == 1 and A.values.shape[-1] == A.crd(1).shape[-1]


def _slots_in_order(A: SparseTensor, slot: torch.Tensor, nlin: int) -> bool:
    """Whether entry ``k`` of ``A.entries()`` is value slot ``k`` for every ``k`` (pattern-only,
    cached on the pattern)."""
    if slot.numel() != nlin:
        return False
    cache = A._cache
    got = cache.get("slots_in_order")
    if got is None:
        got = nlin == 0 or bool((slot == torch.arange(nlin, device=slot.device)).all())
        if is_plain(slot):
            cache["slots_in_order"] = got
    return got


@dataclass
class SolveHandle:
    """Solves ``A X = B`` (or ``A^H X = B`` when ``adjoint``) with a shared plan.

    ``call_options`` are the per-call options of the call that made the handle (rtol, atol,
    maxiter, check_every, callback): the backward pass solves with them whatever other calls
    have done with the shared plan since. ``route`` (:class:`~sparsetorch.autograd.fallback.Route`)
    holds the methods dispatch may fall back to and checks every answer (shape, dtype, device,
    finiteness, the true residual); without one the plan's answer is checked the same way and
    a failure raises (a pinned method).
    """

    state: PlanState
    A: SparseTensor
    adjoint: bool = False
    on_nonconvergence: str = "raise"
    results: list = field(default_factory=list)
    check_finite: bool = False
    call_options: dict | None = None
    route: Any = None

    def __post_init__(self) -> None:
        if self.call_options is None:
            self.call_options = {}
        if self.route is None:
            from .fallback import Route  # noqa: PLC0415 - fallback imports this module

            self.route = Route.single(self.state, self.A)

    def flipped(self) -> "SolveHandle":
        return SolveHandle(self.route.state, self.A, not self.adjoint, self.on_nonconvergence, self.results,
                           call_options=self.call_options, route=self.route)

    def run(self, values: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        # Runs inside the autograd Function, where torch.func transforms hand over plain tensors.
        if self.check_finite:
            from ..ops._inputs import check_finite

            check_finite(self.A.with_values(values), B, "solve")
        X, res = self.route.solve(self, values.detach(), B.detach())
        self.state = self.route.state
        self.results.append(res)
        _check(res, self.route.label, self.on_nonconvergence, "adjoint " if self.adjoint else "")
        return X


@dataclass
class MatmulHandle:
    """``Y = A X`` (or ``A^H X`` when ``adjoint``) with a shared product plan."""

    state: PlanState
    A: SparseTensor
    adjoint: bool = False

    def flipped(self) -> "MatmulHandle":
        return MatmulHandle(self.state, self.A, not self.adjoint)

    def run(self, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        state = self.state
        with state.lock, torch.no_grad():
            state._load(values)
            Y = guarded(lambda: state.plan.apply(X.detach(), adjoint=self.adjoint), state.label, "apply")
        m, n = self.A.format_shape
        rows = n if self.adjoint else m
        want = (*X.shape[:-2], rows, X.shape[-1])
        if not isinstance(Y, torch.Tensor) or tuple(Y.shape) != want or Y.dtype != X.dtype or Y.device != X.device:
            got = (tuple(Y.shape), Y.dtype, Y.device) if isinstance(Y, torch.Tensor) else type(Y).__name__
            raise BackendError(f"{state.label} returned {got} from apply, expected shape {want}, {X.dtype} on "
                               f"{X.device} (plugin bug)", label=state.label, phase="apply")
        return Y


def _check(res: IterationResult, name: str, policy: str, what: str) -> None:
    if res.converged:
        return
    if res.status is Status.INDEFINITE:
        raise IndefiniteMatrixError(
            f"{name} ({what}solve): {res.reason}. The matrix is not positive definite: use method='minres' "
            f"(symmetric indefinite), 'gmres'/'bicgstab' (general) or a direct method"
        )
    msg = (
        f"{name} ({what}solve) stopped after {res.iterations} iterations with relative residual "
        f"{res.residual:.3g} ({res.status.value}: {res.reason or 'no reason given'}). Raise maxiter, "
        f"loosen rtol/atol, add a preconditioner, or pass on_nonconvergence='warn' to get x anyway"
    )
    if policy == "warn":
        warnings.warn(msg, NotConvergedWarning, stacklevel=4)
    elif policy != "ignore":
        raise NotConvergedError(msg, res)


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two plain tensors share storage (a snapshot must never alias the values it guards)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
