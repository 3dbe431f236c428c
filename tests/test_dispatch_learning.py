"""Dispatch that learns from what it measured, recognizes a pattern in fresh buffers, keeps the
plan cache tidy at O(1) per plan, and takes the short way through singular matrices."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch import experience
from sparsetorch.dispatch.plan import PlanCache
from sparsetorch.dispatch.experience import clear_experience
from sparsetorch.dispatch.records import Measured
from sparsetorch.dispatch.select import clear_decisions
from sparsetorch.testing.problems import poisson2d

DT = torch.float64
DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _fresh():
    clear_experience()
    clear_decisions()
    yield
    clear_experience()
    clear_decisions()


def _copy(A: st.SparseTensor) -> st.SparseTensor:
    """The same matrix in fresh buffers (what re-reading a file or re-assembling gives)."""
    k = A.format.num_levels if hasattr(A.format, "num_levels") else len(A.format.levels)
    pos = [A.pos(i).clone() if A.pos(i) is not None else None for i in range(k)]
    crd = [A.crd(i).clone() if A.crd(i) is not None else None for i in range(k)]
    return st.SparseTensor(A.format, A.shape, pos, crd, A.values.clone())


# --- pattern identity by content ------------------------------------------------------------------
def test_fingerprint_is_equal_for_fresh_buffers_and_differs_otherwise():
    A = poisson2d(6, 6)
    B = _copy(A)
    assert A.pattern_key != B.pattern_key
    assert A.pattern_fingerprint == B.pattern_fingerprint
    C = poisson2d(6, 7)
    assert C.pattern_fingerprint != A.pattern_fingerprint
    # same shape and nnz, one coordinate moved: a different pattern
    D = _copy(A)
    col = D.crd(1)
    j = int(torch.nonzero(col == 1)[0])
    col[j] = 2 if int(col[j + 1]) != 2 else 0  # in place: the tensor's derived cache is dropped
    D2 = st.SparseTensor(D.format, D.shape, [D.pos(0), D.pos(1)], [D.crd(0), D.crd(1)], D.values, check=False)
    assert D2.pattern_fingerprint != A.pattern_fingerprint
    # new values on the same pattern keep it
    assert A.with_values(A.values * 3).pattern_fingerprint == A.pattern_fingerprint


def _west() -> st.SparseTensor:
    """west0067 (SuiteSparse, chemical engineering): non-symmetric, not diagonally dominant."""
    import scipy.io

    return st.SparseTensor.from_package(scipy.io.mmread(str(DATA / "west0067.mtx")).tocsr())


# --- direct methods priced at what they measured ----------------------------------------------------
def test_a_direct_method_much_slower_than_its_estimate_is_repriced_on_the_pattern():
    A = _west()
    b = torch.ones(A.shape[0], dtype=DT)
    first = st.explain("solve", A, b).chosen
    assert first is not None and first.offer.direct
    # what the route records when an attempt took far longer than the backend said
    experience.record(A.pattern_fingerprint, A.dtype, first.backend, first.method, first.offer.preconditioner,
                      Measured(0, 1e-10, True, "", seconds=6.0))
    once = st.explain("solve", _copy(A), b)  # one slow attempt proves nothing
    assert (once.chosen.backend, once.chosen.method) == (first.backend, first.method)
    experience.record(A.pattern_fingerprint, A.dtype, first.backend, first.method, first.offer.preconditioner,
                      Measured(0, 1e-10, True, "", seconds=5.0))
    table = st.explain("solve", _copy(A), b)  # a fresh copy: recognized by content
    assert (table.chosen.backend, table.chosen.method) != (first.backend, first.method)
    row = next(r for r in table.rows if (r.backend, r.method) == (first.backend, first.method) and r.seconds)
    assert row.seconds == pytest.approx(5.0) and "measured 5e+03 ms on this pattern" in row.reason
    x = st.solve(_copy(A), b)
    torch.testing.assert_close(A.to_dense() @ x, b, rtol=0, atol=1e-10)


def test_a_confirmed_slow_direct_method_prices_up_the_other_direct_offers():
    """The shared fill tables misjudged the pattern: the direct offers not measured on it are priced up
    by the least measured ratio (a saddle-point matrix whose LUs took 53x their estimate had its QR tried
    next at 30 s a call, twice, before that was measured too); a measured ratio within the noise
    (DIRECT_DIFFICULTY_FROM) changes nothing."""
    A = _west()
    b = torch.ones(A.shape[0], dtype=DT)
    table = st.explain("solve", A, b)
    direct = [r for r in table.rows if r.offer is not None and r.offer.direct]
    assert len(direct) >= 2
    first, other = direct[0], direct[1]
    est = {(r.backend, r.method): r.seconds for r in direct}
    for ratio, expect in ((2.0, 1.0), (40.0, 40.0)):
        clear_experience()
        clear_decisions()
        for _ in range(2):
            experience.record(A.pattern_fingerprint, A.dtype, first.backend, first.method, first.offer.preconditioner,
                              Measured(0, 1e-10, True, "", seconds=ratio * first.seconds))
        again = {(r.backend, r.method): r for r in st.explain("solve", _copy(A), b).rows if r.offer is not None}
        row = again[(other.backend, other.method)]
        assert row.seconds == pytest.approx(est[(other.backend, other.method)] * expect, rel=1e-6)
        assert ("other direct methods took" in row.reason) == (expect > 1.0)


def test_a_slow_direct_attempt_is_recorded_by_the_route(monkeypatch):
    """With the thresholds at zero every direct attempt counts as slower than estimated: the route
    records its measured time on the pattern."""
    monkeypatch.setattr(experience, "DIRECT_SLOWER", 0.0)
    monkeypatch.setattr(experience, "DIRECT_MARGIN", -1.0)
    A = _west()
    b = torch.ones(A.shape[0], dtype=DT)
    _, info = st.solve(A, b, return_info=True)
    got = dict(experience.measured_for(_copy(A).pattern_fingerprint, A.dtype))
    m = got[(info.backend, info.method, info.preconditioner)]
    assert m.seconds is not None and m.seconds > 0 and m.converged and m.samples == 1
    st.solve(_copy(A), b)
    got = dict(experience.measured_for(A.pattern_fingerprint, A.dtype))
    assert got[(info.backend, info.method, info.preconditioner)].samples == 2


def test_one_attempt_never_reprices():
    """Whatever one attempt measured (a loaded machine may stall it), the next call chooses as
    before: a measurement counts only when a second attempt confirms it."""
    A = poisson2d(8, 8)
    b = torch.ones(64, dtype=DT)
    first = st.explain("solve", A, b).chosen
    st.solve(A, b)
    assert all(m.samples <= 1 for _, m in experience.measured_for(A.pattern_fingerprint, A.dtype))
    again = st.explain("solve", _copy(A), b).chosen
    assert (again.backend, again.method) == (first.backend, first.method)


# --- never offer what the build refuses -------------------------------------------------------------
def _zero_diagonal() -> st.SparseTensor:
    n = 40
    D = torch.zeros(n, n, dtype=DT)
    for i in range(n - 1):
        D[i, i + 1] = D[i + 1, i] = 1.0 + 0.1 * i
    return st.SparseTensor.from_dense(D)


def test_jacobi_is_not_offered_on_a_zero_diagonal():
    A = _zero_diagonal()
    b = torch.ones(40, dtype=DT)
    table = st.explain("solve", A, b)
    assert all(r.offer is None or r.offer.preconditioner != "jacobi" for r in table.rows)
    assert any("Jacobi preconditioner divides by A's diagonal" in (r.reason or "") for r in table.rows)
    # asked for, it is still offered (and its build names the problem)
    asked = st.explain("solve", A, b, preconditioner="jacobi", method="minres", backend="scipy")
    assert asked.chosen is not None and asked.chosen.offer.preconditioner == "jacobi"


# --- the plan cache drops plans of freed matrices -----------------------------------------------------
def test_plan_cache_drops_plans_when_their_matrix_is_freed():
    cache = PlanCache(maxsize=8)

    class Key:
        def __init__(self, t):
            import weakref
            self._refs = (weakref.ref(t),)

        def alive(self):
            return all(r() is not None for r in self._refs)

    keep = [torch.arange(5) for _ in range(3)]
    for i, t in enumerate(keep):
        cache.get_or_build(("k", i), Key(t), lambda: object(), ("solve", "b", "m", (5,)))
    tmp = torch.arange(5)
    cache.get_or_build(("k", "tmp"), Key(tmp), lambda: object(), ("solve", "b", "m", (5,)))
    assert len(cache) == 4
    del tmp
    gc.collect()
    assert len(cache) == 3
    _, hit = cache.get_or_build(("k", 0), Key(keep[0]), lambda: object(), ())
    assert hit


@pytest.mark.parametrize("op", ["matmul", "solve", "logdet"])
def test_real_plans_leave_the_cache_with_their_matrix(op):
    """The unit test above with real plans: a plan held its matrix's index buffers (its source tensor shared
    them), so their weak references never fired and every matrix rebuilt in a loop stayed in memory with its
    plan until the LRU evicted it (16 MB a step at 200k entries; session 23's sweep). 5 rebuilt matrices of
    a pattern above the content-keyed size, each used once and dropped: none stays, no plan stays."""
    import weakref

    from sparsetorch.dispatch.plan import CONTENT_KEYED_NSE
    from sparsetorch.format import CSR

    n = CONTENT_KEYED_NSE // 3 + 100
    i = torch.arange(n)
    rows, cols = torch.cat([i, i[:-1], i[1:]]), torch.cat([i, i[1:], i[:-1]])
    vals = torch.cat([torch.full((n,), 4.0), -torch.ones(2 * n - 2)]).to(DT)
    x = torch.randn(n, dtype=DT, generator=torch.Generator().manual_seed(0))
    st.clear_caches()
    gc.collect()
    alive = []
    for _ in range(5):
        A = st.SparseTensor.from_coo(vals.clone(), rows.clone(), cols.clone(), shape=(n, n), format=CSR)
        alive.append(weakref.ref(A.crd(1)))
        out = A @ x if op == "matmul" else (st.solve(A, x) if op == "solve" else st.logdet(A))
        assert torch.isfinite(out).all()
        del A, out
        gc.collect()
    assert sum(w() is not None for w in alive) == 0
    assert len(st.plan_cache().entries()) == 0
    # a matrix kept alive keeps its plan: the next call is a hit
    A = st.SparseTensor.from_coo(vals.clone(), rows.clone(), cols.clone(), shape=(n, n), format=CSR)
    outs = [A @ x if op == "matmul" else (st.solve(A, x) if op == "solve" else st.logdet(A)) for _ in range(2)]
    torch.testing.assert_close(outs[0], outs[1])
    assert len(st.plan_cache().entries()) >= 1 and st.plan_cache().hits >= 1


# --- singular matrices: the short way ---------------------------------------------------------------
def _singular(n: int = 30):
    D = poisson2d(5, 6).to_dense()
    D[4] = D[3]
    D[:, 4] = D[:, 3]
    return st.SparseTensor.from_dense(D), D


def test_b_in_the_range_of_a_singular_matrix_needs_one_failed_lu():
    A, D = _singular()
    b = D @ torch.randn(30, dtype=DT, generator=torch.Generator().manual_seed(3))
    x, info = st.solve(A, b, return_info=True)
    assert float(torch.linalg.vector_norm(D @ x - b) / torch.linalg.vector_norm(b)) <= 1e-10
    failed_lu = [a for a in info.attempts if a.method == "lu" and not a.succeeded]
    assert len(failed_lu) == 1 and "range" in info.reason


def test_b_outside_the_range_is_singular_after_two_lus():
    A, D = _singular()
    b = torch.randn(30, dtype=DT, generator=torch.Generator().manual_seed(4))
    with pytest.raises(st.SingularMatrixError, match="every direct method tried agrees") as e:
        st.solve(A, b)
    assert str(e.value).count("/lu: failed") >= 2 or str(e.value).count("lu: failed") >= 2


# --- one method's failure weighs the others ----------------------------------------------------
def test_a_krylov_failure_on_a_pattern_weighs_every_krylov_offer():
    """After one iterative method ran out of iterations on a pattern, the next call does not try
    the next iterative method in line: their estimates are scaled by how far the failed one's was
    off (the spectrum is the same for all), so a direct method is chosen."""
    from sparsetorch.testing import families

    g = families.graph_laplacian(1000, graph="geometric", seed=0)
    M = g.matrix
    b = torch.from_numpy(M @ torch.ones(M.shape[0], dtype=DT).numpy())
    first = None
    for k in range(3):
        A = st.SparseTensor.from_package(M.copy())
        x, info = st.solve(A, b, return_info=True)
        D = torch.from_numpy(M.toarray())
        assert float(torch.linalg.vector_norm(b - D @ x) / torch.linalg.vector_norm(b)) <= 1e-10
        if k == 0:
            first = info
            continue
        iterative_failures = [a for a in info.attempts if not a.succeeded and a.method not in ("lu", "cholesky", "ldlt")]
        assert not iterative_failures, (k, [str(a) for a in info.attempts])
    assert first is not None
    if any(not a.succeeded for a in first.attempts):
        table = str(st.explain("solve", st.SparseTensor.from_package(M.copy()), b))
        assert "other iterative methods needed over" in table or "did not converge on this pattern" in table


def test_symmetry_map_is_shared_by_pattern_content_and_gives_the_same_properties():
    from sparsetorch.ops import properties as P

    A = poisson2d(7, 7)
    B = _copy(A)
    tags_a = P.detect(A)
    assert P.detect(B) == tags_a == {"spd", "symmetric"} | ({"hermitian"} if A.dtype.is_complex else set())
    key = ("properties", "symmetry_map")
    assert B._cache[key] is A._cache[key]  # fresh buffers, same numbers: one map
    # new values on the shared pattern are judged by their own values
    vals = B.values.clone()
    vals[1] += 1.0  # breaks the symmetry
    assert "nonsymmetric" in P.detect(B.with_values(vals))
    # another pattern of the same size does not hit it
    C = poisson2d(7, 7).T.to_dense()
    C[0, 5] = 1.0
    Cs = st.SparseTensor.from_dense(C)
    assert "nonsymmetric" in P.detect(Cs)
