"""Sparse layers for PyTorch models: :class:`SparseLinear`, :func:`reformat_model`, pruners.

A :class:`SparseLinear` holds its weight as a :class:`~sparsetorch.SparseTensor` in any format of
the DSL: the pattern is fixed (index buffers, moved by ``.to()``, saved in the ``state_dict``),
the stored values are the trainable ``nn.Parameter``. Its forward pass is ``x @ W^T + b`` through
:func:`sparsetorch.matmul` (dispatch, a cached product plan, gradients for the values and ``x``).

:func:`reformat_model` replaces ``nn.Linear`` layers of a model in place, by a function that
decides per layer: return ``None`` to keep it, a ``SparseTensor`` (the new weight) or a module.
:func:`magnitude` and :func:`n_m` are such functions (unstructured magnitude pruning, N:M
structured pruning stored in the ``NM(n, m)`` format)::

    import sparsetorch as st
    st.nn.reformat_model(model, st.nn.magnitude(0.9))          # keep the largest 10 % per layer
    st.nn.reformat_model(model, st.nn.n_m(2, 4), only=lambda name, m: name.startswith("mlp"))
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .errors import InputError
from .format import CSR, NM, TensorFormat
from .ops.matmul import matmul
from .tensor import SparseTensor

__all__ = ["SparseLinear", "SparseWeight", "reformat_model", "magnitude", "n_m", "density"]

#: decides for one ``nn.Linear`` (its dotted name, the module): None keeps it, a SparseTensor is
#: the new weight, a module replaces it
LayerFn = Callable[[str, nn.Linear], "SparseTensor | nn.Module | None"]


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
        y = _rows_times_transpose(x, self.weight, self.backend)
        return y if self.bias is None else y + self.bias

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


class SparseWeight(torch.Tensor):
    """A ``torch.Tensor`` that stands for a SparseTensor in torch code written for dense weights.

    ``torch.matmul``/``@`` (either side), ``mm``, ``mv``, ``nn.functional.linear`` (as the
    weight) and, for a 1-D tensor, ``dot`` run sparsetorch's products (dispatch, cached plans,
    gradients into the SparseTensor's values); ``.t()``/``.T``/``.mT`` give the transposed view.
    Anything else raises an error naming the operation (use ``.to_dense()`` for it): a silent
    densification of a large sparse weight would be a memory surprise.

        W = st.nn.SparseWeight(A)              # A: a SparseTensor (m, n), values may require grad
        y = torch.nn.functional.linear(x, W)   # x @ A^T through sparsetorch
    """

    _A: SparseTensor

    @staticmethod
    def __new__(cls, A: SparseTensor) -> "SparseWeight":
        if not isinstance(A, SparseTensor) or A.batch_shape or len(A.format_shape) not in (1, 2):
            raise InputError(f"SparseWeight needs a 1-D or 2-D SparseTensor without a value batch, got "
                             f"{type(A).__name__ if not isinstance(A, SparseTensor) else tuple(A.shape)}")
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(A.shape), dtype=A.dtype, device=A.device,
                                                requires_grad=False)
        t._A = A
        return t

    @property
    def sparse(self) -> SparseTensor:
        """The SparseTensor this tensor stands for."""
        return self._A

    def to_dense(self, *args, **kwargs) -> torch.Tensor:  # noqa: D102 - torch's name
        return self._A.to_dense()

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        A = self._A
        return f"SparseWeight(shape={tuple(A.shape)}, format={A.format.name or A.format}, nse={A.nse}, dtype={A.dtype})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is None:
            name = getattr(func, "__name__", str(func))
            if name in ("__get__", "__set__") or name.startswith("_"):  # attribute plumbing (shape, dtype, ...)
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)
            raise InputError(f"SparseWeight does not implement {name}: it runs matmul/@, mm, mv, linear, dot and "
                             f"t/T/mT through sparsetorch; call .to_dense() first for other operations")
        return handler(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # reached only by operations __torch_function__ let through (attribute plumbing aside,
        # none should get here): the wrapper has no dense storage to run them on
        raise InputError(f"SparseWeight does not implement {func}: use .to_dense() first")


def _rows_times_transpose(x: torch.Tensor, A: SparseTensor, backend: str | None = None) -> torch.Tensor:
    """``x @ A^T`` for ``x`` of shape ``(..., n)`` and ``A`` of shape ``(m, n)``: one product whose
    columns are the rows of ``x`` (a layer's batch)."""
    lead = x.shape[:-1]
    y = matmul(A, x.reshape(-1, x.shape[-1]).mT, backend=backend).mT
    return y.reshape(*lead, A.shape[0])


def _dense_operand(x: object, what: str) -> torch.Tensor:
    if isinstance(x, SparseWeight) or not isinstance(x, torch.Tensor):
        raise InputError(f"SparseWeight.{what}: the other operand must be a dense torch.Tensor, got {type(x).__name__}")
    return x


def _left(W: SparseWeight, X: torch.Tensor, what: str) -> torch.Tensor:
    """``W @ X`` for X of shape (n,) or (n, k)."""
    X = _dense_operand(X, what)
    if X.dim() not in (1, 2) or len(W._A.format_shape) != 2:
        raise InputError(f"SparseWeight.{what}: needs a 2-D sparse matrix and a 1-D or 2-D dense operand, got "
                         f"{tuple(W.shape)} and {tuple(X.shape)}")
    return matmul(W._A, X)


def _right(X: torch.Tensor, W: SparseWeight, what: str) -> torch.Tensor:
    """``X @ W`` = ``(W^T @ X^T)^T`` for X of shape (..., m)."""
    X = _dense_operand(X, what)
    if len(W._A.format_shape) != 2 or X.shape[-1] != W.shape[0]:
        raise InputError(f"SparseWeight.{what}: shapes {tuple(X.shape)} @ {tuple(W.shape)} do not match")
    return _rows_times_transpose(X, W._A.T)


def _matmul(a, b, *, out=None):
    if out is not None:
        raise InputError("SparseWeight: out= is not supported")
    if isinstance(a, SparseWeight):
        if a._A.format_shape and len(a._A.format_shape) == 1:
            return _dot(a, b)
        return _left(a, b, "matmul")
    return _right(a, b, "matmul")


def _linear(x, weight, bias=None):
    if not isinstance(weight, SparseWeight):
        raise InputError("SparseWeight: linear with a SparseWeight input and a dense weight is not supported")
    if len(weight._A.format_shape) != 2 or not isinstance(x, torch.Tensor) or x.shape[-1] != weight.shape[1]:
        raise InputError(f"SparseWeight.linear: input {tuple(getattr(x, 'shape', ()))} does not end with "
                         f"in_features={weight.shape[-1]}")
    y = _rows_times_transpose(x, weight._A)
    return y if bias is None else y + bias


def _dot(a, b, *, out=None):
    if isinstance(b, SparseWeight):
        a, b = b, a
    A = a._A
    x = _dense_operand(b, "dot")
    if len(A.format_shape) != 1 or x.dim() != 1 or x.shape[0] != A.shape[0]:
        raise InputError(f"SparseWeight.dot: needs two 1-D operands of one length, got {tuple(a.shape)} and {tuple(x.shape)}")
    coords, vals = A.coordinates()
    return (vals * x[coords[0]]).sum()


def _transposed(W, *args):
    return SparseWeight(W._A.T)


_HANDLERS: dict = {
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: lambda W, X: _right(X, W, "matmul"),
    torch.mm: lambda a, b, **k: _matmul(a, b, **k),
    torch.Tensor.mm: lambda a, b: _matmul(a, b),
    torch.mv: lambda a, b, **k: _left(a, b, "mv"),
    torch.Tensor.mv: lambda a, b: _left(a, b, "mv"),
    torch.nn.functional.linear: _linear,
    torch.dot: _dot,
    torch.Tensor.dot: _dot,
    torch.t: _transposed,
    torch.Tensor.t: _transposed,
    torch.Tensor.T.__get__: _transposed,
    torch.Tensor.mT.__get__: _transposed,
}


def _set_child(model: nn.Module, name: str, new: nn.Module) -> None:
    parent = model
    *path, last = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    setattr(parent, last, new)


def reformat_model(model: nn.Module, fn: LayerFn, *, only: Callable[[str, nn.Module], bool] | None = None,
                   backend: str | None = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` in place, as ``fn(name, layer)`` decides.

    ``fn`` returns None (keep the layer), a 2-D SparseTensor (the new weight: the layer becomes a
    :class:`SparseLinear` with the old bias) or an ``nn.Module`` (used as it is). ``only`` picks
    the layers ``fn`` is asked about (default: every ``nn.Linear``). Returns ``model``.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"reformat_model needs an nn.Module, got {type(model).__name__}")
    if not callable(fn):
        raise InputError(f"reformat_model: fn must be callable(name, linear), got {type(fn).__name__}")
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name and (only is None or only(name, m))]
    if isinstance(model, nn.Linear) and (only is None or only("", model)):
        raise InputError("reformat_model replaces layers inside a model; for a lone nn.Linear use "
                         "SparseLinear.from_linear(layer) or SparseLinear(weight, bias)")
    for name, layer in targets:
        out = fn(name, layer)
        if out is None:
            continue
        if isinstance(out, SparseTensor):
            if tuple(out.format_shape) != tuple(layer.weight.shape):
                raise InputError(f"reformat_model: fn returned a weight of shape {tuple(out.format_shape)} for layer "
                                 f"{name!r}, whose weight is {tuple(layer.weight.shape)}")
            bias = None if layer.bias is None else layer.bias.detach().to(out.dtype)
            out = SparseLinear(out, bias, backend=backend)
        elif not isinstance(out, nn.Module):
            raise InputError(f"reformat_model: fn returned {type(out).__name__} for layer {name!r}; it must return "
                             f"None (keep), a SparseTensor (the new weight) or an nn.Module")
        _set_child(model, name, out)
    return model


def magnitude(sparsity: float, *, format: TensorFormat = CSR) -> LayerFn:
    """Keep the ``1 - sparsity`` fraction of each layer's weights with the largest magnitude
    (ties broken by position), in ``format``."""
    if not isinstance(sparsity, (int, float)) or not (0 <= sparsity < 1):
        raise InputError(f"magnitude: sparsity must be in [0, 1) (the fraction removed), got {sparsity!r}")

    def prune(name: str, layer: nn.Linear) -> SparseTensor:
        W = layer.weight.detach()
        keep = max(1, int(round((1 - sparsity) * W.numel())))
        idx = W.abs().flatten().topk(keep).indices
        mask = torch.zeros(W.numel(), dtype=torch.bool, device=W.device)
        mask[idx] = True
        return SparseTensor.from_dense(W, format=format, mask=mask.reshape(W.shape))

    return prune


def n_m(n: int, m: int) -> LayerFn:
    """N:M structured pruning: in every ``m`` consecutive inputs of each output row keep the ``n``
    largest weights, stored in the ``NM(n, m)`` format (in_features must be a multiple of m)."""
    if not (isinstance(n, int) and isinstance(m, int) and 0 < n <= m):
        raise InputError(f"n_m: need integers 0 < n <= m, got n={n!r}, m={m!r}")

    def prune(name: str, layer: nn.Linear) -> SparseTensor:
        W = layer.weight.detach()
        out_f, in_f = W.shape
        if in_f % m:
            raise InputError(f"n_m({n}, {m}): layer {name!r} has in_features={in_f}, not a multiple of m={m}; "
                             f"skip it with reformat_model(..., only=...) or pick another m")
        groups = W.abs().reshape(out_f, in_f // m, m)
        mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, groups.topk(n, -1).indices, True)
        return SparseTensor.from_dense(W, format=NM(n, m), mask=mask.reshape(out_f, in_f))

    return prune


def density(model: nn.Module) -> float:
    """Stored weights over dense weights across the model's Linear and SparseLinear layers."""
    stored = dense = 0
    for m in model.modules():
        if isinstance(m, SparseLinear):
            stored += m.values.numel()
            dense += m.in_features * m.out_features
        elif isinstance(m, nn.Linear):
            stored += m.weight.numel()
            dense += m.weight.numel()
    return stored / dense if dense else math.nan
