"""Symmetry detection on large patterns (``ops/properties.py``): a sample of entries decides a
general matrix without sorting the transposes (a first call's cost), and never decides a symmetric
one: every entry is compared before ``symmetric`` is said. References: dense NumPy comparisons."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")
import scipy.sparse as sp  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.ops import properties as P  # noqa: E402


def _sym_pattern(n: int = 3000, seed: int = 0) -> sp.csr_matrix:
    R = sp.random(n, n, density=6.0 / n, random_state=seed, format="csr")
    S = (R + R.T + sp.eye(n) * 20).tocsr()
    S.sort_indices()
    assert S.nnz > P._SAMPLE
    return S


def _fresh(M: sp.csr_matrix) -> st.SparseTensor:
    return st.SparseTensor.from_package(M.copy())


def test_symmetric_values_are_compared_in_full():
    A = _fresh(_sym_pattern())
    assert "symmetric" in P.detect(A)
    m = A._cache[("properties", "symmetry_map")]
    assert m._pending is None and m.tslot is not None  # the transposes were found


def test_general_values_are_decided_by_the_sample():
    S = _sym_pattern(seed=5)  # a pattern no other test resolved (pattern data is shared by content)
    S.data = np.random.default_rng(1).standard_normal(S.nnz)
    A = _fresh(S)
    assert "nonsymmetric" in P.detect(A)
    m = A._cache[("properties", "symmetry_map")]
    assert m._pending is not None  # no sort of the transposes


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_asymmetric_pair_outside_the_sample_is_still_found(where):
    S = _sym_pattern()
    D = S.toarray()
    rows, cols = S.nonzero()
    off = np.flatnonzero(rows != cols)
    k = {"first": off[1], "middle": off[len(off) // 2 + 3], "last": off[-2]}[where]
    i, j = int(rows[k]), int(cols[k])
    S2 = S.tolil()
    S2[i, j] = S2[i, j] * (1 + 1e-9)  # one pair differs, beyond 1e-12
    S2 = S2.tocsr()
    S2.sort_indices()
    D2 = S2.toarray()
    assert not np.array_equal(D2, D2.T) and np.array_equal(D, D.T)
    assert "nonsymmetric" in P.detect(_fresh(S2))
    # a new set of values on the same pattern object: recomputed from them, the map kept
    A = _fresh(S)
    assert "symmetric" in P.detect(A)
    vals = A.values.clone()
    pos = int(np.flatnonzero((rows == i) & (cols == j))[0])
    vals[pos] *= 1 + 1e-9
    assert "nonsymmetric" in P.detect(A.with_values(vals))


def test_a_missing_transpose_with_a_nonzero_value_is_asymmetric():
    n = 3000
    S = _sym_pattern(n).tolil()
    S[5, n - 7] = 0.5  # no (n - 7, 5) entry stored, unless the pattern had it
    S[n - 7, 5] = 0.0
    S = S.tocsr()
    S.eliminate_zeros()
    S.sort_indices()
    assert "nonsymmetric" in P.detect(_fresh(S))
