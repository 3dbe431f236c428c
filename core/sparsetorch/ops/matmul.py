"""Sparse @ dense: ``matmul``, the stateful ``Matmul`` (UST form), ``norm`` and ``transpose``."""

from __future__ import annotations

import functools
import math
import numbers
import os
import warnings
import weakref
from typing import Any, Mapping

import torch
from torch.autograd import forward_ad as _forward_ad

from ..autograd import products
from ..autograd.products import combine
from ..autograd.matmul import MatmulHandle, matmul_function
from ..dispatch.options import MatmulOptions
from ..dispatch.lru import register_clearable
from ..dispatch.plan import (PlanState, calls_key, calls_seen, count_calls, counts_calls, guarded, make_request,
                             obtain_plan, plan_cache)
from ..dispatch.plans import Bindable, supports
from ..dispatch.select import ExplainTable, get_backends
from ..errors import BackendError, InputError, SparseTorchError, SparseTorchWarning
from ..format import TensorFormat
from ..tensor._compiling import compiling
from ..tensor import SparseTensor
from ..tensor._views import TracedTranspose
from ..tensor.pattern import version_of, vmapped
from .spgemm import spgemm
from ._inputs import (as_rhs, check_matrix, describe_dense, describe_sparse, index_buffers_now, index_buffers_unchanged,
                      restore_rhs)

__all__ = ["matmul", "Matmul", "norm", "transpose", "matmul_request"]


#: the option records of matmul by backend name (records are frozen: one per name serves every call)
_OPTIONS: dict[Any, MatmulOptions] = {}


def matmul_options(backend: str | None = None) -> MatmulOptions:
    """The validated options of a product (made once per backend name)."""
    rec = _OPTIONS.get(backend) if isinstance(backend, (str, type(None))) else None
    if rec is None:
        rec = MatmulOptions(backend=backend)
        if len(_OPTIONS) < 64:
            _OPTIONS[backend] = rec
    return rec


def matmul_request(A: SparseTensor, X: torch.Tensor | None, options: Mapping[str, Any] | None = None):
    """The dispatch request of a product; ``options`` a :class:`MatmulOptions` or its keywords."""
    if not isinstance(options, MatmulOptions):
        options = matmul_options(**(options or {}))
    operands = (describe_sparse(A),) + ((describe_dense(X),) if X is not None else ())
    return make_request("matmul", operands, frozenset(), options)


def _run(A: SparseTensor, Xn: torch.Tensor, state: PlanState, backend: str | None) -> torch.Tensor:
    return matmul_function(A.values, Xn, _handle(state, A.detach(), backend))


def _backend_of(state: PlanState) -> str:
    """The backend's name of a plan ("torch" of "torch/spmm")."""
    return state.label.split("/")[0]


def _torch_state(A: SparseTensor, Xn: torch.Tensor, cache: bool) -> tuple[PlanState, Any, ExplainTable]:
    """``(state, request, table)`` of the torch backend's product plan: where a chosen backend failed."""
    request = matmul_request(A, Xn, matmul_options("torch"))
    state, _, table = obtain_plan("matmul", A, request, cache=cache)
    return state, request, table


def _fallback_note(what: str, exc: BackendError, kept: str = "") -> str:
    return f"{what}: {exc} -- answered by the torch backend instead{kept} (pass backend= to choose one)"


def _handle(state: PlanState, A: SparseTensor, backend: str | None, adjoint: bool = False) -> MatmulHandle:
    """The product's handle: where dispatch chose the backend (no ``backend=``), one whose adjoint
    (the backward's ``A^H dY``) falls back to the torch backend as the forward does (:class:`_Chosen`)."""
    if backend is None:
        return _Chosen(state, A, adjoint)
    return MatmulHandle(state, A, adjoint)


class _Chosen(MatmulHandle):
    """The handle of a product whose backend dispatch chose: the same forward (``run`` is
    MatmulHandle's: nothing per call), and a :meth:`flipped` direction (the backward's ``dX = A^H
    dY``, a double backward's ``A dZ``) that answers on the torch backend where the plugin fails
    (:class:`_Guarded`). The torch plan it fell back to is kept here (``fallback``): later backward
    passes through this handle (a Matmul keeps its handle) do not try the plugin again."""

    fallback: PlanState | None = None
    chosen = True

    def flipped(self) -> MatmulHandle:
        if self.fallback is not None:
            return MatmulHandle(self.fallback, self.A, not self.adjoint)
        g = _Guarded(self.state, self.A, not self.adjoint)
        g.origin = self
        return g


