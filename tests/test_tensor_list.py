"""SparseTensorList: batches of matrices with different patterns."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import COO, CSC, CSR


def _rand(m, n, seed, density=0.4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g, dtype=torch.float64) * (torch.rand(m, n, generator=g) < density)


def test_members_keep_their_own_patterns_and_sizes():
    dense = [_rand(3, 3, 0), _rand(5, 4, 1), _rand(2, 6, 2)]
    lst = st.SparseTensorList.from_dense(dense, CSR)
    assert len(lst) == 3 and lst.shapes == [torch.Size(d.shape) for d in dense]
    for got, ref in zip(lst.to_dense(), dense):
        assert torch.equal(got, ref)
    assert not lst.is_uniform
    csc = lst.convert(CSC)
    assert all(t.format == CSC for t in csc)
    assert all(torch.equal(a, b) for a, b in zip(csc.to_dense(), dense))
    assert isinstance(lst[1:], st.SparseTensorList) and len(lst[1:]) == 2


def test_from_batched_splits_a_shared_pattern_batch():
    base = _rand(4, 4, 3) != 0
    vals = torch.randn(3, 4, 4, dtype=torch.float64) * base
    t = st.SparseTensor.from_dense(vals, CSR, mask=base)
    lst = st.SparseTensorList.from_batched(t)
    assert len(lst) == 3 and lst.is_uniform
    for k, member in enumerate(lst):
        assert torch.equal(member.to_dense(), vals[k])
        assert member.pattern_key == t.pattern_key


def test_with_values_and_dtype_moves():
    lst = st.SparseTensorList.from_dense([_rand(3, 3, 4), _rand(4, 4, 5)], COO)
    new = lst.with_values([t.values * 2 for t in lst])
    assert all(torch.equal(a.to_dense(), 2 * b.to_dense()) for a, b in zip(new, lst))
    f32 = lst.to(torch.float32)
    assert f32.dtype == torch.float32


def test_mixed_members_are_refused_with_the_reason():
    a = st.SparseTensor.from_dense(_rand(3, 3, 6))
    b = st.SparseTensor.from_dense(_rand(3, 3, 7).float())
    with pytest.raises(st.ValidationError, match="dtype"):
        st.SparseTensorList([a, b])
    with pytest.raises(st.ValidationError, match="not a SparseTensor"):
        st.SparseTensorList([a, torch.eye(3)])
    with pytest.raises(st.ValidationError, match="no value batch"):
        st.SparseTensorList.from_batched(a)
    with pytest.raises(st.ValidationError, match="2 value tensors for 1"):
        st.SparseTensorList([a]).with_values([a.values, a.values])


def test_list_solve_errors_name_the_member():
    # with a plugin that takes whole lists installed (cudss), the list path checked the members before its loop
    # and said "the right-hand side has shape (17,)" with no word of which system (session 24's sweep)
    def mk(n, s=4.0):
        return st.SparseTensor.from_dense(s * torch.eye(n, dtype=torch.float64)
                                          + torch.diag(torch.ones(n - 1, dtype=torch.float64), 1))

    ones = [torch.ones(n, dtype=torch.float64) for n in (5, 17, 40)]
    with pytest.raises(st.InputError, match=r"member 0 .*shape \(17,\)"):
        st.solve(st.SparseTensorList([mk(5), mk(17), mk(40)]), [ones[1], ones[1], ones[2]])
    with pytest.raises(st.InputError, match=r"member 2 .*NaN"):
        st.solve(st.SparseTensorList([mk(5), mk(17), mk(40, float("nan"))]), ones)
