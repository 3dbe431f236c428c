"""``FastFunction``: a ``torch.autograd.Function`` whose ``apply`` skips torch's per-call argument
binding on the hot path.

A Function with ``setup_context`` (needed for torch.func: vmap, grad, jacrev) has its ``forward``
arguments bound with ``inspect.signature`` on every ``apply`` (to fill defaults), which costs
tens of microseconds per call (measured: about a quarter of ``Matmul.execute``'s per-call
overhead on a small CPU problem; a GPU product is launch-bound, so the host time is the time).
Called with every forward argument given positionally there is nothing to fill: outside
torch.func transforms this ``apply`` goes straight to autograd's C entry, exactly where torch's
own ``apply`` ends up; under a transform, with keyword arguments, with a different argument
count, or on a torch without the internals used here, it defers to torch's ``apply`` unchanged.

``vmap_columns`` is the ``vmap`` rule the sparse Functions (solve, matmul) share.
"""

from __future__ import annotations

import inspect

import torch

__all__ = ["FastFunction", "vmap_columns"]


def _hooks():
    try:
        from torch._functorch.utils import unwrap_dead_wrappers  # noqa: PLC0415

        active = torch._C._are_functorch_transforms_active
    except (ImportError, AttributeError):  # a torch without them: always torch's apply
        return None
    return unwrap_dead_wrappers, active


_HOOKS = _hooks()
#: the state of torch.jit.trace's recording (None when not tracing)
_jit_tracing = torch._C._get_tracing_state


class FastFunction(torch.autograd.Function):
    """Subclass instead of ``torch.autograd.Function``; call ``apply`` with all forward arguments."""

    @classmethod
    def apply(cls, *args, **kwargs):
        if _jit_tracing() is not None:
            # torch.jit.trace cannot record these Functions (their plans run outside what it sees): it failed
            # with "unordered_map::at" (session 29's sweep). matmul and SparseLinear record plain torch ops instead.
            from ..errors import InputError  # noqa: PLC0415

            raise InputError(f"torch.jit.trace cannot record sparsetorch's {cls.__name__.strip('_').lower()} (its "
                             f"backends run outside what the tracer records, so a traced graph could not replay it); "
                             f"use torch.compile or torch.export, which trace it as a custom op. (A @ x, "
                             f"sparsetorch.matmul and nn.SparseLinear are traced, as plain torch ops)")
        if _HOOKS is not None and not kwargs:
            nargs = cls.__dict__.get("_nargs_cached")
            if nargs is None:
                params = inspect.signature(cls.forward).parameters.values()
                nargs = len(params) if all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params) else -1
                cls._nargs_cached = nargs
            unwrap, active = _HOOKS
            if len(args) == nargs and not active():
                return super(torch.autograd.Function, cls).apply(*unwrap(args))
        return super().apply(*args, **kwargs)


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
