"""sparsetorch.nn: SparseLinear, reformat_model and the pruners, against dense torch layers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.format import COO, CSR, NM
from sparsetorch.nn import SparseLinear, density, magnitude, n_m, reformat_model


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 8), nn.Tanh(), nn.Linear(8, 3, bias=False)).double()


def _dense_twin(model: nn.Module) -> nn.Module:
    """The same network with every SparseLinear replaced by an nn.Linear holding its dense weight."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, SparseLinear):
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None).double()
            with torch.no_grad():
                lin.weight.copy_(m.to_dense())
                if m.bias is not None:
                    lin.bias.copy_(m.bias)
            parent = twin
            *path, last = name.split(".")
            for part in path:
                parent = getattr(parent, part)
            setattr(parent, last, lin)
    return twin


@pytest.mark.parametrize("fmt", [CSR, COO, NM(2, 4)], ids=["csr", "coo", "nm24"])
def test_sparse_linear_matches_dense_forward_and_gradients(fmt) -> None:
    torch.manual_seed(1)
    lin = nn.Linear(12, 5).double()
    mask = torch.rand(5, 12) < 0.4
    if fmt != CSR and fmt != COO:  # NM(2, 4): at most 2 of every 4
        g = lin.weight.detach().abs().reshape(5, 3, 4)
        mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, g.topk(2, -1).indices, True).reshape(5, 12)
    layer = SparseLinear.from_linear(lin, format=fmt, mask=mask)
    W = (lin.weight * mask).detach().requires_grad_(True)
    b = lin.bias.detach().clone().requires_grad_(True)
    x = torch.randn(2, 3, 12, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y = layer(x)
    ref = torch.nn.functional.linear(x2, W, b)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.bias.grad, b.grad, rtol=1e-12, atol=1e-12)
    # the values' gradient is the dense weight gradient at the stored entries
    dense_grad = layer.weight.with_values(layer.values.grad).to_dense()
    torch.testing.assert_close(dense_grad, W.grad * mask, rtol=1e-12, atol=1e-12)
    if fmt in (CSR, COO):
        assert layer.values.numel() == int(mask.sum())


def test_gradcheck_through_the_layer() -> None:
    layer = SparseLinear.from_linear(nn.Linear(6, 4).double(), mask=torch.rand(4, 6) < 0.5)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, v: torch.func.functional_call(layer, {"values": v}, (x,)),
                                    (x, layer.values.detach().clone().requires_grad_(True)))


def test_reformat_model_magnitude_keeps_the_largest_and_trains() -> None:
    model = _mlp()
    original = [m.weight.detach().clone() for m in model if isinstance(m, nn.Linear)]
    reformat_model(model, magnitude(0.75), only=lambda name, m: m.out_features > 3)
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["SparseLinear", "Tanh", "SparseLinear", "Tanh", "Linear"]
    for layer, W in zip([model[0], model[2]], original):
        kept = layer.to_dense().detach()
        k = int(round(0.25 * W.numel()))
        assert layer.values.numel() == k
        threshold = W.abs().flatten().topk(k).values.min()
        assert bool((kept[kept != 0].abs() >= threshold).all())
        torch.testing.assert_close(kept[kept != 0], W[kept != 0])
    assert density(model) == pytest.approx((0.25 * (16 * 24 + 24 * 8) + 8 * 3) / (16 * 24 + 24 * 8 + 8 * 3))
    x = torch.randn(10, 16, dtype=torch.float64)
    torch.testing.assert_close(model(x), _dense_twin(model)(x), rtol=1e-12, atol=1e-12)
    # a few optimizer steps on the sparse values reduce a loss, patterns unchanged
    target = torch.randn(10, 3, dtype=torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0]
    assert model[0].values.numel() == int(round(0.25 * 16 * 24))


def test_n_m_pruning_stores_at_most_n_of_every_m() -> None:
    model = _mlp()
    reformat_model(model, n_m(2, 4))
    for m in model:
        if isinstance(m, SparseLinear):
            assert m.weight.format == NM(2, 4)
            D = m.to_dense().detach().reshape(m.out_features, -1, 4)
            assert int((D != 0).sum(-1).max()) <= 2
    x = torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(model(x), _dense_twin(model)(x), rtol=1e-12, atol=1e-12)


