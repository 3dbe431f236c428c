"""The solve route's iterative probe (issue 14, "rent or buy"): for a matrix class whose iteration
estimates are guesses (non-symmetric, not diagonally dominant), with nothing measured on the
pattern, a short iterative attempt bounded by a share of the direct method's estimated cost runs
first; what it measured decides the next call. And small CPU patterns share plans by content.

References: dense float64 torch solves."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.autograd import fallback
from sparsetorch.dispatch import experience
from sparsetorch.ops.properties import detect

DT = torch.float64


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    # every direct solve here is cheap: probe it anyway (the default bar is a few milliseconds)
    monkeypatch.setattr(fallback, "_PROBE_MIN_DIRECT", 0.0)
    st.clear_caches()
    yield
    st.clear_caches()


def _nonsymmetric(n: int, seed: int, shift: float) -> sp.csr_matrix:
    """Random sparse non-symmetric matrix plus ``shift`` I: not diagonally dominant (the rows
    sum to more than the diagonal), well conditioned for a large shift."""
    rng = np.random.default_rng(seed)
    B = sp.random(n, n, density=8 / n, random_state=rng, format="csr", data_rvs=rng.standard_normal)
    return sp.csr_matrix(B + shift * sp.eye(n))


def _check(M: sp.csr_matrix, x: torch.Tensor, b: torch.Tensor) -> float:
    D = torch.from_numpy(M.toarray())
    ref = torch.linalg.solve(D, b)
    torch.testing.assert_close(x, ref, rtol=1e-8, atol=1e-10)
    return float(torch.linalg.vector_norm(D @ x - b) / torch.linalg.vector_norm(b))


def test_probe_answers_when_the_iterative_method_converges_and_the_next_call_uses_it():
    M = _nonsymmetric(400, 0, shift=8.0)
    props = detect(st.SparseTensor.from_package(M))
    assert "diagonally_dominant" not in props and "symmetric" not in props
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(400))
    x, info = st.solve(st.SparseTensor.from_package(M), b, return_info=True)
    assert _check(M, x, b) <= 1e-10
    first = info.attempts[0]
    assert first.reason.startswith("probe:") and first.succeeded and first.iterations > 0
    assert len(info.attempts) == 1  # no direct method ran
    # the measurement is remembered by content: a matrix rebuilt from the same pattern goes to the
    # iterative method directly (no probe)
    x2, info2 = st.solve(st.SparseTensor.from_package(M.copy()), 2 * b, return_info=True)
    torch.testing.assert_close(x2, 2 * x, rtol=1e-8, atol=1e-10)
    assert info2.preconditioner == first.preconditioner and info2.method == first.method
    assert not any(a.reason.startswith("probe:") for a in info2.attempts)


def test_a_failed_probe_hands_over_to_the_direct_method_and_is_not_repeated():
    # a small shift: eigenvalues straddle zero, Krylov with Jacobi stalls in the probe's budget
    M = _nonsymmetric(300, 2, shift=0.05)
    b = torch.from_numpy(np.random.default_rng(3).standard_normal(300))
    x, info = st.solve(st.SparseTensor.from_package(M), b, return_info=True)
    assert _check(M, x, b) <= 1e-10
    assert info.attempts[0].reason.startswith("probe:") and not info.attempts[0].succeeded
    assert info.attempts[-1].succeeded and info.method == "lu"
    # bounded: the probe ran at most its share of the direct estimate's iterations (or the floor)
    assert info.attempts[0].iterations <= 10 * 300
    _, info2 = st.solve(st.SparseTensor.from_package(M.copy()), b, return_info=True)
    assert not any(a.reason.startswith("probe:") for a in info2.attempts)
    assert len(experience.measured_on(st.SparseTensor.from_package(M))) >= 1


def test_no_probe_when_pinned_or_spd_or_with_a_callback():
    M = _nonsymmetric(200, 4, shift=3.0)
    b = torch.ones(200, dtype=DT)
    _, info = st.solve(st.SparseTensor.from_package(M), b, method="lu", return_info=True)
    assert [a.method for a in info.attempts] == ["lu"]
    st.clear_caches()
    seen = []
    _, info = st.solve(st.SparseTensor.from_package(M), b, return_info=True, callback=lambda i, r: seen.append(i))
    assert not any(a.reason.startswith("probe:") for a in info.attempts)
    st.clear_caches()
    # diagonally dominant (SPD): the class's estimates are trusted, no probe
    W = abs(M) + abs(M).T
    S = sp.csr_matrix(sp.diags(np.asarray(W.sum(axis=1)).ravel() + 1.0) - W)
    x, info = st.solve(st.SparseTensor.from_package(S), b, return_info=True)
    assert not any(a.reason.startswith("probe:") for a in info.attempts)
    _check(S, x, b)


def test_gradients_through_a_probed_solve():
    M = _nonsymmetric(120, 5, shift=8.0)
    A = st.SparseTensor.from_package(M)
    vals = A.values.clone().requires_grad_(True)
    b = torch.from_numpy(np.random.default_rng(6).standard_normal(120)).requires_grad_(True)
    x, info = st.solve(A.with_values(vals), b, return_info=True)
    assert info.attempts[0].reason.startswith("probe:")
    x.square().sum().backward()
    D = torch.from_numpy(M.toarray()).requires_grad_(True)
    b2 = b.detach().clone().requires_grad_(True)
    torch.linalg.solve(D, b2).square().sum().backward()
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-7, atol=1e-9)
    coo = M.tocoo()
    rows, cols = torch.from_numpy(coo.row).long(), torch.from_numpy(coo.col).long()
    torch.testing.assert_close(vals.grad, D.grad[rows, cols], rtol=1e-7, atol=1e-9)


def test_small_cpu_patterns_share_plans_by_content():
    M = _nonsymmetric(150, 7, shift=3.0)
    b = torch.ones(150, dtype=DT)
    cache = st.plan_cache()
    st.solve(st.SparseTensor.from_package(M), b, method="lu", backend="torch")
    misses = cache.misses
    # a fresh tensor with the same indices and new values: the plan (and its analysis) is reused
    M2 = M.copy()
    M2.data *= 2
    x = st.solve(st.SparseTensor.from_package(M2), b, method="lu", backend="torch")
    assert cache.misses == misses and cache.hits >= 1
    torch.testing.assert_close(x, torch.linalg.solve(torch.from_numpy(M2.toarray()), b))
    # writing the caller's index buffer in place later does not reach the shared plan
    A3 = st.SparseTensor.from_package(M.copy())
    st.solve(A3, b, method="lu", backend="torch")
    x4 = st.solve(st.SparseTensor.from_package(M.copy()), b, method="lu", backend="torch")
    torch.testing.assert_close(x4, torch.linalg.solve(torch.from_numpy(M.toarray()), b))
