"""Session 29's sweep (an outside tester), each against dense float64 torch:

2. ``torch.func.vmap`` over a SparseLinear's values (model ensembling: ``functional_call`` + ``stack_module_state``)
   raised "Sparse CSR tensors do not have is_contiguous" (or, after an eager call, "Cannot access data pointer of
   Tensor that doesn't have storage"): the layer's planned product bound the batched values' memory. Under
   torch.func transforms (and forward-mode AD, whose tangent the planned call dropped) the layer now takes the
   general product, as ``A @ x`` does.
3. ``A @ h`` / ``st.matmul`` / ``A.matvec`` ignored ``torch.autocast`` (float32 A, bfloat16 h raised a dtype
   mismatch): the product now runs in the autocast dtype, as ``torch.matmul`` and SparseWeight do.
4. ``torch.jit.trace`` of a SparseLinear or of ``A @ x`` raised "offer from 'torch' has invalid
   seconds=tensor(...)": the traced product is now plain torch ops the tracer records (the cost model's sizes are
   ints under tracing); other sparse ops raise a clear error naming torch.compile / torch.export.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.func import functional_call, grad, jvp, stack_module_state, vmap

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.nn import SparseLinear

pytestmark = pytest.mark.usefixtures("single_thread")

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def _dense(shape=(5, 4), seed: int = 0, dtype=F64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(shape, generator=g, dtype=F64)
    D[torch.rand(shape, generator=g) < 0.4] = 0.0
    return D.to(dtype)


def _layer(seed: int = 0, bias: bool = True, dtype=F64) -> SparseLinear:
    g = torch.Generator().manual_seed(seed + 100)
    D = _dense(seed=seed, dtype=dtype)
    return SparseLinear(st.SparseTensor.from_dense(D), torch.randn(5, generator=g, dtype=F64).to(dtype) if bias else None)


def _dense_weight(lay: SparseLinear, values: torch.Tensor) -> torch.Tensor:
    """The layer's weight with ``values``, dense float64, differentiable in ``values``."""
    (r, c), slot = lay.weight.entries()
    return torch.zeros(lay.out_features, lay.in_features, dtype=F64).index_put((r, c), values.to(F64)[slot],
                                                                              accumulate=True)


