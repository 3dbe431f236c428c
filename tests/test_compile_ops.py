"""torch.compile of st.matmul, ``A @ x``, ``x @ A``, SparseWeight and st.solve: fullgraph with zero
graph breaks (torch._dynamo.explain), values and gradients against dense float64 references
(torch.linalg / dense products), and opcheck on the custom ops of sparsetorch.autograd.compiled."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest
import torch
import torch._dynamo as dynamo

import sparsetorch as st
from sparsetorch.autograd import _compile_hooks, compiled
from sparsetorch.errors import InputError, ValidationError
from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.tensor.pattern import buffer_id

F64 = torch.float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.fixture
def solver():
    """The eager solve behind sparsetorch::spsolve (the ops layer registers it once wired)."""
    before = _compile_hooks.solver()
    if before is None:
        compiled.register_solver(st.solve)
    yield
    _compile_hooks._solver = before


def _dense(m, n, seed=0, density=0.4, dtype=F64, square_boost=0.0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        D = torch.complex(torch.randn(m, n, generator=g, dtype=F64), torch.randn(m, n, generator=g, dtype=F64))
    else:
        D = torch.randn(m, n, generator=g, dtype=F64)
    D = D * (torch.rand(m, n, generator=g) < density)
    if square_boost:
        D = D + square_boost * torch.eye(m, n, dtype=F64)
    return D.to(dtype)


def _breaks(fn, *args) -> int:
    out = dynamo.explain(fn)(*args)
    dynamo.reset()
    return out.graph_break_count


def _compiled(fn, backend="aot_eager"):
    return torch.compile(fn, fullgraph=True, backend=backend)


def _on_pattern(A: st.SparseTensor, G: torch.Tensor) -> torch.Tensor:
    """A dense gradient read at A's value slots (padding slots: zero), the reference for values.grad."""
    coords, slot = A.entries()
    out = torch.zeros(A.values.shape, dtype=G.dtype)
    out[..., slot] = G[(Ellipsis, *coords)]
    return out


def test_format_string_matches_str_on_every_named_format():
    import sparsetorch.format as F

    named = [F.CSR, F.CSC, F.COO, F.DCSR, F.DCSC, F.BSR(2, 3), F.BSC(2, 2), F.DIA, F.DIA_J, F.ELL, F.DELTA(2),
             F.NM(2, 4), F.DENSE, F.DENSE_COL, F.BATCHED_CSR, F.BATCHED_CSC, F.COO_ND(3), F.DENSE_ND(3)]
    for fmt in named:
        assert compiled._spec(fmt) == str(fmt)
        assert F.TensorFormat.parse(compiled._spec(fmt)) == fmt


# opcheck ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [CSR, COO, BSR(2, 2)], ids=["csr", "coo", "bsr"])
def test_opcheck_spmm_and_sampled(fmt):
    A = st.SparseTensor.from_dense(_dense(6, 4), format=fmt)
    spec, shape, present, index = compiled.parts(A)
    v = A.values.clone().requires_grad_(True)
    X = torch.randn(4, 3, dtype=F64, requires_grad=True)
    torch.library.opcheck(compiled.spmm, (spec, shape, present, index, v, X, False, None))
    torch.library.opcheck(compiled.spmm, (spec, shape, present, index, v, torch.randn(6, 2, dtype=F64,
                                                                                   requires_grad=True), True, None))
    P = torch.randn(6, 3, dtype=F64, requires_grad=True)
    Q = torch.randn(4, 3, dtype=F64, requires_grad=True)
    torch.library.opcheck(compiled.sampled, (spec, shape, present, index, A.values, P, Q))


