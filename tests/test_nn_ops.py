"""SparseWeight's elementwise operations that keep the pattern (mul/div by a scalar, neg, to,
detach, clone) and its serialization (torch.save / weights_only load, deepcopy, state dicts),
each checked op by op against a dense float64 twin with ``torch.testing``: the result's dense
form against the op on the dense weight, and the stored values' gradient through a product
against the dense weight's gradient at the stored entries. ``torch.overrides`` checks that
every operation SparseWeight claims is one torch lets a subclass override.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.format import BSR, CSC, CSR
from sparsetorch.nn import SparseWeight
from sparsetorch.nn.weight import _HANDLERS

pytestmark = pytest.mark.usefixtures("single_thread")


def _twin(seed: int = 0, shape=(6, 8), fmt=CSR):
    """(SparseWeight whose values are a leaf v, v, the dense twin (a leaf), the pattern mask)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=gen) < 0.45
    D = torch.randn(shape, generator=gen, dtype=torch.float64) * mask
    A = st.SparseTensor.from_dense(D, fmt, mask=mask)
    v = A.values.clone().requires_grad_(True)
    return SparseWeight(A.with_values(v)), v, D.clone().requires_grad_(True), mask, A


def _grads_match(A, v, Dw, rtol: float = 1e-12, atol: float = 1e-12) -> None:
    """The stored values' gradient is the dense twin's gradient at the stored entries (every
    stored slot inside the shape: BSR's explicit zeros in a block included)."""
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dw.grad[coords[0], coords[1]].to(v.grad.dtype), rtol=rtol, atol=atol)


s0 = torch.tensor(-0.75, dtype=torch.float64)
# (name, op on a SparseWeight or on a dense tensor alike)
OPS = [
    ("mul_number", lambda w: w * 2.5),
    ("rmul_number", lambda w: 2.5 * w),
    ("torch.mul", lambda w: torch.mul(w, 3)),
    ("Tensor.mul_0d", lambda w: w.mul(s0)),
    ("multiply", lambda w: torch.multiply(w, -1.5)),
    ("div", lambda w: w / 4),
    ("torch.div_0d", lambda w: torch.div(w, s0)),
    ("neg", lambda w: -w),
    ("torch.neg", lambda w: torch.neg(w)),
    ("Tensor.negative", lambda w: w.negative()),
    ("detach", lambda w: w.detach()),
    ("clone", lambda w: w.clone()),
    ("torch.clone", lambda w: torch.clone(w)),
    ("to_float64", lambda w: w.to(torch.float64)),
    ("double", lambda w: w.double()),
    ("to_device_cpu", lambda w: w.to("cpu")),
    ("cpu", lambda w: w.cpu()),
    ("chain", lambda w: -(w * 2).clone() / 3),
]