# 2. vmap over a SparseLinear's values ---------------------------------------------------------------------
@pytest.mark.parametrize("eager_first", [False, True], ids=["fresh", "after_eager_call"])
def test_vmap_over_sparse_linear_values_matches_a_loop(eager_first):
    lay = _layer()
    x = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    if eager_first:
        lay(x)  # a planned product made eagerly (it bound the values' memory)
    v0 = lay.values.detach()
    V = torch.stack([v0, 2.0 * v0 - 0.5])

    def f(v):
        return functional_call(lay, {"values": v}, (x,))

    Y = vmap(f)(V)
    for i in range(2):
        ref = x @ _dense_weight(lay, V[i]).T + lay.bias.detach()
        torch.testing.assert_close(Y[i], ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(Y[i], f(V[i]).detach(), rtol=1e-12, atol=1e-12)

    # gradients through the vmapped call (backward), against the loop's and the dense twin's
    w = torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    Vg = V.clone().requires_grad_(True)
    (vmap(f)(Vg) * w).sum().backward()
    for i in range(2):
        vi = V[i].clone().requires_grad_(True)
        (f(vi) * w).sum().backward()
        vd = V[i].clone().requires_grad_(True)
        ((x @ _dense_weight(lay, vd).T) * w).sum().backward()
        torch.testing.assert_close(Vg.grad[i], vi.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(Vg.grad[i], vd.grad, rtol=1e-12, atol=1e-12)

    # torch.func.grad per member under vmap (ensembled gradients)
    G = vmap(grad(lambda v: (f(v) * w).sum()))(V)
    torch.testing.assert_close(G, Vg.grad, rtol=1e-12, atol=1e-12)


def test_vmap_ensemble_with_stack_module_state_and_batched_inputs():
    """The documented ensembling recipe: stacked parameters (values and bias) and one input per member."""
    layers = [_layer(seed=0), _layer(seed=0)]
    with torch.no_grad():
        layers[1].values.mul_(-1.5)
        layers[1].bias.add_(1.0)
    params, buffers = stack_module_state(layers)
    X = torch.randn(2, 3, 4, dtype=F64, generator=torch.Generator().manual_seed(3))
    base = layers[0]

    def f(p, b, x):
        return functional_call(base, (p, b), (x,))

    # stacked index buffers would be a pattern per member: a clear error says to map the values only
    with pytest.raises(InputError, match="index buffers"):
        vmap(f)(params, buffers, X)
    Y = vmap(f, in_dims=(0, None, 0))(params, dict(base.named_buffers()), X)
    for i, lay in enumerate(layers):
        ref = X[i] @ _dense_weight(lay, lay.values.detach()).T + lay.bias.detach()
        torch.testing.assert_close(Y[i], ref, rtol=1e-12, atol=1e-12)
    # vmap over the inputs alone (plain parameters)
    Yx = vmap(base)(X)
    ref = X @ _dense_weight(base, base.values.detach()).T + base.bias.detach()
    torch.testing.assert_close(Yx, ref, rtol=1e-12, atol=1e-12)


def test_forward_mode_ad_through_a_sparse_linear_keeps_the_tangent():
    """jvp in the values (the planned call without autograd dropped forward-mode tangents)."""
    lay = _layer(bias=False)
    x = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(4))
    v = lay.values.detach()
    t = torch.randn(v.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    lay(x)  # an eager plan first
    y, dy = jvp(lambda vv: functional_call(lay, {"values": vv}, (x,)), (v,), (t,))
    torch.testing.assert_close(y, x @ _dense_weight(lay, v).T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dy, x @ _dense_weight(lay, t).T, rtol=1e-12, atol=1e-12)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = functional_call(lay, {"values": fwAD.make_dual(v, t)}, (x,))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, x @ _dense_weight(lay, t).T, rtol=1e-12, atol=1e-12)


# 3. autocast for the SparseTensor product ----------------------------------------------------------------
def _bf16_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = float((got.to(F64) - ref.to(F64)).abs().max())
    scale = float(ref.abs().max())
    assert err <= 2e-2 * scale, f"{what}: error {err:.3g} against {scale:.3g}"


@pytest.mark.parametrize("spelling", ["@", "st.matmul", "matvec", "rmatmul"])
def test_sparse_product_under_autocast_runs_in_the_autocast_dtype(spelling):
    D = _dense(dtype=F64)
    A = st.SparseTensor.from_dense(D.float())
    vals = A.values.detach().clone().requires_grad_(True)
    A = A.with_values(vals)
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 3, generator=torch.Generator().manual_seed(6)))
        lin.bias.copy_(torch.randn(4, generator=torch.Generator().manual_seed(7)))
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
    with torch.autocast("cpu", dtype=BF16):
        h = lin(x).T            # (4, 2), bfloat16: a Linear's output under autocast
        assert h.dtype == BF16
        if spelling == "@":
            y = A @ h
        elif spelling == "st.matmul":
            y = st.matmul(A, h)
        elif spelling == "matvec":
            y = A.matvec(h[:, 0])
        else:
            y = (h.T @ A.T).T
        dense_dtype = torch.matmul(torch.ones(5, 4), h).dtype   # what a dense float32 matrix gives
        dense_ref = torch.matmul(D.float(), h.float() if spelling != "matvec" else h[:, 0].float())
    assert y.dtype == BF16 == dense_dtype
    # values: against float64 dense on the bfloat16-rounded operands, and the float32 computation
    hr = h.detach().to(F64)
    ref = D.to(BF16).to(F64) @ (hr if spelling != "matvec" else hr[:, 0])
    _bf16_close(y, ref, "value")
    _bf16_close(y, dense_ref, "value against float32")
    # gradients w.r.t. A's values and x against the float32 computation (no autocast), within bf16 tolerance
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9))
    (y.float() * w).sum().backward()
    g_vals, g_x = vals.grad.clone(), x.grad.clone()
    assert g_vals.dtype == F32 and g_x.dtype == F32
    vd = vals.detach().to(F64).requires_grad_(True)
    xd = x.detach().to(F64).requires_grad_(True)
    (r, c), slot = A.entries()
    Dd = torch.zeros(5, 4, dtype=F64).index_put((r, c), vd[slot], accumulate=True)
    hd = (xd @ lin.weight.detach().to(F64).T + lin.bias.detach().to(F64)).T
    yd = Dd @ (hd if spelling != "matvec" else hd[:, 0])
    (yd * w.to(F64)).sum().backward()
    _bf16_close(g_vals, vd.grad, "gradient of A's values")
    _bf16_close(g_x, xd.grad, "gradient of x")