def test_opcheck_value_batch_and_complex():
    A = st.SparseTensor.from_dense(_dense(5, 4, seed=2))
    spec, shape, present, index = compiled.parts(A)
    vb = torch.stack([A.values, -2 * A.values]).requires_grad_(True)
    Xb = torch.randn(2, 4, 3, dtype=F64, requires_grad=True)
    torch.library.opcheck(compiled.spmm, (spec, shape, present, index, vb, Xb, False, None))
    torch.library.opcheck(compiled.sampled, (spec, shape, present, index, vb.detach(), torch.randn(2, 5, 3, dtype=F64),
                                             torch.randn(2, 4, 3, dtype=F64)))
    C = st.SparseTensor.from_dense(_dense(5, 4, seed=3, dtype=torch.complex128))
    spec, shape, present, index = compiled.parts(C)
    Xc = torch.randn(4, 2, dtype=torch.complex128, requires_grad=True)
    torch.library.opcheck(compiled.spmm, (spec, shape, present, index, C.values.clone().requires_grad_(True), Xc,
                                          False, None))


def test_opcheck_spsolve(solver):
    A = st.SparseTensor.from_dense(_dense(6, 6, square_boost=4.0))
    spec, shape, present, index = compiled.parts(A)
    v = A.values.clone().requires_grad_(True)
    B = torch.randn(6, 2, dtype=F64, requires_grad=True)
    opts = (None, None, None, None, 0.0, None, None, True, "raise", None, None, None, None, None, None, True)
    torch.library.opcheck(compiled.spsolve, (spec, shape, present, index, v, B, False, *opts))
    torch.library.opcheck(compiled.spsolve, (spec, shape, present, index, v, B, True, *opts))


def test_custom_ops_gradcheck_and_second_derivatives():
    A = st.SparseTensor.from_dense(_dense(5, 4, seed=3), format=COO)
    spec, shape, present, index = compiled.parts(A)
    v = A.values.clone().requires_grad_(True)
    X = torch.randn(4, 2, dtype=F64, requires_grad=True)
    f = lambda v, X: compiled.spmm(spec, shape, present, index, v, X, False, None)  # noqa: E731
    assert torch.autograd.gradcheck(f, (v, X))
    assert torch.autograd.gradgradcheck(f, (v, X))
    fa = lambda v, Y: compiled.spmm(spec, shape, present, index, v, Y, True, None)  # noqa: E731
    assert torch.autograd.gradcheck(fa, (v, torch.randn(5, 2, dtype=F64, requires_grad=True)))
    P = torch.randn(5, 3, dtype=F64, requires_grad=True)
    Q = torch.randn(4, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda P, Q: compiled.sampled(spec, shape, present, index, A.values, P, Q), (P, Q))


def test_custom_ops_complex_gradcheck():
    A = st.SparseTensor.from_dense(_dense(5, 4, seed=4, dtype=torch.complex128))
    spec, shape, present, index = compiled.parts(A)
    v = A.values.clone().requires_grad_(True)
    X = torch.randn(4, 2, dtype=torch.complex128, requires_grad=True)
    for adjoint, rows in ((False, 4), (True, 5)):
        Z = torch.randn(rows, 2, dtype=torch.complex128, requires_grad=True)
        assert torch.autograd.gradcheck(lambda v, Z: compiled.spmm(spec, shape, present, index, v, Z, adjoint, None), (v, Z))
    P = torch.randn(5, 2, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda P, X: compiled.sampled(spec, shape, present, index, A.values, P, X), (P, X))


# matmul / A @ x / x @ A -------------------------------------------------------------------------
FORMATS = [CSR, CSC, COO, BSR(2, 2), ELL, DIA]
IDS = ["csr", "csc", "coo", "bsr", "ell", "dia"]


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_matmul_and_operators_compile_fullgraph(fmt):
    D = _dense(6, 4, seed=1)
    A = st.SparseTensor.from_dense(D, format=fmt)
    X = torch.randn(4, 3, dtype=F64)
    x = torch.randn(4, dtype=F64)
    Z = torch.randn(5, 6, dtype=F64)
    calls = [
        (lambda A, X: st.matmul(A, X), (A, X), D @ X),
        (lambda A, x: st.matmul(A, x), (A, x), D @ x),
        (lambda A, X: A @ X, (A, X), D @ X),
        (lambda A, Z: Z @ A, (A, Z), Z @ D),
        (lambda A, Z: torch.matmul(Z, A), (A, Z), Z @ D),
        (lambda A, X: torch.relu(A @ X).sum(0), (A, X), torch.relu(D @ X).sum(0)),
    ]
    for fn, args, ref in calls:
        assert _breaks(fn, *args) == 0
        torch.testing.assert_close(_compiled(fn)(*args), ref)


