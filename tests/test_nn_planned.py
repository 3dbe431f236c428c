"""SparseLinear keeps a planned product per batch size: what it must still see (new values, new
index buffers, a new dtype) and what copies of it must not carry (the backend plans)."""

from __future__ import annotations

import copy
import pickle

import torch
from torch import nn

import sparsetorch as st


def _layer(seed: int = 0, sparsity: float = 0.7) -> tuple[st.nn.SparseLinear, nn.Linear]:
    torch.manual_seed(seed)
    lin = nn.Linear(12, 7).double()
    return st.nn.SparseLinear(st.nn.magnitude(sparsity)("l", lin), lin.bias.detach()), lin


def _dense(layer: st.nn.SparseLinear) -> torch.Tensor:
    return layer.to_dense().detach()


def test_planned_product_matches_dense_for_every_batch_size_and_after_eviction():
    layer, _ = _layer()
    W, b = _dense(layer), layer.bias.detach()
    for k in list(range(1, 12)) + [1, 3]:       # more sizes than the layer keeps plans for
        x = torch.randn(k, 12, dtype=torch.float64)
        torch.testing.assert_close(layer(x), x @ W.T + b, rtol=1e-12, atol=1e-12)
    x = torch.randn(2, 3, 12, dtype=torch.float64)  # leading dimensions folded into the batch
    torch.testing.assert_close(layer(x), x @ W.T + b, rtol=1e-12, atol=1e-12)
    assert len(layer.__dict__["_handles"]) <= st.nn.linear.LAYER_HANDLES


def test_planned_product_sees_values_changed_in_place_and_gradients_match_dense():
    layer, _ = _layer(1)
    x = torch.randn(4, 12, dtype=torch.float64)
    layer(x)
    with torch.no_grad():
        layer.values.mul_(-2.0)                   # what an optimizer step does
    W, b = _dense(layer), layer.bias.detach()
    torch.testing.assert_close(layer(x), x @ W.T + b, rtol=1e-12, atol=1e-12)
    xx = x.clone().requires_grad_(True)
    (layer(xx) ** 2).sum().backward()
    Wd = W.clone().requires_grad_(True)
    xd = x.clone().requires_grad_(True)
    ((xd @ Wd.T + b) ** 2).sum().backward()
    torch.testing.assert_close(xx.grad, xd.grad, rtol=1e-12, atol=1e-12)
    coo = layer.weight.detach().entries()[0]
    torch.testing.assert_close(layer.values.grad, Wd.grad[coo[0].long(), coo[1].long()], rtol=1e-12, atol=1e-12)


def test_planned_product_follows_a_new_pattern_loaded_in_place_and_a_new_dtype():
    a, _ = _layer(2)
    b, _ = _layer(3)
    assert a.values.numel() == b.values.numel()   # same stored count, other positions
    x = torch.randn(3, 12, dtype=torch.float64)
    a(x)
    a.load_state_dict(b.state_dict())             # copies the index buffers in place
    torch.testing.assert_close(a(x), x @ _dense(b).T + b.bias.detach(), rtol=1e-12, atol=1e-12)
    a.float()
    y = a(x.float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, (x @ _dense(b).T + b.bias.detach()).float(), rtol=1e-5, atol=1e-5)


def test_copies_of_a_used_layer_carry_no_plans_and_still_compute():
    layer, _ = _layer(4)
    x = torch.randn(2, 12, dtype=torch.float64)
    ref = layer(x)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert "_handles" not in twin.__dict__
        torch.testing.assert_close(twin(x), ref, rtol=1e-12, atol=1e-12)


def test_no_grad_calls_run_the_plan_directly_and_see_new_values():
    layer, _ = _layer(5)
    x = torch.randn(3, 12, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
        assert y.grad_fn is None
        torch.testing.assert_close(y, x @ _dense(layer).T + layer.bias.detach(), rtol=1e-12, atol=1e-12)
        layer.values.data.mul_(3.0)               # unseen by the version counter: still reloaded
        torch.testing.assert_close(layer(x), x @ _dense(layer).T + layer.bias.detach(), rtol=1e-12, atol=1e-12)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x[0]), x[0] @ _dense(layer).T + layer.bias.detach(), rtol=1e-12, atol=1e-12)
    y = layer(x)                                  # gradients recorded: the autograd path, same plan
    assert y.grad_fn is not None
    plans = layer.plans()
    assert sorted(p["batch"] for p in plans) == [1, 3]
    assert all(p["plan"].endswith("/spmm") and "candidates" not in p for p in plans)  # CPU: dispatch chooses


def test_no_bias_layer_and_input_that_needs_a_gradient_without_grad_values():
    layer, _ = _layer(6)
    nb = st.nn.SparseLinear(layer.weight.detach())
    nb.values.requires_grad_(False)
    x = torch.randn(2, 12, dtype=torch.float64, requires_grad=True)
    y = nb(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, _dense(nb).sum(0).expand(2, 12), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(nb(x), x.detach() @ _dense(nb).T, rtol=1e-12, atol=1e-12)
