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


def _weight(seed: int = 4, shape=(6, 5), batch: int | None = None):
    """A SparseWeight on a random pattern (values require grad), its dense float64 twin (a leaf)."""
    from sparsetorch.nn import SparseWeight

    gen = torch.Generator().manual_seed(seed)
    full = (batch,) + shape if batch else shape
    mask = torch.rand(shape, generator=gen) < 0.5
    D = torch.randn(full, generator=gen, dtype=torch.float64) * mask
    A = st.SparseTensor.from_dense(D, mask=mask.expand(full), batch_dims=1 if batch else None)
    v = A.values.clone().requires_grad_(True)
    return SparseWeight(A.with_values(v)), v, D.clone().requires_grad_(True), A


def _values_grad_matches(A, v, Dw) -> None:
    """The values' gradient is the dense weight's gradient at the stored entries."""
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[..., slot], Dw.grad[..., coords[0], coords[1]], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["mat2_transposed", "mat1"])
def test_sparse_weight_addmm_matches_dense(where) -> None:
    W, v, Dw, A = _weight()
    gen = torch.Generator().manual_seed(5)
    if where == "mat2_transposed":  # what nn.functional.linear does: bias + x @ W^T
        bias, x = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(3, 5, generator=gen, dtype=torch.float64)
        y = torch.addmm(bias, x, W.t(), beta=0.5, alpha=2.0)
        ref = torch.addmm(bias, x, Dw.t(), beta=0.5, alpha=2.0)
    else:
        bias, x = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(5, 4, generator=gen, dtype=torch.float64)
        y = bias.addmm(W, x, alpha=-1.5)
        ref = bias.addmm(Dw, x, alpha=-1.5)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (y * g).sum().backward()
    (ref * g).sum().backward()
    _values_grad_matches(A, v, Dw)
    # beta=0 ignores the input, NaN included (torch's rule)
    nan = torch.full_like(bias, float("nan"))
    prod = torch.addmm(nan, x, W.t(), beta=0) if where == "mat2_transposed" else torch.addmm(nan, W, x, beta=0)
    assert not prod.isnan().any()


