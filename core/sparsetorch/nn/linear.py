"""`SparseLinear`: ``y = x @ W^T + b`` with a sparse weight whose stored values are the parameter.

Under ``torch.autocast`` the layer runs as ``nn.Linear`` does: the input, the stored values and
the bias cast to the autocast dtype (bfloat16 on CPU by default), the product in that dtype with
float32 accumulation, the output in that dtype; float64 layers are left alone, as autocast does.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..autograd.matmul import MatmulHandle, matmul_function
from ..dispatch.options import MatmulOptions
from ..dispatch.plan import obtain_plan
from ..errors import InputError
from ..format import CSR, TensorFormat
from ..ops.matmul import matmul, matmul_request
from ..tensor import SparseTensor

#: calls a layer's product is priced over when its plan is chosen (a layer is called once per
#: step or token: one-time setups such as a conversion or a kernel's packing are spread over them)
LAYER_REPEAT = 1000
#: planned products kept per layer (one per batch size seen, most recent first)
LAYER_HANDLES = 8

__all__ = ["SparseLinear", "rows_times_transpose", "amp_matmul", "autocast_dtype"]


class SparseLinear(nn.Module):
    """``y = x @ W^T + b`` with a sparse ``W`` of shape ``(out_features, in_features)``.

    Args:
        weight: the weight as a 2-D SparseTensor (any format); its pattern is kept, its values
            become the trainable parameter ``values`` (a copy: the argument is not modified).
        bias: ``(out_features,)`` or None; copied into a parameter.
        backend: pin the product's backend (default: dispatch by cost).
    """

    def __init__(self, weight: SparseTensor, bias: torch.Tensor | None = None, *, backend: str | None = None) -> None:
        super().__init__()
        if not isinstance(weight, SparseTensor) or len(weight.format_shape) != 2 or weight.batch_shape:
            got = (type(weight).__name__ if not isinstance(weight, SparseTensor)
                   else f"format shape {weight.format_shape}, batch {tuple(weight.batch_shape)}")
            raise InputError(f"SparseLinear: weight must be a 2-D SparseTensor (out_features, in_features) "
                             f"without a value batch, got {got}")
        out_features, in_features = (int(s) for s in weight.format_shape)
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (out_features,):
                raise InputError(f"SparseLinear: bias must have shape ({out_features},) (out_features), got "
                                 f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
            if bias.dtype != weight.dtype or bias.device != weight.device:
                raise InputError(f"SparseLinear: bias ({bias.dtype}, {bias.device}) must match the weight "
                                 f"({weight.dtype}, {weight.device})")
        self.in_features, self.out_features = in_features, out_features
        self.backend = backend
        self._format: TensorFormat = weight.format
        w = weight.detach()
        for k in range(len(w.format.levels)):
            p, c = w.pos(k), w.crd(k)
            self.register_buffer(f"pos{k}", None if p is None else p.clone())
            self.register_buffer(f"crd{k}", None if c is None else c.clone())
        self.values = nn.Parameter(w.values.clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @property
    def weight(self) -> SparseTensor:
        """The weight with the current values (differentiable in ``values``). It shares one
        pattern object across calls, so what sparsetorch derives from the pattern (entry lists,
        conversion maps, plans) is computed once, until ``.to()`` moves the index buffers."""
        n = len(self._format.levels)
        pos = [getattr(self, f"pos{k}") for k in range(n)]
        crd = [getattr(self, f"crd{k}") for k in range(n)]
        key = tuple(None if b is None else (b.data_ptr(), b.device, b.dtype) for b in pos + crd)
        cached = self.__dict__.get("_pattern")
        if cached is None or cached[0] != key or cached[1].values.dtype != self.values.dtype:
            source = SparseTensor(self._format, (self.out_features, self.in_features), pos, crd,
                                  self.values.detach(), check=False)
            self.__dict__["_pattern"] = cached = (key, source)
        return cached[1].with_values(self.values)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, format: TensorFormat = CSR, mask: torch.Tensor | None = None,
                    backend: str | None = None) -> "SparseLinear":
        """From an ``nn.Linear``: its weight's nonzeros (or the entries where ``mask``) in ``format``."""
        if not isinstance(linear, nn.Linear):
            raise InputError(f"SparseLinear.from_linear needs an nn.Linear, got {type(linear).__name__}")
        W = SparseTensor.from_dense(linear.weight.detach(), format=format, mask=mask)
        return cls(W, None if linear.bias is None else linear.bias.detach(), backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise InputError(f"SparseLinear: input must end with in_features={self.in_features}, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if torch.compiler.is_compiling():
            y = self._traced_product(x)
        else:
            y = self._planned_product(x)
            if y is None:
                y = rows_times_transpose(x, self.weight, self.backend)
        if self.bias is None:
            return y
        # under autocast the product is in the autocast dtype, and so is the bias (as nn.Linear's)
        return y + (self.bias if self.bias.dtype == y.dtype or autocast_dtype(x.device.type, y.dtype) is None
                    else self.bias.to(y.dtype))

    def __getstate__(self) -> dict:
        # planned products hold backend plans (not copyable, not picklable): a copy plans again
        state = dict(super().__getstate__())
        state.pop("_handles", None)
        return state

    def _index_names(self) -> tuple[str, ...]:
        names = self.__dict__.get("_index_buffer_names")
        if names is None:
            n = len(self._format.levels)
            names = self.__dict__["_index_buffer_names"] = tuple(f"pos{i}" for i in range(n)) + tuple(f"crd{i}" for i in range(n))
        return names

    def _planned_product(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x @ W^T`` through a product plan this layer keeps (per batch size, on the current
        index buffers and dtype), so a call is the plan's apply and not a one-shot dispatch; None
        where the general path must run (autocast, a dtype or device that differs from the
        weight's: it casts or raises with the message)."""
        values = self.values
        if (x.dtype != values.dtype or x.device != values.device or x.layout != torch.strided
                or autocast_dtype(x.device.type, values.dtype, x.dtype) is not None):
            return None
        x2 = x.reshape(-1, self.in_features)
        k = x2.shape[0]
        if k == 0:
            return None
        bufs = self._buffers                  # the index buffers as .to() / load_state_dict left them
        key = (tuple(None if b is None else (b.data_ptr(), b._version)
                     for b in (bufs[name] for name in self._index_names())), values.dtype, values.device, k, self.backend)
        handles: dict = self.__dict__.setdefault("_handles", {})
        h = handles.get(key)
        if h is None:
            W = self.weight.detach()
            Xn = x2.mT
            state, _, _ = obtain_plan("matmul", W, matmul_request(W, Xn, MatmulOptions(backend=self.backend,
                                                                                    repeat=LAYER_REPEAT)))
            h = MatmulHandle(state, W)
            if len(handles) >= LAYER_HANDLES:
                handles.pop(next(iter(handles)))
            handles[key] = h
        return matmul_function(values, x2.mT, h).mT.reshape(*x.shape[:-1], self.out_features)

    # torch.compile ------------------------------------------------------------------------------
    def prepare_compile(self) -> "SparseLinear":
        """Build what a compiled forward needs for a weight that is not CSR: the pattern's CSR
        index buffers and the gather from the stored values to CSR order (non-persistent
        buffers: moved by ``.to()``, not saved). CSR weights need nothing. Returns ``self``.

        Under ``torch.compile`` the forward pass is the ``sparsetorch::csr_matmul`` custom op
        (a fake kernel and an autograd formula, so ``fullgraph=True`` traces it with no graph
        break) instead of dispatch, which is not traceable; half-precision values and inputs
        are upcast to float32 around it, as the eager torch backend does. The CSR view costs
        about two index arrays of the stored count, so it is built only when asked for."""
        if self._format == CSR:
            return self
        from ..tensor.construct import conversion  # noqa: PLC0415 - only for compiled layers

        W = self.weight.detach()
        conv = conversion(W, CSR, W.index_dtype)
        self.register_buffer("_csr_crow", conv.pos[1], persistent=False)
        self.register_buffer("_csr_col", conv.crd[1], persistent=False)
        self.register_buffer("_csr_src", conv.src, persistent=False)
        return self

    def _traced_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` through the custom op (the compiled path; see :meth:`prepare_compile`)."""
        from ..autograd.custom_ops import csr_matmul  # noqa: PLC0415 - the compiled path only

        if self._format == CSR:
            crow, col, vals = self.pos1, self.crd1, self.values
        else:
            crow = self._buffers.get("_csr_crow")
            if crow is None:
                name = self._format.name or str(self._format)
                raise InputError(f"SparseLinear with format {name} under torch.compile needs its CSR view: call "
                                 f"layer.prepare_compile() (or model.apply(sparsetorch.nn.prepare_compile)) before "
                                 f"compiling")
            col, src = self._csr_col, self._csr_src
            vals = self.values if src is None else self.values.index_select(-1, src)
        lead = x.shape[:-1]
        dt = autocast_dtype(x.device.type, vals.dtype, x.dtype)
        if dt is not None:  # as autocast runs nn.Linear: both operands in its dtype
            vals, x = vals.to(dt), x.to(dt)
        X = x.reshape(-1, self.in_features).mT
        with torch.autocast(x.device.type, enabled=False) if dt is not None else contextlib.nullcontext():
            if vals.dtype in (torch.float16, torch.bfloat16):
                y = csr_matmul(crow, col, vals.float(), X.float(), self.out_features, self.in_features).to(x.dtype)
            else:
                y = csr_matmul(crow, col, vals, X, self.out_features, self.in_features)
        return y.mT.reshape(*lead, self.out_features)

    def to_dense(self) -> torch.Tensor:
        """The weight as a dense ``(out_features, in_features)`` tensor (differentiable)."""
        return self.weight.to_dense()

    @property
    def density(self) -> float:
        return self.values.numel() / max(1, self.in_features * self.out_features)

    def extra_repr(self) -> str:
        name = self._format.name or str(self._format)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={name}, stored={self.values.numel()} ({self.density:.1%})")


def rows_times_transpose(x: torch.Tensor, A: SparseTensor, backend: str | None = None) -> torch.Tensor:
    """``x @ A^T`` for ``x`` of shape ``(..., n)`` and ``A`` of shape ``(m, n)``: one product whose
    columns are the rows of ``x`` (a layer's batch)."""
    lead = x.shape[:-1]
    y = amp_matmul(A, x.reshape(-1, x.shape[-1]).mT, backend=backend).mT
    return y.reshape(*lead, A.shape[0])


def autocast_dtype(device_type: str, *dtypes: torch.dtype) -> torch.dtype | None:
    """The dtype autocast runs a product in, for operands of ``dtypes`` on ``device_type``: None
    when autocast is off there, or when an operand is float64 or not floating (autocast leaves
    those alone)."""
    if not torch.is_autocast_enabled(device_type):
        return None
    if any(d == torch.float64 or not d.is_floating_point for d in dtypes):
        return None
    return torch.get_autocast_dtype(device_type)


def amp_matmul(A: SparseTensor, X: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``matmul(A, X)``, under autocast as autocast runs a dense product: both operands cast to
    the autocast dtype (differentiably), the product itself with autocast off so the backends
    see plain half-precision operands (and accumulate in float32, as the torch backend does)."""
    dt = autocast_dtype(X.device.type, A.dtype, X.dtype)
    if dt is None:
        return matmul(A, X, backend=backend)
    with torch.autocast(X.device.type, enabled=False):
        return matmul(A if A.dtype == dt else A.with_values(A.values.to(dt)), X.to(dt), backend=backend)
