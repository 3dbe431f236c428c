"""torch.compile of transposes taken inside the compiled region (``A.T @ x``, ``x @ A.T``,
``st.matmul(A.T, X)``, ``st.solve(A.T, b)``) and of ``Solver.solve`` with a plan built outside the
region (issue 17): fullgraph, zero graph breaks, values and gradients against dense float64 torch
references."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

import sparsetorch as st

F64 = torch.float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def _dense(n: int = 10, m: int | None = None, seed: int = 0, dtype=F64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    D = torch.randn(n, m, generator=g, dtype=F64) * (torch.rand(n, m, generator=g) < 0.35)
    if n == m:
        D = D + 4 * torch.eye(n, dtype=F64)
    if dtype.is_complex:
        D = D.to(dtype) * (1 + 0.5j)
    return D


def _no_breaks(fn, *args) -> None:
    assert dynamo.explain(fn)(*args).graph_break_count == 0


def test_transposed_products_inside_the_region():
    D = _dense(8, 5)
    A = st.SparseTensor.from_dense(D)
    x = torch.randn(8, dtype=F64)
    X = torch.randn(8, 3, dtype=F64)
    Y = torch.randn(2, 5, dtype=F64)

    def f(x, X, Y):
        return A.T @ x, st.matmul(A.mT, X), Y @ A.T, A.T.T @ torch.ones(5, dtype=F64)

    _no_breaks(f, x, X, Y)
    a, b, c, d = torch.compile(f, fullgraph=True)(x, X, Y)
    torch.testing.assert_close(a, D.T @ x)
    torch.testing.assert_close(b, D.T @ X)
    torch.testing.assert_close(c, Y @ D.T)
    torch.testing.assert_close(d, D @ torch.ones(5, dtype=F64))


def test_transposed_product_gradients():
    D = _dense(7, 7, seed=1)
    A0 = st.SparseTensor.from_dense(D)
    vals = A0.values.clone().requires_grad_(True)
    x = torch.randn(7, dtype=F64, requires_grad=True)

    def f(v, x):
        return (A0.with_values(v).T @ x).square().sum()

    torch.compile(f, fullgraph=True)(vals, x).backward()
    Dr = D.clone().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    (Dr.T @ xr).square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    rows, cols = D.nonzero(as_tuple=True)
    torch.testing.assert_close(vals.grad, Dr.grad[rows, cols])


@pytest.mark.parametrize("dtype", [F64, torch.complex128], ids=["real", "complex"])
def test_solve_with_a_transpose_taken_inside(dtype):
    D = _dense(9, seed=2, dtype=dtype)
    A = st.SparseTensor.from_dense(D)
    b = torch.randn(9, dtype=F64).to(dtype)

    def f(b):
        return st.solve(A.T, b)

    _no_breaks(f, b)
    x = torch.compile(f, fullgraph=True)(b)
    torch.testing.assert_close(x, torch.linalg.solve(D.T, b))


def test_solver_planned_outside_serves_the_compiled_solve_with_gradients():
    D = _dense(12, seed=3)
    A0 = st.SparseTensor.from_dense(D)
    vals = A0.values.clone().requires_grad_(True)
    s = st.Solver(A0.with_values(vals), method="lu")
    s.factorize()
    state = s._state
    misses = st.plan_cache().misses
    b = torch.randn(12, dtype=F64, requires_grad=True)

    def f(b):
        return s.solve(b)

    _no_breaks(f, b)
    g = torch.compile(f, fullgraph=True)
    x = g(b)
    torch.testing.assert_close(x, torch.linalg.solve(D, b.detach()))
    assert s._state is state and st.plan_cache().misses == misses  # the Solver's own plan, no new one
    x.square().sum().backward()
    Dr = D.clone().requires_grad_(True)
    br = b.detach().clone().requires_grad_(True)
    torch.linalg.solve(Dr, br).square().sum().backward()
    torch.testing.assert_close(b.grad, br.grad)
    rows, cols = D.nonzero(as_tuple=True)
    torch.testing.assert_close(vals.grad, Dr.grad[rows, cols])
    # several right-hand sides through the same graph function
    B = torch.randn(12, 3, dtype=F64)
    torch.testing.assert_close(torch.compile(lambda B: s.solve(B), fullgraph=True)(B), torch.linalg.solve(D, B))


def test_solver_under_compile_refuses_return_info():
    s = st.Solver(st.SparseTensor.from_dense(_dense(6, seed=4)))
    with pytest.raises(Exception, match="return_info"):
        torch.compile(lambda b: s.solve(b, return_info=True), fullgraph=True)(torch.ones(6, dtype=F64))


def test_t_of_a_matrix_eager_and_compiled():
    D = _dense(6, 4, seed=5)
    A = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(A.t().to_dense(), D.t())
    assert A.t().t().format == A.format
    x = torch.randn(6, dtype=F64)

    def f(x):
        return A.t() @ x

    _no_breaks(f, x)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), D.t() @ x)
    B = st.SparseTensor.from_dense(torch.stack([D, 2 * D]))  # 3 dims
    assert B.ndim == 3
    with pytest.raises(st.SparseTorchError, match="t\\(\\) expects a matrix"):
        B.t()