class _Guarded(_Chosen):
    """A flipped :class:`_Chosen`: its product falls back to the torch backend on a BackendError of
    a plugin's plan (with a warning naming it), as :func:`_product` does for the forward."""

    origin: _Chosen | None = None

    def run(self, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        try:
            return MatmulHandle.run(self, values, X)
        except BackendError as exc:
            if _backend_of(self.state) == "torch":
                raise
            try:
                state = _torch_state(self.A, X, True)[0]
                y = MatmulHandle(state, self.A, self.adjoint).run(values, X)
            except SparseTorchError:
                raise exc from None
            self.state = state
            if self.origin is not None:
                self.origin.fallback = state  # the forward handle's next flipped(): torch at once
            warnings.warn(_fallback_note("matmul (backward)", exc), SparseTorchWarning, stacklevel=2)
            return y


def _product(A: SparseTensor, Xn: torch.Tensor, backend: str | None, cache: bool):
    """``(A @ Xn, state, request, table)`` by the chosen backend. Where dispatch chose it (no ``backend=``) and
    its plan fails (a kernel that does not compile on this GPU, a plugin's bug: BackendError), the torch
    backend answers instead, with a warning naming the failure (the product raised though torch could do it;
    session 27's plugin sweep); a pinned backend's failure is raised."""
    request = matmul_request(A, Xn, matmul_options(backend))
    state, _, table = obtain_plan("matmul", A, request, cache=cache)
    try:
        return _run(A, Xn, state, backend), state, request, table
    except BackendError as exc:
        if backend is not None or _backend_of(state) == "torch":
            raise
        try:
            state, request, table = _torch_state(A, Xn, cache)
            y = _run(A, Xn, state, "torch")
        except SparseTorchError:
            raise exc from None
        warnings.warn(_fallback_note("matmul", exc), SparseTorchWarning, stacklevel=3)
        return y, state, request, table


def autocast_dtype(device_type: str, *dtypes: torch.dtype) -> torch.dtype | None:
    """The dtype autocast runs a product in, for operands of ``dtypes`` on ``device_type``: None
    when autocast is off there, or when an operand is float64 or not floating (autocast leaves
    those alone)."""
    if not torch.is_autocast_enabled(device_type):
        return None
    if any(d == torch.float64 or not d.is_floating_point for d in dtypes):
        return None
    return torch.get_autocast_dtype(device_type)


def _autocast_operands(A: Any, X: Any) -> tuple[Any, torch.Tensor, str] | None:
    """Under ``torch.autocast``: ``(A, X)`` cast (differentiably) to the autocast dtype, as autocast casts the
    operands of ``torch.mm`` / ``torch.matmul``, and the device type (the product then runs with autocast off, so
    the backends see plain operands of that dtype); None where autocast leaves the product alone (off on X's
    device, an operand float64, complex or not floating, or not a sparse matrix and a dense tensor)."""
    if not isinstance(X, torch.Tensor) or not isinstance(A, (SparseTensor, TracedTranspose)):
        return None
    dev = X.device.type
    dt = autocast_dtype(dev, A.dtype, X.dtype)
    if dt is None:
        return None
    if isinstance(A, TracedTranspose):
        base = A.base
        A = A if base.dtype == dt else TracedTranspose(base.with_values(base.values.to(dt)))
    elif A.dtype != dt:
        A = A.with_values(A.values.to(dt))
    return A, (X if X.dtype == dt else X.to(dt)), dev


def matmul(A: SparseTensor, X: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float | complex | None = None,
           beta: float | complex | None = None, backend: str | None = None, cache: bool = True) -> torch.Tensor:
    """``A @ X`` for sparse ``A`` (any format) and dense ``X``. Differentiable in A's values (on
    the pattern) and in ``X``.

    Shapes follow nvmath-python's (numpy.matmul's) rules, with torch's broadcasting of one
    unbatched side: ``X`` is ``(n,)`` or ``(n, k)``; with a batched ``A`` (a value batch
    ``(*B, m, n)`` on one pattern, or a format with BATCH levels such as torch's batched
    CSR/CSC/BSR, one pattern per member) ``X`` is ``(*B, n[, k])`` or unbatched (then shared by
    every member: a 2-D ``X`` of n rows is one matrix for every member, as numpy.matmul reads it,
    also when the batch has n members); with an unbatched ``A``, ``X`` may carry any batch
    ``(*B, n, k)`` (folded into the columns of one product). The result is ``(*B, m[, k])``.

    With ``c`` (or ``alpha``/``beta``) it is the one-shot form of :class:`Matmul`, nvmath-python's
    ``matmul(a, b, c, alpha=, beta=)``: ``alpha * A @ X + beta * c`` with ``alpha`` 1 and ``beta``
    1 by default (nvmath's defaults), written into ``c`` in place and returned, unless a gradient
    is being recorded (then a new tensor is returned and ``c`` is left alone; see :class:`Matmul`).
    ``c`` must have the result's shape, A's dtype and device. Unlike :class:`Matmul` it uses the
    plan cache, so repeated one-shot calls on one pattern plan once. Repeated on the same ``A``
    (no ``c`` / ``alpha`` / ``beta``, no gradient recorded, ``X`` of the same shape, dtype and
    device), a product whose plan binds (the cuda plugin's; the torch backend's on a CSR matrix)
    takes a remembered launch, as ``Matmul.execute`` does (:class:`_OneShot`: 11.9 against 157 us
    per call on the H200's host, ``benchmarks/results/host_h200_s10b_ab.json``; on the CPU a small
    CSR ``A @ x`` by the torch backend costs about its kernel, ``benchmarks/results/overhead_cpu_s17.json``).

    Under ``torch.autocast`` (without ``c``) the product runs as autocast runs ``torch.matmul``: both
    operands cast to the autocast dtype (bfloat16 on the CPU by default; differentiably, so gradients
    reach A's values and ``X`` in their own dtypes), the result in that dtype; float64, complex and
    integer operands are left alone, as autocast leaves them. With ``c`` (the result written into it,
    as ``out=``, which autocast does not touch either) the operands keep their dtypes.

    Under ``torch.compile`` the product is the custom op ``sparsetorch::spmm``, traced with no
    graph break (:mod:`sparsetorch.autograd.compiled`).

    With ``X`` a SparseTensor too (sparse @ sparse) the product is a CSR SparseTensor
    (:func:`sparsetorch.ops.spgemm.spgemm`; no ``c``, ``alpha``, ``beta`` or ``backend``)."""
    if isinstance(X, SparseTensor):
        return _sparse_product(A, X, c, alpha, beta, backend)
    if _any_autocast() and isinstance(X, torch.Tensor) and torch.is_autocast_enabled(X.device.type):
        # A @ h with h a Linear's bfloat16 output raised a dtype mismatch (session 29's sweep). The product runs
        # with autocast off, cast or not: the backends' own dense ops must not be cast behind them
        amp = _autocast_operands(A, X) if c is None else None
        if amp is not None:
            A, X = amp[0], amp[1]
        with torch.autocast(X.device.type, enabled=False):
            return _matmul(A, X, c, alpha=alpha, beta=beta, backend=backend, cache=cache)
    return _matmul(A, X, c, alpha=alpha, beta=beta, backend=backend, cache=cache)


def matmul_exact(A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` in the operands' own dtypes whatever autocast a caller runs under (autocast off inside): what
    sparsetorch's own code calls for a product that must keep them (a solve's residual)."""
    if _any_autocast():
        with torch.autocast(X.device.type, enabled=False):
            return _matmul(A, X)
    return _matmul(A, X)


#: whether autocast is on for any device (one C call; the device's own question only then)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)


def _matmul(A: SparseTensor, X: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float | complex | None = None,
            beta: float | complex | None = None, backend: str | None = None, cache: bool = True) -> torch.Tensor:
    """:func:`matmul` without its autocast rule."""
    if compiling():
        from ..autograd.compiled import traced_matmul  # noqa: PLC0415 - the compiled path only

        return traced_matmul(A, X, c, alpha, beta, backend)
    jit = _jit_tracing() is not None
    if c is None and alpha is None and beta is None and not jit:
        once = _ONE_SHOT.get(id(A))
        if once is not None and once.ref() is A:  # a product repeated on this A: its remembered launch
            y = once(A, X, backend)
            if y is not None:
                return y
    if isinstance(A, SparseTensor) and A.format.num_batch_levels:
        members, rhs = _pattern_batch(A, X, "matmul")
        alpha, beta = _scalars(A, rhs.shape, c, alpha, beta, "matmul")
        ys = [matmul(Ab, Xb, backend=backend, cache=cache) for Ab, Xb in zip(members, rhs.parts)]
        return combine(rhs.finish(ys), c, alpha, beta)
    A = check_matrix(A, "matmul", square=False)
    if jit:
        return _jit_traced(A, X, c, alpha, beta)
    if vmapped(A.values):
        return _vmapped_values(A, X, c, alpha, beta, backend)
    if c is None and alpha is None and beta is None and not A.batch_shape and isinstance(X, torch.Tensor) \
            and X.dim() in (1, 2):
        # the common call (one matrix, a vector or a block): what _rhs and _combine would do, without
        # their layers (this is the per-call path of every one-shot product)
        Xn, vector = as_rhs(A, X, "matmul", rows=A.format_shape[1])
        Y, state, request, table = _product(A, Xn, backend, cache)
        y = restore_rhs(Y, vector)
        if cache and state.reused:  # a pattern seen before: remember its launch (when its plan binds)
            _remember_one_shot(A, X, Xn, vector, backend, state, request, table)
        return y
    rhs = _rhs(A, X, "matmul")
    alpha, beta = _scalars(A, rhs.shape, c, alpha, beta, "matmul")
    return combine(rhs.finish(_product(A, rhs.Xn, backend, cache)[0]), c, alpha, beta)


#: the state of torch.jit.trace's recording (None when not tracing)
_jit_tracing = torch._C._get_tracing_state


def _jit_traced(A: SparseTensor, X, c, alpha, beta) -> torch.Tensor:
    """``matmul`` under ``torch.jit.trace``: the product in plain torch ops that the tracer records (see
    :func:`_gather_scatter`), differentiable by autograd, so that the traced function or module computes it for
    new inputs of the traced shapes. A backend's plan runs where the tracer cannot follow (NumPy memory, buffers
    bound to the plan, an autograd Function it cannot record: the trace failed with "offer from 'torch' has
    invalid seconds=tensor(...)", then "unordered_map::at"; session 29's sweep); ``backend=`` is not used."""
    rhs = _rhs(A, X, "matmul")
    alpha, beta = _scalars(A, rhs.shape, c, alpha, beta, "matmul")
    return combine(rhs.finish(_gather_scatter(A, rhs.Xn)), c, alpha, beta)


def _gather_scatter(A: SparseTensor, Xn: torch.Tensor) -> torch.Tensor:
    """``A Xn`` for ``Xn`` of shape ``(*batch, n, k)``: each stored entry's value times its column's row of
    ``Xn``, added into its row (duplicates summed); half precision accumulated in float32, as the backends do."""
    state = _jit_tracing()
    torch._C._set_tracing_state(None)  # the pattern's entries are constants of the trace (made or cached alike)
    try:
        coords, slot = A.entries()
    finally:
        torch._C._set_tracing_state(state)
    rows, cols = coords[-2], coords[-1]
    vals = A._linear_buffers()[2][..., slot]
    X = Xn
    if vals.dtype in (torch.float16, torch.bfloat16):
        vals, X = vals.float(), X.float()
    terms = vals.unsqueeze(-1) * X.index_select(-2, cols)
    Y = terms.new_zeros((*terms.shape[:-2], A.format_shape[0], terms.shape[-1])).index_add(-2, rows, terms)
    return Y.to(Xn.dtype)


def _vmapped_values(A: SparseTensor, X, c, alpha, beta, backend) -> torch.Tensor:
    """``matmul`` under ``torch.func.vmap`` over A's values: planned on the pattern with plain zero
    values (a plan holding the batched values "escaped" the vmap; session 21's sweep); the Function's
    vmap rule multiplies member by member."""
    P = A.detach().with_values(torch.zeros(A.values.shape, dtype=A.dtype, device=A.device))
    rhs = _rhs(P, X, "matmul")
    alpha, beta = _scalars(P, rhs.shape, c, alpha, beta, "matmul")
    state, _, _ = obtain_plan("matmul", P, matmul_request(P, rhs.Xn, matmul_options(backend)), cache=False)
    try:
        y = matmul_function(A.values, rhs.Xn, _handle(state, P, backend))
    except BackendError as exc:  # as _product: a chosen backend's failure is answered by torch
        if backend is not None or _backend_of(state) == "torch":
            raise
        try:
            state = _torch_state(P, rhs.Xn, False)[0]
            y = matmul_function(A.values, rhs.Xn, MatmulHandle(state, P, False))
        except SparseTorchError:
            raise exc from None
        warnings.warn(_fallback_note("matmul", exc), SparseTorchWarning, stacklevel=3)
    return combine(rhs.finish(y), c, alpha, beta)


class _Rhs:
    """The dense operand as the plan takes it (``Xn``: ``(*value_batch, n, k)``), the result's
    shape, and ``finish`` mapping the plan's output back to that shape."""

    __slots__ = ("Xn", "shape", "finish", "parts", "vector")

    def __init__(self, Xn, shape, finish, parts=None, vector=False) -> None:
        self.Xn, self.shape, self.finish, self.parts, self.vector = Xn, tuple(shape), finish, parts, vector


def _rhs(A: SparseTensor, X: object, op: str) -> _Rhs:
    """``X`` against a matrix ``A`` (2 format dims, maybe a value batch): A's batch on ``X``,
    an unbatched ``X`` broadcast over A's batch, or a batched ``X`` folded into the columns."""
    m, n = A.format_shape
    vb = tuple(A.batch_shape)
    if isinstance(X, torch.Tensor) and X.layout == torch.strided:
        nb = len(vb)
        exact = ((X.dim() == nb + 1 and tuple(X.shape[:nb]) == vb and X.shape[-1] == n)
                 or (X.dim() == nb + 2 and tuple(X.shape[:nb]) == vb and X.shape[-2] == n))
        if exact and nb == 1 and X.dim() == 2 and X.shape[0] == n:
            # (n, k) with k == n and a batch of n: numpy.matmul's reading, one matrix for every member
            # (the batch-of-vectors reading answered (B, m) where numpy and torch give (B, m, k);
            # session 21's sweep). torch.linalg.solve reads it as vectors, and so does solve
            exact = False
        if not exact and vb and (X.dim() == 1 and X.shape[0] == n or X.dim() == 2 and X.shape[0] == n):
            X = X.expand(*vb, *X.shape)  # one X for every member of the value batch
        elif not exact and not vb and X.dim() > 2 and X.shape[-2] == n:
            lead, k = tuple(X.shape[:-2]), X.shape[-1]
            # (n, prod(lead) * k): the sizes given, which reshape cannot infer with n = 0 (a 0-column A: a crash)
            Xn, _ = as_rhs(A, X.movedim(-2, 0).reshape(n, math.prod(lead) * k), op, rows=n)
            # Y (m, prod(lead) * k) -> (*lead, m, k)
            return _Rhs(Xn, lead + (m, k), lambda Y: Y.reshape(m, *lead, k).movedim(0, -2))
    Xn, vector = as_rhs(A, X, op, rows=n)
    shape = tuple(Xn.shape[:-2]) + (m,) + (() if vector else (Xn.shape[-1],))
    return _Rhs(Xn, shape, lambda Y: restore_rhs(Y, vector), vector=vector)


def _pattern_batch(A: SparseTensor, X: object, op: str) -> tuple[list[SparseTensor], _Rhs]:
    """A format with BATCH levels (a pattern per member, torch's batched CSR/CSC/BSR) as its
    member matrices, and ``X`` split to match (``(*B, n[, k])``, or one unbatched ``X`` shared)."""
    fmt = A.format
    nb = fmt.num_batch_levels
    if A.batch_shape:
        raise InputError(f"{op}: a value batch {tuple(A.batch_shape)} on a format with BATCH levels ({fmt}) is not "
                         f"supported; use one of the two")
    if fmt.ndim - nb != 2:
        raise InputError(f"{op} needs matrices: {fmt} has {fmt.ndim - nb} non-batch dimensions, not 2")
    fshape = tuple(A.format_shape)
    bs, (m, n) = fshape[:nb], fshape[nb:]
    count = math.prod(bs)
    if not isinstance(X, torch.Tensor) or X.layout != torch.strided:
        raise InputError(f"{op}: the right-hand side must be a dense torch.Tensor, got {type(X).__name__}")
    if X.dim() in (1, 2) and X.shape[0] == n:
        # one vector or matrix for every member (numpy.matmul's reading of a 2-D X, also when the
        # batch has n members: the batch-of-vectors reading answered (B, m) for numpy's (B, m, k))
        parts, tail = [X] * count, tuple(X.shape[1:])
    elif X.dim() in (nb + 1, nb + 2) and tuple(X.shape[:nb]) == bs and X.shape[nb] == n:
        parts, tail = list(X.reshape(count, *X.shape[nb:]).unbind(0)), tuple(X.shape[nb + 1:])
    else:
        raise InputError(f"{op}: the right-hand side has shape {tuple(X.shape)}; for A of shape {fshape} (batch {bs} "
                         f"of {m}x{n} patterns) it must be {bs + (n,)}, {bs + (n, 'k')}, ({n},) or ({n}, k)")
    inner = TensorFormat(fmt.dims[nb:], [(lv.expr, lv.type) for lv in fmt.levels[nb:]])
    flat = lambda b: None if b is None else b.reshape(count, *b.shape[nb:])  # noqa: E731
    pos = [flat(A.pos(k)) for k in range(nb, fmt.num_levels)]
    crd = [flat(A.crd(k)) for k in range(nb, fmt.num_levels)]
    vals = A.values.reshape(count, *A.values.shape[nb:])
    A.ensure_valid()
    members = [SparseTensor(inner, (m, n), [None if p is None else p[i] for p in pos],
                            [None if c is None else c[i] for c in crd], vals[i], check=False) for i in range(count)]
    shape = bs + (m,) + tail
    return members, _Rhs(None, shape, lambda ys: torch.stack(ys).reshape(shape), parts=parts)


def _scalars(a: SparseTensor, shape: tuple, c: torch.Tensor | None, alpha, beta, what: str) -> tuple[Any, Any]:
    """nvmath's defaults (alpha 1; beta 1 with c) after checking c against the result's shape, and
    alpha / beta: numbers (a complex one only for complex operands: no silent promotion)."""
    checked = []
    for name, v in (("alpha", alpha), ("beta", beta)):
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, numbers.Number):
                raise InputError(f"{what}: {name} must be a number, got {v!r} ({type(v).__name__})")
            if not isinstance(v, numbers.Real) and not a.dtype.is_complex:
                if complex(v).imag != 0:
                    raise InputError(f"{what}: {name}={v!r} is complex but A is {a.dtype}: the result would be promoted "
                                     f"to a complex dtype; convert the operands to a complex dtype first")
                v = complex(v).real  # a complex number with no imaginary part: the real number
        checked.append(v)
    alpha, beta = checked
    if c is None and beta is not None and beta != 0:
        raise InputError(f"{what}: beta={beta} needs an output operand c (pass c=, or leave beta out)")
    if c is not None:
        if not isinstance(c, torch.Tensor) or c.layout != torch.strided:
            raise InputError(f"{what}: c must be a dense (strided) torch.Tensor, got "
                             f"{getattr(c, 'layout', type(c).__name__)}")
        if tuple(c.shape) != tuple(shape):
            raise InputError(f"{what}: c has shape {tuple(c.shape)}; for this product it must be {tuple(shape)} "
                             f"(the result's shape: c is written in place, so it is not broadcast)")
        if c.dtype != a.dtype or c.device != a.device:
            raise InputError(f"{what}: c must have A's dtype {a.dtype} and device {a.device}, got {c.dtype} on {c.device}")
        if any(st == 0 and sz > 1 for st, sz in zip(c.stride(), c.shape)):
            raise InputError(f"{what}: c (strides {tuple(c.stride())} for shape {tuple(c.shape)}) has elements sharing "
                             f"memory (an expanded tensor), and it is written in place; pass c.clone() or a fresh tensor")
    alpha = 1.0 if alpha is None else alpha
    beta = (1.0 if c is not None else 0.0) if beta is None else beta
    return alpha, beta


def transpose(A: SparseTensor) -> SparseTensor:
    """``A.T``: a view with the same buffers (CSR becomes CSC)."""
    return A.T


def norm(A: SparseTensor, ord: str | int | float = "fro") -> torch.Tensor:
    """Matrix norms from the stored entries: "fro", 1 (max column sum), inf (max row sum),
    "max" (largest magnitude). Differentiable in the values. Batched over A's value batch."""
    A = check_matrix(A, "norm", square=False)
    coords, vals = A.coordinates()
    m, n = A.format_shape
    if not A.format.is_unique and coords.shape[-1]:
        # repeated coordinates (triplets as given, an uncoalesced torch COO) sum: the norms read the sums
        key = coords[0] * n + coords[1]
        keys, inverse = torch.unique(key, return_inverse=True)
        vals = vals.new_zeros(*vals.shape[:-1], keys.numel()).index_add(-1, inverse, vals)
        coords = torch.stack([keys // n, keys % n])
    mag = vals.abs()
    if ord == "fro":
        return torch.linalg.vector_norm(vals, dim=-1)
    if ord == "max":
        return mag.amax(-1) if mag.shape[-1] else mag.new_zeros(mag.shape[:-1])
    if ord in (1, float("inf"), "inf"):
        idx, size = (coords[1], n) if ord == 1 else (coords[0], m)
        sums = mag.new_zeros(*mag.shape[:-1], size).index_add(-1, idx, mag)
        return sums.amax(-1) if size else sums.new_zeros(sums.shape[:-1])
    raise InputError(f"norm ord must be 'fro', 1, inf or 'max', got {ord!r}")


#: whether a torch.func transform (vmap, grad, jacrev, ...) is active; such calls take the Function
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None) or (lambda: False)
_grad_enabled = torch.is_grad_enabled
_is_compiling = compiling
#: the output allocation of the direct paths: ``empty_like`` of a one-element template expanded
#: to the output's shape is the cheapest torch allocation from Python (H200 host, session 9:
#: 2.1 us against 3.5 for ``new_empty`` and 2.9-3.9 for ``torch.empty``)
_empty_like = torch.empty_like
_strided = torch.strided


def _template(like: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The output's shape, dtype and device on one element (a stride-0 view is not dense, so
    ``empty_like`` of it is contiguous)."""
    return like.new_empty((1,)).expand(shape)


def _index_versions(a: SparseTensor) -> tuple | None:
    """``((buffer, version), ...)`` of A's index buffers, or None (inference tensors keep no
    version counter)."""
    try:
        return tuple((b, version_of(b)) for b in (*a.pos_buffers, *a.crd_buffers) if b is not None)
    except RuntimeError:
        return None


def _viewed(t: torch.Tensor) -> bool:
    """A conjugate or negative view (a bit over storage that holds the other values): bound launches
    read storage, so they take no such operand (a conjugate ``c`` crashed in the bound CPU product)."""
    return t.is_conj() or t.is_neg()


class _Direct:
    """``Matmul.execute``'s per-call path when the plan can bind its product to the operands
    (``plan.bind(values, X)``, a backend's one recorded launch, e.g. the cuda plugin's, or the torch
    backend's CSR kernel called with ``out=``): the
    output allocated (or ``c`` itself, with ``beta == 0``), one launch, nothing else. Declines a
    call (returns None; ``execute`` then takes the general path through the autograd Function)
    when a gradient is being recorded, under forward-mode AD, a torch.func transform or
    torch.compile, or when the bound launch cannot take the call (X re-laid out, values moved).
    A write into A's index buffers since the bind (their torch version counters moved)
    re-validates them and re-plans: the plan read the old pattern.

    The operands are held here (``X``: the plan's right-hand side, ``(n, k)``; ``c`` with
    ``into_c``), so a call reads no attribute of the Matmul; ``reset_operands_unchecked(b=)``
    keeps ``X`` current, every other operand change drops the bind. Per call: three
    ``requires_grad`` reads (``is_grad_enabled`` only when one is set), the forward-AD level, the
    compile and transform flags, one version read per index buffer, the allocation, the call."""

    __slots__ = ("bound", "values", "X", "c", "index", "template", "into_c", "xshape", "xdtype", "xdev", "label")

    def __init__(self, bound: Any, values: torch.Tensor, X: torch.Tensor, c: torch.Tensor | None, index: tuple,
                 shape: tuple, label: str) -> None:
        self.bound, self.values, self.X, self.c = bound, values, X, c
        self.label = label  # the plan's "backend/method", for a BackendError of the bound launch
        # X as bound: a ``.data`` swapped since for another shape, dtype or device must not reach
        # the launch (its kernel would read past the new buffer or read it as another type)
        self.xshape, self.xdtype, self.xdev = X.shape, X.dtype, X.get_device()
        self.index = index  # ((buffer, version at bind), ...): checked one by one per call
        self.template = _template(X, shape)
        self.into_c = c is not None

    def __call__(self, mm: "Matmul") -> torch.Tensor | None:
        X, c = self.X, self.c
        if X.shape != self.xshape or X.dtype is not self.xdtype or X.get_device() != self.xdev:
            mm._direct = None  # bind again (or take the general path, which checks X) on this call's X
            mm._direct_tried = False
            return None
        # the cheap reads first: is_grad_enabled only matters when something requires grad
        if (self.values.requires_grad or X.requires_grad or (c is not None and c.requires_grad)) and _grad_enabled():
            return None
        if _forward_ad._current_level >= 0 or _is_compiling() or _transforms_active():
            return None
        for buf, version in self.index:
            if version_of(buf) != version:
                mm.a.ensure_valid()  # raises if the new index buffers are invalid
                mm._state = None  # the plan holds (or copied) the old pattern: plan again
                mm._direct = None
                return None
        Y = c if c is not None else _empty_like(self.template)
        try:  # what guarded() does, without a closure per call
            if self.bound(X, Y):
                return Y
        except SparseTorchError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named (execute may fall back)
            raise BackendError(f"{self.label} failed in the bound launch: {type(exc).__name__}: {exc}",
                               label=self.label, phase="apply") from exc
        mm._direct = None  # X or the values were laid out anew: bind again on the next call
        mm._direct_tried = False
        return None


#: st.matmul's remembered launches, id(A) -> :class:`_OneShot` (at most ONE_SHOT_SIZE; an entry
#: goes with its tensor, and with :func:`sparsetorch.clear_caches`)
_ONE_SHOT: dict[int, "_OneShot"] = {}
ONE_SHOT_SIZE = 64
#: calls a remembered launch serves before one call takes the full path again (asks the
#: dispatcher: a decision that changed, e.g. after ``clear_decisions``, is seen within this many)
ONE_SHOT_RECHECK = 256


class _OneShot:
    """``st.matmul(A, X)`` repeated on the same ``A`` (the same object, index buffers unwritten,
    the same values tensor) with ``X`` of the same shape, dtype, device and layout, no gradient
    recorded (nor forward AD, a torch.func transform, torch.compile), no ``c`` / ``alpha`` /
    ``beta``, through a plan that binds (``plan.bind``: the cuda plugin's, the torch backend's on CSR): the output allocated
    and the bound launch called, as :class:`_Direct` does for ``Matmul.execute``, without asking
    the dispatcher, the plan cache or the autograd Function again.

    Made by the full path on a plan it found in the cache (the pattern's second product). The
    full path runs again, and re-decides, when the calls counted for the pattern reach the next
    power of two (where :func:`~sparsetorch.dispatch.plan.expected_calls` would change the
    decision's ``repeat``: the calls served here are counted there first), after
    :data:`ONE_SHOT_RECHECK` calls, when the backends are registered anew or the plan cache is
    cleared, when A's index buffers were written (re-validated there), or when the bound launch
    declines. Safe to call from several threads (the bound launch locks its argument block; a
    lost update of ``left`` only moves the next full pass)."""

    __slots__ = ("key", "ref", "backend", "xshape", "dtype", "dev", "values", "pos", "crd", "index", "bound", "template",
                 "left", "start", "misses", "counted", "generation", "epoch")

    def __call__(self, A: SparseTensor, X: Any, backend: str | None) -> torch.Tensor | None:
        if backend != self.backend or type(X) is not torch.Tensor or X.shape != self.xshape or X.dtype is not self.dtype \
                or X.get_device() != self.dev or X.layout is not _strided:
            self.misses += 1
            return None
        values = A._values
        if values is not self.values or A._pos is not self.pos or A._crd is not self.crd:
            self.drop()
            return None
        if (values.requires_grad or X.requires_grad) and _grad_enabled():
            return None
        if _forward_ad._current_level >= 0 or _transforms_active():
            return None
        for buf, version in self.index:
            if version_of(buf) != version:
                self.drop()  # the full path re-validates the buffers and plans again
                return None
        left = self.left - 1
        if left < 0 or self.generation != get_backends().generation or self.epoch != _plan_cache.epoch:
            self.drop()
            return None
        self.left = left
        Y = _empty_like(self.template)
        try:
            if self.bound(X, Y):
                return Y
        except Exception:  # noqa: BLE001 - a plugin's failing launch: the full path answers (and falls back or raises)
            pass
        self.drop()
        return None

    def drop(self) -> None:
        """Forget this launch, counting the calls it served for the pattern and the plan cache."""
        if _ONE_SHOT.get(self.key) is self:
            _ONE_SHOT.pop(self.key, None)
        served, self.start = self.start - max(self.left, 0), 0
        self.left = 0
        if served > 0:
            if self.counted is not None:
                count_calls(self.counted, served)
            _plan_cache.count_hits(served)


def _forget_one_shot(ref: Any, key: int) -> None:
    e = _ONE_SHOT.get(key)
    if e is not None and e.ref is ref:
        _ONE_SHOT.pop(key, None)


def _remember_one_shot(A: SparseTensor, X: torch.Tensor, Xn: torch.Tensor, vector: bool, backend: str | None,
                       state: PlanState, request: Any, table: Any) -> None:
    """Make A's :class:`_OneShot` after a full-path product on a cached plan (see there)."""
    key = id(A)
    old = _ONE_SHOT.get(key)
    if old is not None and old.ref() is A and old.left > 0 and old.misses < 8:
        return  # another X served by it (a few full-path calls of another shape do not evict it)
    if old is not None:
        old.drop()
    if type(X) is not torch.Tensor or type(A.values) is not torch.Tensor or Xn.dim() != 2 or A.batch_shape \
            or A.values.requires_grad or X.requires_grad or _forward_ad._current_level >= 0 or _transforms_active() \
            or _dispatch_uncached():
        return
    plan = state.plan
    if plan is None or not supports(plan, Bindable):
        return
    index = _index_versions(A)
    if index is None:
        return
    try:
        with state.lock:
            bound = plan.bind(A.values, Xn)
    except Exception:  # noqa: BLE001 - a plugin whose bind fails: nothing remembered, the full path serves each call
        return
    if bound is None:
        return
    counted = calls_key("matmul", A) if counts_calls(request, table) else None
    seen = calls_seen(counted) if counted is not None else 0
    e = _OneShot()
    e.key = key
    e.ref = weakref.ref(A, functools.partial(_forget_one_shot, key=key))
    e.backend, e.xshape, e.dtype, e.dev = backend, X.shape, X.dtype, X.get_device()
    e.values, e.pos, e.crd, e.index, e.bound = A.values, A._pos, A._crd, index, bound
    m = A.format_shape[0]
    e.template = _template(X, (m,) if vector else (m, Xn.shape[1]))
    # the calls this launch may serve: up to the next power of two of the pattern's count (where
    # the dispatcher's repeat changes), at most ONE_SHOT_RECHECK
    e.left = e.start = min(ONE_SHOT_RECHECK, (1 << seen.bit_length()) - seen - 1 if counted is not None else ONE_SHOT_RECHECK)
    e.misses, e.counted = 0, counted
    e.generation, e.epoch = get_backends().generation, _plan_cache.epoch
    if e.left <= 0:
        return
    if old is None and len(_ONE_SHOT) >= ONE_SHOT_SIZE:
        try:
            _ONE_SHOT.pop(next(iter(_ONE_SHOT)), None)  # the oldest goes
        except (StopIteration, RuntimeError):  # another thread changed the dict meanwhile
            pass
    _ONE_SHOT[key] = e


def _dispatch_uncached() -> bool:
    """Whether every call must ask the dispatcher (decisions not remembered, or traced)."""
    return os.environ.get("SPARSETORCH_DISPATCH_CACHE", "1").lower() in ("0", "false", "no", "off") \
        or os.environ.get("SPARSETORCH_TRACE", "").strip().lower() in ("1", "true", "yes", "on")


_plan_cache = plan_cache()
register_clearable("one-shot launches", _ONE_SHOT.clear)


class Matmul:
    """Stateful ``c := alpha * a @ b + beta * c`` (the UST form), planned once, executed many times.

    ::

        with Matmul(a, b, c) as mm:   # alpha = beta = 1: c := a @ b + c
            mm.plan()
            mm.execute()
            mm.reset_operands(b=b2)
            mm.execute()

    Defaults follow nvmath-python's ``sparse.Matmul``: ``alpha`` is 1; ``beta`` is 1 when ``c`` is
    given (accumulate into ``c``; pass ``beta=0`` to overwrite it) and 0 without ``c``.
    Deliberate differences: ``c`` is optional (nvmath requires it for now): without it
    ``execute`` returns a new tensor, and a nonzero ``beta`` without ``c`` raises (nvmath warns and
    ignores it). ``c`` is updated in place unless a gradient is being recorded (operands that
    require grad): then ``execute`` returns a new tensor and leaves ``c`` unchanged, since
    in-place writes would break autograd. ``execute`` always returns the result.

    Threads: one ``Matmul`` object serves one thread at a time (it holds its operands and its
    bound launch; two threads that ``execute`` or ``reset_operands`` one object at once may see each
    other's operands). Separate objects, also on one matrix and one cached plan, are safe to use
    from several threads at once.
    """

    def __init__(self, a: SparseTensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
                 alpha: float | complex | None = None, beta: float | complex | None = None,
                 backend: str | None = None) -> None:
        self._backend = backend
        self._state: PlanState | None = None
        self._table: ExplainTable | None = None
        #: the plan with A's pattern, kept from one execute to the next (None: made at the next)
        self._handle: MatmulHandle | None = None
        self._planned_key: Any = None
        #: (A, its pos / crd tuples, (buffer, version, address, shape) of each index buffer) at plan
        #: time: the per-call check that A's pattern is still the planned one (see _same_pattern)
        self._planned_bufs: tuple | None = None
        #: the bound launch of the common call (see _Direct), tried once per operand set
        self._direct: _Direct | None = None
        self._direct_tried = False
        #: the backends dispatch chose whose plans failed (build, set_values, apply, bind or the bound
        #: launch): this Matmul answered on the torch backend since and plans there, never asking them again
        self._failed: frozenset[str] = frozenset()
        self._set(a, b, c, alpha, beta)

    def _set(self, a, b, c, alpha, beta) -> None:
        if isinstance(a, SparseTensor) and a.format.num_batch_levels:
            members, rhs = _pattern_batch(a, b, "Matmul")
        else:
            a = check_matrix(a, "Matmul", square=False)
            members, rhs = None, _rhs(a, b, "Matmul")
        alpha, beta = _scalars(a, rhs.shape, c, alpha, beta, "Matmul")
        self.a, self.b, self.c, self.alpha, self.beta = a, b, c, alpha, beta
        self._rhs, self._members = rhs, members
        self._handle = None
        self._direct, self._direct_tried = None, False

    def plan(self) -> ExplainTable:
        """Choose the backend and build its plan for A's pattern (``execute`` plans when this was
        not called). Where dispatch chose the backend (no ``backend=``) and its plan fails to build
        (a kernel that does not compile on this device, a plugin's bug: BackendError), the plan is
        the torch backend's, with a warning naming the failure, as ``matmul`` does; later plans of
        this Matmul (another pattern) are the torch backend's where dispatch chooses that backend
        again. A pinned backend's failure is raised."""
        return self._plan(3)

    def _plan(self, stacklevel: int) -> ExplainTable:
        """:meth:`plan`, warning ``stacklevel`` frames up (the user's call) where it falls back."""
        if self._members is not None:  # one plan per member pattern, through the plan cache
            request = matmul_request(self._members[0], self._rhs.parts[0], matmul_options(self._backend))
            _, _, self._table = obtain_plan("matmul", self._members[0], request, cache=True)
            self._state = True  # type: ignore[assignment]
            return self._table
        a = self.a
        request = matmul_request(a, self._rhs.Xn, matmul_options(self._backend))
        self._direct, self._direct_tried = None, False  # a bound launch belongs to the plan it came from
        state, _, table = obtain_plan("matmul", a, request, cache=False)
        if self._failed and _backend_of(state) in self._failed:
            state, _, table = _torch_state(a, self._rhs.Xn, False)  # it failed here before: not again
        self._state, self._table = state, table
        self._planned_key = a.pattern_key  # the pattern (buffers and their versions) planned for
        self._planned_bufs = index_buffers_now(a)
        try:
            state.build()
        except BackendError as exc:
            if self._backend is not None or _backend_of(state) == "torch":
                raise
            failed = _backend_of(state)
            try:
                state, _, table = _torch_state(a, self._rhs.Xn, False)
                state.build()
            except SparseTorchError:
                raise exc from None
            self._failed |= {failed}
            self._state, self._table = state, table
            warnings.warn(_fallback_note("Matmul", exc, ", for this Matmul's later calls too"), SparseTorchWarning,
                          stacklevel=stacklevel)
        return table

    def execute(self) -> torch.Tensor:
        """``alpha * a @ b + beta * c`` (into ``c``, see the class). Where dispatch chose the backend
        (no ``backend=``) and its plan fails (BackendError in set_values, apply, the bound launch...),
        the torch backend answers, with a warning naming the failure, and its plan is kept: later
        calls do not try the failed backend again (see :meth:`plan`). A pinned backend's failure
        is raised, and so is every error about the operands."""
        try:  # (no cost per call until something raises)
            direct = self._direct
            if direct is not None:
                y = direct(self)
                if y is not None:
                    return y
            elif not self._direct_tried:
                direct = self._bind()
                if direct is not None:
                    y = direct(self)
                    if y is not None:
                        return y
            if self._state is None or (self._members is None and not self._same_pattern()):
                # not planned yet, or A's index buffers were written in place (or swapped) since: a
                # plan on them as they are now (ensure_valid raises if they are no longer valid, before
                # any backend reads them; the old plan may hold a copy of the old pattern)
                self.a.ensure_valid()
                self._plan(3)
            if self._members is not None:
                ys = [matmul(Ab, Xb, backend=self._backend) for Ab, Xb in zip(self._members, self._rhs.parts)]
                return combine(self._rhs.finish(ys), self.c, self.alpha, self.beta)
            handle = self._handle
            if handle is None or handle.state is not self._state:
                handle = self._handle = _handle(self._state, self.a.detach(), self._backend)
            y = self._rhs.finish(matmul_function(self.a.values, self._rhs.Xn, handle))
            if self.c is None and self.alpha == 1:
                return y
            return combine(y, self.c, self.alpha, self.beta)
        except BackendError as exc:
            state = self._state
            if self._backend is not None or self._members is not None or not isinstance(state, PlanState) \
                    or _backend_of(state) == "torch":
                raise  # pinned, a pattern batch (its members' products fell back themselves), or torch's own
            return self._fall_back(exc, state)

    def _fall_back(self, exc: BackendError, state: PlanState) -> torch.Tensor:
        """``execute`` on the torch backend after the chosen backend's plan ``state`` raised ``exc``;
        its plan kept (the warning says so once). Where torch fails too, ``exc`` is raised and
        the next ``execute`` plans anew."""
        failed = self._failed
        self._failed = failed | {_backend_of(state)}
        self._state = None  # planned anew, on torch (plan() skips the failed backend)
        self._direct, self._direct_tried = None, False  # the failed plan's bound launch goes with it
        try:
            y = self.execute()
        except SparseTorchError:
            self._failed, self._state = failed, None
            raise exc from None
        warnings.warn(_fallback_note("Matmul", exc, ", for this Matmul's later calls too"), SparseTorchWarning,
                      stacklevel=3)
        return y

    def _same_pattern(self) -> bool:
        """Whether A's pattern is the one planned for: the same tensor (or its pos / crd tuples),
        each index buffer at the same version, address and shape (what :attr:`pattern_key`
        compares, without building a key per call: 0.8 against 9 us on a 2-core CPU); another
        tensor falls back to comparing pattern keys (same buffers: the plan applies)."""
        planned = self._planned_bufs
        a = self.a
        if planned is not None and planned[0] is a and planned[1] is a._pos and planned[2] is a._crd:
            return index_buffers_unchanged(planned, a)
        if a.pattern_key != self._planned_key:
            return False
        self._planned_bufs = index_buffers_now(a)
        return True

    def _bind(self) -> _Direct | None:
        """The :class:`_Direct` path for these operands, or None (tried once per operand set): one
        matrix (no value batch, no pattern batch), ``alpha == 1``, no ``c`` or ``c`` overwritten
        (``beta == 0``, contiguous, not sharing memory with ``b``), a plan with ``bind``."""
        if self._members is not None or self.alpha != 1:
            self._direct_tried = True
            return None
        a = self.a
        if self._state is None or not self._same_pattern():
            # not planned yet, or A's index buffers were written (or swapped) since: a plan built
            # on them as they are now (ensure_valid raises if they are no longer valid)
            a.ensure_valid()
            self._plan(4)
        self._direct_tried = True
        state = self._state
        plan = state.plan if state is not None else None
        bind = plan.bind if plan is not None and supports(plan, Bindable) else None
        c, rhs = self.c, self._rhs
        X = rhs.Xn
        if bind is None or a.batch_shape or X is None or X.dim() != 2 or type(X) is not torch.Tensor \
                or type(a.values) is not torch.Tensor or _viewed(X) or _viewed(a.values):
            return None
        m = a.format_shape[0]
        shape = (m,) if rhs.vector else (m, X.shape[1])
        if tuple(rhs.shape) != shape:
            # a batched b folded into the columns: the general path reshapes the plan's (m, B k) output
            # (the bound launch returned it folded; session 21's sweep)
            return None
        into_c = c is not None
        if into_c and not (self.beta == 0 and type(c) is torch.Tensor and not _viewed(c) and c.is_contiguous()
                           and tuple(c.shape) == shape
                           and c.dtype == X.dtype and c.device == X.device and not _shares_memory(c, X)
                           and not _shares_memory(c, a.values)):
            return None
        index = _index_versions(a)
        if index is None:  # inference tensors keep no version counter
            return None
        with state.lock:  # (a plugin's exception: BackendError naming it, as the other phases)
            bound = guarded(lambda: bind(a.values, X), state.label, "bind")
        if bound is None:
            return None
        self._direct = _Direct(bound, a.values, X, c if into_c else None, index, shape, state.label)
        return self._direct

    def reset_operands(self, a: SparseTensor | None = None, b: torch.Tensor | None = None, c: torch.Tensor | None = None,
                       *, alpha: float | complex | None = None, beta: float | complex | None = None) -> None:
        """Swap operands (checked like the constructor's); those not given keep their values. A
        new ``a`` on the same pattern keeps the plan (values reload), another pattern re-plans on
        the next ``execute`` (nvmath requires the same format, shape and nnz; we allow more)."""
        if a is None and b is None and c is None and alpha is None and beta is None:
            raise InputError("reset_operands() with no argument changes nothing; pass a=, b=, c=, alpha= or beta=")
        new_a = a if a is not None else self.a
        if a is not None and a.pattern_key != self.a.pattern_key:
            self._state = None
        self._set(new_a, b if b is not None else self.b, c if c is not None else self.c,
                  self.alpha if alpha is None else alpha, self.beta if beta is None else beta)

    def reset_operands_unchecked(self, *, a: SparseTensor | None = None, b: torch.Tensor | None = None,
                                 c: torch.Tensor | None = None, alpha: float | complex | None = None,
                                 beta: float | complex | None = None) -> None:
        """:meth:`reset_operands` without the operand checks (nvmath's fast path for loops that
        swap operands every step): no type, shape, dtype or device checks and no re-validation of
        ``a``'s index buffers. The caller guarantees the new operands match the old ones in
        shape, dtype and device, and that ``c`` is given when ``beta`` is nonzero; a mismatch is
        undefined behaviour (a wrong result or an error from the backend). A new ``a`` on another
        pattern still re-plans (one identity comparison), since a stale plan would compute with
        the old pattern."""
        if self._members is not None and (a is not None or b is not None):
            self._set(a if a is not None else self.a, b if b is not None else self.b, self.c, self.alpha, self.beta)
            a = b = None  # a pattern batch re-splits its members (cheap views); the plans are cached
        if a is not None or c is not None or alpha is not None or beta is not None \
                or (b is not None and self._direct is not None and self._direct.into_c):
            self._direct, self._direct_tried = None, False  # bound to the old operands: bind again
        if a is not None:
            if a.pattern_key != self.a.pattern_key:
                self._state = None
            self.a = a
            self._handle = None
        if b is not None:
            self.b = b
            rhs = self._rhs
            if rhs.Xn is not None and tuple(b.shape) == tuple(rhs.Xn.shape[:-1] if rhs.vector else rhs.Xn.shape):
                # the plain layouts: b is what the plan takes (a vector gets its column back)
                if b.dtype != rhs.Xn.dtype or b.device != rhs.Xn.device:
                    self._direct, self._direct_tried = None, False  # the bound launch reads b as the old dtype
                self._rhs = _Rhs(b.unsqueeze(-1) if rhs.vector else b, rhs.shape, rhs.finish, vector=rhs.vector)
                if self._direct is not None:
                    self._direct.X = self._rhs.Xn  # the bound launch takes the new b (checked per call)
            else:  # broadcast or folded layouts: redo the (shape-only) mapping
                self._direct, self._direct_tried = None, False
                self._rhs = _rhs(self.a, b, "Matmul")
        if c is not None:
            self.c = c
        if alpha is not None:
            self.alpha = alpha
        if beta is not None:
            self.beta = beta

    def free(self) -> None:
        self._state = None
        self._handle = None
        self._direct, self._direct_tried = None, False

    def __enter__(self) -> "Matmul":
        return self

    def __exit__(self, *exc) -> None:
        self.free()


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two strided tensors' storages are one (then writing one may change the other)."""
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return True


def _matmul_operator(self: SparseTensor, other: torch.Tensor) -> torch.Tensor:
    """``A @ X`` through :func:`sparsetorch.matmul` (dispatch, plan cache, gradients); ``A @ B`` of two
    SparseTensors is their sparse product (:func:`sparsetorch.ops.spgemm.spgemm`, a CSR SparseTensor)."""
    if isinstance(other, SparseTensor):
        return spgemm(self, other)
    return matmul(self, other)


def _sparse_product(A: Any, B: SparseTensor, c: Any, alpha: Any, beta: Any, backend: Any) -> SparseTensor:
    """``matmul(A, B)`` with a sparse ``B``: :func:`spgemm` (which names what is wrong with A or B)."""
    given = [name for name, v in (("c", c), ("alpha", alpha), ("beta", beta), ("backend", backend)) if v is not None]
    if given:
        raise InputError(f"matmul: sparse @ sparse takes no {', '.join(given)} (the product is a new SparseTensor); "
                         f"scale or add the result instead")
    return spgemm(A, B)


def _rmatmul_operator(self: SparseTensor, other: torch.Tensor) -> torch.Tensor:
    """``X @ A`` as ``(A^T @ X^T)^T`` (A^T is a view)."""
    if not isinstance(other, torch.Tensor):
        return NotImplemented
    if _any_autocast() and torch.is_autocast_enabled(other.device.type):
        amp = _autocast_operands(self, other)  # as matmul under autocast: both operands in its dtype, autocast off
        with torch.autocast(other.device.type, enabled=False):
            return _rmatmul_operator(*(amp[:2] if amp is not None else (self, other)))
    if compiling():
        from ..autograd.compiled import traced_rmatmul  # noqa: PLC0415 - the compiled path only

        return traced_rmatmul(self, other)
    if other.dim() == 1:
        return matmul(self.T, other)
    return matmul(self.T, other.transpose(-2, -1)).transpose(-2, -1)


# The tensor layer sits below dispatch: its operators are bound here, where matmul lives.
SparseTensor.__matmul__ = _matmul_operator  # type: ignore[method-assign]
SparseTensor.__rmatmul__ = _rmatmul_operator  # type: ignore[method-assign]


def _traced_transpose_matmul(self: TracedTranspose, other: torch.Tensor) -> torch.Tensor:
    """``A.T @ X`` inside a compiled region (where ``A.T`` is a :class:`TracedTranspose`)."""
    return matmul(self, other)  # type: ignore[arg-type]


def _traced_transpose_rmatmul(self: TracedTranspose, other: torch.Tensor) -> torch.Tensor:
    """``X @ A.T`` inside a compiled region."""
    if not isinstance(other, torch.Tensor):
        return NotImplemented
    from ..autograd.compiled import traced_rmatmul  # noqa: PLC0415 - the compiled path only

    if _any_autocast() and torch.is_autocast_enabled(other.device.type):
        amp = _autocast_operands(self, other)  # as the eager X @ A.T under autocast
        with torch.autocast(other.device.type, enabled=False):
            return traced_rmatmul(*(amp[:2] if amp is not None else (self, other)))
    return traced_rmatmul(self, other)


TracedTranspose.__matmul__ = _traced_transpose_matmul  # type: ignore[attr-defined]
TracedTranspose.__rmatmul__ = _traced_transpose_rmatmul  # type: ignore[attr-defined]


def _product_state(A: SparseTensor, X: torch.Tensor) -> PlanState:
    """The product plan for ``A @ X`` (what the autograd layer's checks and tangents use)."""
    state, _, _ = obtain_plan("matmul", A, matmul_request(A, X, matmul_options()))
    return state


products.register(_product_state)
