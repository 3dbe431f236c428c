"""Dispatch and ops behaviour not covered by the conformance kit: tracing, callbacks, the plan
cache, calibration, gradients into the caller's tensors, batches and lists."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

import sparsetorch as st
from sparsetorch.demo import poisson2d
from sparsetorch.format import CSR


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    st.plan_cache().clear()
    yield
    st.plan_cache().clear()


def _nonsym(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.3)
    D += n * torch.eye(n, dtype=torch.float64)
    return st.SparseTensor.from_dense(D), D


def test_trace_logs_every_decision(monkeypatch, caplog):
    monkeypatch.setenv("SPARSETORCH_TRACE", "1")
    A = poisson2d(4)
    with caplog.at_level(logging.INFO, logger="sparsetorch.dispatch"):
        st.solve(A, torch.ones(16, dtype=torch.float64))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "solve -> " in text and "backend" in text and "method" in text


def test_explain_ranks_and_declines_with_reasons():
    A, _ = _nonsym()
    table = st.explain("solve", A, torch.ones(12, dtype=torch.float64))
    assert table.chosen is not None and table.chosen.offer is not None
    secs = [r.seconds for r in table.offers]
    assert secs == sorted(secs) or table.offers[0].chosen  # ties may reorder within 1 %
    reasons = {(r.backend, r.method): r.reason for r in table.declines}
    assert "symmetric positive definite" in reasons[("torch", "cg")]
    assert "symmetric" in reasons[("torch", "minres")]
    assert "->" in str(table) and "cg" in str(table)


def test_unknown_backend_names_the_loaded_ones():
    A = poisson2d(3)
    with pytest.raises(st.NoBackendError, match="backend='nope' is not loaded; loaded backends: .*torch"):
        st.solve(A, torch.ones(9, dtype=torch.float64), backend="nope")


def test_callback_sees_every_check_and_changes_between_calls():
    A = poisson2d(8)
    b = torch.randn(64, dtype=torch.float64)
    first, second = [], []
    st.solve(A, b, backend="torch", method="cg", check_every=4, callback=lambda it, r: first.append((it, r)))
    st.solve(A, b * 2, backend="torch", method="cg", check_every=4, callback=lambda it, r: second.append((it, r)))
    assert first and second  # the cached plan takes the new callback
    assert [it for it, _ in first] == list(range(4, 4 * len(first) + 1, 4))
    assert first[-1][1] <= 1e-6


def test_progress_needs_tqdm_or_works():
    A = poisson2d(4)
    b = torch.ones(16, dtype=torch.float64)
    try:
        import tqdm  # noqa: F401
    except ImportError:
        with pytest.raises(st.InputError, match="pip install tqdm"):
            st.solve(A, b, method="cg", progress=True)
    else:
        x = st.solve(A, b, method="cg", progress=True)
        assert torch.allclose(A.to_dense() @ x, b, atol=1e-5)


def test_plan_cache_is_bounded_inspectable_and_sees_new_values():
    cache = st.plan_cache()
    cache.clear()
    A = poisson2d(6)
    b = torch.randn(36, dtype=torch.float64)

    def solves():
        return [e for e in cache.entries() if e.op == "solve"]

    st.solve(A, b, backend="torch", method="cg")
    # one solve plan (the core checks a small answer's residual from A's entries, with no plan)
    assert len(solves()) == 1 and len(cache) == 1 and cache.misses == 1
    A2 = A.with_values(A.values * 3)
    x2 = st.solve(A2, b, backend="torch", method="cg", rtol=1e-10)
    assert cache.hits == 1 and len(solves()) == 1
    assert torch.allclose(x2, torch.linalg.solve(A2.to_dense(), b), atol=1e-8)
    e = solves()[0]
    assert (e.op, e.backend, e.method, e.shape) == ("solve", "torch", "cg", (36, 36))
    old = cache.maxsize
    try:
        cache.maxsize = 2
        for n in (3, 4, 5):
            st.solve(poisson2d(n), torch.ones(n * n, dtype=torch.float64), backend="torch", method="cg")
        assert len(cache) == 2
    finally:
        cache.maxsize = old
    cache.clear()
    assert len(cache) == 0


def test_gradients_reach_the_callers_torch_values():
    D = poisson2d(4).to_dense()
    csr = D.to_sparse_csr()
    vals = csr.values().clone().requires_grad_(True)
    t = torch.sparse_csr_tensor(csr.crow_indices(), csr.col_indices(), vals, D.shape)
    A = st.from_package(t)
    b = torch.randn(16, dtype=torch.float64)
    st.solve(A, b).square().sum().backward()
    Dr = D.clone().requires_grad_(True)
    torch.linalg.solve(Dr, b).square().sum().backward()
    rows = torch.repeat_interleave(torch.arange(16), csr.crow_indices().diff())
    assert vals.grad is not None
    assert torch.allclose(vals.grad, Dr.grad[rows, csr.col_indices()], atol=1e-10)


def test_from_coo_values_get_matmul_gradients_with_duplicates():
    vals = torch.randn(5, dtype=torch.float64, requires_grad=True)
    row, col = torch.tensor([0, 1, 1, 2, 0]), torch.tensor([0, 2, 2, 1, 0])
    A = st.SparseTensor.from_coo(vals, row, col, shape=(3, 3), format=CSR)
    X = torch.randn(3, 2, dtype=torch.float64)
    (A @ X).sum().backward()
    ref = vals.detach().clone().requires_grad_(True)
    (torch.zeros(3, 3, dtype=torch.float64).index_put((row, col), ref, accumulate=True) @ X).sum().backward()
    assert torch.allclose(vals.grad, ref.grad)


def test_value_batch_and_list_solves_match_dense():
    A = poisson2d(4)
    vals = torch.stack([A.values, A.values * 2, A.values * 0.5])
    Ab = A.with_values(vals)
    B = torch.randn(3, 16, 2, dtype=torch.float64)
    X = st.solve(Ab, B, rtol=1e-10)
    assert torch.allclose(X, torch.linalg.solve(Ab.to_dense(), B), atol=1e-8)
    lst = st.SparseTensorList([poisson2d(3), poisson2d(4)])
    xs = st.solve(lst, [torch.ones(9, dtype=torch.float64), torch.ones(16, dtype=torch.float64)])
    assert [tuple(x.shape) for x in xs] == [(9,), (16,)]
    assert all(torch.allclose(a.to_dense() @ x, torch.ones_like(x), atol=1e-5) for a, x in zip(lst, xs))


def test_matmul_reset_operands_keeps_plan_on_same_pattern():
    A = poisson2d(4)
    b1, b2 = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    c = torch.zeros(16, dtype=torch.float64)
    with st.Matmul(A, b1, c, beta=1.0) as mm:
        mm.plan()
        state = mm._state
        mm.execute()
        mm.reset_operands(a=A.with_values(A.values * 2), b=b2)
        mm.execute()
        assert mm._state is state
    D = A.to_dense()
    assert torch.allclose(c, D @ b1 + 2 * D @ b2)


def test_calibration_is_cached_on_disk(monkeypatch, tmp_path):
    cal = sys.modules["sparsetorch.dispatch.calibrate"]

    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "measure")  # CPUs use the built-in rates otherwise
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cal._memo.clear()
    r = cal.rates("cpu")
    assert r.measured and r.bandwidth > 0 and r.flops > 0 and r.launch > 0
    stored = json.loads((tmp_path / "sparsetorch" / "calibration.json").read_text())
    assert any(v["bandwidth"] == r.bandwidth for v in stored.values())
    cal._memo.clear()
    assert cal.rates("cpu") == r  # read back from disk, not re-measured
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    assert not cal.rates("cpu").measured
    monkeypatch.delenv("SPARSETORCH_CALIBRATION")
    assert not cal.rates("cpu").measured  # the CPU models were fitted against the built-in rates


def test_cli_calibrate(tmp_path):
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "sparsetorch", "calibrate"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "GB/s" in out.stdout and (tmp_path / "sparsetorch" / "calibration.json").exists()