@pytest.mark.parametrize("fmt", [CSR, CSC, BSR(2, 2)], ids=lambda f: f.name)
@pytest.mark.parametrize("name,op", OPS, ids=[n for n, _ in OPS])
def test_elementwise_op_matches_the_dense_twin(name, op, fmt) -> None:
    W, v, Dw, mask, A = _twin(1, fmt=fmt)
    out = op(W)
    assert isinstance(out, SparseWeight), name
    ref = op(Dw)
    torch.testing.assert_close(out.to_dense(), ref.detach() if name != "detach" else ref, rtol=1e-14, atol=1e-14)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.device == ref.device
    # the pattern is kept: no stored slot added or dropped, the same index buffers for views of values
    assert out.sparse.nse == A.nse and out.sparse.format == A.format
    if name not in ("clone", "torch.clone", "chain"):
        assert all(a is b for a, b in zip(out.sparse.crd_buffers, A.crd_buffers))
    # gradients through a product, against the dense twin's at the stored entries
    x = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    if name == "detach":
        assert not out.sparse.values.requires_grad and not ref.requires_grad
        return
    (out @ x).sin().sum().backward()
    (ref @ x).sin().sum().backward()
    _grads_match(A, v, Dw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_to_dtype_matches_the_dense_cast(dtype) -> None:
    W, v, Dw, mask, A = _twin(3)
    for out, ref in [(W.to(dtype), Dw.to(dtype)), (W.to(dtype=dtype), Dw.to(dtype=dtype)),
                     ({torch.float32: W.float, torch.float16: W.half, torch.bfloat16: W.bfloat16}[dtype](), Dw.to(dtype))]:
        assert isinstance(out, SparseWeight) and out.dtype == dtype
        torch.testing.assert_close(out.to_dense(), ref.detach(), rtol=0, atol=0)
    # the cast is differentiable: the gradient in float64 is the dense cast's
    x = torch.randn(8, 2, dtype=dtype)
    out = W.to(dtype)
    (out @ x).float().sum().backward()
    (Dw.to(dtype) @ x).float().sum().backward()
    _grads_match(A, v, Dw, rtol=1e-2, atol=1e-2)
    assert W.to(torch.float64) is W  # no change: the same tensor, as torch.Tensor.to


def test_scalar_tensor_factor_gets_its_gradient() -> None:
    W, v, Dw, mask, A = _twin(4)
    s = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    sd = s.detach().clone().requires_grad_(True)
    x = torch.randn(8, dtype=torch.float64)
    ((W * s) @ x).square().sum().backward()
    ((Dw * sd) @ x).square().sum().backward()
    torch.testing.assert_close(s.grad, sd.grad, rtol=1e-12, atol=1e-12)


def test_clone_and_detach_are_independent_where_torch_makes_them() -> None:
    W, v, Dw, mask, A = _twin(5)
    c = W.clone()
    with torch.no_grad():
        c.sparse.values.mul_(0)
    torch.testing.assert_close(W.to_dense().detach(), Dw.detach())  # a clone owns its values
    d = W.detach()
    with torch.no_grad():
        d.sparse.values.mul_(2)
    torch.testing.assert_close(W.to_dense().detach(), 2 * Dw.detach())  # detach shares them, as torch's


def test_ops_that_would_lose_the_pattern_are_refused() -> None:
    W, *_ = _twin(6)
    with pytest.raises(InputError, match="number or a 0-d tensor"):
        W * torch.ones(6, 8, dtype=torch.float64)
    with pytest.raises(InputError, match="divide by its zeros"):
        1.0 / W
    with pytest.raises(InputError, match="two sparse weights"):
        W * W
    with pytest.raises(InputError, match="to_dense"):
        W + 1
    with pytest.raises(InputError, match="to_dense"):
        torch.exp(W)


def test_every_claimed_op_is_overridable_and_w_is_tensor_like() -> None:
    W, *_ = _twin(7)
    assert torch.overrides.is_tensor_like(W) and torch.overrides.has_torch_function((W,))
    overridable = {f for fs in torch.overrides.get_overridable_functions().values() for f in fs}
    for func in _HANDLERS:
        name = torch.overrides.resolve_name(func) or repr(func)
        getter = getattr(func, "__name__", "") == "__get__"  # property getters (.T, .mT)
        assert func in overridable or getter, name


# serialization -------------------------------------------------------------------------------------
def _roundtrip(obj, weights_only: bool = True):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only)


@pytest.mark.parametrize("fmt", [CSR, BSR(2, 2)], ids=lambda f: f.name)
def test_torch_save_and_weights_only_load(fmt) -> None:
    W, v, Dw, mask, A = _twin(8, fmt=fmt)
    for weights_only in (True, False):
        back = _roundtrip(W.detach(), weights_only)
        assert isinstance(back, SparseWeight) and back.sparse.format == fmt
        torch.testing.assert_close(back.to_dense(), Dw.detach(), rtol=0, atol=0)
    dc = copy.deepcopy(W.detach())
    torch.testing.assert_close(dc.to_dense(), Dw.detach(), rtol=0, atol=0)
    assert dc.sparse.values.data_ptr() != W.sparse.values.data_ptr()