def test_square_matrix_operand_order():
    # square A and square X: A @ X and X @ A differ, and both must come out right
    D = _dense(5, 5, seed=2)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(5, 5, dtype=F64)
    torch.testing.assert_close(_compiled(lambda A, X: A @ X)(A, X), D @ X)
    torch.testing.assert_close(_compiled(lambda A, X: X @ A)(A, X), X @ D)
    torch.testing.assert_close(_compiled(lambda A, X: (A @ X) @ A - X @ (A @ X))(A, X), D @ X @ D - X @ D @ X)


@pytest.mark.parametrize("dynamo_first", [False, True], ids=["sparsetorch-first", "dynamo-first"])
def test_operand_order_whatever_the_import_order(dynamo_first):
    # dynamo's reverse-matmul entry is added by an import hook (dynamo loaded later) or at once
    first = "import torch._dynamo\n" if dynamo_first else ""
    code = first + (
        "import sys, torch, sparsetorch as st\n"
        "assert ('torch._dynamo' in sys.modules) == %r\n"
        "D = torch.randn(5, 5, dtype=torch.float64)\n"
        "A = st.SparseTensor.from_dense(D); X = torch.randn(5, 5, dtype=torch.float64)\n"
        "f = torch.compile(lambda A, X: (A @ X, X @ A), fullgraph=True, backend='eager')\n"
        "ax, xa = f(A, X)\n"
        "torch.testing.assert_close(ax, D @ X); torch.testing.assert_close(xa, X @ D)\n"
        "print('ok')\n" % dynamo_first)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_closure_matrix_and_batched_operands():
    D = _dense(6, 4, seed=5)
    A = st.SparseTensor.from_dense(D)
    Xb = torch.randn(2, 3, 4, 5, dtype=F64)  # a batched X against an unbatched A
    assert _breaks(lambda X: A @ X, Xb) == 0
    torch.testing.assert_close(_compiled(lambda X: A @ X)(Xb), D @ Xb)
    # a value batch: B matrices on one pattern, X with the batch or shared
    vals = torch.stack([A.values, 2 * A.values, -A.values])
    Ab = A.with_values(vals)
    Db = torch.stack([D, 2 * D, -D])
    Xv = torch.randn(3, 4, 2, dtype=F64)
    torch.testing.assert_close(_compiled(lambda A, X: st.matmul(A, X))(Ab, Xv), Db @ Xv)
    x = torch.randn(4, dtype=F64)
    torch.testing.assert_close(_compiled(lambda A, x: st.matmul(A, x))(Ab, x), Db @ x)


def test_alpha_beta_c_under_compile():
    D = _dense(6, 4, seed=6)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(4, 3, dtype=F64)
    c = torch.randn(6, 3, dtype=F64)
    out = _compiled(lambda A, X, c: st.matmul(A, X, c.clone(), alpha=2.0, beta=0.5))(A, X, c)
    torch.testing.assert_close(out, 2.0 * D @ X + 0.5 * c)
    out = _compiled(lambda A, X: st.matmul(A, X, alpha=-1.0))(A, X)
    torch.testing.assert_close(out, -(D @ X))
    out = _compiled(lambda A, X: st.matmul(A, X, backend="torch"))(A, X)  # a pinned backend crosses the graph
    torch.testing.assert_close(out, D @ X)
    with pytest.raises(Exception, match="nosuchbackend"):
        _compiled(lambda A, X: st.matmul(A, X, backend="nosuchbackend"))(A, X)


