"""``sparsetorch.solve`` on a matrix-free A (a callable ``x -> A x`` or a ``LinearOperator``):
answers against ``torch.linalg.solve``, every method, gradients by the adjoint method in ``b`` and in
the tensors the operator closes over, the adjoint from ``rmatvec`` / self-adjointness / autograd,
non-convergence and the errors (ops/operator.py, autograd/operator.py; docs/solve.md,
"Matrix-free operators")."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch.results import Status

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def _matrices(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    R = torch.randn(n, n, generator=g, dtype=F64)
    spd = R @ R.T / n + torch.eye(n, dtype=F64)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    eig = torch.linspace(1.0, 3.0, n, dtype=F64) * torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0).to(F64)
    sym = Q @ torch.diag(eig) @ Q.T
    sym = (sym + sym.T) / 2
    gen = torch.randn(n, n, generator=g, dtype=F64) / n ** 0.5 + 2 * torch.eye(n, dtype=F64)
    return {"spd": spd, "symmetric": sym, "general": gen}


METHODS = {"spd": ["cg", "minres", "gmres", "bicgstab"], "symmetric": ["minres", "gmres", "bicgstab"],
           "general": ["gmres", "bicgstab"]}
CASES = [(kind, m) for kind, ms in METHODS.items() for m in ms]


def _rel(x, y):
    return float(torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(y))


@pytest.mark.parametrize("kind,method", CASES)
def test_answers_match_dense(kind, method):
    n = 120
    A = _matrices(n)[kind]
    b = torch.randn(n, dtype=F64, generator=torch.Generator().manual_seed(1))
    x, info = st.solve(lambda v: A @ v, b, method=method, return_info=True)
    ref = torch.linalg.solve(A, b)
    assert x.shape == (n,) and x.dtype == F64
    # the accuracy contract's tolerance for float64: relative residual 1e-10
    assert info.converged and info.residual <= 1e-10
    assert float(torch.linalg.vector_norm(b - A @ x) / torch.linalg.vector_norm(b)) <= 1e-10
    assert _rel(x, ref) < 1e-7
    assert info.method == method and info.backend == "torch" and info.status is Status.CONVERGED
    assert info.iterations > 0 and info.extra["operator"] == "matrix-free"
    # a block of right-hand sides: the callable still sees vectors
    B = torch.randn(n, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    seen = []

    def matvec(v):
        seen.append(tuple(v.shape))
        return A @ v

    X = st.solve(matvec, B, method=method)
    assert set(seen) == {(n,)}
    assert _rel(X, torch.linalg.solve(A, B)) < 1e-7


def test_default_methods_from_properties():
    n = 60
    mats = _matrices(n)
    b = torch.ones(n, dtype=F64)
    _, info = st.solve(lambda v: mats["general"] @ v, b, return_info=True)
    assert info.method == "gmres"
    _, info = st.solve(st.LinearOperator(lambda v: mats["spd"] @ v, (n, n), properties="spd"), b, return_info=True)
    assert info.method == "cg" and info.extra["adjoint"] == "self-adjoint"
    _, info = st.solve(st.LinearOperator(lambda v: mats["symmetric"] @ v, (n, n), properties="symmetric"), b,
                       return_info=True)
    assert info.method == "minres"
    _, info = st.solve(lambda v: mats["symmetric"] @ v, b, properties="symmetric", return_info=True)
    assert info.method == "minres"


def test_sparse_tensor_inside_the_callable_and_its_value_gradients():
    n = 50
    D = _matrices(n)["general"]
    mask = (D.abs() > 0.15) | torch.eye(n, dtype=torch.bool)
    Ad = torch.where(mask, D, torch.zeros((), dtype=F64))
    A = st.SparseTensor.from_dense(Ad)
    values = A.values.detach().clone().requires_grad_()
    As = A.detach().with_values(values)
    b = torch.randn(n, dtype=F64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    w = torch.randn(n, dtype=F64, generator=torch.Generator().manual_seed(4))
    x = st.solve(lambda v: As @ v, b, method="gmres")
    assert _rel(x.detach(), torch.linalg.solve(Ad, b.detach())) < 1e-8
    (x * w).sum().backward()
    # the sparse path's gradients for the same matrix (differentiable in the values too)
    values2 = A.values.detach().clone().requires_grad_()
    b2 = b.detach().clone().requires_grad_()
    (st.solve(A.detach().with_values(values2), b2) * w).sum().backward()
    assert torch.allclose(b.grad, b2.grad, rtol=1e-7, atol=1e-10)
    assert torch.allclose(values.grad, values2.grad, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("method", ["cg", "minres", "gmres", "bicgstab"])
def test_gradients_match_dense(method):
    n = 40
    kind = "spd" if method == "cg" else ("symmetric" if method == "minres" else "general")
    M0 = _matrices(n, seed=5)[kind]
    s = torch.tensor(1.7, dtype=F64, requires_grad=True)
    b = torch.randn(n, 2, dtype=F64, generator=torch.Generator().manual_seed(6), requires_grad=True)
    w = torch.randn(n, 2, dtype=F64, generator=torch.Generator().manual_seed(7))
    x = st.solve(lambda v: (s * M0) @ v, b, method=method)
    (x * w).sum().backward()
    got_s, got_b = s.grad.clone(), b.grad.clone()
    s.grad = b.grad = None
    (torch.linalg.solve(s * M0, b) * w).sum().backward()
    assert torch.allclose(got_b, b.grad, rtol=1e-7, atol=1e-10)
    assert torch.allclose(got_s, s.grad, rtol=1e-7, atol=1e-10)


def test_gradcheck_b_and_closed_over_tensors():
    n = 8
    M0 = _matrices(n, seed=8)["general"]
    b = torch.randn(n, 2, dtype=F64, generator=torch.Generator().manual_seed(9), requires_grad=True)
    s = torch.tensor(0.9, dtype=F64, requires_grad=True)
    M = M0.clone().requires_grad_()
    # found by the probe product (no params=)
    assert torch.autograd.gradcheck(lambda b_, s_, M_: st.solve(lambda v: (s_ * M_) @ v, b_, method="gmres"),
                                    (b, s, M))
    # named (params=): only those get gradients; the others are constants
    assert torch.autograd.gradcheck(
        lambda b_, s_: st.solve(lambda v: (s_ * M0) @ v, b_, method="bicgstab", params=[s_]), (b, s))
    # a LinearOperator with its rmatvec
    assert torch.autograd.gradcheck(
        lambda b_, M_: st.solve(st.LinearOperator(lambda v: M_ @ v, (n, n), rmatvec=lambda y: M_.T @ y), b_,
                                method="gmres"), (b, M))
    # self-adjoint by its properties (the adjoint solve reuses matvec)
    S = _matrices(n, seed=10)["spd"].clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda b_, S_: st.solve(st.LinearOperator(lambda v: ((S_ + S_.T) / 2) @ v, (n, n), properties="spd"), b_),
        (b, S))


def test_rmatvec_given_and_derived_agree():
    n = 30
    M0 = _matrices(n, seed=11)["general"]
    calls = {"r": 0}

    def rmatvec(y):
        calls["r"] += 1
        return M0.T @ y

    b = torch.randn(n, dtype=F64, generator=torch.Generator().manual_seed(12))
    grads = {}
    for label, op in {"given": st.LinearOperator(lambda v: M0 @ v, (n, n), rmatvec=rmatvec),
                      "derived": st.LinearOperator(lambda v: M0 @ v, (n, n)),
                      "callable": (lambda v: M0 @ v)}.items():
        bb = b.clone().requires_grad_()
        x, info = st.solve(op, bb, method="gmres", return_info=True)
        x.square().sum().backward()
        grads[label] = bb.grad
        assert info.extra["adjoint"] == ("rmatvec" if label == "given" else "vjp")
    assert calls["r"] > 0
    ref = torch.linalg.solve(M0.T, 2 * torch.linalg.solve(M0, b))
    for g in grads.values():
        assert torch.allclose(g, ref, rtol=1e-7, atol=1e-10)


def _graph_nodes(t):
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.append(type(node).__name__)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return names


def test_graph_is_one_node_and_closure_from_outside():
    n = 30
    M0 = _matrices(n, seed=13)["general"]
    s = torch.tensor(2.0, dtype=F64, requires_grad=True)
    M2 = s * M0  # a non-leaf tensor computed before the solve, closed over
    b = torch.ones(n, dtype=F64)
    x, info = st.solve(lambda v: M2 @ v, b, method="gmres", restart=3, return_info=True)
    assert info.iterations > 10
    nodes = _graph_nodes(x)
    assert any("OperatorSolve" in name for name in nodes)
    # the graph is the same few nodes whatever the iteration count (none per iteration)
    assert len(nodes) <= 6, nodes
    loss = x.sum() + M2.sum()  # the outer graph walks M2's history too
    loss.backward()
    s2 = s.detach().clone().requires_grad_()
    (torch.linalg.solve(s2 * M0, b).sum() + (s2 * M0).sum()).backward()
    assert torch.allclose(s.grad, s2.grad, rtol=1e-8)
    # named non-leaf: its gradient flows on through its history
    s.grad = None
    M3 = s * M0
    st.solve(lambda v: M3 @ v, b, method="gmres", params=[M3]).sum().backward()
    assert torch.allclose(s.grad, torch.autograd.grad(torch.linalg.solve(s2 * M0, b).sum(), s2)[0], rtol=1e-8)


def test_no_grad_and_second_derivative():
    n = 10
    M0 = _matrices(n, seed=14)["general"]
    s = torch.tensor(1.0, dtype=F64, requires_grad=True)
    with torch.no_grad():
        x = st.solve(lambda v: (s * M0) @ v, torch.ones(n, dtype=F64))
    assert x.grad_fn is None
    x = st.solve(lambda v: (s * M0) @ v, torch.ones(n, dtype=F64))
    (g,) = torch.autograd.grad(x.sum(), s, create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        g.backward()


def test_not_converged_raises_and_policies():
    n = 100
    A = torch.diag(torch.logspace(0, 4, n, dtype=F64))  # SPD, condition number 1e4: a few iterations do not do
    b = torch.randn(n, dtype=F64, generator=torch.Generator().manual_seed(16))
    with pytest.raises(st.NotConvergedError, match="matrix-free gmres") as exc:
        st.solve(lambda v: A @ v, b, method="gmres", maxiter=1, restart=2)
    assert exc.value.info is not None and not exc.value.info.converged
    with pytest.warns(st.NotConvergedWarning):
        x, info = st.solve(lambda v: A @ v, b, method="bicgstab", maxiter=2, on_nonconvergence="warn",
                           return_info=True)
    assert not info.converged and info.iterations == 2 and x.shape == (n,)
    _, info = st.solve(lambda v: A @ v, b, method="minres", maxiter=3, on_nonconvergence="ignore", return_info=True)
    assert not info.converged and info.status is Status.MAX_ITERATIONS


def test_cg_on_indefinite_names_the_problem():
    n = 40
    A = _matrices(n, seed=17)["symmetric"]
    with pytest.raises(st.IndefiniteMatrixError, match="minres"):
        st.solve(lambda v: A @ v, torch.ones(n, dtype=F64), method="cg")


def test_preconditioner_callable():
    n = 80
    d = torch.linspace(1, 1e3, n, dtype=F64)
    A = torch.diag(d) + _matrices(n, seed=18)["general"] * 0.1
    b = torch.ones(n, dtype=F64, requires_grad=True)
    x, info = st.solve(lambda v: A @ v, b, method="gmres", preconditioner=lambda r: r / d, return_info=True)
    _, plain = st.solve(lambda v: A @ v, b.detach(), method="gmres", return_info=True)
    assert info.converged and info.preconditioner == "user" and info.iterations < plain.iterations
    x.sum().backward()
    assert torch.allclose(b.grad, torch.linalg.solve(A.T, torch.ones(n, dtype=F64)), rtol=1e-7)


def test_float32_contract():
    n = 50
    A = _matrices(n, seed=19)["general"].float()
    b = torch.ones(n)
    x, info = st.solve(lambda v: A @ v, b, return_info=True)
    assert x.dtype == torch.float32 and info.converged and info.residual <= 1e-5


def test_errors_name_the_values():
    n = 20
    A = _matrices(n, seed=20)["general"]
    b = torch.ones(n, dtype=F64)
    with pytest.raises(st.InputError, match=r"returned shape \(19,\) for an input of shape \(20,\)"):
        st.solve(lambda v: (A @ v)[:-1], b)
    with pytest.raises(st.InputError, match="returned torch.float32 .* for an input of torch.float64"):
        st.solve(lambda v: (A @ v).float(), b)
    with pytest.raises(st.InputError, match="returned list"):
        st.solve(lambda v: [0.0] * n, b)
    with pytest.raises(st.InputError, match=r"dtype torch.float32 and b is torch.float64"):
        st.solve(st.LinearOperator(lambda v: A @ v, (n, n), dtype=torch.float32), b)
    with pytest.raises(st.InputError, match="on meta and b is on cpu"):
        st.solve(st.LinearOperator(lambda v: A @ v, (n, n), device="meta"), b)
    with pytest.raises(st.InputError, match=r"shape \(21, 21\) and b has shape \(20,\)"):
        st.solve(st.LinearOperator(lambda v: v, (21, 21)), b)
    with pytest.raises(st.InputError, match="method='lu' is not available for a matrix-free A"):
        st.solve(lambda v: A @ v, b, method="lu")
    with pytest.raises(st.InputError, match=r"method='cg' needs a symmetric .* properties say \['nonsymmetric'\]"):
        st.solve(st.LinearOperator(lambda v: A @ v, (n, n), properties="general"), b, method="cg")
    with pytest.raises(st.InputError, match="preconditioner='jacobi' reads A's entries"):
        st.solve(lambda v: A @ v, b, preconditioner="jacobi")
    with pytest.raises(st.InputError, match="backend='scipy'"):
        st.solve(lambda v: A @ v, b, backend="scipy")
    with pytest.raises(st.InputError, match="dense_max=10 does not apply"):
        st.solve(lambda v: A @ v, b, dense_max=10)
    with pytest.raises(st.InputError, match=r"shape \(n,\) or \(n, k\), got \(2, 20, 1\)"):
        st.solve(lambda v: A @ v, torch.ones(2, n, 1, dtype=F64))
    with pytest.raises(st.InputError, match="NaN or Inf"):
        st.solve(lambda v: A @ v, torch.full((n,), float("nan"), dtype=F64))
    with pytest.raises(st.InputError, match="LinearOperator: shape must be"):
        st.LinearOperator(lambda v: v, (3, 4))
    with pytest.raises(st.InputError, match="params= names the tensors a matrix-free A"):
        st.solve(st.SparseTensor.from_dense(A), b, params=[A])
    with pytest.raises(st.InputError, match="torch.func transforms"):
        torch.func.vmap(lambda bb: st.solve(lambda v: A @ v, bb))(torch.ones(2, n, dtype=F64))
    # A^H cannot be derived from a callable autograd cannot differentiate
    def opaque(v):
        return torch.from_numpy(A.numpy() @ v.detach().numpy())

    bb = b.clone().requires_grad_()
    x = st.solve(opaque, bb, method="gmres")
    with pytest.raises(st.InputError, match="rmatvec="):
        x.sum().backward()


@pytest.mark.parametrize("case", ["general", "hermitian", "complex symmetric"])
def test_complex_operators_and_gradients(case):
    n = 20
    C = torch.complex128
    g = torch.Generator().manual_seed(21)
    G = torch.complex(torch.randn(n, n, generator=g, dtype=F64), torch.randn(n, n, generator=g, dtype=F64))
    G = G / n ** 0.5 + 2 * torch.eye(n, dtype=C)
    A, kw = {"general": (G, {"method": "gmres"}),
             "hermitian": (G @ G.mH + torch.eye(n, dtype=C), {"properties": "hermitian"}),
             "complex symmetric": (G + G.T, {"properties": "symmetric", "method": "bicgstab"})}[case]
    b = torch.complex(torch.randn(n, generator=g, dtype=F64), torch.randn(n, generator=g, dtype=F64))
    s = torch.tensor(1.2, dtype=F64, requires_grad=True)
    Ml = A.clone().requires_grad_()
    bb = b.clone().requires_grad_()
    x, info = st.solve(lambda v: s * (Ml @ v), bb, return_info=True, **kw)
    assert info.extra["adjoint"] == {"general": "vjp", "hermitian": "self-adjoint",
                                     "complex symmetric": "complex symmetric (conj A conj)"}[case]
    (x.abs() ** 2).sum().backward()
    s2, M2, b2 = s.detach().clone().requires_grad_(), A.clone().requires_grad_(), b.clone().requires_grad_()
    xd = torch.linalg.solve(s2 * M2, b2)
    (xd.abs() ** 2).sum().backward()
    assert torch.allclose(x.detach(), xd.detach(), rtol=1e-8, atol=1e-12)
    for got, ref in ((bb.grad, b2.grad), (s.grad, s2.grad), (Ml.grad, M2.grad)):
        assert torch.allclose(got, ref, rtol=1e-7, atol=1e-10)


def test_blocks_operator_and_module_parameters():
    n = 25
    M0 = _matrices(n, seed=22)["general"]
    shapes = []

    def block_matvec(V):
        shapes.append(tuple(V.shape))
        return M0 @ V

    B = torch.randn(n, 4, dtype=F64, generator=torch.Generator().manual_seed(23), requires_grad=True)
    X = st.solve(st.LinearOperator(block_matvec, (n, n), blocks=True), B, method="gmres")
    assert set(shapes) == {(n, 4)}
    assert _rel(X.detach(), torch.linalg.solve(M0, B.detach())) < 1e-8
    X.sum().backward()
    assert torch.allclose(B.grad, torch.linalg.solve(M0.T, torch.ones(n, 4, dtype=F64)), rtol=1e-7)
    # an nn.Module as the operator: its parameters get the gradient (found, or named by params=)
    lin = torch.nn.Linear(n, n, bias=False, dtype=F64)
    with torch.no_grad():
        lin.weight.copy_(M0)
    b = torch.ones(n, dtype=F64)
    for params in (None, lin):
        lin.zero_grad()
        st.solve(lin, b, method="bicgstab", params=params).square().sum().backward()
        W = M0.clone().requires_grad_()
        torch.linalg.solve(W, b).square().sum().backward()
        assert torch.allclose(lin.weight.grad, W.grad, rtol=1e-7, atol=1e-10)
    # params=(): the operator is a constant
    s = torch.tensor(1.0, dtype=F64, requires_grad=True)
    bb = b.clone().requires_grad_()
    st.solve(lambda v: (s * M0) @ v, bb, method="gmres", params=()).sum().backward()
    assert s.grad is None and bb.grad is not None
