"""Session 28's outside sweep: lstsq's acceptance of a wide, row-scaled A's answer (a residual neither small nor
orthogonal to range(A) was accepted as converged, 97 % from the minimum-norm solution), the row-scaled retry of
a wide A, info.converged of an answer whose last refinement solve stopped short, and eigsh attempts bounded by
their own estimate (an attempt estimated at 0.7 s ran 288 s because no dense offer came after it)."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch.accuracy import backward_error_bound
from sparsetorch.dispatch.results import IterationResult, Status


def _wide_row_scaled(seed: int = 0, decades: float = 5.0):
    """12 x 30, full row rank, rows scaled 10^-decades..10^decades (condition 1.4e10 at 5): A x = b consistent."""
    rng = np.random.default_rng(seed)
    m, n = 12, 30
    A = rng.standard_normal((m, n))
    A[np.abs(A) < 0.5] = 0
    A = A * (10.0 ** np.linspace(-decades, decades, m))[:, None]
    b = rng.standard_normal(m)
    return A, b


def _st(A: np.ndarray) -> st.SparseTensor:
    return st.SparseTensor.from_dense(torch.tensor(A))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_row_scaled_default_call_is_the_minimum_norm_solution(seed) -> None:
    """The default call answered LSQR's x with relative residual 0.39, 97 % from NumPy's minimum-norm solution,
    converged=True (seed 2: 69 %). Now within the conditioning's bound (cond 1.4e10: NumPy's own error ~1e-7)."""
    A, b = _wide_row_scaled(seed)
    x, info = st.lstsq(_st(A), torch.tensor(b), return_info=True)
    ref = np.linalg.lstsq(A, b, rcond=None)[0]
    assert info.converged
    assert np.linalg.norm(x.numpy() - ref) / np.linalg.norm(ref) < 1e-5


def test_acceptance_refuses_a_residual_neither_small_nor_orthogonal_to_range() -> None:
    """The mechanism: ``LstsqHandle._eta`` of an x that solves all but the two smallest rows and misses those
    (r lies in the small rows: not small against ||b||, not orthogonal to range(A)) exceeds the acceptance limit;
    the per-column measure with ``||A||_F ||x||`` in its denominator read it ~1e-15 and accepted it. NumPy's
    minimum-norm solution stays within the limit."""
    from sparsetorch.autograd.lstsq import LstsqHandle

    A, b = _wide_row_scaled(0)
    ref = np.linalg.lstsq(A, b, rcond=None)[0]
    big = A[2:]  # rows scaled 8e-4 .. 1e5
    null = np.linalg.svd(big)[2][-1]  # a direction all but the two smallest rows (1e-5, 8e-5) do not see
    r_small = A @ null
    x_bad = ref + 0.4 * np.linalg.norm(b) / np.linalg.norm(r_small) * null
    rel = np.linalg.norm(b - A @ x_bad) / np.linalg.norm(b)
    assert 0.3 < rel < 0.5
    S = _st(A)
    h = LstsqHandle(state=None, A=S, options={})  # type: ignore[arg-type]
    limit = 16 * backward_error_bound(torch.float64, 30)

    def eta(x):
        return h._eta(S.values, torch.tensor(b).unsqueeze(-1), torch.tensor(x).unsqueeze(-1), False)[0]

    assert eta(x_bad) > 100 * limit
    assert eta(ref) <= limit


@pytest.mark.skipif(importlib.util.find_spec("sparsetorch_scipy") is None, reason="needs the SciPy plugin")
def test_wide_row_scaled_retry_scales_rows_and_b_together() -> None:
    """SciPy's LSQR / LSMR alone (no direct method to hand over to) broke down on the row-scaled A and the call
    raised NotConvergedError; the retry solves D A x = D b (D powers of two, unit rows), whose solutions are A x
    = b's, and info says so. Against NumPy's minimum-norm solution."""
    A, b = _wide_row_scaled(0)
    x, info = st.lstsq(_st(A), torch.tensor(b), backend="scipy", return_info=True)
    ref = np.linalg.lstsq(A, b, rcond=None)[0]
    assert "rows and b's scaled" in info.reason
    assert np.linalg.norm(x.numpy() - ref) / np.linalg.norm(ref) < 1e-5


def test_info_reports_the_answer_not_its_last_refinement_solve(monkeypatch) -> None:
    """An answer accepted after refinement whose last correction solve stopped at maxiter read converged=False,
    status max_iterations in info (rows 1e-8..1e8), although on_nonconvergence="raise" had returned it as an
    answer. info reports the answer's own result."""
    from sparsetorch.autograd.lstsq import LstsqHandle

    sharpen = LstsqHandle._sharpen

    def with_a_short_last_solve(self, values, B, X, adjoint):
        out = sharpen(self, values, B, X, adjoint)
        self.results.append(IterationResult(7, 0.5, False, Status.MAX_ITERATIONS, "a correction solve stopped"))
        return out

    monkeypatch.setattr(LstsqHandle, "_sharpen", with_a_short_last_solve)
    g = torch.Generator().manual_seed(1)
    D = torch.randn(40, 8, generator=g, dtype=torch.float64)
    b = torch.randn(40, generator=g, dtype=torch.float64)
    x, info = st.lstsq(st.SparseTensor.from_dense(D), b, method="lsqr", return_info=True)
    assert info.converged and info.status is not Status.MAX_ITERATIONS
    torch.testing.assert_close(x, torch.linalg.lstsq(D, b.unsqueeze(-1)).solution[:, 0], rtol=1e-9, atol=1e-12)