@pytest.mark.parametrize("fmt", [CSR, COO, BSR(2, 2), DIA], ids=["csr", "coo", "bsr", "dia"])
def test_matmul_gradients_match_dense(fmt):
    D = _dense(6, 4, seed=7)
    A = st.SparseTensor.from_dense(D, format=fmt)
    v = A.values.clone().requires_grad_(True)
    X = torch.randn(4, 3, dtype=F64, requires_grad=True)
    Z = torch.randn(2, 6, dtype=F64, requires_grad=True)
    W = torch.randn(6, 3, dtype=F64)

    def loss(v, X, Z):
        Av = A.with_values(v)
        return ((Av @ X) * W).sum() + (Z @ Av).square().sum()

    assert _breaks(loss, v, X, Z) == 0
    _compiled(loss)(v, X, Z).backward()
    Dr = D.clone().requires_grad_(True)
    Xr, Zr = X.detach().clone().requires_grad_(True), Z.detach().clone().requires_grad_(True)
    (((Dr @ Xr) * W).sum() + (Zr @ Dr).square().sum()).backward()
    torch.testing.assert_close(X.grad, Xr.grad)
    torch.testing.assert_close(Z.grad, Zr.grad)
    torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad))


def test_complex_values_and_gradients():
    C = torch.complex128
    D = _dense(5, 4, seed=8, dtype=C)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    X = torch.randn(4, 2, dtype=C, requires_grad=True)
    Z = torch.randn(3, 5, dtype=C, requires_grad=True)

    def loss(v, X, Z):
        Av = A.with_values(v)
        return (Av @ X).abs().square().sum() + (Z @ Av).real.sum()

    _compiled(loss)(v, X, Z).backward()
    Dr = D.clone().requires_grad_(True)
    Xr, Zr = X.detach().clone().requires_grad_(True), Z.detach().clone().requires_grad_(True)
    ((Dr @ Xr).abs().square().sum() + (Zr @ Dr).real.sum()).backward()
    torch.testing.assert_close(X.grad, Xr.grad)
    torch.testing.assert_close(Z.grad, Zr.grad)
    torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad))


def test_plan_and_pattern_shared_with_eager_calls():
    D = _dense(8, 8, seed=9)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(8, 2, dtype=F64)
    st.matmul(A, X)  # the eager call plans first (the plan cache)
    f = _compiled(lambda A, X: A @ X)
    torch.testing.assert_close(f(A, X), D @ X)  # traced (fake kernels) and run once
    cache = st.plan_cache()
    misses = cache.misses
    for k in range(3):
        torch.testing.assert_close(f(A, X + k), D @ (X + k))
    assert cache.misses == misses  # the compiled calls ran on the eager call's plan
    ids = tuple(buffer_id(b) for b in (A.pos(1), A.crd(1)))
    assert sum(1 for key in compiled._PATTERNS if key[3] == ids) == 1  # A rebuilt once, reused


def test_new_matrices_do_not_recompile_per_matrix():
    from torch._dynamo.utils import counters

    counters.clear()
    f = _compiled(lambda A, X: A @ X)
    X = torch.randn(6, 2, dtype=F64)
    for seed in range(5):  # each from_dense makes a format object of its own; nnz differs too
        D = _dense(6, 6, seed=30 + seed, density=0.3 + 0.1 * seed)
        torch.testing.assert_close(f(st.SparseTensor.from_dense(D), X), D @ X)
    # one graph, and one more once dynamo marks the stored count dynamic: not one per matrix
    assert counters["stats"]["unique_graphs"] <= 2
    D = _dense(6, 6, seed=40)
    for fmt in (CSC, COO, BSR(2, 2), CSR):  # another format is another graph, with its own layout
        torch.testing.assert_close(f(st.SparseTensor.from_dense(D, format=fmt), X), D @ X)


def test_pattern_record_keeps_no_buffer_alive():
    import gc
    import weakref

    D = _dense(30, 30, seed=41)
    X = torch.randn(30, 2, dtype=F64)
    f = _compiled(lambda A, X: A @ X)
    A = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(f(A, X), D @ X)
    buf = weakref.ref(A.crd(1))
    ids = tuple(buffer_id(b) for b in (A.pos(1), A.crd(1)))
    assert any(key[3] == ids for key in compiled._PATTERNS)
    del A
    st.plan_cache().clear()  # the plan cache holds its plans' patterns until evicted (as for eager calls)
    gc.collect()
    assert buf() is None
    assert not any(key[3] == ids for key in compiled._PATTERNS)  # the record went with the buffers


