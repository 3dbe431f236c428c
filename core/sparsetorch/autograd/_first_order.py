"""Gradients that are not themselves differentiable, made to say so.

A backward pass computed outside autograd (solves under ``no_grad``, an eigenvector adjoint by a
bordered solve) returns tensors without a graph. Differentiated again (``create_graph=True``,
``gradgradcheck``, a Hessian-vector product) they read as constants: ``slogdet``'s gradient came
back with no graph at all (a second derivative of zero), ``det``'s Hessian and the eigenvector
Hessian of ``eigsh`` were silently wrong (session 21's sweep). torch's ``once_differentiable``
guards only when the incoming gradient itself requires grad, which it does not for a loss that
is the op's output (the lstsq error then read "One of the differentiated Tensors appears to not
have been used in the graph"). :func:`first_order_only` ties such a gradient to the op's inputs
through a node whose backward raises a clear error naming the op.
"""

from __future__ import annotations

import torch

__all__ = ["first_order_only", "first_order_in"]


class _FirstOrderOnly(torch.autograd.Function):
    # torch.func style (setup_context, a generated vmap rule): a gradient taken by torch.func.grad is
    # computed with grad mode on, so this node is built under the transforms too
    generate_vmap_rule = True

    @staticmethod
    def forward(out: torch.Tensor, what: str, *anchors: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.what = inputs[1]

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"{ctx.what}: second derivatives are not implemented (its gradient is computed by solves outside "
            f"autograd, so differentiating that gradient again, with create_graph=True, gradgradcheck or a "
            f"Hessian-vector product, has no rule); differentiate once, or use finite differences of the gradient"
        )


def first_order_only(out: torch.Tensor | None, what: str, *anchors: torch.Tensor | None) -> torch.Tensor | None:
    """``out`` unchanged, but, when grad mode is on in a backward pass (``create_graph=True``) and an
    anchor (the op's inputs) requires grad, differentiating it raises instead of treating it as a
    constant."""
    if out is None or not torch.is_grad_enabled():
        return out
    live = [a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad]
    if not live:
        return out
    return _FirstOrderOnly.apply(out.detach(), what, *live)


def first_order_in(out: torch.Tensor | None, what: str, *anchors: torch.Tensor | None) -> torch.Tensor | None:
    """``out`` with its own graph kept, plus a zero tied to ``anchors`` whose backward raises: for a gradient
    that is exact as a function of some inputs (the incoming gradient, recorded under ``create_graph=True``)
    but was computed with others (``anchors``) held constant. Differentiating it again along those raises;
    along the rest it is exact. (``first_order_only`` cuts the whole graph.)"""
    if out is None or not torch.is_grad_enabled():
        return out
    live = [a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad]
    if not live:
        return out
    return out + _FirstOrderOnly.apply(torch.zeros_like(out.detach()), what, *live)