def test_autocast_leaves_float64_and_the_out_form_alone_and_mismatch_still_raises():
    D = _dense(dtype=F64)
    A64 = st.SparseTensor.from_dense(D)
    A32 = st.SparseTensor.from_dense(D.float())
    x64 = torch.randn(4, 2, dtype=F64, generator=torch.Generator().manual_seed(10))
    with torch.autocast("cpu", dtype=BF16):
        y = A64 @ x64                       # float64: autocast leaves it alone, as torch.mm
        assert y.dtype == F64
        torch.testing.assert_close(y, D @ x64, rtol=1e-12, atol=1e-12)
        c = torch.zeros(5, 2)
        out = st.matmul(A32, x64.float(), c)   # c given (an out= form): the operands' dtype
        assert out.dtype == F32
        torch.testing.assert_close(out.double(), D @ x64, rtol=1e-5, atol=1e-5)
        # a solve under autocast keeps float32 (its residual check is not cast)
        Sd = torch.eye(4, dtype=F64) * 3 + torch.diag(torch.ones(3, dtype=F64), 1)
        xs = st.solve(st.SparseTensor.from_dense(Sd.float()), torch.ones(4))
        assert xs.dtype == F32
        torch.testing.assert_close(xs.double(), torch.linalg.solve(Sd, torch.ones(4, dtype=F64)), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="dtype"):
        A32 @ x64.to(BF16)                  # outside autocast the mismatch is an error, as before


def test_sparse_products_under_autocast_compile_as_eager_runs():
    """The same rule in a compiled region (fullgraph, aot_eager): ``A @ x``, ``x @ A.T`` and ``A.T @ x``."""
    D = _dense(dtype=F64)
    A = st.SparseTensor.from_dense(D.float())
    x, z, u = (torch.randn(*s, generator=torch.Generator().manual_seed(20 + i)) for i, s in
               enumerate(((4, 3), (3, 4), (5, 3))))

    def f(x, z, u):
        with torch.autocast("cpu", dtype=BF16):
            return A @ x, z @ A.T, A.T @ u

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, z, u)
    torch._dynamo.reset()
    ref = f(x, z, u)
    dense = (D @ x.double(), z.double() @ D.T, D.T @ u.double())
    for g, r, d in zip(got, ref, dense):
        assert g.dtype == r.dtype == BF16
        torch.testing.assert_close(g, r)
        _bf16_close(g, d, "compiled value")


# 4. torch.jit.trace -------------------------------------------------------------------------------------
def _trace(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the tracer's notes on shape checks it specializes
        return torch.jit.trace(f, args)


def test_jit_trace_of_a_sparse_linear_matches_eager_on_a_new_input():
    lay = _layer(dtype=F64)
    x = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(11))
    lay(x)  # an eager plan first
    traced = _trace(lay, x)
    x2 = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(12)).requires_grad_(True)
    y = traced(x2)
    Dw = _dense_weight(lay, lay.values.detach())
    torch.testing.assert_close(y, x2 @ Dw.T + lay.bias.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, lay(x2), rtol=1e-12, atol=1e-12)
    # gradients through the traced module reach the layer's parameters and the input
    w = torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(13))
    (y * w).sum().backward()
    vd = lay.values.detach().clone().requires_grad_(True)
    xd = x2.detach().clone().requires_grad_(True)
    ((xd @ _dense_weight(lay, vd).T) * w).sum().backward()
    torch.testing.assert_close(lay.values.grad, vd.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x2.grad, xd.grad, rtol=1e-12, atol=1e-12)
    # the traced module reads the parameter: a step of the optimizer is followed
    with torch.no_grad():
        lay.values.mul_(2.0)
    torch.testing.assert_close(traced(x2), x2 @ (2.0 * Dw).T + lay.bias.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["matrix", "vector", "rmatmul", "alpha"])
def test_jit_trace_of_a_sparse_product_matches_eager_on_a_new_input(form):
    D = _dense(dtype=F64)
    A = st.SparseTensor.from_dense(D)
    shape = {"matrix": (4, 3), "vector": (4,), "rmatmul": (2, 5), "alpha": (4, 3)}[form]
    fns = {"matrix": lambda x: A @ x, "vector": lambda x: A.matvec(x), "rmatmul": lambda x: x @ A,
           "alpha": lambda x: st.matmul(A, x, alpha=2.0)}
    refs = {"matrix": lambda x: D @ x, "vector": lambda x: D @ x, "rmatmul": lambda x: x @ D,
            "alpha": lambda x: 2.0 * (D @ x)}
    A @ torch.ones(4, 3, dtype=F64)  # a plan in the cache first
    traced = _trace(fns[form], torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(14)))
    x2 = torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(15))
    torch.testing.assert_close(traced(x2), refs[form](x2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traced(x2), fns[form](x2), rtol=1e-12, atol=1e-12)


def test_jit_trace_of_other_sparse_ops_names_compile_and_export():
    A = st.SparseTensor.from_dense(torch.eye(4, dtype=F64) * 2)
    with pytest.raises(InputError, match="torch.compile or torch.export"):
        _trace(lambda b: st.solve(A, b), torch.ones(4, dtype=F64))