def test_index_buffer_written_in_place_is_revalidated():
    D = _dense(6, 6, seed=10)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(6, 2, dtype=F64)
    f = _compiled(lambda A, X: A @ X)
    torch.testing.assert_close(f(A, X), D @ X)
    A.crd(1)[0] = 99  # out of range, written in place: the kernel revalidates before use
    with pytest.raises(ValidationError):
        f(A, X)


def test_dynamic_batch_does_not_break():
    D = _dense(6, 4, seed=11)
    A = st.SparseTensor.from_dense(D)
    f = torch.compile(lambda X: A @ X, fullgraph=True, backend="aot_eager", dynamic=True)
    for k in (1, 3, 7):
        X = torch.randn(4, k, dtype=F64)
        torch.testing.assert_close(f(X), D @ X)


def test_inductor_backend_cpu():
    D = _dense(6, 4, seed=12)
    A = st.SparseTensor.from_dense(D)
    X = torch.randn(4, 3, dtype=F64, requires_grad=True)
    try:
        f = _compiled(lambda A, X: torch.tanh(A @ X).sum(), backend="inductor")
        out = f(A, X)
    except Exception as exc:  # pragma: no cover - no C++ toolchain for inductor here
        pytest.skip(f"inductor unavailable: {type(exc).__name__}: {str(exc)[:200]}")
    out.backward()
    Xr = X.detach().clone().requires_grad_(True)
    ref = torch.tanh(D @ Xr).sum()
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(X.grad, Xr.grad)


def test_float32_and_bfloat16_match_eager():
    D = _dense(16, 12, seed=13)
    for dt in (torch.float32, torch.bfloat16):
        A = st.SparseTensor.from_dense(D.to(dt))
        X = torch.randn(12, 4, dtype=F64).to(dt)
        got = _compiled(lambda A, X: A @ X)(A, X)
        assert got.dtype == dt
        torch.testing.assert_close(got, st.matmul(A, X))
        ref = D.to(dt).double() @ X.double()
        tol = 1e-5 if dt == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_refusals_under_compile_name_the_problem():
    A = st.SparseTensor.from_dense(_dense(4, 3))
    with pytest.raises(Exception, match="other operand has shape"):
        _compiled(lambda A, X: st.matmul(A, X))(A, torch.randn(5, 2, dtype=F64))


def test_sparse_tensor_torch_function_declines_other_functions():
    A = st.SparseTensor.from_dense(_dense(4, 3))
    with pytest.raises(TypeError):
        torch.cumsum(A, 0)  # (torch.add(A, 1) is handled since session 30: the dense sum)
    x = torch.randn(4, dtype=F64)
    torch.testing.assert_close(torch.matmul(x, A), x @ A.to_dense())  # eager, through __torch_function__


# SparseWeight -----------------------------------------------------------------------------------
def test_sparse_weight_products_compile_fullgraph():
    D = _dense(6, 4, seed=14)
    A = st.SparseTensor.from_dense(D)
    W = st.nn.SparseWeight(A)
    x = torch.randn(3, 4, dtype=F64)
    X = torch.randn(4, 2, dtype=F64)
    Z = torch.randn(2, 6, dtype=F64)
    b = torch.randn(2, 4, dtype=F64)
    calls = [
        (lambda W, x: torch.nn.functional.linear(x, W), (W, x), x @ D.mT),
        (lambda W, x: torch.nn.functional.linear(x, W, torch.ones(6, dtype=F64)), (W, x), x @ D.mT + 1),
        (lambda W, X: W @ X, (W, X), D @ X),
        (lambda W, Z: Z @ W, (W, Z), Z @ D),
        (lambda W, X: torch.mm(W, X) + torch.matmul(W, X), (W, X), 2 * D @ X),
        (lambda W, X: W.mv(X[:, 0]), (W, X), D @ X[:, 0]),
        (lambda W, Z: torch.addmm(b, Z, W, beta=2.0), (W, Z), 2 * b + Z @ D),
    ]
    for fn, args, ref in calls:
        assert _breaks(fn, *args) == 0
        torch.testing.assert_close(_compiled(fn)(*args), ref)


