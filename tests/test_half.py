"""float16 / bfloat16 through the torch backend: products and their gradients in every format,
the layers, and the refusal of half-precision eigsh and logdet (solve: tests/test_half_solve.py).

References are dense float64 products of the *same* half-rounded inputs, so the only errors
left are the product's own: a float32 accumulation (relative ~n * 2**-24) and the final
rounding to the half dtype (half an ulp of the result). The tolerance of an entry is therefore
``u * (|A| @ |X|)`` with ``u`` the half dtype's ulp at 1 (float16 2**-10, bfloat16 2**-7), which a
sum accumulated in the half dtype would exceed on long rows; the long-row tests check that
directly (a sum of 4097 ones that float16 accumulation stops at 2048).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sparsetorch as st
from sparsetorch.errors import NoBackendError
from sparsetorch.format import BSC, BSR, COO, CSC, CSR, DCSC, DCSR, DELTA, DENSE, DENSE_COL, DIA, DIA_J, ELL, NM
from sparsetorch.nn import SparseLinear, SparseWeight

HALF = [torch.float16, torch.bfloat16]
#: the ulp at 1 (machine epsilon) of each half dtype
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
FORMATS = {"coo": COO, "csr": CSR, "csc": CSC, "dcsr": DCSR, "dcsc": DCSC, "bsr22": BSR(2, 2), "bsc22": BSC(2, 2),
           "dia": DIA, "dia_j": DIA_J, "ell": ELL, "delta2": DELTA(2), "nm24": NM(2, 4), "dense": DENSE,
           "dense_col": DENSE_COL}


def _mask(fmt, m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    if fmt == NM(2, 4):  # two of every four consecutive columns
        keys = torch.rand(m, n // 4, 4, generator=gen)
        return torch.zeros(m, n // 4, 4, dtype=torch.bool).scatter_(-1, keys.topk(2, -1).indices, True).reshape(m, n)
    if fmt in (DIA, DIA_J):  # a few diagonals
        i, j = torch.arange(m)[:, None], torch.arange(n)[None, :]
        return ((j - i) == 0) | ((j - i) == 3) | ((j - i) == -2)
    return torch.rand(m, n, generator=gen) < 0.4


def _operands(fmt, dtype, device, m=12, n=16, k=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = _mask(fmt, m, n, gen)
    W = (torch.randn(m, n, generator=gen, dtype=torch.float64) * mask).to(dtype)
    X = torch.randn(n, k, generator=gen, dtype=torch.float64).to(dtype)
    A = st.SparseTensor.from_dense(W.to(device), format=fmt, mask=mask.to(device))
    return A, W, X.to(device), mask


def _assert_within(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, dtype, what: str) -> None:
    """|got - ref| <= eps(dtype) * scale entrywise (scale: the sum of |terms|), float64 throughout."""
    err = (got.double().cpu() - ref).abs()
    bound = EPS[dtype] * scale + 1e-30
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: error {err.max().item():.3g} exceeds eps*|terms| (ratio {worst:.2f})"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_product_and_gradients_match_float64(name, dtype, device) -> None:
    fmt = FORMATS[name]
    A, W, X, mask = _operands(fmt, dtype, device)
    values = A.values.detach().clone().requires_grad_(True)
    Xg = X.detach().clone().requires_grad_(True)
    Y = st.matmul(A.with_values(values), Xg, backend="torch")
    assert Y.dtype == dtype and Y.device.type == device
    W64, X64 = W.double(), X.double().cpu()
    _assert_within(Y, W64 @ X64, W64.abs() @ X64.abs(), dtype, f"{name} forward")
    gen = torch.Generator().manual_seed(1)
    dY = torch.randn(Y.shape, generator=gen, dtype=torch.float64).to(dtype)
    Y.backward(dY.to(device))
    dY64 = dY.double()
    assert Xg.grad.dtype == dtype and values.grad.dtype == dtype
    _assert_within(Xg.grad, W64.T @ dY64, W64.abs().T @ dY64.abs(), dtype, f"{name} dX")
    # the values' gradient, placed back in the matrix, is dY X^T at the stored entries (0 elsewhere;
    # stored entries include the explicit zeros of BSR blocks, DIA diagonals, ELL rows, DELTA bridges)
    stored = A.with_values(torch.ones_like(values)).to_dense().cpu() != 0
    assert bool((stored | ~mask).all())
    dW = A.with_values(values.grad).to_dense().double().cpu()
    _assert_within(dW, (dY64 @ X64.T) * stored, (dY64.abs() @ X64.abs().T) * stored, dtype, f"{name} dvalues")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_long_rows_accumulate_in_float32(dtype, device) -> None:
    # A row of 4097 ones times ones is 4097 (rounds to 4096 in both half dtypes); a float16 sum
    # stalls at 2048 (2048 + 1 rounds back to 2048), a bfloat16 one at 256.
    n = 4097
    A = st.SparseTensor.from_dense(torch.ones(2, n, dtype=dtype, device=device))
    v = A.values.detach().clone().requires_grad_(True)
    x = torch.ones(n, 1, dtype=dtype, device=device, requires_grad=True)
    y = st.matmul(A.with_values(v), x, backend="torch")
    assert y.flatten().tolist() == [4096.0, 4096.0]
    # backward: dX = A^T dY sums 2 terms (exact), dvalues = dY X^T sums over the columns: one here
    y.backward(torch.ones_like(y))
    assert x.grad.flatten().unique().tolist() == [2.0]
    # a values-gradient that sums 4097 columns: (1, 4097) @ ... gives dY (2, 4097), X (1, 4097)
    B = st.SparseTensor.from_dense(torch.ones(2, 1, dtype=dtype, device=device))
    w = B.values.detach().clone().requires_grad_(True)
    X = torch.ones(1, n, dtype=dtype, device=device)
    st.matmul(B.with_values(w), X, backend="torch").backward(torch.ones(2, n, dtype=dtype, device=device))
    assert w.grad.tolist() == [4096.0, 4096.0]


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_value_batch_and_adjoint_products(dtype) -> None:
    # a value batch (shared pattern) and X @ A (the adjoint direction of the plan)
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(6, 7, generator=gen) < 0.5
    W = (torch.randn(3, 6, 7, generator=gen, dtype=torch.float64) * mask).to(dtype)
    A = st.SparseTensor.from_dense(W, mask=mask.expand(3, 6, 7), batch_dims=1)
    X = torch.randn(3, 7, 4, generator=gen, dtype=torch.float64).to(dtype)
    W64, X64 = W.double(), X.double()
    _assert_within(st.matmul(A, X, backend="torch"), W64 @ X64, W64.abs() @ X64.abs(), dtype, "value batch")
    A2 = st.SparseTensor.from_dense(W[0], mask=mask)
    Z = torch.randn(5, 6, generator=gen, dtype=torch.float64).to(dtype)
    _assert_within(Z @ A2, Z.double() @ W64[0], Z.double().abs() @ W64[0].abs(), dtype, "X @ A")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("fmt", [CSR, NM(2, 4)], ids=["csr", "nm24"])
def test_sparse_linear_half_forward_backward(fmt, dtype, device) -> None:
    torch.manual_seed(0)
    lin64 = nn.Linear(32, 8).double()
    g = lin64.weight.detach().abs().reshape(8, 8, 4)
    mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, g.topk(2, -1).indices, True).reshape(8, 32)
    with torch.no_grad():  # the float64 twin holds exactly the half-rounded weights
        lin64.weight.copy_((lin64.weight * mask).to(dtype).double())
        lin64.bias.copy_(lin64.bias.to(dtype).double())
    layer = SparseLinear.from_linear(nn.Linear(32, 8).to(dtype), format=fmt, mask=mask).to(device)
    with torch.no_grad():
        layer.values.copy_(st.SparseTensor.from_dense(lin64.weight.to(dtype), format=fmt, mask=mask).values)
        layer.bias.copy_(lin64.bias.to(dtype))
    x = torch.randn(4, 32, dtype=torch.float64).to(dtype)
    xh = x.to(device).clone().requires_grad_(True)
    y = layer(xh)
    assert y.dtype == dtype
    x64 = x.detach().double().requires_grad_(True)
    ref = lin64(x64)
    W64 = lin64.weight.detach()
    # the bias add rounds once more (half an ulp of |y|): allow 2 eps of the terms
    _assert_within(y, ref.detach(), 2 * ((x64.detach().abs() @ W64.abs().T) + lin64.bias.detach().abs()), dtype,
                   "SparseLinear forward")
    dy = torch.randn(y.shape, dtype=torch.float64).to(dtype)
    y.backward(dy.to(device))
    ref.backward(dy.double())
    _assert_within(xh.grad, x64.grad, dy.double().abs() @ W64.abs(), dtype, "SparseLinear dx")
    dW = layer.weight.with_values(layer.values.grad).to_dense().double().cpu()
    _assert_within(dW, lin64.weight.grad * mask, (dy.double().abs().T @ x.double().abs()) * mask, dtype,
                   "SparseLinear dvalues")
    _assert_within(layer.bias.grad, lin64.bias.grad, dy.double().abs().sum(0), dtype, "SparseLinear dbias")


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_sparse_weight_linear_half(dtype) -> None:
    A, W, _, _ = _operands(CSR, dtype, "cpu")
    v = A.values.detach().clone().requires_grad_(True)
    x = torch.randn(3, 16, dtype=torch.float64).to(dtype).requires_grad_(True)
    y = torch.nn.functional.linear(x, SparseWeight(A.with_values(v)))
    assert y.dtype == dtype
    x64, W64 = x.detach().double(), W.double()
    _assert_within(y, x64 @ W64.T, x64.abs() @ W64.abs().T, dtype, "linear(x, SparseWeight)")
    y.sum().backward()
    _assert_within(x.grad, torch.ones(3, 12, dtype=torch.float64) @ W64, torch.ones(3, 12, dtype=torch.float64)
                   @ W64.abs(), dtype, "linear dx")


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_half_training_step_follows_float64(dtype) -> None:
    # a few SGD steps of a half-precision sparse layer stay near the float64 run of the same steps
    torch.manual_seed(2)
    lin = nn.Linear(16, 4).double()
    mask = torch.rand(4, 16) < 0.5
    l64 = SparseLinear.from_linear(lin, mask=mask)
    lh = SparseLinear.from_linear(lin, mask=mask).to(dtype)
    x, t = torch.randn(32, 16, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)
    for layer, xx, tt in ((l64, x, t), (lh, x.to(dtype), t.to(dtype))):
        opt = torch.optim.SGD(layer.parameters(), lr=0.05)
        for _ in range(5):
            opt.zero_grad()
            ((layer(xx) - tt) ** 2).mean().backward()
            opt.step()
    drift = (lh.values.double() - l64.values).abs().max().item()
    assert drift < 20 * EPS[dtype], f"{dtype}: values drifted {drift:.3g} from the float64 run"
    assert not torch.equal(lh.values.double(), SparseLinear.from_linear(lin, mask=mask).values.to(dtype).double())


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("op", ["eigsh", "logdet"])
def test_half_precision_spectral_and_logdet_are_refused_with_advice(op, dtype) -> None:
    # (solve takes half inputs: solved in float32 and rounded back, tests/test_half_solve.py)
    dense = (torch.eye(6) * 4 + torch.diag(torch.ones(5), 1) + torch.diag(torch.ones(5), -1)).to(dtype)
    A = st.SparseTensor.from_dense(dense)
    with pytest.raises(NoBackendError) as info:
        if op == "eigsh":
            st.eigsh(A, k=2)
        else:
            st.logdet(A)
    msg = str(info.value)
    name = str(dtype).replace("torch.", "")
    assert f"{op} in {name} is not supported" in msg
    assert "float32 or float64" in msg and "mixed precision" in msg


def test_backend_info_declares_the_half_dtypes() -> None:
    from sparsetorch.backends.torch_native.plugin import sparsetorch_backend_info

    info = sparsetorch_backend_info()
    assert torch.float16 in info.dtypes and torch.bfloat16 in info.dtypes
    assert torch.float32 in info.dtypes and torch.float64 in info.dtypes
