"""Model surgery: :func:`reformat_model` and the pruners :func:`magnitude` and :func:`n_m`."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ..errors import InputError
from ..format import COO, CSR, NM, TensorFormat
from ..tensor import SparseTensor
from .linear import SparseLinear
from .weight import SparseWeight

__all__ = ["reformat_model", "magnitude", "n_m", "density", "prepare_compile", "LayerFn"]

#: decides for one ``nn.Linear`` (its dotted name, the module): None keeps it, a SparseTensor is
#: the new weight, a module replaces it
LayerFn = Callable[[str, nn.Linear], "SparseTensor | nn.Module | None"]


def _set_child(model: nn.Module, name: str, new: nn.Module) -> None:
    parent = model
    *path, last = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    setattr(parent, last, new)


def reformat_model(model: nn.Module, fn: LayerFn | None = None, *, func: Callable | None = None,
                   only: Callable[[str, nn.Module], bool] | None = None, backend: str | None = None,
                   subclasses: bool = False) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` in place, as ``fn(name, layer)`` decides.

    ``fn`` returns None (keep the layer), a 2-D SparseTensor (the new weight: the layer becomes a
    :class:`SparseLinear` with the old bias) or an ``nn.Module`` (used as it is). ``only`` picks
    the layers ``fn`` is asked about (default: every ``nn.Linear``). Returns ``model``.

    Only layers whose type is ``nn.Linear`` itself are replaced unless ``subclasses=True``: a
    subclass may hold more (a LoRA layer's adapters) or be read by its owner (``MultiheadAttention``
    reads ``out_proj.weight``), and replacing it dropped those silently or broke the owner. A layer
    whose weight is tied to another module's parameter (an LM head tied to its embedding) is left
    dense with a warning: a sparse copy would untie it. A layer reached by several paths (one module
    used twice) is replaced by one :class:`SparseLinear` at every path. The new parameters keep the
    old ones' ``requires_grad`` (a frozen layer stays frozen).

    UST's spelling works too: ``func(weight)`` (nvmath-python's ``reformat_model(model,
    func=...)``) is asked with each layer's weight tensor and returns None (keep) or the new
    weight (a SparseTensor or a :class:`SparseWeight`); with neither ``fn`` nor ``func`` every
    ``nn.Linear`` weight becomes a COO SparseTensor of its nonzeros, as UST's default does. Unlike
    UST's, the result trains: the stored values are the layers' parameters (the pattern fixed).
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"reformat_model needs an nn.Module, got {type(model).__name__}")
    if fn is not None and func is not None:
        raise InputError("reformat_model takes fn(name, layer) or UST's func(weight), not both")
    if func is not None:
        if not callable(func):
            raise InputError(f"reformat_model: func must be callable(weight), got {type(func).__name__}")
        fn = _from_weight_rule(func)
    elif fn is None:
        fn = _from_weight_rule(lambda w: SparseTensor.from_dense(w, format=COO))
    if not callable(fn):
        raise InputError(f"reformat_model: fn must be callable(name, linear), got {type(fn).__name__}")
    if isinstance(model, nn.Linear) and (only is None or only("", model)):
        raise InputError("reformat_model replaces layers inside a model; for a lone nn.Linear use "
                         "SparseLinear.from_linear(layer) or SparseLinear(weight, bias)")

    def linear(m: nn.Module) -> bool:
        return isinstance(m, nn.Linear) if subclasses else type(m) is nn.Linear

    # every path to every module (one module used twice has two), in order of first appearance
    paths: dict[int, list[str]] = {}
    mods: dict[int, nn.Module] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name and linear(m):
            paths.setdefault(id(m), []).append(name)
            mods[id(m)] = m
    # parameters shared with a module outside the layer (tied weights)
    owners: dict[int, set[int]] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(id(m))
    for key, names in paths.items():
        layer, name = mods[key], names[0]
        if only is not None and not only(name, layer):
            continue
        readers = [n for n in names if isinstance(model.get_submodule(n.rpartition(".")[0]), _WEIGHT_READERS)]
        if readers:
            import warnings

            warnings.warn(f"reformat_model: layer {readers[0]!r} left dense: its owner "
                          f"({type(model.get_submodule(readers[0].rpartition('.')[0])).__name__}) reads its weight "
                          f"tensor directly (F.multi_head_attention_forward), which a SparseLinear cannot stand for; the "
                          f"forward raised torch's TypeError (session 32's sweep)", stacklevel=2)
            continue
        tied = [p for p in (layer.weight, layer.bias) if p is not None and owners.get(id(p), {key}) != {key}]
        if tied:
            import warnings

            warnings.warn(f"reformat_model: layer {name!r} left dense: its {'weight' if tied[0] is layer.weight else 'bias'} "
                          f"is tied to another module's parameter (a sparse copy would untie them); untie it first to "
                          f"make it sparse", stacklevel=2)
            continue
        out = fn(name, layer)
        if out is None:
            continue
        if isinstance(out, SparseTensor):
            if tuple(out.format_shape) != tuple(layer.weight.shape):
                raise InputError(f"reformat_model: fn returned a weight of shape {tuple(out.format_shape)} for layer "
                                 f"{name!r}, whose weight is {tuple(layer.weight.shape)}")
            bias = None if layer.bias is None else layer.bias.detach().to(out.dtype)
            out = SparseLinear(out, bias, backend=backend)
            # a frozen layer stays frozen
            out.values.requires_grad_(layer.weight.requires_grad)
            if out.bias is not None and layer.bias is not None:
                out.bias.requires_grad_(layer.bias.requires_grad)
        elif not isinstance(out, nn.Module):
            raise InputError(f"reformat_model: fn returned {type(out).__name__} for layer {name!r}; it must return "
                             f"None (keep), a SparseTensor (the new weight) or an nn.Module")
        for path in names:
            _set_child(model, path, out)
    return model


#: modules that read a child nn.Linear's weight tensor themselves instead of calling it (subclasses=True reaches them)
_WEIGHT_READERS = (nn.MultiheadAttention,)


def _from_weight_rule(func: Callable) -> LayerFn:
    """A per-layer rule from UST's per-weight one: a SparseWeight answer stands for its SparseTensor."""
    def rule(name: str, layer: nn.Linear):
        out = func(layer.weight.detach())
        return out.sparse if isinstance(out, SparseWeight) else out

    return rule


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


def prepare_compile(module: nn.Module) -> None:
    """``model.apply(prepare_compile)``: :meth:`SparseLinear.prepare_compile` on every SparseLinear (a no-op
    since session 15, kept for code written before: every format compiles as it is)."""
    if isinstance(module, SparseLinear):
        module.prepare_compile()


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