def test_sparse_weight_in_a_module_trains_under_compile():
    D = _dense(6, 4, seed=15)
    A = st.SparseTensor.from_dense(D)
    vals = A.values.clone().requires_grad_(True)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.W = st.nn.SparseWeight(A.with_values(vals))

        def forward(self, x):
            return torch.tanh(torch.nn.functional.linear(x, self.W)).sum()

    net = Net()
    x = torch.randn(5, 4, dtype=F64, requires_grad=True)
    assert _breaks(net, x) == 0
    _compiled(net)(x).backward()
    Dr = D.clone().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    torch.tanh(xr @ Dr.mT).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(vals.grad, _on_pattern(A, Dr.grad))


def test_sparse_weight_under_autocast_compiles_as_eager_runs():
    D = _dense(16, 12, seed=23).float()
    A = st.SparseTensor.from_dense(D)
    vals = A.values.clone().requires_grad_(True)
    W = st.nn.SparseWeight(A.with_values(vals))
    x, z = torch.randn(5, 12), torch.randn(5, 16)

    def f(W, x, z):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.nn.functional.linear(x, W), z @ W, W @ x.mT

    assert _breaks(f, W, x, z) == 0
    got = _compiled(f)(W, x, z)
    sum(g.float().sum() for g in got).backward()
    grad, vals.grad = vals.grad, None
    ref = f(W, x, z)  # eager: the same casts, the same bfloat16 products
    sum(r.float().sum() for r in ref).backward()
    dense = (x @ D.mT, z @ D, D @ x.mT)
    for g, r, d in zip(got, ref, dense):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, r)
        torch.testing.assert_close(g.float(), d, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(grad, vals.grad)


def test_reformat_model_with_sparse_weight_rule_compiles_and_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 4)).double()
    twin = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 4)).double()
    masks = {}
    for i in (0, 2):
        m = model[i].weight.detach().abs() > 0.15
        masks[i] = m
        twin[i].weight.data = model[i].weight.detach() * m
        twin[i].bias.data = model[i].bias.detach().clone()

    def rule(w):  # UST's spelling: a SparseWeight of the kept entries
        return st.nn.SparseWeight(st.SparseTensor.from_dense(w * (w.abs() > 0.15)))

    st.nn.reformat_model(model, func=rule)
    x = torch.randn(5, 8, dtype=F64)
    assert _breaks(model, x) == 0
    out = _compiled(model)(x)
    ref = twin(x)
    torch.testing.assert_close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    for i in (0, 2):
        layer = model[i]
        torch.testing.assert_close(layer.values.grad, _on_pattern(layer.weight.detach(), twin[i].weight.grad * masks[i]))
        torch.testing.assert_close(layer.bias.grad, twin[i].bias.grad)


# solve ------------------------------------------------------------------------------------------
def _spd(n, seed):
    D = _dense(n, n, seed=seed, density=0.3)
    return D @ D.mT + n * torch.eye(n, dtype=F64)


@pytest.mark.parametrize("kw", [{}, {"method": "lu"}, {"method": "cg", "properties": "spd", "rtol": 1e-12},
                                {"method": "cholesky", "properties": ["spd"]}],
                         ids=["dispatch", "lu", "cg", "cholesky"])
def test_solve_op_values_and_gradients(solver, kw):
    n = 9
    D = _spd(n, seed=16)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    b = torch.randn(n, dtype=F64, requires_grad=True)
    B = torch.randn(n, 2, dtype=F64, requires_grad=True)
    w = torch.randn(n, dtype=F64)

    def loss(v, b, B):
        Av = A.with_values(v)
        return compiled.traced_solve(Av, b, **kw) @ w + compiled.traced_solve(Av, B, **kw).square().sum()

    assert _breaks(loss, v, b, B) == 0
    _compiled(loss)(v, b, B).backward()
    Dr = D.clone().requires_grad_(True)
    br, Br = b.detach().clone().requires_grad_(True), B.detach().clone().requires_grad_(True)
    (torch.linalg.solve(Dr, br) @ w + torch.linalg.solve(Dr, Br).square().sum()).backward()
    tol = dict(rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(b.grad, br.grad, **tol)
    torch.testing.assert_close(B.grad, Br.grad, **tol)
    torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad), **tol)