# --- eigsh: attempts bounded by their own estimate ------------------------------------------------------------
def _dirichlet_path(n: int) -> np.ndarray:
    return 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)


def _patch_attempts(monkeypatch, first, others=None):
    """The first eigsh plan call (whichever torch iterative method dispatch ranked first) is ``first(orig, self,
    k, **kw)``; later calls ``others`` (None: the real method). Each records the budget it was given."""
    from sparsetorch.backends.torch_native.lanczos import LanczosPlan
    from sparsetorch.backends.torch_native.spectral import LobpcgPlan
    from sparsetorch.ops.spectral import _attempts

    monkeypatch.setattr(_attempts, "OVERRUN_FACTOR", 1.0, raising=False)
    monkeypatch.setattr(_attempts, "OVERRUN_MIN_BUDGET", 0.2, raising=False)
    monkeypatch.setenv("SPARSETORCH_DISPATCH_CACHE", "0")
    calls: list = []
    for cls in (LanczosPlan, LobpcgPlan):
        orig = cls.eigsh

        def wrapped(self, k, *, _orig=orig, **kw):
            calls.append((type(self).__name__, kw.get("budget")))
            fn = first if calls[0][0] == type(self).__name__ else others
            return _orig(self, k, **kw) if fn is None else fn(_orig, self, k, **kw)

        monkeypatch.setattr(cls, "eigsh", wrapped)
    return calls


def _slow(orig, plan, k, *, budget=None, **kw):
    """Honours its budget (stops when it is spent, unconverged); unbounded it answers (the real method)."""
    if budget is not None:
        time.sleep(budget)
        return (torch.zeros(k, dtype=torch.float64), torch.zeros(1, k, dtype=torch.float64),
                IterationResult(3, 1.0, False, Status.MAX_ITERATIONS, "stopped when its budget was spent (fake)"))
    return orig(plan, k, **kw)


def _unbounded(orig, plan, k, *, budget=None, **kw):
    """The real method, its budget dropped (this test's 1x factor would cut it on a busy machine)."""
    return orig(plan, k, **kw)


def _fails(orig, plan, k, *, budget=None, **kw):
    return (torch.zeros(k, dtype=torch.float64), torch.zeros(1, k, dtype=torch.float64),
            IterationResult(1, 1.0, False, Status.BREAKDOWN, "fails (fake)"))


def test_an_attempt_with_another_after_it_is_bounded_by_its_own_estimate(monkeypatch) -> None:
    """No dense offer after it (dense_max below n): the first attempt ran unbounded (budget None) to its own
    maxiter. It now gets OVERRUN_FACTOR x its estimate (at least OVERRUN_MIN_BUDGET), gives way when that is
    spent, and the next method answers. Against NumPy's eigvalsh."""
    n, k = 120, 3
    L = _dirichlet_path(n)
    calls = _patch_attempts(monkeypatch, _slow, _unbounded)
    w, _, info = st.eigsh(_st(L), k, which="SA", backend="torch", dense_max=10, return_info=True)
    tries = info.extra["attempts"]
    from sparsetorch.ops.spectral import _attempts

    assert calls[0][1] is not None and tries[0]["budget"] is not None
    est = st.explain("eigsh", _st(L), k, which="SA", backend="torch", dense_max=10).offers[0].seconds
    assert tries[0]["budget"] == pytest.approx(max(_attempts.OVERRUN_MIN_BUDGET, _attempts.OVERRUN_FACTOR * est))
    assert not tries[0]["accepted"] and tries[-1]["accepted"] and len(tries) == 2
    np.testing.assert_allclose(np.sort(w.numpy()), np.linalg.eigvalsh(L)[:k], rtol=1e-9)


def test_an_attempt_cut_by_its_own_bound_runs_again_when_every_other_failed(monkeypatch) -> None:
    """A slow answer is still one: the attempt stopped by its own bound runs again, unbounded, after the others
    failed (here the second method always fails), and answers."""
    n, k = 120, 3
    L = _dirichlet_path(n)
    calls = _patch_attempts(monkeypatch, _slow, _fails)
    w, _, info = st.eigsh(_st(L), k, which="SA", backend="torch", dense_max=10, return_info=True)
    tries = info.extra["attempts"]
    assert [t["accepted"] for t in tries] == [False, False, True]
    assert tries[0]["budget"] is not None and tries[2]["budget"] is None
    assert (tries[0]["backend"], tries[0]["method"]) == (tries[2]["backend"], tries[2]["method"])
    assert calls[0][0] == calls[2][0]
    np.testing.assert_allclose(np.sort(w.numpy()), np.linalg.eigvalsh(L)[:k], rtol=1e-9)
