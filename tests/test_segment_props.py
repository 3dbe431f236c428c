"""``segment_props`` (the order and uniqueness of a compressed level's coordinates, read when a
package's CSR / CSC / BSR is wrapped) agrees with the general ``lex_props`` on the (segment,
coordinate) pairs, including empty segments, segments of one entry, duplicates and descents at
a segment's first entry; a wrapped SciPy matrix gets the exact level properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.tensor.interop._common import lex_props, segment_owner, segment_props


def _case(rng: np.random.Generator, segments: int, mode: str, dtype: torch.dtype):
    counts = rng.integers(0, 5, size=segments)
    counts[rng.integers(segments)] = 0  # an empty segment somewhere
    pos = torch.zeros(segments + 1, dtype=dtype)
    pos[1:] = torch.from_numpy(np.cumsum(counts)).to(dtype)
    crd = []
    for c in counts:
        seg = np.sort(rng.choice(50, size=c, replace=False))
        if mode == "dup" and c >= 2:
            seg[-1] = seg[-2]
        if mode == "unsorted" and c >= 2:
            seg = seg[::-1].copy()
        crd.append(seg)
    crd = torch.from_numpy(np.concatenate(crd) if crd else np.zeros(0, dtype=np.int64)).to(dtype)
    return pos, crd


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("mode", ["sorted", "dup", "unsorted"])
def test_segment_props_matches_the_general_test(mode, dtype):
    rng = np.random.default_rng({"sorted": 0, "dup": 1, "unsorted": 2}[mode])
    for segments in (1, 2, 7, 40, 300):
        pos, crd = _case(rng, segments, mode, dtype)
        assert segment_props(pos, crd) == lex_props([segment_owner(pos), crd])


def test_a_descent_at_a_segments_first_entry_is_not_a_disorder():
    pos = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    crd = torch.tensor([4, 7, 9, 0, 2], dtype=torch.int32)  # 9 -> 0 crosses into the third segment
    assert segment_props(pos, crd) == (True, True)
    crd2 = torch.tensor([4, 7, 7, 0, 2], dtype=torch.int32)
    assert segment_props(pos, crd2) == (True, False)


def test_scipy_matrices_are_wrapped_with_their_exact_properties():
    sp = pytest.importorskip("scipy.sparse")
    M = sp.random(200, 150, density=0.05, format="csr", random_state=0)
    M.sort_indices()
    lv = st.from_package(M).format.levels[1].type
    assert lv.ordered and lv.unique
    U = M.copy()
    for r in range(U.shape[0]):  # reverse every row's columns: unordered, still unique
        a, b = U.indptr[r], U.indptr[r + 1]
        U.indices[a:b] = U.indices[a:b][::-1].copy()
        U.data[a:b] = U.data[a:b][::-1].copy()
    U.has_sorted_indices = False
    lv = st.from_package(U).format.levels[1].type
    assert not lv.ordered and lv.unique
    np.testing.assert_allclose(st.from_package(U).to_dense().numpy(), M.toarray())
