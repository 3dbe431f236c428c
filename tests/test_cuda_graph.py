"""CG blocks replayed as CUDA graphs (krylov/_graph.py): same answers as the eager loop.

GPU only (they skip without CUDA); the CPU side checks that graphs stay off there.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.backends.torch_native.krylov import cg
from sparsetorch.format import CSR
from sparsetorch.ops.info import Status

# the module (the package exports the function under the same name)
cg_mod = importlib.import_module("sparsetorch.backends.torch_native.krylov.cg")

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def poisson2d(m: int, device: str, dtype=torch.float64) -> tuple[st.SparseTensor, torch.Tensor]:
    """5-point 2-D Poisson on an m x m grid: the SparseTensor and the dense matrix (float64)."""
    import scipy.sparse as sp

    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    A = (sp.kron(sp.eye(m), t) + sp.kron(t, sp.eye(m))).tocsr()
    A.sort_indices()
    n = m * m
    crow = torch.as_tensor(A.indptr, dtype=torch.int64, device=device)
    col = torch.as_tensor(A.indices, dtype=torch.int64, device=device)
    vals = torch.as_tensor(A.data, dtype=dtype, device=device)
    S = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals)
    return S, torch.as_tensor(A.toarray(), dtype=torch.float64, device=device)


class Spy:
    """Records the BlockGraph objects the CG states create."""

    def __init__(self, monkeypatch) -> None:
        self.made: list = []
        real = cg_mod.BlockGraph
        spy = self

        class Recorded(real):
            def __init__(self, *a, **k) -> None:
                super().__init__(*a, **k)
                spy.made.append(self)

        monkeypatch.setattr(cg_mod, "BlockGraph", Recorded)


def test_cpu_solves_never_build_a_graph(monkeypatch) -> None:
    spy = Spy(monkeypatch)
    S, D = poisson2d(12, "cpu")
    b = torch.randn(S.shape[0], 1, dtype=torch.float64)
    x, info = cg(lambda v: D @ v, b, cuda_graph=True)
    assert info.converged and not spy.made
    assert torch.allclose(D @ x, b, atol=1e-5 * float(b.norm()))


@cuda
@pytest.mark.parametrize("check_every", [1, 5, 8])
def test_graph_cg_equals_eager_cg(check_every) -> None:
    S, D = poisson2d(40, "cuda")
    T = torch.sparse_csr_tensor(S.pos(1), S.crd(1), S.values, S.shape)
    g = torch.Generator(device="cuda").manual_seed(0)
    b = torch.randn(S.shape[0], 1, dtype=torch.float64, device="cuda", generator=g)
    b0 = b.clone()
    matvec = lambda v: (T @ v[:, 0])[:, None]  # noqa: E731
    x_e, info_e = cg(matvec, b, rtol=1e-10, check_every=check_every)
    x_g, info_g = cg(matvec, b, rtol=1e-10, check_every=check_every, cuda_graph=True)
    assert torch.equal(b, b0)  # the graph works on copies, never on the caller's b
    assert info_g.converged and info_g.iterations == info_e.iterations
    assert torch.allclose(x_g, x_e, rtol=1e-12, atol=1e-14)
    ref = torch.linalg.solve(D, b)
    assert torch.allclose(x_g, ref, rtol=1e-7, atol=1e-9)


@cuda
def test_graph_is_captured_and_replayed_through_solve(monkeypatch) -> None:
    spy = Spy(monkeypatch)
    S, D = poisson2d(48, "cuda")
    b = torch.randn(S.shape[0], dtype=torch.float64, device="cuda")
    st.plan_cache().clear()
    x, info = st.solve(S, b, backend="torch", method="cg", rtol=1e-10, return_info=True)
    ref = torch.linalg.solve(D, b)
    assert torch.allclose(x, ref, rtol=1e-7, atol=1e-9)
    assert spy.made and all(g.captured and g.failed is None for g in spy.made)
    # jacobi is capturable too
    spy.made.clear()
    x, info = st.solve(S, b, backend="torch", method="cg", preconditioner="jacobi", rtol=1e-10, return_info=True)
    assert torch.allclose(x, ref, rtol=1e-7, atol=1e-9)
    assert spy.made and spy.made[0].captured


@cuda
def test_graph_off_by_option_and_by_environment(monkeypatch) -> None:
    spy = Spy(monkeypatch)
    S, _ = poisson2d(24, "cuda")
    b = torch.randn(S.shape[0], dtype=torch.float64, device="cuda")
    st.solve(S, b, backend="torch", method="cg", backend_options={"cuda_graph": False})
    assert not spy.made
    monkeypatch.setenv("SPARSETORCH_CUDA_GRAPHS", "0")
    st.plan_cache().clear()
    st.solve(S, b, backend="torch", method="cg")
    assert not spy.made


@cuda
def test_uncapturable_operator_warns_and_runs_eagerly() -> None:
    S, D = poisson2d(20, "cuda")
    b = torch.randn(S.shape[0], 1, dtype=torch.float64, device="cuda")

    def syncing(v):  # reads a value on the host: not capturable
        if float(v.abs().sum()) < 0:
            raise AssertionError
        return D @ v

    with pytest.warns(RuntimeWarning, match="CUDA graph failed"):
        x, info = cg(syncing, b, rtol=1e-10, cuda_graph=True)
    assert info.converged
    assert torch.allclose(x, torch.linalg.solve(D, b), rtol=1e-7, atol=1e-9)


@cuda
def test_graph_reports_indefinite_and_maxiter() -> None:
    S, D = poisson2d(16, "cuda")
    b = torch.randn(S.shape[0], 1, dtype=torch.float64, device="cuda")
    x, info = cg(lambda v: -(D @ v), b, cuda_graph=True)
    assert info.status is Status.INDEFINITE
    x, info = cg(lambda v: D @ v, b, rtol=1e-14, maxiter=13, cuda_graph=True)
    assert info.iterations == 13 and not info.converged  # 8 (graph) + 5 (eager tail)
    x_e, _ = cg(lambda v: D @ v, b, rtol=1e-14, maxiter=13)
    assert torch.allclose(x, x_e, rtol=1e-12, atol=1e-14)


@cuda
def test_gradients_through_graph_cg_match_dense() -> None:
    S, D = poisson2d(10, "cuda")
    v = S.values.clone().requires_grad_(True)
    b = torch.randn(S.shape[0], dtype=torch.float64, device="cuda", requires_grad=True)
    x = st.solve(S.with_values(v), b, backend="torch", method="cg", rtol=1e-12)
    w = torch.randn_like(x)
    (x * w).sum().backward()
    # dense reference: x = D^-1 b; dL/db = D^-T w; dL/dA_ij = -(D^-T w)_i x_j
    lam = torch.linalg.solve(D.T, w)
    xd = torch.linalg.solve(D, b.detach())
    assert torch.allclose(b.grad, lam, rtol=1e-8, atol=1e-10)
    coords, slot = S.entries()
    ref = -(lam[coords[0]] * xd[coords[1]])
    got = torch.zeros_like(ref).index_add(0, torch.arange(slot.numel(), device="cuda"), v.grad[slot])
    assert torch.allclose(got, ref, rtol=1e-7, atol=1e-9)
    assert np.isfinite(float(v.grad.abs().sum()))


@cuda
def test_failed_capture_leaves_random_numbers_working() -> None:
    S, D = poisson2d(8, "cuda")
    b = torch.randn(S.shape[0], 1, dtype=torch.float64, device="cuda")
    with pytest.warns(RuntimeWarning, match="CUDA graph failed"):
        cg(lambda v: D @ v if float(v.sum()) == float(v.sum()) else v, b, cuda_graph=True)
    torch.randn(4, device="cuda")  # raised "Offset increment outside graph capture" before the fix
    x, info = cg(lambda v: D @ v, b, rtol=1e-10, cuda_graph=True)  # graphs still work afterwards
    assert info.converged


@cuda
def test_nan_inside_a_block_hands_back_the_last_finite_checked_iterate() -> None:
    S, D = poisson2d(30, "cuda")
    b = torch.randn(S.shape[0], 1, dtype=torch.float64, device="cuda")
    calls = torch.zeros((), device="cuda")  # counts executed products on the device (capturable)

    def poisoned(v):  # the 21st product returns NaN
        calls.add_(1)
        return D @ v + torch.where(calls == 21, float("nan"), 0.0)

    x, info = cg(poisoned, b, rtol=1e-14, check_every=8, cuda_graph=True)
    assert info.status is Status.NOT_FINITE
    assert bool(torch.isfinite(x).all())
    x16, _ = cg(lambda v: D @ v, b, rtol=1e-14, maxiter=16)  # the iterate of the last good check
    assert torch.allclose(x, x16, rtol=1e-12, atol=1e-14)


def _cuda_request(**options):
    from sparsetorch.dispatch.records import OperandInfo, Request

    n = 1_000_000
    dev = torch.device("cuda")
    A = OperandInfo("sparse", (n, n), torch.float64, dev, CSR, 5 * n)
    b = OperandInfo("dense", (n, 1), torch.float64, dev)
    return Request("solve", (A, b), frozenset({"spd"}), options)


@pytest.mark.parametrize("pre", [None, "jacobi"])
def test_cost_model_prices_the_graph(pre, monkeypatch) -> None:
    """Metadata only (no GPU needed): graph CG is priced below eager CG, and only where it runs."""
    from sparsetorch.backends.torch_native import cost
    from sparsetorch.dispatch.calibrate import _DEFAULTS

    rates = _DEFAULTS["cuda"]
    graph, _, its = cost.krylov_cost(rates, _cuda_request(), "cg", pre)
    eager, _, its2 = cost.krylov_cost(rates, _cuda_request(backend_options={"cuda_graph": False}), "cg", pre)
    assert its == its2 and graph < 0.6 * eager
    monkeypatch.setenv("SPARSETORCH_CUDA_GRAPHS", "0")
    off, _, _ = cost.krylov_cost(rates, _cuda_request(), "cg", pre)
    assert off == eager
    monkeypatch.delenv("SPARSETORCH_CUDA_GRAPHS")
    # block Jacobi (batched LU solves) is not captured: priced eagerly
    bj, _, _ = cost.krylov_cost(rates, _cuda_request(), "cg", "block_jacobi")
    bj_eager, _, _ = cost.krylov_cost(rates, _cuda_request(backend_options={"cuda_graph": False}), "cg", "block_jacobi")
    assert bj == bj_eager


@cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_graph_masked_cg_several_columns_and_batches(dtype, monkeypatch) -> None:
    """The masked step (columns finishing at different times, a batch, complex) in a graph."""
    spy = Spy(monkeypatch)
    _, D = poisson2d(12, "cuda")
    n = D.shape[0]
    D2 = torch.stack([D, D + 0.5 * torch.eye(n, dtype=D.dtype, device="cuda")]).to(dtype)
    g = torch.Generator(device="cuda").manual_seed(3)
    B = torch.randn(2, n, 3, dtype=torch.float64, device="cuda", generator=g).to(dtype)
    B[0, :, 1] = 0  # a zero column: done at once
    mv = lambda V: D2 @ V  # noqa: E731
    x_e, info_e = cg(mv, B, rtol=1e-10)
    x_g, info_g = cg(mv, B, rtol=1e-10, cuda_graph=True)
    assert spy.made and spy.made[0].captured
    assert info_g.converged and info_g.iterations == info_e.iterations
    torch.testing.assert_close(x_g, x_e, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x_g, torch.linalg.solve(D2, B), rtol=1e-7, atol=1e-9)