class _Holder(torch.nn.Module):
    """Dense-weight style code: a weight buffer used with F.linear (here a SparseWeight)."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


def test_state_dict_save_and_load_into_a_module() -> None:
    W, v, Dw, mask, A = _twin(9)
    m = _Holder(W.detach())
    sd = _roundtrip(m.state_dict(), weights_only=True)
    fresh = _Holder(SparseWeight(A.with_values(torch.zeros_like(A.values))))
    values = fresh.weight.sparse.values
    assert str(fresh.load_state_dict(sd)) == "<All keys matched successfully>"
    assert fresh.weight.sparse.values is values  # loaded in place
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(fresh(x), x @ Dw.detach().T, rtol=1e-12, atol=1e-12)
    # a dense checkpoint of the pruned model loads too (zero off the pattern) ...
    dense_sd = {"weight": 2 * Dw.detach()}
    fresh.load_state_dict(dense_sd)
    torch.testing.assert_close(fresh.weight.to_dense(), 2 * Dw.detach(), rtol=0, atol=0)
    # ... one with a nonzero off the pattern, or another pattern, does not, and nothing changes
    bad = 2 * Dw.detach()
    i, j = (int(t) for t in (~mask).nonzero()[0])
    bad[i, j] = 1.0
    with pytest.raises(RuntimeError, match=r"off the weight's sparsity pattern"):
        fresh.load_state_dict({"weight": bad})
    other = _Holder(_twin(10)[0].detach())
    with pytest.raises(RuntimeError, match="patterns differ|stores"):
        fresh.load_state_dict(other.state_dict())
    torch.testing.assert_close(fresh.weight.to_dense(), 2 * Dw.detach(), rtol=0, atol=0)


def test_products_under_autocast_run_in_the_autocast_dtype() -> None:
    """F.linear / @ / addmm with a SparseWeight under bf16 autocast, as with a dense weight."""
    W, v, Dw, mask, A = _twin(11)
    W32 = W.to(torch.float32)
    D32 = Dw.detach().to(torch.float32)
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pairs = [(torch.nn.functional.linear(x, W32), torch.nn.functional.linear(x, D32)),
                 (W32 @ x.T, D32 @ x.T),
                 (torch.addmm(torch.zeros(5, 6), x, W32.t()), torch.addmm(torch.zeros(5, 6), x, D32.t()))]
    for got, ref in pairs:
        assert got.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_weight_used_under_inference_mode_then_trained():
    # to_dense under inference_mode cached the entry slots as inference tensors on the pattern; a later
    # to_dense with autograd raised "Inference tensors cannot be saved for backward" (session 21's sweep)
    torch.manual_seed(0)
    layer = st.nn.SparseLinear.from_linear(torch.nn.Linear(16, 8))
    with torch.inference_mode():
        layer.to_dense()
    layer.to_dense().norm().backward()
    assert layer.values.grad is not None and torch.isfinite(layer.values.grad).all()


def test_sparse_weight_linear_with_bias_under_autocast_matches_dense_dtype():
    import torch.nn.functional as F

    torch.manual_seed(0)
    D = torch.randn(6, 8) * (torch.rand(6, 8) < 0.5)
    W = SparseWeight(st.SparseTensor.from_dense(D))
    x, b = torch.randn(3, 8), torch.randn(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yd, ys = F.linear(x, D, b), F.linear(x, W, b)
    assert ys.dtype == yd.dtype == torch.bfloat16
    torch.testing.assert_close(ys.float(), yd.float(), rtol=2e-2, atol=2e-2)


def test_module_holding_a_sparse_weight_buffer_moves_and_casts():
    import torch.nn.functional as F

    class Holder(torch.nn.Module):
        def __init__(self, W):
            super().__init__()
            self.register_buffer("weight", W)

        def forward(self, x):
            return F.linear(x, self.weight)

    D = torch.eye(4) * 2
    m = Holder(SparseWeight(st.SparseTensor.from_dense(D)))
    m.to("cpu")
    m.to(torch.float64)
    assert m.weight.dtype == torch.float64
    torch.testing.assert_close(m(torch.ones(2, 4, dtype=torch.float64)), torch.full((2, 4), 2.0, dtype=torch.float64))
    m.half()
    assert m.weight.dtype == torch.float16


class _WeightOnParameter(torch.nn.Module):
    """A module holding a SparseWeight built on its own Parameter (the weight's values)."""

    def __init__(self, A):
        super().__init__()
        self.vals = torch.nn.Parameter(A.values.clone())
        self.W = SparseWeight(A.with_values(self.vals))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.W)