def test_state_dict_round_trip_and_to() -> None:
    model = reformat_model(_mlp(), magnitude(0.5))
    state = model.state_dict()
    other = reformat_model(_mlp(seed=5), magnitude(0.5))
    other.load_state_dict(state)
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(other(x), model(x))
    f32 = copy.deepcopy(model).float()
    assert f32[0].values.dtype == torch.float32 and f32[0].crd1.dtype == model[0].crd1.dtype
    torch.testing.assert_close(f32(x.float()), model(x).float(), rtol=1e-5, atol=1e-5)


def test_errors_say_what_is_wrong() -> None:
    with pytest.raises(InputError, match="sparsity"):
        magnitude(1.0)
    with pytest.raises(InputError, match="0 < n <= m"):
        n_m(5, 4)
    with pytest.raises(InputError, match="not a multiple of m=4"):
        reformat_model(nn.Sequential(nn.Linear(10, 4)), n_m(2, 4))
    with pytest.raises(InputError, match="must return"):
        reformat_model(nn.Sequential(nn.Linear(4, 4)), lambda name, m: "nope")
    with pytest.raises(InputError, match="shape"):
        reformat_model(nn.Sequential(nn.Linear(4, 4)), lambda name, m: st.SparseTensor.from_dense(torch.eye(3)))
    with pytest.raises(InputError, match="in_features=4"):
        SparseLinear.from_linear(nn.Linear(4, 2))(torch.randn(2, 5))
    with pytest.raises(InputError, match="bias must have shape"):
        SparseLinear(st.SparseTensor.from_dense(torch.eye(3)), torch.zeros(4))
    with pytest.raises(InputError, match="lone nn.Linear"):
        reformat_model(nn.Linear(3, 3), magnitude(0.5))


def test_inputs_are_not_modified() -> None:
    lin = nn.Linear(6, 6).double()
    w0 = lin.weight.detach().clone()
    W = st.SparseTensor.from_dense(lin.weight.detach())
    v0 = W.values.clone()
    layer = SparseLinear(W, lin.bias)
    with torch.no_grad():
        layer.values.mul_(2)
    assert torch.equal(W.values, v0) and torch.equal(lin.weight, w0)


def test_sparse_weight_runs_dense_style_code() -> None:
    """A torch.Tensor standing for a SparseTensor: @ on either side, mm, mv, linear, t, dot."""
    from sparsetorch.nn import SparseWeight

    torch.manual_seed(3)
    D = torch.randn(6, 5, dtype=torch.float64)
    D[D.abs() < 0.6] = 0
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    W = SparseWeight(A.with_values(v))
    x, X, Z = (torch.randn(5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64),
               torch.randn(2, 4, 6, dtype=torch.float64))
    torch.testing.assert_close(W @ x, D @ x)
    torch.testing.assert_close(torch.mm(W, X), D @ X)
    torch.testing.assert_close(W.mv(x), D @ x)
    torch.testing.assert_close(Z @ W, Z @ D)
    torch.testing.assert_close(W.T @ Z[0, 0], D.T @ Z[0, 0])
    torch.testing.assert_close(torch.nn.functional.linear(Z[..., :5], W, torch.ones(6, dtype=torch.float64)),
                               Z[..., :5] @ D.T + 1)
    # gradients reach the SparseTensor's values, as on the dense weight at the stored entries
    Dw = D.clone().requires_grad_(True)
    (torch.nn.functional.linear(Z[..., :5], W).sin().sum()).backward()
    (torch.nn.functional.linear(Z[..., :5], Dw).sin().sum()).backward()
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dw.grad[coords[0], coords[1]])
    # a 1-D SparseTensor: dot
    s = st.SparseTensor.from_dense(torch.tensor([0.0, 2.0, 0.0, -1.0], dtype=torch.float64))
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert float(torch.dot(SparseWeight(s), y)) == pytest.approx(0.0)
    assert float(SparseWeight(s) @ torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)) == pytest.approx(1.0)
    with pytest.raises(InputError, match="to_dense"):
        W + 1
    with pytest.raises(InputError, match="do not match"):
        torch.randn(3, 5, dtype=torch.float64) @ W
