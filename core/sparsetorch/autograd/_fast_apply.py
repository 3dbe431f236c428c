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
"""

from __future__ import annotations

import inspect

import torch

__all__ = ["FastFunction"]


def _hooks():
    try:
        from torch._functorch.utils import unwrap_dead_wrappers  # noqa: PLC0415

        active = torch._C._are_functorch_transforms_active
    except (ImportError, AttributeError):  # a torch without them: always torch's apply
        return None
    return unwrap_dead_wrappers, active


_HOOKS = _hooks()


class FastFunction(torch.autograd.Function):
    """Subclass instead of ``torch.autograd.Function``; call ``apply`` with all forward arguments."""

    @classmethod
    def apply(cls, *args, **kwargs):
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
