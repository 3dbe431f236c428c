"""FastFunction.apply: outside torch.func it skips torch's argument binding and goes straight to
autograd's entry; results, gradients and double backward are those of torch's apply, and under
vmap / grad, with keyword arguments or a different argument count, torch's apply runs."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.autograd import _fast_apply
from sparsetorch.autograd._fast_apply import FastFunction


class _Scale(FastFunction):
    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, k: float) -> torch.Tensor:
        return x * w * k

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, w, k = inputs
        ctx.save_for_backward(x, w)
        ctx.k = k

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return _Scale.apply(g, w, ctx.k), (g * x * ctx.k), None

    @staticmethod
    def vmap(info, in_dims, x, w, k):
        xd, wd, _ = in_dims
        x = x.movedim(xd, 0) if xd is not None else x
        w = w.movedim(wd, 0) if wd is not None else w
        return _Scale.apply(x, w, k), 0


def test_fast_path_is_taken_and_matches(monkeypatch) -> None:
    calls = []
    real = torch.autograd.Function.apply.__func__

    def spy(cls, *args, **kwargs):
        calls.append(cls)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(spy))
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = _Scale.apply(x, w, 3.0)
    assert calls == []  # straight to autograd's C entry
    (gx, gw) = torch.autograd.grad(y.sum(), (x, w), create_graph=True)
    torch.testing.assert_close(gx, 3.0 * w)
    torch.testing.assert_close(gw, 3.0 * x)
    (ggw,) = torch.autograd.grad(gx.sum(), (w,))  # double backward through the same Function
    torch.testing.assert_close(ggw, torch.full_like(w, 3.0))
    assert torch.autograd.gradcheck(lambda a, b: _Scale.apply(a, b, 2.0), (x.detach().requires_grad_(), w.detach().requires_grad_()))


def test_transforms_keywords_and_counts_fall_back() -> None:
    x = torch.randn(4, 3, dtype=torch.float64)
    w = torch.randn(3, dtype=torch.float64)
    out = torch.func.vmap(lambda xi: _Scale.apply(xi, w, 2.0))(x)
    torch.testing.assert_close(out, x * w * 2.0)
    g = torch.func.grad(lambda ww: _Scale.apply(x[0], ww, 2.0).sum())(w)
    torch.testing.assert_close(g, x[0] * 2.0)
    # keywords go to torch's own apply, which takes them from torch 2.12 or so and refuses them
    # before (torch 2.11: "apply() takes no keyword arguments"): the same answer as torch's
    class _Plain(torch.autograd.Function):
        forward = _Scale.forward
        setup_context = _Scale.setup_context
        backward = _Scale.backward

    try:
        expected = _Plain.apply(x[0], w, k=2.0)
    except TypeError:
        with pytest.raises(TypeError):
            _Scale.apply(x[0], w, k=2.0)
    else:
        torch.testing.assert_close(_Scale.apply(x[0], w, k=2.0), expected)
    with pytest.raises(TypeError):
        _Scale.apply(x[0], w)  # a missing argument: torch's apply says so


def test_without_torch_internals_it_is_torchs_apply(monkeypatch) -> None:
    monkeypatch.setattr(_fast_apply, "_HOOKS", None)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = _Scale.apply(x, torch.ones(3, dtype=torch.float64), 1.5)
    (g,) = torch.autograd.grad(y.sum(), (x,))
    torch.testing.assert_close(g, torch.full_like(x, 1.5))
