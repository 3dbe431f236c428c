"""Matrix-free solves: ``sparsetorch.solve(A, b)`` with ``A`` a function ``x -> A x`` or a
:class:`LinearOperator` (docs/solve.md, "Matrix-free operators").

Dispatch plans for a SparseTensor (its pattern, format and nnz are what backends bid on); an
operator known only by its action has none of these, so it goes straight to the torch backend's
Krylov solvers (CG, MINRES, GMRES, BiCGStab), the ones its sparse plans run. This layer may not
import the backend: the package registers a loader for them (:func:`register_krylov`, called by
``sparsetorch/__init__.py``), as ``autograd/products.py`` does for product plans.

Gradients by the adjoint method (``autograd/operator.py``): ``db = A^{-H} g``, and for every tensor
the operator depends on, the vector-Jacobian product of ``A(x)`` with cotangent ``-A^{-H} g``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ..autograd.operator import OperatorHandle, operator_solve_function
from ..dispatch.accuracy import default_rtol
from ..dispatch.options import DEFAULT_CHECK_EVERY, DEFAULT_RESTART
from ..dispatch.results import Attempt
from ..errors import InputError
from ..tensor import SparseTensor
from ..tensor.pattern import is_plain
from ..tensor.validate import check_finite_rhs
from .info import SolveInfo
from .properties import normalize_tags

__all__ = ["LinearOperator", "register_krylov", "solve_operator", "OPERATOR_METHODS"]

#: The methods a matrix-free operator takes (the torch backend's Krylov solvers), with what A must be.
OPERATOR_METHODS = {"cg": "symmetric (Hermitian) positive definite", "minres": "symmetric (Hermitian)",
                    "gmres": "any square", "bicgstab": "any square"}
_SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)

_krylov_loader: Callable[[], Mapping[str, Callable]] | None = None


def register_krylov(loader: Callable[[], Mapping[str, Callable]]) -> None:
    """Set the function returning the Krylov solvers by method name (``{"cg": cg, ...}``, the torch
    backend's ``krylov`` interface); called once by the package on import, loaded on first use."""
    global _krylov_loader
    _krylov_loader = loader


def _krylov(method: str) -> Callable:
    if _krylov_loader is None:  # pragma: no cover - sparsetorch/__init__.py registers on import
        raise RuntimeError("no Krylov solvers registered: import sparsetorch (the package registers them)")
    return _krylov_loader()[method]


class LinearOperator:
    """A square linear operator known by its action: ``A @ x`` is ``matvec(x)``.

    - ``matvec(x)``: ``A x`` for a vector ``x`` of shape ``(n,)`` (returns ``(n,)``); with
      ``blocks=True`` it takes (and returns) an ``(n, k)`` block of columns instead, one call per
      block (without it, blocks are applied column by column).
    - ``shape``: ``(n, n)``.
    - ``rmatvec(y)``: ``A^H y`` (the adjoint, same calling convention), for the backward pass; when
      None, ``A`` itself if ``properties`` say it is self-adjoint, else derived by autograd (a
      vector-Jacobian product of ``matvec``, exact for a linear ``matvec`` that autograd can
      differentiate).
    - ``dtype`` / ``device``: what ``b`` must be (None: whatever ``b`` is).
    - ``properties``: "spd", "symmetric", "hermitian" or "general" (a string or several): pick the
      default method (cg, minres, gmres) and let the adjoint be ``matvec`` itself.
    """

    def __init__(self, matvec: Callable[[torch.Tensor], torch.Tensor], shape: Sequence[int], *,
                 rmatvec: Callable[[torch.Tensor], torch.Tensor] | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, properties: str | Sequence[str] | None = None,
                 blocks: bool = False) -> None:
        if not callable(matvec):
            raise InputError(f"LinearOperator: matvec must be a callable x -> A x, got {type(matvec).__name__}")
        if rmatvec is not None and not callable(rmatvec):
            raise InputError(f"LinearOperator: rmatvec must be None or a callable y -> A^H y, got "
                             f"{type(rmatvec).__name__}")
        try:
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise InputError(f"LinearOperator: shape must be (n, n), got {shape!r}") from None
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
            raise InputError(f"LinearOperator: shape must be (n, n) with n >= 1 (a square operator), got {shape}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise InputError(f"LinearOperator: dtype must be a torch.dtype or None, got {dtype!r}")
        self.matvec = matvec
        self.rmatvec = rmatvec
        self.shape = shape
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.properties = normalize_tags(properties)
        self.blocks = bool(blocks)

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matvec(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matvec(x)

    def __repr__(self) -> str:
        props = f", properties={sorted(self.properties)}" if self.properties else ""
        return f"LinearOperator(shape={self.shape}{props}{', rmatvec' if self.rmatvec else ''})"


def _block_apply(fn: Callable, blocks: bool, n: int, dtype: torch.dtype, device: torch.device,
                 what: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``X -> fn`` applied to an ``(n, k)`` block (column by column unless ``blocks``), each output
    checked: a tensor of the input's shape, dtype and device."""

    def check(out: Any, shape: tuple) -> torch.Tensor:
        if not isinstance(out, torch.Tensor):
            raise InputError(f"solve: {what} returned {type(out).__name__} for an input of shape {shape}; it must "
                             f"return a torch.Tensor of shape {shape}")
        if tuple(out.shape) != shape:
            raise InputError(f"solve: {what} returned shape {tuple(out.shape)} for an input of shape {shape}; it must "
                             f"return shape {shape} (A is {n} x {n})" + (
                                 "" if blocks else "; it is called on one vector (n,) at a time, or pass "
                                 "LinearOperator(..., blocks=True) for a matvec of (n, k) blocks"))
        if out.dtype != dtype or out.device != device:
            raise InputError(f"solve: {what} returned {out.dtype} on {out.device} for an input of {dtype} on {device}; "
                             f"it must keep the input's dtype and device (cast the tensors it closes over, or b)")
        return out

    def apply(X: torch.Tensor) -> torch.Tensor:
        if blocks:
            return check(fn(X), tuple(X.shape))
        if X.shape[-1] == 1:
            return check(fn(X[:, 0]), (n,)).unsqueeze(-1)
        return torch.stack([check(fn(X[:, j]), (n,)) for j in range(X.shape[-1])], dim=-1)

    return apply


def _vjp_adjoint(apply: Callable[[torch.Tensor], torch.Tensor], what: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``Y -> A^H Y`` as the vector-Jacobian product of ``apply`` (exact for a linear operator): the
    product is recorded once per block shape (at zero), each call is one backward pass through it."""
    recorded: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def adjoint(Y: torch.Tensor) -> torch.Tensor:
        key = (tuple(Y.shape), Y.dtype, Y.device)
        if key not in recorded:
            with torch.enable_grad():
                Z = torch.zeros_like(Y, requires_grad=True)
                V = apply(Z)
            if not V.requires_grad:
                raise InputError(
                    f"solve: the backward pass needs A^H, and {what} is not differentiable by autograd in its input "
                    f"(its output has no graph), so A^H cannot be derived: pass LinearOperator(matvec, shape, "
                    f"rmatvec=...) or properties='symmetric' / 'hermitian' / 'spd' for a self-adjoint A")
            recorded[key] = (Z, V)
        Z, V = recorded[key]
        with torch.enable_grad():
            (G,) = torch.autograd.grad(V, Z, grad_outputs=Y, retain_graph=True, allow_unused=True)
        return torch.zeros_like(Y) if G is None else G

    return adjoint


def _leaves(out: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors requiring grad that ``out``'s graph reaches (what a probe product depends on)."""
    found: dict[int, torch.Tensor] = {}
    # the visited nodes are kept alive: torch may hand out a new Python wrapper per access of a graph node
    # (torch 2.11 does), so a wrapper freed after its visit let another node's wrapper reuse its id, and that node
    # was skipped as seen (the closed-over tensors got no gradient: found on the H100's torch 2.11)
    seen: dict[int, Any] = {}
    stack = [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        var = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if isinstance(var, torch.Tensor):
            found.setdefault(id(var), var)
            continue
        stack.extend(nxt for nxt, _ in node.next_functions)
    return list(found.values())


def _params(params: Any, apply: Callable[[torch.Tensor], torch.Tensor], B: torch.Tensor,
            blocks: bool) -> list[torch.Tensor]:
    """The tensors the operator's gradient goes to: ``params`` as given (tensors, SparseTensors for their
    values, nn.Modules for their parameters), else found by one probe product (the leaves requiring
    grad that the graph of ``A`` applied to b's first column, or to the block b, reaches; none when
    grad mode is off)."""
    if params is not None:
        items = [params] if isinstance(params, (torch.Tensor, SparseTensor, torch.nn.Module)) else list(params)
        out: list[torch.Tensor] = []
        for i, p in enumerate(items):
            if isinstance(p, SparseTensor):
                out.append(p.values)
            elif isinstance(p, torch.nn.Module):
                out.extend(p.parameters())
            elif isinstance(p, torch.Tensor):
                out.append(p)
            else:
                raise InputError(f"solve: params[{i}] is a {type(p).__name__}; params= takes tensors, SparseTensors "
                                 f"(their values) and nn.Modules (their parameters)")
        return list({id(p): p for p in out}.values())
    if not torch.is_grad_enabled():
        return []
    with torch.enable_grad():
        probe = apply(B.detach() if blocks else B.detach()[:, :1])
    return _leaves(probe) if probe.requires_grad else []


def _method(method: str | None, tags: frozenset[str] | None, dtype: torch.dtype) -> str:
    tags = tags or frozenset()
    self_adjoint = "hermitian" in tags or ("symmetric" in tags and not dtype.is_complex)
    if method is None:
        if "spd" in tags:
            return "cg"
        return "minres" if self_adjoint else "gmres"
    if not isinstance(method, str) or method not in OPERATOR_METHODS:
        known = ", ".join(f"{m!r} ({a} A)" for m, a in OPERATOR_METHODS.items())
        raise InputError(f"solve: method={method!r} is not available for a matrix-free A (a function or "
                         f"LinearOperator, known only by its products); methods: {known}")
    if method in ("cg", "minres") and "nonsymmetric" in tags:
        raise InputError(f"solve: method={method!r} needs a {OPERATOR_METHODS[method]} A, and the operator's "
                         f"properties say {sorted(tags)}: use method='gmres' or 'bicgstab'")
    if method in ("cg", "minres") and "symmetric" in tags and not self_adjoint:
        raise InputError(f"solve: method={method!r} needs a Hermitian A; a complex symmetric A "
                         f"(properties {sorted(tags)}) is not: use method='gmres' or 'bicgstab'")
    return method


def _preconditioners(pre: Any, n: int, dtype: torch.dtype, device: torch.device,
                     self_adjoint: bool) -> tuple[Callable | None, Callable | None, str | None]:
    if pre is None:
        return None, None, None
    if isinstance(pre, str):
        raise InputError(f"solve: preconditioner={pre!r} reads A's entries, which a matrix-free A does not have: pass a "
                         f"callable M(x) ~ A^-1 x (or a LinearOperator, whose rmatvec serves the backward pass)")
    if isinstance(pre, LinearOperator):
        if pre.shape != (n, n):
            raise InputError(f"solve: the preconditioner has shape {pre.shape}; A is {n} x {n}")
        M = _block_apply(pre.matvec, pre.blocks, n, dtype, device, "the preconditioner")
        MH = M if (pre.rmatvec is None or self_adjoint) else _block_apply(pre.rmatvec, pre.blocks, n, dtype, device,
                                                                          "the preconditioner's rmatvec")
        return M, MH, "user"
    if not callable(pre):
        raise InputError(f"solve: preconditioner must be None or a callable M(x) ~ A^-1 x, got {type(pre).__name__}")
    # as the sparse path's user preconditioner: the same callable for the adjoint solve (a Krylov
    # method converges to A^-H g with any nonsingular M; an adjoint-matched M only converges faster)
    M = _block_apply(pre, False, n, dtype, device, "the preconditioner")
    return M, M, "user"


def solve_operator(A: Any, B: Any, *, backend: str | None, method: str | None, preconditioner: Any, rtol: float | None,
                   atol: float, maxiter: int | None, restart: int | None, return_info: bool, properties: Any,
                   check_finite: bool, on_nonconvergence: str, callback: Callable | None, check_every: int | None,
                   params: Any, **unused: Any):
    """``sparsetorch.solve`` for a matrix-free ``A`` (a callable or :class:`LinearOperator`); see
    docs/solve.md, "Matrix-free operators"."""
    for key, value in unused.items():
        if value is not None:
            raise InputError(f"solve: {key}={value!r} does not apply to a matrix-free A (it tunes dispatch's sparse "
                             f"plans); leave it out")
    if backend not in (None, "torch"):
        raise InputError(f"solve: backend={backend!r}: a matrix-free A is solved by the torch backend's Krylov methods "
                         f"only (backend=None or 'torch')")
    op = A if isinstance(A, LinearOperator) else None
    fn = op.matvec if op is not None else A
    if not isinstance(B, torch.Tensor) or B.layout != torch.strided:
        raise InputError(f"solve: with a matrix-free A, b must be a dense torch.Tensor of shape (n,) or (n, k), got "
                         f"{type(B).__name__ if not isinstance(B, torch.Tensor) else f'layout {B.layout}'}")
    if B.dim() not in (1, 2) or B.shape[0] < 1:
        raise InputError(f"solve: with a matrix-free A, b must have shape (n,) or (n, k), got {tuple(B.shape)} "
                         f"(batched right-hand sides: put them in the columns)")
    n = B.shape[0]
    if op is not None:
        if op.shape[0] != n:
            raise InputError(f"solve: A is a LinearOperator of shape {op.shape} and b has shape {tuple(B.shape)}: b "
                             f"must have {op.shape[0]} rows")
        if op.dtype is not None and op.dtype != B.dtype:
            raise InputError(f"solve: A is a LinearOperator of dtype {op.dtype} and b is {B.dtype}: cast b with "
                             f"b.to({op.dtype})")
        if op.device is not None and (op.device.type != B.device.type or
                                      (op.device.index is not None and op.device.index != B.device.index)):
            raise InputError(f"solve: A is a LinearOperator on {op.device} and b is on {B.device}: move b there")
    if B.dtype not in _SUPPORTED_DTYPES:
        raise InputError(f"solve: b has dtype {B.dtype}; a matrix-free solve runs in float32, float64, complex64 or "
                         f"complex128: cast b (and what the operator closes over)")
    if not is_plain(B):
        raise InputError("solve: a matrix-free solve does not run under torch.func transforms (vmap, grad, jvp, ...): "
                         "differentiate it with torch.autograd (backward / autograd.grad), batch it in b's columns")
    if check_finite:
        check_finite_rhs(B, "solve")
    tags = normalize_tags(properties) if properties is not None else (op.properties if op is not None else None)
    method = _method(method, tags, B.dtype)
    tags = tags or frozenset()
    self_adjoint = "hermitian" in tags or ("symmetric" in tags and not B.dtype.is_complex)
    complex_symmetric = "symmetric" in tags and B.dtype.is_complex and not self_adjoint
    blocks = op.blocks if op is not None else False
    what = "the operator A" if op is None else "the LinearOperator's matvec"
    apply = _block_apply(fn, blocks, n, B.dtype, B.device, what)
    Bn = B if B.dim() == 2 else B.unsqueeze(-1)

    if op is not None and op.rmatvec is not None:
        adj = _block_apply(op.rmatvec, blocks, n, B.dtype, B.device, "the LinearOperator's rmatvec")
        adjoint_source = "rmatvec"

        def adjoint() -> Callable:
            return adj
    elif self_adjoint:
        adjoint_source = "self-adjoint"

        def adjoint() -> Callable:
            return apply
    elif complex_symmetric:
        adjoint_source = "complex symmetric (conj A conj)"

        def adjoint() -> Callable:
            return lambda Y: apply(Y.conj().resolve_conj()).conj().resolve_conj()
    else:
        adjoint_source = "vjp"

        def adjoint() -> Callable:
            # a fresh record per adjoint solve: it is dropped when that solve ends
            return _vjp_adjoint(apply, what)

    M, MH, pre_name = _preconditioners(preconditioner, n, B.dtype, B.device, self_adjoint)
    options: dict[str, Any] = dict(rtol=default_rtol(B.dtype) if rtol is None else rtol, atol=atol, maxiter=maxiter,
                                   check_every=check_every or DEFAULT_CHECK_EVERY, callback=callback)
    if method == "gmres":
        options["restart"] = restart or DEFAULT_RESTART
    found = _params(params, apply, Bn, blocks)
    handle = OperatorHandle(name=f"matrix-free {method}", apply=apply, adjoint=adjoint, solver=_krylov(method),
                            options=options, params=found, preconditioner=M, adjoint_preconditioner=MH,
                            policy=on_nonconvergence)
    X = operator_solve_function(Bn, handle)
    if B.dim() == 1:
        X = X.squeeze(-1)
    if not return_info:
        return X
    res = handle.results[0]
    attempt = Attempt(backend="torch", method=method, preconditioner=pre_name, iterations=res.iterations,
                      status=res.status, residual=res.residual, reason=res.reason, succeeded=res.converged)
    info = SolveInfo(backend="torch", method=method, iterations=res.iterations, residual=res.residual,
                     converged=res.converged, status=res.status, reason=res.reason,
                     residual_history=tuple(res.history), preconditioner=pre_name,
                     extra={"operator": "matrix-free", "adjoint": adjoint_source, "params": len(found)},
                     attempts=(attempt,))
    return X, info
