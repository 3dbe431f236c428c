"""The per-call path of ``solve``: what is cached per pattern (property detection's transpose map),
per value set (the plan's loaded values) and checked once (NaN/Inf), and that no cache is ever
stale: in-place value writes (seen or unseen by torch's version counter), a new pattern with the
same shape and nnz, an index buffer written in place, another dtype."""

from __future__ import annotations

import math

import pytest
import torch

import sparsetorch as st
from sparsetorch.demo import poisson2d
from sparsetorch.format import COO, CSC, CSR
from sparsetorch.tensor import validate as _inputs
from sparsetorch.ops.properties import _detect, detect

_MAP = ("properties", "symmetry_map")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    st.plan_cache().clear()
    yield
    st.plan_cache().clear()


def _sym_indefinite(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.4)
    return D + D.T


def _cases():
    g = torch.Generator().manual_seed(3)
    P = poisson2d(5)
    Pd = P.to_dense()
    N = Pd.clone()
    N[0, 1] = -2.0  # symmetric pattern, nonsymmetric values
    E = Pd.clone()
    E[3, 0] = 0.5  # nonsymmetric pattern
    U = torch.triu(torch.randn(25, 25, generator=g, dtype=torch.complex128), 1) * (Pd != 0)
    H = Pd.to(torch.complex128) + U + U.mH  # Hermitian, complex off the diagonal
    return {
        "poisson csr": P,
        "poisson csc": st.SparseTensor.from_dense(Pd, CSC),
        "poisson coo": st.SparseTensor.from_dense(Pd, COO),
        "indefinite": st.SparseTensor.from_dense(_sym_indefinite()),
        "nonsym values": st.SparseTensor.from_dense(N),
        "nonsym pattern": st.SparseTensor.from_dense(E),
        "hermitian": st.SparseTensor.from_dense(H),
        "value batch": P.with_values(torch.stack([P.values, P.values * 2, -P.values])),
        "empty": st.SparseTensor.from_dense(torch.zeros(4, 4, dtype=torch.float64)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_detect_matches_the_uncached_reference(name):
    A = _cases()[name]
    got = detect(A)
    if name != "empty":  # (the reference path fails on a matrix with no entries: amax of nothing)
        assert got == _detect(A), name
    assert detect(A) == got  # the second call, on the cached map
    assert _MAP in A._cache
    expected = {"poisson csr": "spd", "poisson csc": "spd", "poisson coo": "spd", "indefinite": "symmetric",
                "nonsym values": "nonsymmetric", "nonsym pattern": "nonsymmetric", "hermitian": "hermitian",
                "value batch": "symmetric", "empty": "symmetric"}[name]
    assert expected in got, (name, got)
    if name in ("indefinite", "value batch"):
        assert "spd" not in got  # the batch has a negated member: not SPD as a whole


def test_detect_reuses_the_pattern_work_and_sees_every_value_change():
    A = poisson2d(6)
    A = A.with_values(A.values.clone())
    assert "spd" in detect(A)
    m = A._cache[_MAP]
    B = A.with_values(A.values * 2)  # new values, same pattern: same map
    assert "spd" in detect(B) and B._cache[_MAP] is m
    coords, slot = A.entries()
    k = int(slot[coords[0] != coords[1]][0])
    A.values[k] = 3.0  # in place (version counter bumped)
    assert detect(A) - {"diagonally_dominant"} == frozenset({"nonsymmetric"})
    A.values[k] = -1.0
    assert "spd" in detect(A)
    A.values.numpy()[k] = 3.0  # a write torch does not see
    assert detect(A) - {"diagonally_dominant"} == frozenset({"nonsymmetric"})
    A.values.numpy()[k] = -1.0
    d = int(slot[coords[0] == coords[1]][0])
    A.values.data[d] = -4.0  # through .data: symmetric, no longer SPD
    assert detect(A) == frozenset({"symmetric"})
    assert A._cache[_MAP] is m


def test_detect_on_a_new_pattern_with_equal_shape_and_nnz():
    # Large enough that a nonsymmetric pattern is answered from the pattern alone (no dense check).
    A = poisson2d(50)
    n = A.shape[0]
    assert "spd" in detect(A)
    coords, _ = A.entries()
    rows, cols = coords[0].clone(), coords[1].clone()
    k = int(torch.nonzero(cols == rows + 1)[0, 0])  # move one upper entry (0, 1) -> (0, 2)
    cols[k] = rows[k] + 2
    B = st.SparseTensor.from_coo(A.values.detach().clone(), rows, cols, shape=(n, n), format=CSR)
    assert B.nse == A.nse and tuple(B.shape) == tuple(A.shape)
    assert detect(B) == _detect(B) and detect(B) - {"diagonally_dominant"} == frozenset({"nonsymmetric"})
    assert "spd" in detect(A)


def test_detect_sees_an_index_buffer_written_in_place():
    # (0,0) (0,1) (1,0) (2,2): symmetric pattern; then crd (1,0) -> (1,2): nonsymmetric, same
    # values. A stale transpose map would pair slot 1 with slot 2 (equal values) and say symmetric.
    pos = torch.tensor([0, 2, 3, 4])
    crd = torch.tensor([0, 1, 0, 2])
    vals = torch.tensor([4.0, 1.0, 1.0, 4.0], dtype=torch.float64)
    A = st.SparseTensor(CSR, (3, 3), [None, pos], [None, crd], vals)
    assert detect(A) == frozenset({"symmetric", "zero_diagonal"})  # (row 1 has no diagonal entry: not SPD)
    A.crd(1)[2] = 2
    assert detect(A) - {"diagonally_dominant"} == frozenset({"nonsymmetric"}) == _detect(A)


def test_detect_with_duplicate_coordinates_takes_the_general_path():
    # COO with (0,1) stored twice: the matrix is their sum, 1 + 1 = 2 = A[1, 0].
    rows = torch.tensor([0, 0, 0, 1, 1])
    cols = torch.tensor([0, 1, 1, 0, 1])
    vals = torch.tensor([5.0, 1.0, 1.0, 2.0, 5.0], dtype=torch.float64)
    A = st.SparseTensor(COO, (2, 2), [torch.tensor([0, 5]), None], [rows, cols], vals, check=False)
    assert A._cache.get(_MAP, "absent") in (None, "absent")
    assert detect(A) == _detect(A)
    assert A._cache[_MAP] is None  # remembered: duplicates, no transpose map


def test_detect_per_dtype_and_through_solve_choice():
    A = poisson2d(5)
    for dtype in (torch.float64, torch.float32, torch.complex128):
        Ad = A.to(dtype)
        assert "spd" in detect(Ad)
        N = Ad.with_values(Ad.values.clone())
        N.values[1] = 7  # (0, 1) only: nonsymmetric in every dtype
        assert detect(N) == frozenset({"nonsymmetric"})
    # Method choice follows the values of the call, not a cached answer: CG is refused once A is
    # not symmetric (the torch backend then has no method for it, or picks a general one).
    b = torch.ones(25, dtype=torch.float64)
    M = A.with_values(A.values.clone())
    x = st.solve(M, b)
    assert torch.allclose(x, torch.linalg.solve(M.to_dense(), b))
    M.values.numpy()[1] = 2.5
    table = st.explain("solve", M, b)
    assert all(r.method not in ("cg", "cholesky") for r in table if r.offer is not None), table


# --- NaN/Inf: checked once per solve ------------------------------------------------------------------
def test_nonfinite_check_runs_once_per_solve(monkeypatch):
    calls = []
    real = _inputs._all_finite

    def counting(t):
        calls.append(tuple(t.shape))
        return real(t)

    monkeypatch.setattr(_inputs, "_all_finite", counting)
    A = poisson2d(4)
    b = torch.ones(16, dtype=torch.float64)
    st.solve(A, b, backend="torch", method="cg")
    assert sorted(calls) == sorted([tuple(A.values.shape), (16, 1)]), calls  # A once, b once
    calls.clear()
    st.solve(A, b, backend="torch", method="cg", check_finite=False)
    assert calls == []


@pytest.mark.parametrize("where", ["A", "b"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_still_rejected_with_the_clear_error(where, bad):
    A = poisson2d(4)
    b = torch.ones(16, dtype=torch.float64)
    if where == "A":
        v = A.values.clone()
        v[5] = bad
        A = A.with_values(v)
    else:
        b[7] = bad
    with pytest.raises(st.InputError, match="check_finite=False") as info:
        st.solve(A, b, backend="torch", method="cg")
    msg = str(info.value)
    assert ("A's values" in msg and "slot 5" in msg) if where == "A" else ("right-hand side" in msg and "index 7" in msg)


def test_finite_values_whose_sum_overflows_are_not_rejected():
    big = torch.finfo(torch.float64).max / 2
    D = torch.diag(torch.tensor([big, big, big], dtype=torch.float64))
    A = st.SparseTensor.from_dense(D)
    assert math.isinf(float(A.values.sum()))
    b = torch.tensor([big, big, -big], dtype=torch.float64)
    x = st.solve(A, b, backend="torch", method="lu")
    assert torch.allclose(x, torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))
    assert _inputs._all_finite(torch.tensor([big, big, -math.inf])) is False
    assert _inputs._all_finite(torch.tensor([1.0 + 1j, complex(1, math.nan)])) is False
    assert _inputs._all_finite(torch.tensor([], dtype=torch.float64)) is True


def test_nonfinite_rhs_rejected_under_vmap():
    A = poisson2d(3)
    Bs = torch.ones(4, 9, dtype=torch.float64)
    Bs[2, 4] = math.nan
    with pytest.raises(st.InputError, match="right-hand side"):
        torch.func.vmap(lambda b: st.solve(A, b, backend="torch", method="lu"))(Bs)
    Bs[2, 4] = 1.0
    X = torch.func.vmap(lambda b: st.solve(A, b, backend="torch", method="lu"))(Bs)
    assert torch.allclose(X, torch.linalg.solve(A.to_dense(), Bs.T).T)


# --- the plan's loaded values --------------------------------------------------------------------------
@pytest.mark.parametrize("change", ["in_place", "data", "numpy_view", "with_values"])
def test_cached_plan_refactors_on_every_value_change_and_only_then(change, monkeypatch):
    A = poisson2d(5)
    A = A.with_values(A.values.clone())
    b = torch.arange(25, dtype=torch.float64)
    set_values = []
    x1 = st.solve(A, b, backend="torch", method="lu")
    state = st.plan_cache().plan(st.plan_cache().entries()[0].key)
    real_set = state.plan.set_values
    monkeypatch.setattr(state.plan, "set_values", lambda v: (set_values.append(1), real_set(v))[1])
    st.solve(A, b, backend="torch", method="lu")
    assert set_values == [], "unchanged values were factored again"
    if change == "in_place":
        A.values.mul_(2)
    elif change == "data":
        A.values.data.mul_(2)
    elif change == "numpy_view":
        A.values.numpy()[...] *= 2
    else:
        A = A.with_values(A.values * 2)
    x2 = st.solve(A, b, backend="torch", method="lu")
    assert set_values == [1], f"values changed ({change}) but the plan did not refactor"
    assert torch.allclose(x2, x1 / 2, rtol=1e-12, atol=1e-12)
    assert torch.allclose(x2, torch.linalg.solve(A.to_dense(), b))
    st.solve(A, b, backend="torch", method="lu")
    assert set_values == [1]


def test_clear_caches_empties_every_cache_of_the_core():
    from sparsetorch.dispatch import experience, select

    A = poisson2d(6)
    b = torch.ones(36, dtype=torch.float64)
    st.solve(A, b)
    st.solve(A.with_values(A.values * 2), b)
    info = st.cache_info()
    assert {"plans", "dispatch decisions", "calls per pattern", "measurements", "jacobian colorings"} <= set(info)
    assert len(st.plan_cache()) > 0 and len(select._DECISIONS) > 0
    st.clear_caches()
    assert len(st.plan_cache()) == 0 and len(select._DECISIONS) == 0 and len(experience._store) == 0
    x = st.solve(A, b)  # nothing is wrong afterwards
    torch.testing.assert_close(A.to_dense() @ x, b)


def test_lru_bound_order_and_threads():
    import threading

    from sparsetorch.dispatch.lru import LRU

    c: LRU[int, int] = LRU("test lru", 3)
    for i in range(5):
        c.put(i, i * i)
    assert list(c) == [2, 3, 4] and c.get(2) == 4
    c.put(5, 25)  # 3 is now the least recently used
    assert list(c) == [4, 2, 5]
    assert c.get_or_set(7, lambda: 49) == 49 and 4 not in c

    def work(t):
        for i in range(2000):
            c.put((t, i % 7), i)
            c.get((t, (i + 1) % 7))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c) == 3
