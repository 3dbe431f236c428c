"""What ``torch.compile`` traces for ``matmul``, ``A @ X`` and ``solve``: opaque custom ops.

Dispatch (plan choice, the plan cache, the plans' locks, the fallback route's checks) is Python
that dynamo cannot trace. Under ``torch.compile`` the ops route here instead: a SparseTensor is
taken apart into what a graph can carry (its format as its DSL string, its format shape, its
level buffers and values), and the work is one ``torch.library`` custom op, opaque to dynamo:

    sparsetorch::spmm(fmt, shape, present, index, values, X, adjoint, backend)      A X  or  A^H X
    sparsetorch::sampled(fmt, shape, present, index, values, P, Q)                  sum_c P[i, c] conj(Q[j, c]) on A's pattern
    sparsetorch::spsolve(fmt, shape, present, index, values, B, adjoint, options)   A^-1 B  or  A^-H B

Each has a fake kernel (the output's shape, dtype and device, nothing computed), so dynamo and
AOTAutograd trace through it with no graph break and no host synchronization. Their eager
kernels run outside the trace, at run time, through the ordinary path: ``spmm`` through the
product plan dispatch chooses (the plan cache: a plan built by an eager call outside the
compiled region is the one a compiled call uses, and the other way round), ``spsolve`` through
``sparsetorch.solve`` itself (property detection, the finiteness check, the checked fallback
route). The autograd formulas are the adjoint rules of :mod:`.matmul` and :mod:`.solve`:

    Y = A X        dX = A^H dY                 dvalues = sampled(dY, X)
    Y = A^H X      dX = A dY                   dvalues = sampled(X, dY)
    X = A^-1 B     dB = A^-H dX = M            dvalues = -sampled(M, X)
    X = A^-H B     dB = A^-1 dX = M            dvalues = -sampled(X, M)
    V = sampled(P, Q)   dP = A(dV) Q           dQ = A(dV)^H P

so first and second derivatives compile too (the backward of ``spmm`` is ``spmm`` and
``sampled``, whose backward is ``spmm``).

The eager kernels rebuild the SparseTensor from its buffers once per pattern (kept while its
index buffers live and are not written in place; a new pattern is validated in full, which the
traced code cannot do) and reuse it with each call's values, so pattern-derived data (entry
lists, conversion maps) is computed once, as for an eager call.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..dispatch.options import MatmulOptions
from ..dispatch.plan import PlanState, guarded, obtain_plan
from ..dispatch.plans import SampledProduct, supports
from ..dispatch.records import OperandInfo, make_request
from ..errors import InputError
from ..format import Add, Dimension, FloorDiv, LevelType, Mod, Sub, TensorFormat
from ..tensor import SparseTensor
from ..tensor._views import TracedTranspose
from ..tensor.pattern import buffer_id
from ..tensor.sparse_tensor import _install_reverse_matmul, is_plain
from . import _compile_hooks
from .matmul import MatmulHandle
from .solve import solver_object
from .sddmm import sddmm
from .products import combine

__all__ = ["spmm", "sampled", "spsolve", "traced_matmul", "traced_rmatmul", "traced_solve", "register_solver", "parts"]

_HALF = (torch.float16, torch.bfloat16)

#: patterns rebuilt by the eager kernels, most recent last (bounded: a model has a few)
_PATTERNS: OrderedDict = OrderedDict()
_PATTERNS_MAX = 64
_PATTERNS_LOCK = threading.Lock()
_FORMATS: dict[str, TensorFormat] = {}

def register_solver(fn: Callable) -> None:
    """Set the function the eager kernel of ``spsolve`` calls (``sparsetorch.solve``; see
    :mod:`._compile_hooks`, where the ops layer registers it without importing this module)."""
    _compile_hooks.register_solver(fn)


def _format(spec: str) -> TensorFormat:
    fmt = _FORMATS.get(spec)
    if fmt is None:
        fmt = _FORMATS[spec] = TensorFormat.parse(spec)
    return fmt


def _pattern(spec: str, shape: Sequence[int], present: Sequence[bool], index: Sequence[Tensor],
             values: Tensor) -> SparseTensor:
    """The SparseTensor of these buffers with ``values``. A pattern seen for the first time is
    validated in full (the traced code could not); while the same buffers live unmodified
    (address, extent and version; the first ones still alive, so their memory is not another's)
    the tensor is put together again from what was recorded then: the validated token and the
    pattern-derived data (entry lists, conversion maps), as ``with_values`` shares them. The
    record holds the buffers weakly and goes when they do: the cache keeps no pattern alive."""
    key = (spec, tuple(int(s) for s in shape), tuple(bool(p) for p in present),
           tuple(buffer_id(b) for b in index), values.dtype, values.device)
    it = iter(index)
    bufs = [next(it) if p else None for p in present]
    half = len(bufs) // 2
    with _PATTERNS_LOCK:
        hit = _PATTERNS.get(key)
        if hit is not None:
            refs, fmt, checked, derived = hit
            if all(r() is not None for r in refs):
                _PATTERNS.move_to_end(key)
                return SparseTensor._assembled(fmt, shape, bufs[:half], bufs[half:], values, tuple(index), checked,
                                               derived)
            del _PATTERNS[key]
    A = SparseTensor(_format(spec), tuple(shape), bufs[:half], bufs[half:], values, check=True)
    with _PATTERNS_LOCK:
        _PATTERNS[key] = (tuple(weakref.ref(b) for b in index), A._format, A._checked, A._derived)
        if index:
            weakref.finalize(index[0], _forget, key)
        while len(_PATTERNS) > _PATTERNS_MAX:
            _PATTERNS.popitem(last=False)
    return A


def _forget(key: tuple) -> None:
    with _PATTERNS_LOCK:
        _PATTERNS.pop(key, None)


def _spec(fmt: TensorFormat) -> str:
    """The format's DSL string (``str(fmt)``), built from constants only (dimension names, the
    expressions' integers, the level types' fields), so that dynamo folds it to a constant of the
    graph guarded on those values, not on the format object: every SparseTensor holds a format
    object of its own (its index dtype), and a guard on the object's identity would recompile for
    each new matrix. (``tests/test_compile_ops.py`` checks it against ``str`` on every named format.)"""
    dims = [d.name for d in fmt.dims]
    levels = [f"{_expr_string(lv.expr)} : {_type_string(lv.type)}" for lv in fmt.levels]
    return f"({', '.join(dims)}) -> ({', '.join(levels)})"


def _expr_string(e: object) -> str:
    if isinstance(e, Dimension):
        return e.name
    if isinstance(e, FloorDiv):
        return f"{e.dim.name} // {e.c}"
    if isinstance(e, Mod):
        return f"{e.dim.name} % {e.c}"
    if isinstance(e, Add):
        return f"{e.a.name} + {e.b.name}"
    if isinstance(e, Sub):
        return f"{e.a.name} - {e.b.name}"
    return str(e)


def _type_string(t: LevelType) -> str:
    args = [] if t.parameter is None else [str(t.parameter)]
    if not t.unique:
        args.append("nonunique")
    if not t.ordered:
        args.append("unordered")
    return t.format.value + (f"({', '.join(args)})" if args else "")


def parts(A: SparseTensor) -> tuple[str, list[int], list[bool], list[Tensor]]:
    """What the custom ops take of ``A`` besides its values: the format's DSL string, the format
    shape, which of the level buffers ``pos(0), ..., pos(L-1), crd(0), ..., crd(L-1)`` exist, and
    those that do, in that order."""
    fmt = A.format
    n = len(fmt.levels)
    bufs = [A.pos(k) for k in range(n)] + [A.crd(k) for k in range(n)]
    return _spec(fmt), list(A.format_shape), [b is not None for b in bufs], [b for b in bufs if b is not None]


def _plain(t: Tensor) -> Tensor:
    """``t`` detached, with lazy conjugation or negation applied (views the traced code makes:
    the kernels below hand their operands to backends that expect plain tensors)."""
    return t.detach().resolve_conj().resolve_neg()


def _fresh(out: Tensor, *inputs: Tensor) -> Tensor:
    """``out``, copied if it shares memory with an input (a custom op's output may not alias)."""
    if out.numel() and any(t.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                           for t in inputs):
        return out.clone()
    return out


# dynamo's table entry that makes ``A @ x`` mean A @ x (see sparse_tensor.py); installed at import
# already, done again here in case the import hook could not run (a loader without exec_module)
_install_reverse_matmul()


# sparsetorch::spmm --------------------------------------------------------------------------------
def _state(A: SparseTensor, X: Tensor, backend: str | None) -> PlanState:
    """The product plan dispatch chooses for ``A X`` (from the plan cache), remembered on the
    pattern per right-hand side's shape, dtype and device (as an eager SparseLinear keeps one plan
    per batch size): a compiled call repeated on one pattern skips dispatch (its request, choice and
    plan-cache lookup were about two thirds of the op's host time). Held weakly (the plan cache
    owns the plan, which holds the pattern: a strong reference here would keep the buffers alive),
    and dropped with the pattern's other derived data when an index buffer is written in place."""
    cache = A._cache
    key = ("compiled_state", tuple(X.shape), X.dtype, X.device, backend)
    ref = cache.get(key)
    state = ref() if ref is not None else None
    if state is None:
        operands = (OperandInfo("sparse", tuple(A.shape), A.dtype, A.device, A.format, A.nse, tuple(A.batch_shape), False),
                    OperandInfo("dense", tuple(X.shape), X.dtype, X.device, None, None, (), False))
        state, _, _ = obtain_plan("matmul", A, make_request("matmul", operands, frozenset(), MatmulOptions(backend=backend)))
        if is_plain(X):
            cache[key] = weakref.ref(state)
    return state


def _product(A: SparseTensor, X: Tensor, adjoint: bool, backend: str | None) -> Tensor:
    """``A X`` (``A^H X``) through the product plan dispatch chooses (the plan cache)."""
    return MatmulHandle(_state(A, X, backend), A, adjoint).run(A.values, X)


@torch.library.custom_op("sparsetorch::spmm", mutates_args=())
def spmm(fmt: str, shape: Sequence[int], present: Sequence[bool], index: Sequence[Tensor],
         values: Tensor, X: Tensor, adjoint: bool, backend: Optional[str]) -> Tensor:
    """``A X`` (``A^H X`` when ``adjoint``) for ``A`` given by its parts (:func:`parts`) and
    ``values`` (``(*batch, slots)``), ``X`` of shape ``(*batch, n, k)`` (``(*batch, m, k)``)."""
    A = _pattern(fmt, shape, present, index, _plain(values))
    return _fresh(_product(A, _plain(X), adjoint, backend).contiguous(), X)


@spmm.register_fake
def _(fmt, shape, present, index, values, X, adjoint, backend):
    rows = shape[-1] if adjoint else shape[-2]
    return X.new_empty((*X.shape[:-2], rows, X.shape[-1]))


def _spmm_setup(ctx, inputs, output) -> None:
    fmt, shape, present, index, values, X, adjoint, backend = inputs
    ctx.fmt, ctx.shape, ctx.adjoint, ctx.backend = fmt, list(shape), adjoint, backend
    ctx.present = list(present)
    ctx.save_for_backward(values, X, *index)


def _spmm_backward(ctx, dY: Tensor):
    values, X, *index = ctx.saved_tensors
    dX = dV = None
    if ctx.needs_input_grad[5]:
        dX = spmm(ctx.fmt, ctx.shape, ctx.present, index, values, dY, not ctx.adjoint, ctx.backend)
    if ctx.needs_input_grad[4]:
        P, Q = (X, dY) if ctx.adjoint else (dY, X)
        dV = sampled(ctx.fmt, ctx.shape, ctx.present, index, values, P, Q)
    return None, None, None, [None] * len(index), dV, dX, None, None


spmm.register_autograd(_spmm_backward, setup_context=_spmm_setup)


# sparsetorch::sampled -----------------------------------------------------------------------------
@torch.library.custom_op("sparsetorch::sampled", mutates_args=())
def sampled(fmt: str, shape: Sequence[int], present: Sequence[bool], index: Sequence[Tensor],
            values: Tensor, P: Tensor, Q: Tensor) -> Tensor:
    """``sum_c P[..., i, c] conj(Q[..., j, c])`` at every stored entry ``(i, j)`` of ``A``, in A's
    value slots (``values``' shape and dtype; padding slots get zero). ``values`` only carries
    the slots' shape and dtype; half-precision factors are summed in float32."""
    A = _pattern(fmt, shape, present, index, _plain(values))
    P, Q = _plain(P), _plain(Q)
    if not (P.numel() and Q.numel()):
        # an empty product (no columns, or A with no rows or columns): sums over nothing
        return _fresh(torch.zeros(values.shape, dtype=values.dtype, device=values.device), P, Q)
    if not (P.is_complex() or Q.is_complex()):
        # the product plan's own sampled kernel where its backend has one (as the eager backward)
        state = _state(A, Q, None)
        plan = state.build()
        if supports(plan, SampledProduct):
            with state.lock:
                out = guarded(lambda: plan.sddmm(P, Q), state.label, "sddmm")
            if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(values.shape) and out.dtype == values.dtype:
                return _fresh(out.contiguous(), P, Q)
    if P.dtype in _HALF or Q.dtype in _HALF:
        out = sddmm(A, P.float(), Q.float()).to(values.dtype)
    else:
        out = sddmm(A, P, Q)
    if tuple(out.shape) != tuple(values.shape):
        out = out.expand(values.shape)
    return _fresh(out.contiguous(), P, Q)


@sampled.register_fake
def _(fmt, shape, present, index, values, P, Q):
    return values.new_empty(values.shape)


def _sampled_setup(ctx, inputs, output) -> None:
    fmt, shape, present, index, values, P, Q = inputs
    ctx.fmt, ctx.shape = fmt, list(shape)
    ctx.present = list(present)
    ctx.save_for_backward(values, P, Q, *index)


def _sampled_backward(ctx, dV: Tensor):
    values, P, Q, *index = ctx.saved_tensors
    dP = dQ = None
    if ctx.needs_input_grad[5]:
        dP = spmm(ctx.fmt, ctx.shape, ctx.present, index, dV, Q, False, None)
    if ctx.needs_input_grad[6]:
        dQ = spmm(ctx.fmt, ctx.shape, ctx.present, index, dV, P, True, None)
    return None, None, None, [None] * len(index), None, dP, dQ


sampled.register_autograd(_sampled_backward, setup_context=_sampled_setup)


# sparsetorch::spsolve -----------------------------------------------------------------------------
@torch.library.custom_op("sparsetorch::spsolve", mutates_args=())
def spsolve(fmt: str, shape: Sequence[int], present: Sequence[bool], index: Sequence[Tensor],
            values: Tensor, B: Tensor, adjoint: bool, backend: Optional[str], method: Optional[str],
            preconditioner: Optional[str], rtol: Optional[float], atol: float, maxiter: Optional[int],
            properties: Optional[str], check_finite: bool, on_nonconvergence: str, restart: Optional[int],
            block_size: Optional[int], dense_max: Optional[int], max_bytes: Optional[int],
            check_every: Optional[int], repeat: Optional[int], cache: bool) -> Tensor:
    """``X`` with ``A X = B`` (``A^H X = B`` when ``adjoint``), ``B`` of shape ``(*batch, n, k)``,
    through ``sparsetorch.solve`` with these options (``properties`` comma-separated)."""
    solve = _compile_hooks.solver()
    if solve is None:
        raise RuntimeError("sparsetorch::spsolve has no solver registered: the ops layer registers sparsetorch.solve "
                           "with sparsetorch.autograd._compile_hooks.register_solver (docs/compile.md)")
    A = _pattern(fmt, shape, present, index, _plain(values))
    props = None if properties is None else [p.strip() for p in properties.split(",") if p.strip()]
    declared = set(props or ())
    if adjoint and not ("spd" in declared or "hermitian" in declared
                        or ("symmetric" in declared and not A.values.is_complex())):
        # A^H as a view (the transposed pattern: a plan of its own). A declared self-adjoint
        # matrix is solved as it is, on the forward's plan and factorization (the same values).
        A = A.T.with_values(torch.conj_physical(A.values) if A.values.is_complex() else A.values)
    with torch.no_grad():
        X = solve(A, _plain(B), backend=backend, method=method, preconditioner=preconditioner, rtol=rtol,
                    atol=atol, maxiter=maxiter, properties=props, check_finite=check_finite,
                    on_nonconvergence=on_nonconvergence, restart=restart, block_size=block_size, dense_max=dense_max,
                    max_bytes=max_bytes, check_every=check_every, cache=cache, repeat=repeat)
    return _fresh(X.contiguous(), B, values)


@spsolve.register_fake
def _(fmt, shape, present, index, values, B, adjoint, backend, method, preconditioner, rtol, atol, maxiter, properties,
      check_finite, on_nonconvergence, restart, block_size, dense_max, max_bytes, check_every, repeat, cache):
    return B.new_empty(B.shape)


_SOLVE_OPTIONS = ("backend", "method", "preconditioner", "rtol", "atol", "maxiter", "properties", "check_finite",
                  "on_nonconvergence", "restart", "block_size", "dense_max", "max_bytes", "check_every", "repeat",
                  "cache")


def _spsolve_setup(ctx, inputs, output) -> None:
    fmt, shape, present, index, values, B, adjoint, *options = inputs
    ctx.fmt, ctx.shape, ctx.adjoint, ctx.options = fmt, list(shape), adjoint, options
    ctx.present = list(present)
    ctx.save_for_backward(values, output, *index)


def _spsolve_backward(ctx, dX: Tensor):
    values, X, *index = ctx.saved_tensors
    need_v, need_b = ctx.needs_input_grad[4], ctx.needs_input_grad[5]
    dV = dB = None
    if need_v or need_b:
        M = spsolve(ctx.fmt, ctx.shape, ctx.present, index, values, dX, not ctx.adjoint, *ctx.options)
        dB = M if need_b else None
        if need_v:
            dV = -(sampled(ctx.fmt, ctx.shape, ctx.present, index, values, X, M) if ctx.adjoint
                   else sampled(ctx.fmt, ctx.shape, ctx.present, index, values, M, X))
    return (None, None, None, [None] * len(index), dV, dB) + (None,) * (1 + len(_SOLVE_OPTIONS))


spsolve.register_autograd(_spsolve_backward, setup_context=_spsolve_setup)


# What the ops run under torch.compile ------------------------------------------------------------------
def _matrix(A: object, op: str) -> SparseTensor:
    if not isinstance(A, SparseTensor):
        raise InputError(f"{op} takes a sparsetorch.SparseTensor as A, got {type(A).__name__}")
    if len(A.format_shape) != 2 or A.format.num_batch_levels:
        raise InputError(f"{op} under torch.compile needs a matrix (2 format dims, value batches allowed), got format "
                         f"shape {tuple(A.format_shape)} ({A.format}); formats with BATCH levels run eagerly only")
    return A


def _operand(A: SparseTensor, X: object, op: str) -> Tensor:
    if not isinstance(X, torch.Tensor) or X.layout != torch.strided:
        raise InputError(f"{op}: the right-hand side must be a dense (strided) torch.Tensor, got "
                         f"{getattr(X, 'layout', type(X).__name__)}")
    if X.dtype != A.dtype:
        raise InputError(f"{op}: A has dtype {A.dtype} but the right-hand side has {X.dtype}; cast one of them "
                         f"(no silent promotion)")
    if X.device != A.device:
        raise InputError(f"{op}: A is on {A.device} but the right-hand side is on {X.device}; move them to one device")
    return X


def _unwrap(A: object) -> tuple[object, bool]:
    """``(matrix, transposed)``: a :class:`~sparsetorch.tensor._views.TracedTranspose` (``A.T``
    taken in the compiled region) is its matrix, used in the transposed direction."""
    if isinstance(A, TracedTranspose):
        return A.base, True
    return A, False


def traced_matmul(A: object, X: object, c: Tensor | None = None, alpha=None, beta=None,
                  backend: str | None = None) -> Tensor:
    """``sparsetorch.matmul`` as ``torch.compile`` traces it: the same shapes and broadcasting
    (a value batch on ``X`` or ``X`` shared by it; an unbatched ``A`` against a batched ``X``),
    ``alpha``/``beta``/``c`` as nvmath defines them, the product one ``sparsetorch::spmm``
    (``A.T`` taken in the region: the adjoint direction of A's product)."""
    A, transposed = _unwrap(A)
    A = _matrix(A, "matmul")
    Y = _product_of(A, _operand(A, X, "matmul"), transposed, backend)
    if c is None and beta is not None and beta != 0:
        raise InputError(f"matmul: beta={beta} needs an output operand c (pass c=, or leave beta out)")
    if c is not None and (not isinstance(c, torch.Tensor) or tuple(c.shape) != tuple(Y.shape) or c.dtype != Y.dtype):
        raise InputError(f"matmul: c must be a dense tensor of the result's shape {tuple(Y.shape)} and dtype {Y.dtype}")
    return combine(Y, c, 1.0 if alpha is None else alpha, 1.0 if beta is None else beta)


def traced_rmatmul(A: object, X: object) -> Tensor:
    """``X @ A`` as ``torch.compile`` traces it: ``(A^T X^T)^T``, ``A^T`` being the adjoint
    direction of A's product (conjugated around it for complex values), no transposed view built."""
    A, transposed = _unwrap(A)
    A = _matrix(A, "matmul")
    X = _operand(A, X, "matmul")
    # X @ A = (A^T X^T)^T; X @ A^T = (A X^T)^T
    if X.dim() == 1:
        return _product_of(A, X, not transposed)
    return _product_of(A, X.transpose(-2, -1), not transposed).transpose(-2, -1)


def _product_of(A: SparseTensor, X: Tensor, transposed: bool, backend: str | None = None) -> Tensor:
    """``A X`` (``A^T X`` when ``transposed``) with matmul's shape rules."""
    m, n = A.format_shape
    if transposed:
        m, n = n, m
    vb = tuple(A.batch_shape)
    nb = len(vb)
    if X.dim() == nb + 1 and tuple(X.shape[:nb]) == vb and X.shape[-1] == n:
        Xn, finish = X.unsqueeze(-1), (lambda Y: Y.squeeze(-1))
    elif X.dim() == nb + 2 and tuple(X.shape[:nb]) == vb and X.shape[-2] == n:
        Xn, finish = X, (lambda Y: Y)
    elif vb and X.dim() == 1 and X.shape[0] == n:
        Xn, finish = X.unsqueeze(-1).expand(*vb, n, 1), (lambda Y: Y.squeeze(-1))
    elif vb and X.dim() == 2 and X.shape[0] == n:
        Xn, finish = X.expand(*vb, *X.shape), (lambda Y: Y)
    elif not vb and X.dim() > 2 and X.shape[-2] == n:
        lead, k = tuple(X.shape[:-2]), X.shape[-1]
        Xn = X.movedim(-2, 0).reshape(n, -1)
        finish = (lambda Y: Y.reshape(m, *lead, k).movedim(0, -2))  # noqa: E731
    else:
        seen = tuple(A.shape) if not transposed else vb + (m, n)
        raise InputError(f"matmul: the other operand has shape {tuple(X.shape)}; for a sparse operand of shape {seen} "
                         f"it must be {vb + (n,)} or {vb + (n, 'k')}")
    fmt, shape, present, index = parts(A)
    values = A.values
    if transposed and values.is_complex():
        # A^T Z = (conj A)^H Z
        return finish(spmm(fmt, shape, present, index, torch.conj_physical(values), Xn, True, backend))
    return finish(spmm(fmt, shape, present, index, values, Xn, transposed, backend))


def traced_solve(A: object, B: object, *, backend: str | None = None, method: str | None = None,
                 preconditioner: object = None, rtol: float | None = None, atol: float = 0.0,
                 maxiter: int | None = None, return_info: bool = False, properties: object = None,
                 check_finite: bool = True, on_nonconvergence: str = "raise", callback: object = None,
                 progress: bool = False, restart: int | None = None, block_size: int | None = None,
                 dense_max: int | None = None, max_bytes: int | None = None, check_every: int | None = None,
                 backend_options: dict | None = None, cache: bool = True, repeat: int | None = None) -> Tensor:
    """``sparsetorch.solve`` as ``torch.compile`` traces it: one ``sparsetorch::spsolve`` (the
    eager solve runs inside it: dispatch, the finiteness check, the checked fallback route) and
    its adjoint rule. What cannot cross a graph is refused with a message: ``return_info``,
    ``callback``, ``progress``, a callable preconditioner, ``backend_options``, a SparseTensorList."""
    A, transposed = _unwrap(A)
    if not isinstance(A, SparseTensor):
        raise InputError(f"solve under torch.compile takes one SparseTensor A (a SparseTensorList solves eagerly "
                         f"only), got {type(A).__name__}")
    refused = [name for name, bad in (("return_info=True", return_info), ("callback", callback is not None),
                                      ("progress=True", progress), ("a callable preconditioner", callable(preconditioner)),
                                      ("backend_options", bool(backend_options))) if bad]
    if refused:
        raise InputError(f"solve under torch.compile does not take {', '.join(refused)} (Python objects a graph "
                         f"cannot carry); call it outside the compiled region, or wrap it with "
                         f"torch.compiler.disable")
    A = _matrix(A, "solve")
    m, n = A.format_shape
    if m != n:
        raise InputError(f"solve needs a square matrix, got {m}x{n}")
    B = _operand(A, B, "solve")
    vb = tuple(A.batch_shape)
    nb = len(vb)
    if B.dim() == nb + 1 and tuple(B.shape[:nb]) == vb and B.shape[-1] == n:
        Bn, vector = B.unsqueeze(-1), True
    elif B.dim() == nb + 2 and tuple(B.shape[:nb]) == vb and B.shape[-2] == n:
        Bn, vector = B, False
    elif nb and B.dim() in (1, 2) and B.shape[0] == n:
        # an unbatched right-hand side of a value-batched A: broadcast over the batch, as the eager
        # solve does (ops/_inputs.as_rhs; the batched forms above take precedence where a shape could
        # be read either way). expand's backward sums the members' gradients back into B
        vector = B.dim() == 1
        Bn = (B.unsqueeze(-1) if vector else B).expand(vb + ((n, 1) if vector else tuple(B.shape))).contiguous()
    else:
        raise InputError(f"solve: the right-hand side has shape {tuple(B.shape)}; for A of shape {tuple(A.shape)} it "
                         f"must be {vb + (n,)} or {vb + (n, 'k')}" + (f" (or {(n,)} / {(n, 'k')}, broadcast over the "
                                                                      f"batch)" if nb else ""))
    if properties is not None and not isinstance(properties, str):
        properties = ",".join(properties)  # type: ignore[arg-type]
    fmt, shape, present, index = parts(A)
    # A^T x = b is the adjoint solve of conj(A): (conj A)^H x = b (no conjugation for real A)
    values = torch.conj_physical(A.values) if transposed and A.values.is_complex() else A.values
    X = spsolve(fmt, shape, present, index, values, Bn, transposed, backend, method,
                preconditioner, None if rtol is None else float(rtol), float(atol), maxiter, properties,
                bool(check_finite), on_nonconvergence, restart, block_size, dense_max, max_bytes, check_every, repeat,
                bool(cache))
    return X.squeeze(-1) if vector else X


# sparsetorch::solver_solve: a Solver's solve under torch.compile -----------------------------------
@torch.library.custom_op("sparsetorch::solver_solve", mutates_args=())
def solver_solve(handle: int, values: Tensor, B: Tensor, adjoint: bool) -> Tensor:
    """``X`` with ``A(values) X = B`` (``A^H`` when ``adjoint``), ``B`` ``(*batch, n, k)``, through
    the plan (and factorization) of the Solver registered under ``handle``: a plan built outside
    the compiled region serves the graph."""
    X = solver_object(handle)._run(_plain(values), _plain(B), adjoint)
    return _fresh(X.contiguous(), values, B)


@solver_solve.register_fake
def _(handle, values, B, adjoint):
    return B.new_empty(B.shape)


@torch.library.custom_op("sparsetorch::solver_values_grad", mutates_args=())
def solver_values_grad(handle: int, values: Tensor, X: Tensor, M: Tensor, adjoint: bool) -> Tensor:
    """The gradient of a Solver's solve in A's values, ``-sddmm(M, X)`` on the pattern
    (``-sddmm(X, M)`` for the adjoint direction), ``M`` the adjoint solve of the output gradient."""
    A = solver_object(handle)._pattern
    X, M = _plain(X), _plain(M)
    dV = -(sddmm(A, X, M) if adjoint else sddmm(A, M, X))
    return _fresh(dV.contiguous(), values, X, M)


@solver_values_grad.register_fake
def _(handle, values, X, M, adjoint):
    return values.new_empty(values.shape)


def _solver_setup(ctx, inputs, output) -> None:
    handle, values, B, adjoint = inputs
    ctx.handle, ctx.adjoint = handle, adjoint
    ctx.save_for_backward(values, output)


def _solver_backward(ctx, dX: Tensor):
    values, X = ctx.saved_tensors
    M = solver_solve(ctx.handle, values, dX, not ctx.adjoint)
    dV = solver_values_grad(ctx.handle, values, X, M, ctx.adjoint) if ctx.needs_input_grad[1] else None
    return None, dV, (M if ctx.needs_input_grad[2] else None), None


solver_solve.register_autograd(_solver_backward, setup_context=_solver_setup)


def traced_solver_solve(solver: object, handle: int, values: Tensor, B: object) -> Tensor:
    """``Solver.solve(B)`` as ``torch.compile`` traces it: one ``sparsetorch::solver_solve`` on the
    Solver's own plan (its factorization, made outside the region or at the first run)."""
    A = _matrix(solver._pattern, "Solver.solve")  # type: ignore[attr-defined]
    n = A.format_shape[0]
    B = _operand(A, B, "Solver.solve")
    vb = tuple(A.batch_shape)
    nb = len(vb)
    if B.dim() == nb + 1 and tuple(B.shape[:nb]) == vb and B.shape[-1] == n:
        return solver_solve(handle, values, B.unsqueeze(-1), False).squeeze(-1)
    if B.dim() == nb + 2 and tuple(B.shape[:nb]) == vb and B.shape[-2] == n:
        return solver_solve(handle, values, B, False)
    if nb and B.dim() in (1, 2) and B.shape[0] == n:
        # unbatched B of a value-batched pattern: broadcast, as the eager Solver.solve does
        vector = B.dim() == 1
        Bn = (B.unsqueeze(-1) if vector else B).expand(vb + ((n, 1) if vector else tuple(B.shape))).contiguous()
        X = solver_solve(handle, values, Bn, False)
        return X.squeeze(-1) if vector else X
    raise InputError(f"Solver.solve: the right-hand side has shape {tuple(B.shape)}; for A of shape {tuple(A.shape)} "
                     f"it must be {vb + (n,)} or {vb + (n, 'k')}" + (f" (or {(n,)} / {(n, 'k')}, broadcast over the "
                                                                     f"batch)" if nb else ""))