def test_sparse_weight_addmv_and_errors() -> None:
    W, v, Dw, A = _weight()
    x, b = torch.randn(5, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    y = torch.addmv(b, W, x, beta=2.0, alpha=0.25)
    ref = torch.addmv(b, Dw, x, beta=2.0, alpha=0.25)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    ref.sum().backward()
    _values_grad_matches(A, v, Dw)
    with pytest.raises(InputError, match="vec must be a 1-D"):
        torch.addmv(b, W, torch.randn(5, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="exactly one of mat1, mat2"):
        torch.addmm(torch.zeros(6, 6, dtype=torch.float64), W, W.t())
    with pytest.raises(InputError, match="out= is not supported"):
        torch.addmm(b, torch.randn(2, 5, dtype=torch.float64), W.t(), out=torch.empty(2, 6, dtype=torch.float64))


@pytest.mark.parametrize("side", ["left", "right"])
def test_sparse_weight_bmm_baddbmm_3d(side) -> None:
    W, v, Dw, A = _weight(batch=3)
    assert tuple(W.shape) == (3, 6, 5)
    gen = torch.Generator().manual_seed(6)
    if side == "left":
        X = torch.randn(3, 5, 2, generator=gen, dtype=torch.float64)
        inp = torch.randn(3, 6, 2, generator=gen, dtype=torch.float64)
        y, ref = torch.bmm(W, X), torch.bmm(Dw, X)
        z, zref = torch.baddbmm(inp, W, X, beta=0.5, alpha=3.0), torch.baddbmm(inp, Dw, X, beta=0.5, alpha=3.0)
        m, mref = W @ X, Dw @ X
    else:
        X = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
        inp = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
        y, ref = X.bmm(W), X.bmm(Dw)
        z, zref = inp.baddbmm(X, W, alpha=-1.0), inp.baddbmm(X, Dw, alpha=-1.0)
        m, mref = torch.matmul(X, W), torch.matmul(X, Dw)
    for got, want in ((y, ref), (z, zref), (m, mref)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (y.sum() + z.square().sum() + m.sin().sum()).backward()
    (ref.sum() + zref.square().sum() + mref.sin().sum()).backward()
    _values_grad_matches(A, v, Dw)
    # the transposed 3-D weight: mT and transpose(-2, -1), the value batch kept in front
    Xt = torch.randn(3, 6, 2, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(torch.bmm(W.mT, Xt), Dw.detach().mT @ Xt, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(W.transpose(-2, -1) @ Xt, Dw.detach().mT @ Xt, rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match="same B"):
        torch.bmm(W, torch.randn(2, 5, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="mT for a 3-D"):
        W.t()
    with pytest.raises(InputError, match="value batch keeps its place"):
        W.transpose(0, 1)


def test_sparse_weight_gradcheck_addmm_and_bmm() -> None:
    W, v, _, A = _weight(seed=7)
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    from sparsetorch.nn import SparseWeight

    assert torch.autograd.gradcheck(lambda b, x, v: torch.addmm(b, x, SparseWeight(A.with_values(v)).t(), alpha=0.7),
                                    (b, x, v.detach().clone().requires_grad_(True)))
    W3, v3, _, A3 = _weight(seed=8, batch=2)
    X = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda X, v: torch.bmm(SparseWeight(A3.with_values(v)), X),
                                    (X, v3.detach().clone().requires_grad_(True)))


def test_sparse_weight_mul_in_place_scales_values() -> None:
    W, v, Dw, A = _weight()
    x = torch.randn(5, dtype=torch.float64)
    with torch.no_grad():
        out = W.mul_(0.5)
        W.mul_(torch.tensor(-3.0, dtype=torch.float64))
    assert out is W
    torch.testing.assert_close(W @ x, (Dw.detach() * -1.5) @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(W.to_dense(), Dw.detach() * -1.5, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):  # torch's rule, as for dense
        W.mul_(2.0)
    with pytest.raises(InputError, match="number or a 0-d tensor"):
        W.mul_(torch.ones(6, 5, dtype=torch.float64))


def test_sparse_weight_zeros_like_ones_like_keep_the_pattern() -> None:
    from sparsetorch.nn import SparseWeight

    W, _, Dw, A = _weight()
    Z = torch.zeros_like(W)
    O = torch.ones_like(W, dtype=torch.float32, requires_grad=True)
    assert isinstance(Z, SparseWeight) and isinstance(O, SparseWeight)
    assert Z.sparse.pattern_key == A.pattern_key and Z.dtype == torch.float64
    assert torch.equal(Z.to_dense(), torch.zeros(6, 5, dtype=torch.float64))
    assert O.dtype == torch.float32 and O.sparse.values.requires_grad
    stored = A.with_values(torch.ones_like(A.values)).to_dense() != 0
    assert torch.equal(O.to_dense().detach(), stored.float())
    # the pattern's indicator: ones_like(W) @ x sums x over each row's stored columns
    x = torch.randn(5, dtype=torch.float32)
    torch.testing.assert_close(O @ x, stored.float() @ x)
    with pytest.raises(InputError, match="layout"):
        torch.zeros_like(W, layout=torch.sparse_coo)


def test_sparse_weight_t_of_1d_is_itself() -> None:
    from sparsetorch.nn import SparseWeight

    s = SparseWeight(st.SparseTensor.from_dense(torch.tensor([0.0, 2.0, 0.0, -1.0], dtype=torch.float64)))
    y = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    assert s.t() is s and s.T is s and torch.t(s) is s
    assert float(s.t() @ y) == pytest.approx(-1.0)
    with pytest.raises(InputError, match="needs a matrix"):
        s.mT


@pytest.mark.parametrize("fmt", [CSR, NM(2, 4), COO], ids=["csr", "nm24", "coo"])
def test_sparse_linear_compiles_fullgraph_with_no_graph_break(fmt) -> None:
    import torch._dynamo as dynamo

    torch.manual_seed(11)
    lin = nn.Linear(16, 6).double()
    g = lin.weight.detach().abs().reshape(6, 4, 4)
    mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, g.topk(2, -1).indices, True).reshape(6, 16)
    layer = SparseLinear.from_linear(lin, format=fmt, mask=mask)
    model = nn.Sequential(layer, nn.Tanh())
    # every format compiles as it is (prepare_compile is kept as a no-op for older code)
    assert layer.prepare_compile() is layer and not any(n.startswith("_csr") for n, _ in layer.named_buffers())
    x = torch.randn(3, 2, 16, dtype=torch.float64)
    assert dynamo.explain(model)(x).graph_break_count == 0
    dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    xc = x.clone().requires_grad_(True)
    y = compiled(xc)
    # against the dense float64 twin, values and gradients
    W = (lin.weight * mask).detach().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    ref = torch.tanh(torch.nn.functional.linear(x2, W, lin.bias.detach()))
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    (ref * gy).sum().backward()
    torch.testing.assert_close(xc.grad, x2.grad, rtol=1e-12, atol=1e-12)
    dW = layer.weight.with_values(layer.values.grad).to_dense()
    torch.testing.assert_close(dW, W.grad * mask, rtol=1e-12, atol=1e-12)
    assert set(layer.state_dict()) == set(SparseLinear.from_linear(lin, format=fmt, mask=mask).state_dict())


def test_code_reading_the_layers_weight_compiles_fullgraph() -> None:
    # reading layer.weight inside a compiled function (a regularizer on the weight, W @ x) failed with
    # fullgraph=True ("Data pointer comparison", a ContextVar): the pattern object is built eagerly, at
    # construction and after .to() (session 22's sweep)
    import torch._dynamo as dynamo

    torch.manual_seed(3)
    lin = nn.Linear(12, 5)
    mask = torch.rand(5, 12) > 0.4
    layer = SparseLinear.from_linear(lin, mask=mask)

    def f(x):
        W = layer.weight
        return layer(x) * (W.values ** 2).sum() + (W @ x.T).T

    x = torch.randn(3, 12)
    assert dynamo.explain(f)(x).graph_break_count == 0
    dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    Wd = (lin.weight * mask).detach()
    ref = torch.nn.functional.linear(x, Wd, lin.bias.detach()) * (Wd ** 2).sum() + x @ Wd.T
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    layer = layer.double()  # buffers cast: the pattern object follows, eagerly
    assert layer.weight.dtype == torch.float64
    got64 = torch.compile(f, backend="aot_eager", fullgraph=True)(x.double())
    torch.testing.assert_close(got64, ref.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how", ["load_state_dict_assign", "setattr"])
def test_compiled_code_reading_weight_follows_a_replaced_pattern(how) -> None:
    # the compiled region reads the pattern object built eagerly: a new pattern loaded with assign=True (or
    # buffers assigned) kept the old one there, a silent wrong product (session 22's sweep)
    def mk(seed):
        g = torch.Generator().manual_seed(seed)
        D = torch.randn(16, 12, generator=g, dtype=torch.float64)
        mask = torch.zeros(16, 12, dtype=torch.bool)
        for i in range(16):
            mask[i, torch.randperm(12, generator=g)[:3]] = True  # the same count per row, other columns
        return D * mask, mask

    D1, m1 = mk(1)
    D2, m2 = mk(2)
    x = torch.randn(5, 12, dtype=torch.float64)
    lin = SparseLinear(st.SparseTensor.from_dense(D1, mask=m1))
    other = SparseLinear(st.SparseTensor.from_dense(D2, mask=m2))
    f = torch.compile(lambda m: st.matmul(m.weight, x.T).T, backend="aot_eager")
    torch.testing.assert_close(f(lin), x @ D1.T)
    if how == "setattr":
        for name, buf in other.named_buffers():
            setattr(lin, name, buf.clone())
        lin.values = torch.nn.Parameter(other.values.detach().clone())
    else:
        lin.load_state_dict(other.state_dict(), assign=True)
    torch.testing.assert_close(f(lin), x @ D2.T)
    torch.testing.assert_close(lin.weight.to_dense(), D2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sparse_linear_compiled_half_accumulates_in_float32(dtype) -> None:
    # a row of 4097 ones times ones: 4096 after rounding, 2048 (fp16) / 256 (bf16) if summed in half
    n = 4097
    layer = SparseLinear(st.SparseTensor.from_dense(torch.ones(2, n, dtype=dtype)))
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.ones(1, n, dtype=dtype)
    y = compiled(x)
    assert y.dtype == dtype and y.flatten().tolist() == [4096.0, 4096.0]


def test_reformat_model_leaves_linear_subclasses_alone():
    # a LoRA layer (an nn.Linear subclass with adapters) was swapped for a plain SparseLinear, its
    # adapters and forward dropped; MultiheadAttention's out_proj (a subclass its owner reads) broke
    # the attention (session 21's sweep)
    import torch.nn.functional as F

    torch.manual_seed(0)

    class LoRALinear(nn.Linear):
        def __init__(self, i, o, r=4):
            super().__init__(i, o)
            self.lora_A = nn.Parameter(torch.randn(r, i) * 0.1)
            self.lora_B = nn.Parameter(torch.randn(o, r) * 0.1)

        def forward(self, x):
            return F.linear(x, self.weight, self.bias) + x @ self.lora_A.T @ self.lora_B.T

    model = nn.Sequential(LoRALinear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    names = sorted(n for n, _ in model.named_parameters())
    st.nn.reformat_model(model, st.nn.magnitude(0.5))
    assert isinstance(model[0], LoRALinear) and isinstance(model[2], st.nn.SparseLinear)
    assert {"0.lora_A", "0.lora_B"} <= {n for n, _ in model.named_parameters()}
    assert names != sorted(n for n, _ in model.named_parameters())  # the plain layer was replaced
    model(x)
    st.nn.reformat_model(nn.Sequential(LoRALinear(16, 32)), st.nn.magnitude(0.5), subclasses=True)  # opted in

    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    twin = copy.deepcopy(layer)
    st.nn.reformat_model(layer, st.nn.magnitude(0.5))
    assert type(layer.self_attn.out_proj) is not st.nn.SparseLinear
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(twin, name).weight.copy_(getattr(layer, name).to_dense())
    xs = torch.randn(2, 5, 16)
    torch.testing.assert_close(layer(xs), twin(xs), rtol=1e-5, atol=1e-6)


def test_reformat_model_keeps_frozen_layers_frozen_and_shared_layers_shared():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    model[0].requires_grad_(False)
    st.nn.reformat_model(model, st.nn.magnitude(0.5))
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["2.values", "2.bias"]

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(16, 16)
            self.dec = self.enc

        def forward(self, x):
            return self.dec(torch.relu(self.enc(x)))

    m = Twice()
    st.nn.reformat_model(m, st.nn.magnitude(0.9))
    assert isinstance(m.enc, st.nn.SparseLinear) and m.dec is m.enc


def test_reformat_model_leaves_a_tied_weight_dense_with_a_warning():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.head = nn.Linear(16, 32, bias=False)
            self.head.weight = self.emb.weight
            self.mid = nn.Linear(16, 16)

        def forward(self, t):
            return self.head(self.mid(self.emb(t)))

    m = LM()
    with pytest.warns(UserWarning, match="'head' left dense: its weight is tied"):
        st.nn.reformat_model(m, st.nn.magnitude(0.5))
    assert m.head.weight is m.emb.weight and isinstance(m.mid, st.nn.SparseLinear)
