"""``torch.func.vmap`` over a sparse matrix's values (docs/dispatch.md): solve and matmul run member by
member through their Functions' vmap rules; planning sees the pattern (session 21's sweep: detection
raised "data-dependent control flow" and plans let the batched values escape)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

D = torch.tensor([[4., 1, 0, 0], [1, 5, 1, 0], [0, 2, 6, 1], [0, 0, 1, 7]], dtype=torch.float64)


@pytest.fixture
def batch():
    A = st.SparseTensor.from_dense(D)
    vb = torch.stack([A.values, 1.1 * A.values, 0.9 * A.values + 0.1])
    return A, vb


@pytest.mark.parametrize("kw", [{}, {"properties": "general"}, {"backend": "torch", "method": "lu"},
                                {"properties": "symmetric"}])
def test_vmap_solve_over_values(batch, kw):
    A, vb = batch
    b = torch.linspace(1, 2, 4, dtype=torch.float64)
    X = torch.func.vmap(lambda v: st.solve(A.with_values(v), b, **kw))(vb)
    dense = torch.zeros(3, 4, 4, dtype=torch.float64)
    r, c = (D != 0).nonzero(as_tuple=True)
    dense[:, r, c] = vb
    torch.testing.assert_close(X, torch.linalg.solve(dense, b.expand(3, 4)), rtol=1e-12, atol=1e-12)


def test_vmap_of_grad_of_solve_over_values(batch):
    A, vb = batch
    b = torch.linspace(1, 2, 4, dtype=torch.float64)
    f = torch.func.grad(lambda v: st.solve(A.with_values(v), b).sum())
    g = torch.func.vmap(f)(vb)
    torch.testing.assert_close(g, torch.stack([f(v) for v in vb]), rtol=1e-12, atol=1e-12)


def test_vmap_matmul_over_values(batch):
    A, vb = batch
    x = torch.linspace(1, 2, 4, dtype=torch.float64)
    Y = torch.func.vmap(lambda v: A.with_values(v) @ x)(vb)
    torch.testing.assert_close(Y, A.with_values(vb) @ x)
    Y2 = torch.func.vmap(lambda v: st.matmul(A.with_values(v), x, alpha=2.0))(vb)
    torch.testing.assert_close(Y2, 2 * (A.with_values(vb) @ x))


def test_from_coo_inside_torch_func_transforms():
    # index buffers built inside a transform came out wrapped: "Cannot access data pointer of Tensor
    # that doesn't have storage" under grad / jvp (session 21's sweep)
    rows = torch.tensor([0, 0, 1, 1, 2])
    cols = torch.tensor([0, 1, 0, 1, 2])
    v = torch.tensor([4., -1., -1., 4., 2.], dtype=torch.float64)
    b = torch.ones(3, dtype=torch.float64)
    A = st.SparseTensor.from_coo(v, rows, cols, shape=(3, 3))

    def f(v):
        return st.solve(st.SparseTensor.from_coo(v, rows, cols, shape=(3, 3)), b).sum()

    g = torch.func.grad(f)(v)
    torch.testing.assert_close(g, torch.func.grad(lambda v: st.solve(A.with_values(v), b).sum())(v))
    u = torch.linspace(-1, 1, 5, dtype=torch.float64)
    _, t = torch.func.jvp(f, (v,), (u,))
    torch.testing.assert_close(t, (g * u).sum())
    y = torch.func.grad(lambda v: (st.SparseTensor.from_coo(v, rows, cols, shape=(3, 3)) @ b).sum())(v)
    torch.testing.assert_close(y, torch.ones(5, dtype=torch.float64))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_solver_first_solving_inside_torch_func_grad(requires_grad):
    """A Solver built outside torch.func.grad whose first solve runs inside it: detach() there returns the
    transform's wrapper even of a plain tensor, and the factorization read it ("Cannot access data pointer";
    session 23's sweep). Also a Solver built inside, on the transform's values. Against dense autograd."""
    from torch.func import grad

    D = torch.tensor([[4.0, 1, 0], [1, 3, 1], [0, 1, 2]], dtype=torch.float64)
    b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D)
    S = st.Solver(A.with_values(A.values.clone().requires_grad_(requires_grad)))
    bd = b.clone().requires_grad_(True)
    torch.linalg.solve(D, bd).pow(2).sum().backward()
    torch.testing.assert_close(grad(lambda b_: S.solve(b_).pow(2).sum())(b), bd.grad)
    Dd = D.clone().requires_grad_(True)
    torch.linalg.solve(Dd, b).sum().backward()
    coords, slot = A.entries()
    g = grad(lambda v: st.Solver(A.with_values(v)).solve(b).sum())(A.values.clone())
    torch.testing.assert_close(g[slot], Dd.grad[coords[0], coords[1]])