def test_solve_op_nonsymmetric_and_complex(solver):
    n = 7
    for dt in (F64, torch.complex128):
        D = _dense(n, n, seed=17, dtype=dt, square_boost=5.0)
        A = st.SparseTensor.from_dense(D)
        v = A.values.clone().requires_grad_(True)
        b = torch.randn(n, dtype=dt, requires_grad=True)
        f = _compiled(lambda v, b: compiled.traced_solve(A.with_values(v), b).abs().square().sum())
        f(v, b).backward()
        Dr = D.clone().requires_grad_(True)
        br = b.detach().clone().requires_grad_(True)
        torch.linalg.solve(Dr, br).abs().square().sum().backward()
        torch.testing.assert_close(b.grad, br.grad)
        torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad))


def test_solve_op_broadcasts_an_unbatched_rhs_over_a_value_batch(solver):
    # as the eager solve does: b of shape (n,) or (n, k) for A with values (2, nse); the gradient of b
    # sums over the batch members (expand's backward)
    n = 8
    D = _spd(n, seed=30)
    A = st.SparseTensor.from_dense(D)
    vals = torch.stack([A.values, A.values * torch.linspace(1.0, 2.0, A.values.numel(), dtype=F64)])
    v = vals.clone().requires_grad_(True)
    for shape in ((n,), (n, 3)):
        b = torch.randn(*shape, dtype=F64, requires_grad=True)
        assert _breaks(lambda v, b: compiled.traced_solve(A.with_values(v), b).square().sum(), v, b) == 0
        _compiled(lambda v, b: compiled.traced_solve(A.with_values(v), b).square().sum())(v, b).backward()
        Dr = torch.stack([A.with_values(vals[k]).to_dense() for k in range(2)])
        br = b.detach().clone().requires_grad_(True)
        rhs = br.expand(2, *shape) if len(shape) == 2 else br.unsqueeze(-1).expand(2, n, 1)
        X = torch.linalg.solve(Dr, rhs)
        X.square().sum().backward()
        torch.testing.assert_close(b.grad, br.grad)
        eager = st.solve(A.with_values(vals), b.detach())
        assert eager.shape == (2, *shape)
        torch.testing.assert_close(_compiled(lambda v, b: compiled.traced_solve(A.with_values(v), b))(vals, b.detach()),
                                   eager)
        b.grad = None
    with pytest.raises(InputError, match="broadcast over the batch"):
        compiled.traced_solve(A.with_values(vals), torch.randn(n + 1, dtype=F64))


def test_solve_op_plan_built_outside_and_inside(solver):
    n = 8
    D = _spd(n, seed=18)
    A = st.SparseTensor.from_dense(D)
    b = torch.randn(n, dtype=F64)
    st.solve(A, b)  # outside: dispatch plans (and caches) for A's pattern
    f = _compiled(lambda A, b: compiled.traced_solve(A, b))
    torch.testing.assert_close(f(A, b), torch.linalg.solve(D, b))
    A2 = st.SparseTensor.from_dense(_spd(n, seed=19))  # a pattern first seen inside the compiled call
    torch.testing.assert_close(f(A2, b), torch.linalg.solve(A2.to_dense(), b))


def test_solve_backward_of_a_declared_spd_matrix_reuses_the_forward_plan(solver):
    n = 10
    cache = st.plan_cache()
    backward_misses = {}
    for props, seed in (("spd", 24), ("general", 25)):
        A = st.SparseTensor.from_dense(_spd(n, seed=seed))
        v = A.values.clone().requires_grad_(True)
        b = torch.randn(n, dtype=F64, requires_grad=True)
        f = _compiled(lambda v, b: compiled.traced_solve(A.with_values(v), b, method="lu", properties=props).sum())
        out = f(v, b)
        before = cache.misses
        out.backward()
        backward_misses[props] = cache.misses - before
        Dr = A.to_dense().clone().requires_grad_(True)
        br = b.detach().clone().requires_grad_(True)
        torch.linalg.solve(Dr, br).sum().backward()
        torch.testing.assert_close(b.grad, br.grad)
        torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad))
    # spd: the adjoint solve is A's own (the forward's plan and factorization); general: one more,
    # A^T's (both may plan the product that the sampled gradient runs on)
    assert backward_misses["general"] == backward_misses["spd"] + 1, backward_misses