def test_deepcopy_keeps_a_weight_on_the_copied_parameter():
    import copy

    torch.manual_seed(0)
    A = st.SparseTensor.from_dense(torch.randn(6, 8) * (torch.rand(6, 8) < 0.5))
    net2 = copy.deepcopy(_WeightOnParameter(A))
    assert net2.W.sparse.values is net2.vals
    net2(torch.randn(4, 8)).pow(2).sum().backward()
    assert net2.vals.grad is not None


def test_dense_vector_at_sparse_vector_is_their_dot_product():
    w = torch.tensor([1.0, 0, 2, 0, 3])
    W = SparseWeight(st.SparseTensor.from_dense(w))
    y = torch.arange(5.0)
    torch.testing.assert_close(y @ W, torch.dot(y, w))
    torch.testing.assert_close(W @ y, torch.dot(y, w))


def test_grad_attributes_of_a_sparse_weight_point_to_its_values():
    W = SparseWeight(st.SparseTensor.from_dense(torch.eye(3)))
    with pytest.raises(InputError, match="trainable tensor is W.sparse.values"):
        W.requires_grad_(True)


def test_sparse_weight_refuses_what_dense_torch_refuses():
    """F.linear with a bias of another dtype (outside autocast), mv of a matrix, mm of a vector or a batch: dense
    torch raises; SparseWeight promoted the bias or ran matmul's broadcasting instead (session 26's sweep)."""
    import torch.nn.functional as F

    D = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 4.0]])
    W = SparseWeight(st.SparseTensor.from_dense(D))
    x = torch.ones(3, 4)
    for bad in (torch.ones(2, dtype=torch.float64), torch.ones(3)):
        with pytest.raises(RuntimeError):
            F.linear(x, D, bad)
        with pytest.raises(InputError, match="bias"):
            F.linear(x, W, bad)
    for call in (lambda M: torch.mv(M, torch.ones(4, 5)), lambda M: M.mv(torch.ones(4, 5)),
                 lambda M: torch.mm(M, torch.ones(4)), lambda M: torch.mm(M, torch.ones(2, 4, 5)),
                 lambda M: M.mm(torch.ones(4))):
        with pytest.raises(RuntimeError):
            call(D)
        with pytest.raises(InputError, match="torch.m[mv]'s rule"):
            call(W)
    # what both take, alike
    torch.testing.assert_close(F.linear(x, W, torch.ones(2)), F.linear(x, D, torch.ones(2)))
    torch.testing.assert_close(F.linear(x, W, torch.ones(1)), F.linear(x, D, torch.ones(1)))
    torch.testing.assert_close(torch.mv(W, torch.arange(4.0)), torch.mv(D, torch.arange(4.0)))
    torch.testing.assert_close(torch.mm(torch.ones(5, 2), W), torch.mm(torch.ones(5, 2), D))


def test_sparse_weight_metadata_follows_its_values():
    """W.requires_grad said False while W.sparse.values required grad, and W.dtype kept float32 after the module's
    .double() converted the Parameter its values are (session 26's sweep)."""
    A = st.SparseTensor.from_dense(torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    net = _WeightOnParameter(A)
    assert net.W.requires_grad and net.W.dtype == torch.float32 and net.W.device == torch.device("cpu")
    assert not SparseWeight(A).requires_grad
    net.double()
    assert net.W.dtype == torch.float64 == net(torch.ones(2, 3, dtype=torch.float64)).dtype


def test_sparse_layers_name_inputs_they_cannot_take():
    """A meta-device or torch-sparse input to SparseLinear, and moving a SparseWeight to the meta device, raised
    torch's internal RuntimeErrors (autocast's device lookup, reshape of a sparse tensor, item() on meta; session
    26's sweep)."""
    from sparsetorch.errors import ConversionError

    layer = st.nn.SparseLinear.from_linear(torch.nn.Linear(4, 2))
    with pytest.raises(InputError, match="input is on meta and the layer on cpu"):
        layer(torch.ones(3, 4, device="meta"))
    with pytest.raises(InputError, match="dense \\(strided\\) tensor, got layout torch.sparse_coo"):
        layer(torch.ones(3, 4).to_sparse())
    with pytest.raises(ConversionError, match="meta device"):
        SparseWeight(st.SparseTensor.from_dense(torch.eye(2))).to("meta")
    assert layer(torch.ones(3, 4)).shape == (3, 2)
