"""Adjoint rule of sparse least squares ``X = argmin ||A X - B||_F^2 + damp^2 ||X||_F^2``.

Math (A is m x n with full column rank when ``damp == 0``; K = A^H A + damp^2 I, invertible):

    forward   X = K^{-1} A^H B,   R = B - A X
    backward  from  K dX = dA^H R - A^H dA X  (differentiate K X = A^H B):
              Lambda = K^{-1} G                      (G = dL/dX)
              dB     = A Lambda
              dA     = R Lambda^H - (A Lambda) X^H   kept on A's pattern:
                       dA_vals[k] = sum_c R[row_k, c] conj(Lambda[col_k, c]) - W[row_k, c] conj(X[col_k, c])

W = A Lambda comes from one *adjoint* least-squares solve on the same plan, without forming K:
W = argmin ||A^H W - G||^2 + damp^2 ||W||^2 = (A A^H + damp^2 I)^{-1} A G = A K^{-1} G
(for damp = 0 the minimum-norm solution of the underdetermined A^H W = G, which is what LSQR/LSMR
return from a zero start). Then Lambda:

- ``damp == 0``: Lambda = A^+ W (a second least-squares solve; exact when A has full column
  rank, since A^+ A = I). Rank-deficient A: the pseudo-inverse is not differentiable in the
  usual sense (Golub & Pereyra's extra terms); not supported, and m < n raises.
- ``damp != 0``: Lambda = (G - A^H W) / damp^2 (from K Lambda = G; valid for any rank). Its
  error is about ``||A||^2 / damp^2`` times the adjoint solve's relative error, so tight
  tolerances (``atol``/``btol``) are needed when ``damp`` is small against ``||A||``.

Plans never see autograd: inputs arrive detached; this backward is not differentiable again
(``once_differentiable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import torch
from torch.autograd.function import once_differentiable

from ..errors import InputError, NotConvergedError, NotConvergedWarning
from ..format import CSR
from ..tensor import SparseTensor
from ..tensor.interop.torch_io import compressed_tensor
from ..tensor._serial import SerialCsr, serial_ok
from ..dispatch.plan import PlanState, guarded
from .sddmm import sddmm

__all__ = ["LstsqHandle", "lstsq_function", "apply_entries"]

#: value dtypes torch's CPU CSR kernel multiplies (others take the entry-wise product)
_CSR_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def apply_entries(A: SparseTensor, values: torch.Tensor, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
    """``A X`` (``A^H X`` when ``adjoint``) from A's stored entries; ``values`` (*batch, slots),
    ``X`` (*batch, cols, k). Plain torch (any device), used by the backward pass and the solves'
    residual checks. A CPU CSR matrix with one value set and no gradient to record takes one call: a small
    product the serial NumPy one (``tensor/_serial.py``: torch's CSR kernel opens a parallel region that
    stalls on a busy machine), a larger one torch's CSR kernel (the gathers, product and scatter below are
    ~4x its time)."""
    if not adjoint and A.format == CSR and not A.format.num_batch_levels and values.device.type == "cpu":
        if serial_ok(values, X):  # small: no parallel region (tensor/_serial.py)
            return SerialCsr(A.pos(1), A.crd(1), tuple(A.format_shape))(values, X)
        if (values.dim() == 1 and X.dim() == 2 and values.dtype in _CSR_DTYPES and X.dtype == values.dtype
                and values.layout == torch.strided and X.layout == torch.strided
                and not (torch.is_grad_enabled() and (values.requires_grad or X.requires_grad))):
            return compressed_tensor("csr", A.pos(1), A.crd(1), values.contiguous(), tuple(A.format_shape)) @ X
    coords, slot = A.entries()
    rows, cols = coords[0], coords[1]
    m, n = A.format_shape
    v = values.index_select(-1, slot)  # index_select: torch's advanced indexing opens a parallel region
    if adjoint:
        v = v.conj() if v.is_complex() else v
        rows, cols, m = cols, rows, n
    per = v.unsqueeze(-1) * X.index_select(-2, cols)
    out = per.new_zeros(*per.shape[:-2], m, X.shape[-1])
    return out.index_add(-2, rows, per)


@dataclass
class LstsqHandle:
    """Runs the least-squares plan in ``state`` (``adjoint``: for ``A^H``) with one call's options."""

    state: PlanState
    A: SparseTensor
    options: dict
    on_nonconvergence: str = "raise"
    results: list = field(default_factory=list)

    def run(self, values: torch.Tensor, B: torch.Tensor, adjoint: bool = False) -> torch.Tensor:
        state = self.state
        with state.lock, torch.no_grad():
            state._load(values)
            plan = state.plan
            X, res = guarded(lambda: plan.lstsq(B.detach(), adjoint=adjoint, options=dict(self.options)), state.label,
                             "lstsq")
        self.results.append(res)
        if not res.converged:
            what = "adjoint " if adjoint else ""
            msg = (f"{plan.backend}/{plan.method} ({what}least squares) stopped after {res.iterations} iterations "
                   f"({res.status.value}: {res.reason or 'no reason given'}). Raise maxiter, loosen atol/btol, raise "
                   f"conlim or add damp, or pass on_nonconvergence='warn' to get x anyway")
            if self.on_nonconvergence == "warn":
                import warnings

                warnings.warn(msg, NotConvergedWarning, stacklevel=5)
            elif self.on_nonconvergence != "ignore":
                raise NotConvergedError(msg, res)
        return X


class _Lstsq(torch.autograd.Function):
    @staticmethod
    def forward(values: torch.Tensor, B: torch.Tensor, handle: LstsqHandle) -> torch.Tensor:
        return handle.run(values, B)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, B, handle = inputs
        ctx.handle = handle
        ctx.save_for_backward(values, B, output)

    @staticmethod
    @once_differentiable
    def backward(ctx, G: torch.Tensor):
        values, B, X = ctx.saved_tensors
        h: LstsqHandle = ctx.handle
        need_v, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_v or need_b):
            return None, None, None
        m, n = h.A.format_shape
        damp = float(h.options.get("damp") or 0.0)
        if damp == 0.0 and m < n:
            raise InputError(f"lstsq gradients need full column rank (m >= n) when damp == 0; A is {m}x{n} "
                             f"(underdetermined). Pass damp > 0 or do not require grad")
        G = G.detach()
        W = h.run(values, G, adjoint=True)  # A K^{-1} G
        if damp == 0.0:
            Lam = h.run(values, W)  # A^+ W = K^{-1} G for full column rank
        else:
            Lam = (G - apply_entries(h.A, values, W, adjoint=True)) / damp**2
        dB = W if need_b else None
        dV = None
        if need_v:
            R = B - apply_entries(h.A, values, X)
            dV = sddmm(h.A, R, Lam) - sddmm(h.A, W, X)
        return dV, dB, None


def lstsq_function(values: torch.Tensor, B: torch.Tensor, handle: LstsqHandle) -> torch.Tensor:
    """``X`` minimising ``||A(values) X - B||^2 + damp^2 ||X||^2`` through the plan, differentiable."""
    return _Lstsq.apply(values, B, handle)
