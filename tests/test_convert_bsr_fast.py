"""CSR -> BSR through the CPU kernel path (construct._csr_to_bsr: one sort of packed keys, no
argsort, then SciPy's csr_tobsr on the sorted keys or the NumPy fallback): exact against SciPy's
``tobsr`` + ``sort_indices`` (indptr, indices and blocks) over
shapes, block sizes, index and value dtypes, empty matrices and rows, dense blocks and
skewed block rows; every branch of the key layout (int32 halves, packed int64, argsort) and
the sort in runs; the value map (computed on first use) against the values moved in the
first pass; and a property test."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetorch import SparseTensor
from sparsetorch.format import BSR, CSR
from sparsetorch.tensor import construct

INF = float("inf")
BLOCKS = [(1, 1), (2, 2), (3, 2), (4, 4), (2, 3)]
VALUE_DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]


@pytest.fixture
def calls(monkeypatch):
    """Route every conversion through SciPy's kernel paths (any size) and record the results of
    ``_csr_to_bsr``: the tests check that the fast path, not the general one, converted."""
    monkeypatch.setattr(construct, "USE_SCIPY", True)
    monkeypatch.setattr(construct, "SCIPY_MIN_ENTRIES", 0)
    monkeypatch.setattr(construct, "_plugin_kernel", lambda name: None)  # the core's own path, not a plugin's kernel
    seen: list = []
    real = construct._csr_to_bsr

    def spy(*args, **kw):
        seen.append("raised")  # replaced by the result when it returns
        seen[-1] = got = real(*args, **kw)
        return got

    monkeypatch.setattr(construct, "_csr_to_bsr", spy)
    return seen


def random_csr(m: int, n: int, density: float, seed: int, dtype=np.float64) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    a = sp.random_array((m, n), density=density, format="csr", rng=rng, dtype=np.float64)
    a.sort_indices()
    a.data[a.data == 0] = 0.5  # no stored zeros: SciPy's reference keeps them anyway, but be plain
    if np.dtype(dtype).kind == "c":
        a = a.astype(dtype)
        a.data += 1j * rng.standard_normal(a.nnz)
    return a.astype(dtype)


def tensor(a: sp.csr_array, idt: torch.dtype = torch.int64, dtype: torch.dtype | None = None) -> SparseTensor:
    vals = torch.from_numpy(a.data.copy())
    if dtype is not None:
        vals = vals.to(dtype)
    return SparseTensor(CSR, a.shape, [None, torch.from_numpy(a.indptr.astype(np.int64)).to(idt)],
                        [None, torch.from_numpy(a.indices.astype(np.int64)).to(idt)], vals, check=True)


def scipy_bsr(a: sp.csr_array, blk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SciPy's BSR of ``a``, blocks sorted (the canonical layout ours has), as flat arrays."""
    m, n = a.shape
    if a.nnz == 0:  # SciPy's tobsr of an empty matrix: no blocks
        return np.zeros(m // blk[0] + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, a.dtype)
    b = a.tobsr(blocksize=blk)
    b.sort_indices()
    return b.indptr, b.indices, b.data.reshape(-1)


def assert_matches_scipy(out: SparseTensor, a: sp.csr_array, blk, idt: torch.dtype) -> None:
    indptr, indices, data = scipy_bsr(a, blk)
    assert out.pos(1).dtype == idt and out.crd(1).dtype == idt
    assert np.array_equal(out.pos(1).numpy(), indptr)
    assert np.array_equal(out.crd(1).numpy(), indices)
    assert out.values.dtype == torch.from_numpy(data).dtype
    assert np.array_equal(out.values.numpy(), data)  # exact: values moved, no arithmetic
    out.validate()


def bsr_oracle(ptr: np.ndarray, col: np.ndarray, data: np.ndarray, m: int, n: int, bh: int, bw: int):
    """The sorted BSR buffers by the book (Python sets and dicts), for shapes SciPy cannot hold."""
    rows = np.repeat(np.arange(m), np.diff(ptr))
    blocks = sorted({(int(r) // bh, int(c) // bw) for r, c in zip(rows, col)})
    rank = {b: k for k, b in enumerate(blocks)}
    bp = np.zeros(m // bh + 1, dtype=np.int64)
    for br, _ in blocks:
        bp[br + 1] += 1
    vals = np.zeros(len(blocks) * bh * bw, dtype=data.dtype)
    for r, c, v in zip(rows, col, data):
        vals[rank[(int(r) // bh, int(c) // bw)] * bh * bw + (int(r) % bh) * bw + int(c) % bw] = v
    return np.cumsum(bp), np.array([c for _, c in blocks], dtype=np.int64), vals


# Against SciPy --------------------------------------------------------------------------------


@pytest.mark.parametrize("blk", BLOCKS)
@pytest.mark.parametrize("shape", [(36, 36), (24, 60), (60, 12), (6, 6)])
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_random_matches_scipy(calls, blk, shape, idt):
    shape = (shape[0] // blk[0] * blk[0], shape[1] // blk[1] * blk[1])
    for seed, density in ((1, 0.05), (2, 0.3), (3, 0.9)):
        a = random_csr(*shape, density, seed)
        out = tensor(a, idt).convert(BSR(*blk), max_fill=INF)
        assert_matches_scipy(out, a, blk, idt)
    assert calls and all(c is not None for c in calls)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("blk", [(2, 2), (3, 2)])
def test_value_dtypes(calls, dtype, blk):
    npd = torch.empty(0, dtype=dtype).numpy().dtype
    a = random_csr(48, 30, 0.2, 7, npd)
    out = tensor(a).convert(BSR(*blk), max_fill=INF)
    assert_matches_scipy(out, a, blk, torch.int64)
    assert calls[-1] is not None


@pytest.mark.parametrize("blk", BLOCKS)
def test_empty_matrix_and_empty_rows(calls, blk):
    bh, bw = blk
    for shape in ((0, 0), (0, 4 * bw), (4 * bh, 0), (4 * bh, 4 * bw)):
        a = sp.csr_array(shape, dtype=np.float64)
        out = tensor(a).convert(BSR(*blk), max_fill=INF)
        assert out.nse == 0 and out.crd(1).numel() == 0
        assert out.pos(1).tolist() == [0] * (shape[0] // bh + 1)
        out.validate()
    # every other block row empty, and the first and last rows empty
    a = random_csr(12 * bh, 10 * bw, 0.4, 5).tolil()
    for r in range(a.shape[0]):
        if (r // bh) % 2 or r in (0, a.shape[0] - 1):
            a[r, :] = 0
    a = sp.csr_array(a)
    a.eliminate_zeros()
    out = tensor(a).convert(BSR(*blk), max_fill=INF)
    assert_matches_scipy(out, a, blk, torch.int64)
    assert all(c is not None for c in calls)


@pytest.mark.parametrize("blk", BLOCKS)
def test_single_dense_block_and_dense_matrix(calls, blk):
    bh, bw = blk
    d = np.zeros((3 * bh, 4 * bw))
    d[bh:2 * bh, 2 * bw:3 * bw] = np.arange(1, bh * bw + 1).reshape(bh, bw)
    a = sp.csr_array(d)
    out = tensor(a).convert(BSR(*blk))
    assert out.pos(1).tolist() == [0, 0, 1, 1] and out.crd(1).tolist() == [2]
    assert out.values.tolist() == list(range(1, bh * bw + 1))
    assert_matches_scipy(out, a, blk, torch.int64)
    full = sp.csr_array(np.arange(1.0, 1 + 6 * bh * 5 * bw).reshape(6 * bh, 5 * bw))
    assert_matches_scipy(tensor(full).convert(BSR(*blk)), full, blk, torch.int64)
    assert all(c is not None for c in calls)


def test_skewed_block_rows_and_sort_runs(calls, monkeypatch):
    """One block row far longer than a sort run, many short ones around it, runs of 8 keys."""
    monkeypatch.setattr(construct, "BSR_SORT_RUN", 8)
    d = np.zeros((40, 600))
    rng = np.random.default_rng(3)
    d[rng.random(d.shape) < 0.02] = 1.0
    d[10:12, :] = rng.standard_normal((2, 600))  # block row 5 of BSR(2, *): 1200 entries
    d[d == 0] = 0
    a = sp.csr_array(d)
    a.eliminate_zeros()
    for blk in [(2, 2), (2, 3), (4, 4), (1, 1)]:
        assert_matches_scipy(tensor(a).convert(BSR(*blk), max_fill=INF), a, blk, torch.int64)
    assert all(c is not None for c in calls)


def test_large_conversion_sorts_in_runs(calls):
    """Enough entries for several runs of the default size, both index dtypes."""
    a = random_csr(600, 800, 0.03, 11)
    assert a.nnz > 4 * construct.BSR_SORT_RUN
    for blk in [(2, 2), (4, 4), (3, 2)]:
        for idt in (torch.int32, torch.int64):
            assert_matches_scipy(tensor(a, idt).convert(BSR(*blk), max_fill=INF), a, blk, idt)
    assert all(c is not None for c in calls)


# The key layouts ------------------------------------------------------------------------------


def huge_csr(m: int, n: int, nnz: int, seed: int):
    """An ``m x n`` CSR with ``nnz`` random entries in columns below 2**40 (buffers only)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, m, nnz))
    ptr = np.zeros(m + 1, dtype=np.int64)
    np.add.at(ptr, rows + 1, 1)
    ptr = np.cumsum(ptr)
    hi = min(n, 2**40)
    col = np.concatenate([np.sort(rng.choice(hi, ptr[i + 1] - ptr[i], replace=False)) for i in range(m)])
    return ptr, col.astype(np.int64), rng.standard_normal(nnz)


@pytest.mark.parametrize("shape,blk", [
    ((2**17, 2**17), (2, 2)),  # keys of 34 bits: packed int64 with the positions
    ((64, 2**50), (2, 2)),  # keys of 56 bits: no room for the positions, an argsort
    ((30, 2**45), (3, 4)),
    ((4, 100000), (2, 2)),  # int32 keys, few entries in many columns: no table over the columns
])
def test_wide_keys(calls, shape, blk):
    m, n = shape
    ptr, col, vals = huge_csr(m, n, 600, 2)
    t = SparseTensor(CSR, shape, [None, torch.from_numpy(ptr)], [None, torch.from_numpy(col)],
                     torch.from_numpy(vals), check=True)
    out = t.convert(BSR(*blk), max_fill=INF)
    assert calls[-1] is not None
    bp, bj, bv = bsr_oracle(ptr, col, vals, m, n, *blk)
    assert np.array_equal(out.pos(1).numpy(), bp)
    assert np.array_equal(out.crd(1).numpy(), bj)
    assert np.array_equal(out.values.numpy(), bv)
    out.validate()
    new = torch.randn(t.nse, dtype=torch.float64)
    again = t.with_values(new).convert(BSR(*blk), max_fill=INF)  # the cached value map
    assert np.array_equal(again.values.numpy(), bsr_oracle(ptr, col, new.numpy(), m, n, *blk)[2])


def test_keys_beyond_int64_take_the_general_path(calls):
    ptr, col, vals = huge_csr(4, 2**62, 20, 1)
    t = SparseTensor(CSR, (4, 2**62), [None, torch.from_numpy(ptr)], [None, torch.from_numpy(col)],
                     torch.from_numpy(vals), check=True)
    out = t.convert(BSR(2, 1), max_fill=INF)
    assert calls[-1] is None  # declined: the general path converted
    bp, bj, bv = bsr_oracle(ptr, col, vals, 4, 2**62, 2, 1)
    assert np.array_equal(out.pos(1).numpy(), bp) and np.array_equal(out.crd(1).numpy(), bj)
    assert np.array_equal(out.values.numpy(), bv)


@pytest.mark.parametrize("blk", [(1, 1), (1, 3), (2, 2)])
def test_rows_out_of_order_are_sorted_too(blk):
    """Called directly with columns unsorted within rows (not a valid CSR, but the key sort
    does not rely on their order; one row per block row checks instead of assuming)."""
    a = random_csr(12, 18, 0.4, 9)
    ptr, col, data = a.indptr.astype(np.int64), a.indices.astype(np.int64).copy(), a.data.copy()
    for r in range(12):
        s = slice(ptr[r], ptr[r + 1])
        col[s], data[s] = col[s][::-1].copy(), data[s][::-1].copy()
    pos, crd, src, dst, nslots, first = construct._csr_to_bsr(None, blk, 12, 18, ptr, col, data, torch.int64, None)
    indptr, indices, ref = scipy_bsr(a, blk)
    assert np.array_equal(pos[1].numpy(), indptr) and np.array_equal(crd[1].numpy(), indices)
    assert np.array_equal(first.numpy(), ref) and nslots == ref.size
    moved = np.zeros(nslots)
    moved[dst().numpy()] = data
    assert np.array_equal(moved, ref)


# The value map ----------------------------------------------------------------------------------


@pytest.mark.parametrize("blk", [(2, 2), (3, 2), (1, 1)])
def test_value_map_agrees_with_first_pass(calls, blk):
    a = random_csr(30, 24, 0.3, 4)
    t = tensor(a)
    conv = construct.conversion(t, BSR(*blk), torch.int64, max_fill=INF, values_too=True)
    first = conv.values(t.values)  # the values moved in the first pass
    assert callable(conv._dst)  # the map is computed on first use, not before
    assert np.array_equal(first.numpy(), scipy_bsr(a, blk)[2])
    again = conv.values(t.values)  # through the map now
    assert torch.equal(again, first)
    dst = conv.dst.numpy()
    assert np.array_equal(np.sort(dst), np.unique(dst))  # distinct slots
    new = torch.randn(t.nse, dtype=torch.float64)
    assert torch.equal(t.with_values(new).convert(BSR(*blk), max_fill=INF).to_dense(), t.with_values(new).to_dense())


def test_values_that_cannot_move_use_the_map(calls):
    """Batched values and values that require grad go through the value map (computed at once)."""
    a = random_csr(20, 20, 0.3, 6)
    t = tensor(a)
    batch = torch.stack([t.values, 2 * t.values])
    tb = SparseTensor(CSR, t.shape, t.pos_buffers, t.crd_buffers, batch, check=True)
    out = tb.convert(BSR(2, 2), max_fill=INF)
    ref = scipy_bsr(a, (2, 2))[2]
    assert np.array_equal(out.values.numpy(), np.stack([ref, 2 * ref]))
    v = t.values.clone().requires_grad_(True)
    og = t.with_values(v).convert(BSR(2, 2), max_fill=INF)
    assert np.array_equal(og.values.detach().numpy(), ref)
    w = torch.randn(og.nse, dtype=torch.float64)
    (og.values * w).sum().backward()
    # each source value went to one slot: its gradient is that slot's weight
    dense_w = og.with_values(w).to_dense()
    rows = torch.from_numpy(np.repeat(np.arange(20), np.diff(a.indptr)))
    assert torch.equal(v.grad, dense_w[rows, torch.from_numpy(a.indices.astype(np.int64))])
    assert all(c is not None for c in calls)


def test_fill_guard_refuses_before_the_values_move(calls):
    from sparsetorch import ConversionError

    a = random_csr(2000, 2000, 0.0005, 3)  # ~2000 blocks of 64 slots: over 8 x 2000 + 65536
    with pytest.raises(ConversionError):
        tensor(a).convert(BSR(8, 8))
    assert calls == ["raised"]  # the fast path's guard refused
    out = tensor(a).convert(BSR(8, 8), max_fill=INF)
    assert_matches_scipy(out, a, (8, 8), torch.int64)


# Property ---------------------------------------------------------------------------------------


@settings(max_examples=60)
@given(mb=st.integers(0, 9), nb=st.integers(0, 9), bh=st.integers(1, 4), bw=st.integers(1, 4),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), seed=st.integers(0, 2**16),
       idt=st.sampled_from([torch.int32, torch.int64]), dtype=st.sampled_from([np.float64, np.complex64]),
       run=st.sampled_from([4, 2048]))
def test_property_matches_scipy(mb, nb, bh, bw, density, seed, idt, dtype, run):
    a = random_csr(mb * bh, nb * bw, density, seed, dtype)
    old = construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES, construct.BSR_SORT_RUN
    construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES, construct.BSR_SORT_RUN = True, 0, run
    try:
        t = tensor(a, idt)
        out = t.convert(BSR(bh, bw), max_fill=INF)
        new = torch.from_numpy(np.arange(1, a.nnz + 1).astype(dtype))
        again = t.with_values(new).convert(BSR(bh, bw), max_fill=INF)  # through the value map
    finally:
        construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES, construct.BSR_SORT_RUN = old
    assert_matches_scipy(out, a, (bh, bw), idt)
    b = a.copy()
    b.data = new.numpy()
    assert np.array_equal(again.values.numpy(), scipy_bsr(b, (bh, bw))[2])


# SciPy's csr_tobsr on the sorted keys vs the NumPy fallback -------------------------------------


@pytest.mark.parametrize("blk", [(1, 1), (2, 2), (3, 2), (2, 3), (4, 4)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex64, np.complex128])
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_kernel_and_numpy_agree_bit_for_bit(blk, dtype, idt):
    """The values go through SciPy's kernel as integer bits (it adds each to a zeroed slot, and
    0.0 + -0.0 would be +0.0): signed zeros and NaN payloads arrive as they were, and the
    kernel's buffers equal the NumPy fallback's (``tools=None``), value map included."""
    from scipy.sparse import _sparsetools as tools

    bh, bw = blk
    a = random_csr(12 * bh, 10 * bw, 0.2, 5, dtype)
    ptr, col = a.indptr.astype(np.int64), a.indices.astype(np.int64)
    data = a.data.copy()
    data[::5] = -0.0
    data[1::7] = np.nan
    keep = (ptr.copy(), col.copy(), data.copy())
    nit = np.int32 if idt == torch.int32 else np.int64
    got = [construct._csr_to_bsr(k, blk, 12 * bh, 10 * bw, ptr.astype(nit), col.astype(nit), data, idt, None)
           for k in (tools, None)]
    for pos, crd, src, *_ in got:
        assert pos[1].dtype == idt and crd[1].dtype == idt and src is None
    (p0, c0, _, d0, n0, f0), (p1, c1, _, d1, n1, f1) = got
    assert n0 == n1 and torch.equal(p0[1], p1[1]) and torch.equal(c0[1], c1[1])
    assert f0.numpy().tobytes() == f1.numpy().tobytes()  # bit for bit: -0.0 and NaN kept
    assert torch.equal(d0(), d1())
    moved = np.zeros(n0, dtype=data.dtype)
    moved[d0().numpy()] = data
    assert moved.tobytes() == f0.numpy().tobytes()
    indptr, indices, _ = scipy_bsr(a, blk)
    assert np.array_equal(p0[1].numpy(), indptr) and np.array_equal(c0[1].numpy(), indices)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(keep, (ptr, col, data)))  # inputs untouched