def test_solve_op_checks_run_at_run_time(solver):
    n = 5
    D = _spd(n, seed=20)
    A = st.SparseTensor.from_dense(D)
    f = _compiled(lambda A, b: compiled.traced_solve(A, b))
    b = torch.randn(n, dtype=F64)
    torch.testing.assert_close(f(A, b), torch.linalg.solve(D, b))
    b[0] = float("nan")  # the finiteness check runs in the op's kernel, outside the graph
    with pytest.raises(InputError, match="(?i)nan|finite"):
        f(A, b)
    g = _compiled(lambda A, b: compiled.traced_solve(A, b, check_finite=False, method="lu"))
    with pytest.raises(st.SparseTorchError):  # unchecked input: the route's check of the answer still runs
        g(A, b)


def test_solve_refuses_what_a_graph_cannot_carry(solver):
    A = st.SparseTensor.from_dense(_spd(4, seed=21))
    b = torch.randn(4, dtype=F64)
    for kw in ({"return_info": True}, {"callback": lambda i, r: None}, {"preconditioner": lambda r: r}):
        with pytest.raises(InputError, match="under torch.compile"):
            compiled.traced_solve(A, b, **kw)


def _solve_wired() -> bool:
    module = importlib.import_module("sparsetorch.ops.solve")
    return "traced_solve" in inspect.getsource(module.solve)


@pytest.mark.skipif(not _solve_wired(), reason="st.solve does not route to sparsetorch::spsolve under compile yet "
                                               "(the lines for ops/solve.py are in docs/compile.md)")
def test_st_solve_compiles_fullgraph_once_wired():
    n = 8
    D = _spd(n, seed=22)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    b = torch.randn(n, dtype=F64, requires_grad=True)

    def loss(v, b):
        return st.solve(A.with_values(v), b).square().sum()

    assert _breaks(loss, v, b) == 0
    _compiled(loss)(v, b).backward()
    Dr = D.clone().requires_grad_(True)
    br = b.detach().clone().requires_grad_(True)
    torch.linalg.solve(Dr, br).square().sum().backward()
    torch.testing.assert_close(b.grad, br.grad)
    torch.testing.assert_close(v.grad, _on_pattern(A, Dr.grad))


def test_sparse_weight_elementwise_ops_under_compile_match_eager():
    """Operations that make a new SparseWeight (mul / div by a scalar, neg, to, clone, detach) graph-break under
    torch.compile; chained, each must still run its own operation: dynamo compiled SparseWeight.__torch_function__
    as a frame of its own with the first operation's handler and replayed it for the next (``(W / 2) * 3`` gave
    ``W / 6``, ``(W * 2) / 4`` gave ``8 W``; session 26's sweep)."""
    from sparsetorch.nn import SparseWeight

    D = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    W = SparseWeight(st.SparseTensor.from_dense(D))
    x = torch.ones(3, 2)
    cases = [
        (lambda: ((W / 2) * 3).to_dense(), 1.5 * D),
        (lambda: ((W * 2) / 4).to_dense(), 0.5 * D),
        (lambda: (-(W * 2)).to(torch.float64).clone().detach().to_dense(), (-2 * D).double()),
        (lambda: torch.div(torch.mul(W, 2), 4).to_dense(), 0.5 * D),
        (lambda: (W * 2) @ x, 2 * D @ x),
    ]
    for fn, ref in cases:
        dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="eager")(), ref, rtol=0, atol=0)
    # a transpose inside the region: refused with what to do (the traced view is not a SparseTensor)
    dynamo.reset()
    with pytest.raises(Exception, match="transpose outside the compiled"):
        torch.compile(lambda: (3 * W).T @ torch.ones(2), backend="eager")()
    # the products still compile whole
    dynamo.reset()
    out = torch.compile(lambda x: torch.nn.functional.linear(x.T, W) + W @ x.sum(1), fullgraph=True,
                        backend="eager")(x)
    torch.testing.assert_close(out, x.T @ D.T + D @ x.sum(1))
