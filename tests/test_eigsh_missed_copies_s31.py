"""eigsh's check for copies of a repeated eigenvalue that ARPACK missed, where the inertia count's factorization is
costly (session 31): a Rayleigh-Ritz count over the returned vectors and the extreme Ritz vectors of their orthogonal
complement proves a miss without factoring. Random sparse SPD n = 5000 took 1.3 s in the factorization against
ARPACK's 0.03 s. References: dense numpy.linalg.eigh in float64."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsetorch as st

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sparsetorch_scipy") is None,
                                reason="needs the SciPy plugin (ARPACK)")


def _st(S) -> st.SparseTensor:
    return st.SparseTensor.from_package(sp.csr_array(S))


def _random_spd(n: int, seed: int, degree: float = 5.0) -> sp.csr_matrix:
    B = sp.random(n, n, density=degree / n, random_state=seed, format="csr")
    return sp.csr_matrix(B + B.T + 10.0 * sp.identity(n))


def _blocks(copies: int, n: int = 150, seed: int = 2) -> sp.csr_matrix:
    """``copies`` identical random sparse SPD blocks: every eigenvalue repeated ``copies`` times."""
    return sp.csr_matrix(sp.block_diag([_random_spd(n, seed)] * copies))


@pytest.fixture
def no_factorization(monkeypatch):
    """Any inertia-count factorization fails the test (the check must not factor on this route)."""
    from sparsetorch_scipy import spectral

    def refuse(*args, **kwargs):  # pragma: no cover - reached only when the check regresses
        raise AssertionError("the inertia count factored a matrix on a route that must not")

    monkeypatch.setattr(spectral, "_count_at_least", refuse)
    return spectral


def test_factor_time_model_is_its_envelope_flops_in_rcm_order():
    """The predicted factorization time: a tridiagonal matrix spans one entry left of each diagonal but the first
    (n - 1 flops), whatever its numbering (the order is reverse Cuthill-McKee's, not the input's); a random sparse
    SPD matrix of n = 5000, whose factorization took 1.3 s against ARPACK's 0.03 s, is predicted costly."""
    from sparsetorch_scipy import spectral

    n = 400
    T = sp.diags([np.ones(n - 1), 2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]).tocsr()
    p = np.random.default_rng(0).permutation(n)
    unit = spectral.INERTIA_SECONDS_PER_FLOP
    assert spectral._factor_seconds(T) == pytest.approx((n - 1) * unit)
    assert spectral._factor_seconds(T[p][:, p]) == pytest.approx((n - 1) * unit)
    assert spectral._factor_seconds(_random_spd(5000, 1)) > max(spectral.INERTIA_MIN_SECONDS,
                                                               spectral.INERTIA_RATIO * 0.03)


def _every_factorization_costly(monkeypatch, spectral) -> None:
    monkeypatch.setattr(spectral, "INERTIA_MIN_SECONDS", 0.0)
    monkeypatch.setattr(spectral, "INERTIA_RATIO", 0.0)


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
def test_rayleigh_ritz_count_proves_a_miss_and_accepts_a_right_answer(which):
    """Three identical blocks (every eigenvalue three times): an answer holding one copy of the end value and the
    next distinct value instead of the other copies is refused; an answer holding copies of the end value only (k
    of 3) is accepted. The eigenvectors are the dense reference's, so the test is of the count, not of ARPACK."""
    from sparsetorch_scipy.spectral import _missed_copies

    L = _blocks(3)
    w, V = np.linalg.eigh(L.toarray())
    end = {"LA": [-1, -2, -3], "SA": [0, 1, 2], "LM": [-1, -2, -3]}[which]  # SPD: largest magnitude = largest
    nxt = {"LA": -4, "SA": 3, "LM": -4}[which]
    bad = [end[0], nxt]
    why = _missed_copies(L, w[bad], which, V=V[:, bad])
    assert why is not None and "Rayleigh-Ritz" in why
    want, got = re.search(r"returned (\d+) eigenvalues .* has at least (\d+) there", why).groups()
    assert int(want) == 1 and int(got) >= 2
    good = end[:2]
    assert _missed_copies(L, w[good], which, V=V[:, good]) is None


def test_costly_factorization_is_replaced_by_the_rayleigh_ritz_count(monkeypatch, no_factorization):
    """A random sparse SPD matrix (distinct eigenvalues, its factorization predicted costly): the default eigsh answers without
    any inertia factorization, and the answer is right to the dense reference's accuracy."""
    A = _random_spd(1200, 3)
    _every_factorization_costly(monkeypatch, no_factorization)  # n = 1200 stands for n = 5000
    ref = np.linalg.eigvalsh(A.toarray())
    for which, want in (("LA", ref[-6:]), ("LM", ref[-6:])):
        w, V = st.eigsh(_st(A), 6, which=which)
        np.testing.assert_allclose(np.sort(w.numpy()), want, rtol=1e-11)
        Vn = V.numpy()
        assert np.abs(A @ Vn - Vn * w.numpy()).max() < 1e-10 * abs(A).sum(1).max()


def test_missed_copies_are_still_found_where_the_factorization_is_skipped(monkeypatch):
    """Identical blocks with every factorization predicted costly: an ARPACK answer that misses copies is refused (by
    the Rayleigh-Ritz count before any factorization, or by the inertia count where the answer shows a repeat) and
    the call hands over; the result holds every copy."""
    from sparsetorch_scipy import spectral

    L = _blocks(4, n=120)
    ref = np.linalg.eigvalsh(L.toarray())
    _every_factorization_costly(monkeypatch, spectral)
    w, _, info = st.eigsh(_st(L), 6, which="LA", return_info=True)
    np.testing.assert_allclose(np.sort(w.numpy()), ref[-6:], rtol=1e-10)
    for t in info.extra["attempts"][:-1]:  # a refused ARPACK answer says why
        assert not t["accepted"]


def test_above_verify_all_max_the_count_now_checks_answers_without_a_repeat(monkeypatch):
    """Above VERIFY_ALL_MAX nothing checked an answer without a repeated value; the Rayleigh-Ritz count does now (here
    the limit is lowered so that a small matrix stands for a large one)."""
    from sparsetorch_scipy import spectral

    L = _blocks(3)
    w, V = np.linalg.eigh(L.toarray())
    monkeypatch.setattr(spectral, "VERIFY_ALL_MAX", 10)
    bad = [-1, -4]  # one copy of the top value and the next distinct one: no two alike
    assert spectral._missed_copies(L, w[bad], "LA", V=V[:, bad]) is not None
    assert spectral._missed_copies(L, w[bad], "LA") is None  # without the vectors: unchecked, as before
