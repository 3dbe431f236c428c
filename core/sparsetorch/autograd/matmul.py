"""Adjoint rule of sparse @ dense, ``Y = A X``.

    backward  dX = A^H dY                     (the product plan's adjoint direction)
              dA_vals[k] = sum_c dY[row_k, c] conj(X[col_k, c])    (SDDMM on A's pattern)

For the adjoint direction (``Y = A^H X``): dX = A dY, dA = X dY^H. Gradients flow through the
values only, never through indices; padding slots of a format get zero.

Forward mode (``jvp``): dY = A(dvalues) X + A dX, with the same plan.

Half precision (float16, bfloat16): the products are the plan's (which accumulate in float32);
the core's SDDMM sums over the columns of ``dY`` and ``X``, so it gets them upcast to float32 and
its result is cast back to the values' dtype.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ._fast_apply import FastFunction, vmap_columns
from .sddmm import sddmm
from ..dispatch.plan import PlanState, guarded
from ..dispatch.plans import SampledProduct, supports
from ..errors import BackendError, SparseTorchError, SparseTorchWarning
from ..tensor import SparseTensor

__all__ = ["MatmulHandle", "matmul_function"]

_HALF = (torch.float16, torch.bfloat16)


@dataclass
class MatmulHandle:
    """``Y = A X`` (or ``A^H X`` when ``adjoint``) with a shared product plan."""

    state: PlanState
    A: SparseTensor
    adjoint: bool = False
    #: the result's rows (A's format shape read once per handle: a Matmul keeps its handle)
    _rows: int | None = field(default=None, repr=False, compare=False)
    #: dispatch chose the backend (no ``backend=``): a plugin's failing sddmm in the backward is answered by the
    #: core's (with a warning), and not asked again through this handle (ops/matmul.py's ``_Chosen`` sets it)
    chosen = False
    _sddmm_failed = False

    def flipped(self) -> "MatmulHandle":
        return MatmulHandle(self.state, self.A, not self.adjoint)

    def run(self, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # the Function's forward and the route's checks run without grad
            with torch.no_grad():
                return self.run(values, X)
        state = self.state
        rows = self._rows
        if rows is None:
            m, n = self.A.format_shape
            rows = self._rows = n if self.adjoint else m
        if values.dim() > 1 and 0 in values.shape[:-1]:
            # a value batch of no members: nothing to multiply (backends stacked an empty list)
            return X.new_zeros((*X.shape[:-2], rows, X.shape[-1]))
        with state.lock:
            state._load(values)
            try:  # what guarded() does, without a closure per call
                Y = state.plan.apply(X.detach(), adjoint=self.adjoint)
            except SparseTorchError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
                raise BackendError(f"{state.label} failed in apply: {type(exc).__name__}: {exc}", label=state.label,
                                   phase="apply") from exc
        want = (*X.shape[:-2], rows, X.shape[-1])
        if not isinstance(Y, torch.Tensor) or tuple(Y.shape) != want or Y.dtype != X.dtype or Y.device != X.device:
            got = (tuple(Y.shape), Y.dtype, Y.device) if isinstance(Y, torch.Tensor) else type(Y).__name__
            raise BackendError(f"{state.label} returned {got} from apply, expected shape {want}, {X.dtype} on "
                               f"{X.device} (plugin bug)", label=state.label, phase="apply")
        return Y


class _Matmul(FastFunction):
    @staticmethod
    def forward(values: torch.Tensor, X: torch.Tensor, handle: MatmulHandle) -> torch.Tensor:
        return handle.run(values, X)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, X, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, X)
        ctx.save_for_forward(values, X)

    @staticmethod
    def jvp(ctx, dvalues, dX, _):
        """Forward mode: ``dY = A(dvalues) X + A dX``, two products on the same plan (a product
        plan reloads values on every call, so the tangent values are one more load)."""
        values, X = ctx.saved_tensors
        h: MatmulHandle = ctx.handle
        out = None
        if dvalues is not None:
            out = _Matmul.apply(dvalues, X, h)
        if dX is not None:
            term = _Matmul.apply(values, dX, h)
            out = term if out is None else out + term
        if out is None:  # no tangent at all (torch does not call jvp then; kept for safety)
            out = torch.zeros(*X.shape[:-2], h.A.format_shape[1 if h.adjoint else 0], X.shape[-1],
                              dtype=X.dtype, device=X.device)
        return out

    @staticmethod
    def backward(ctx, dY: torch.Tensor):
        values, X = ctx.saved_tensors
        h: MatmulHandle = ctx.handle
        dX = _Matmul.apply(values, dY, h.flipped()) if ctx.needs_input_grad[1] else None
        dV = None
        if ctx.needs_input_grad[0]:
            P, Q = (X, dY) if h.adjoint else (dY, X)
            plan = h.state.plan
            if not (P.numel() and Q.numel()):
                # an empty product (no columns: an empty mini-batch; no rows or columns in A): every
                # entry's gradient is a sum over nothing
                dV = torch.zeros_like(values)
            elif (supports(plan, SampledProduct) and not torch.is_grad_enabled() and not P.is_complex()
                    and not Q.is_complex() and not h._sddmm_failed):
                # the backend's own kernel (first-order backward, real values: the core's sddmm
                # is the one that is differentiable again and conjugates)
                try:
                    dV = _plugin_sddmm(h, plan, P, Q, values)
                except BackendError as exc:
                    if not h.chosen:
                        raise
                    h._sddmm_failed = True
                    warnings.warn(f"matmul (backward): {exc} -- the values' gradient computed by the core's sddmm "
                                  f"instead (pass backend= to choose one)", SparseTorchWarning, stacklevel=2)
                    dV = _core_sddmm(h.A, P, Q, values)
            else:
                dV = _core_sddmm(h.A, P, Q, values)
        return dV, dX, None

    @staticmethod
    def vmap(info, in_dims, values, X, handle):
        return vmap_columns(_Matmul.apply, info, in_dims, values, X, handle)


def matmul_function(values: torch.Tensor, X: torch.Tensor, handle: MatmulHandle) -> torch.Tensor:
    return _Matmul.apply(values, X, handle)


def _plugin_sddmm(h: MatmulHandle, plan, P: torch.Tensor, Q: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The plan's own SDDMM, its output checked (a BackendError names the plugin otherwise)."""
    with h.state.lock:
        dV = guarded(lambda: plan.sddmm(P, Q), h.state.label, "sddmm")
    if not (isinstance(dV, torch.Tensor) and dV.dim() >= 1 and dV.shape[-1] == values.shape[-1]
            and dV.dtype == values.dtype and dV.device == values.device):
        raise BackendError(f"{h.state.label} returned {type(dV).__name__} "
                           f"{tuple(getattr(dV, 'shape', ()))} from sddmm; expected (*batch, {values.shape[-1]}) "
                           f"in {values.dtype} on {values.device} (plugin bug)",
                           label=h.state.label, phase="result")
    return dV


def _core_sddmm(A: SparseTensor, P: torch.Tensor, Q: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The core's SDDMM (differentiable again; half precision summed in float32)."""
    if P.dtype in _HALF or Q.dtype in _HALF:
        return sddmm(A, P.float(), Q.float()).to(values.dtype)
    return sddmm(A, P, Q)
