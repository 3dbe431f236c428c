"""The compiled CSR -> BSR kernel (``sparsetorch_eigen.convert.csr_to_bsr``, offered to the core
through ``sparsetorch_conversion_kernels``) against SciPy's ``tobsr`` + ``sort_indices``.

SciPy places the entries (it adds each value to a zeroed slot, so its values are compared through
the place of each entry: the reference converts the entry numbers 1..nnz, exact in int64, and the
expected data is ``vals`` gathered at those numbers, bit for bit). Where SciPy cannot (columns
beyond what its block mask can hold), a NumPy reference from sorted block keys stands in.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import scipy.sparse as sp

import sparsetorch_eigen.plugin as plugin
from sparsetorch_eigen.convert import csr_to_bsr

BIG = 2**62

BLOCKS = [(1, 1), (2, 2), (4, 4), (3, 5), (16, 16), (2, 8), (8, 1)]


# --- helpers ------------------------------------------------------------------------------------
def random_csr(m, n, density, rng, *, index_dtype=np.int64, empty_rows=(), dense=False):
    """A CSR pattern (ptr, col) of an m x n matrix, columns sorted within rows."""
    if dense:
        mask = np.ones((m, n), dtype=bool)
    else:
        mask = rng.random((m, n)) < density
    for r in empty_rows:
        mask[r] = False
    counts = mask.sum(axis=1)
    ptr = np.zeros(m + 1, dtype=index_dtype)
    np.cumsum(counts, out=ptr[1:])
    col = np.nonzero(mask)[1].astype(index_dtype)
    return ptr, col


def random_values(nnz, dtype, rng):
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(nnz) + 1j * rng.standard_normal(nnz)).astype(dtype)
    return rng.standard_normal(nnz).astype(dtype)


def scipy_reference(bh, bw, m, n, ptr, col):
    """(bp, bj, place): SciPy's canonical BSR of the entry numbers; place[s] = entry at slot s + 1,
    0 where no entry lies."""
    nnz = col.size
    numbers = np.arange(1, nnz + 1, dtype=np.int64)
    A = sp.csr_array((numbers, col.astype(np.int64), ptr.astype(np.int64)), shape=(m, n))
    B = A.tobsr(blocksize=(bh, bw))
    B.sort_indices()
    return B.indptr.astype(np.int64), B.indices.astype(np.int64), B.data.reshape(-1).astype(np.int64)


def numpy_reference(bh, bw, m, n, ptr, col):
    """The same from sorted (block row, block column) keys (no SciPy; any n)."""
    nnz = col.size
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(ptr.astype(np.int64)))
    c = col.astype(np.int64)
    nbr = m // bh
    keys = np.stack([rows // bh, c // bw])
    uniq, inverse = np.unique(keys, axis=1, return_inverse=True)  # sorted by block row, then column
    bj = uniq[1].copy()
    bp = np.zeros(nbr + 1, dtype=np.int64)
    np.add.at(bp, uniq[0] + 1, 1)
    np.cumsum(bp, out=bp)
    place = np.zeros(bj.size * bh * bw, dtype=np.int64)
    slot = inverse.reshape(-1) * bh * bw + (rows % bh) * bw + c % bw
    place[slot] = np.arange(1, nnz + 1)
    return bp, bj, place


def expected_data(place, vals):
    out = np.zeros(place.size, dtype=vals.dtype)
    hit = place > 0
    out[hit] = vals[place[hit] - 1]
    return out


def bits(a):
    """Bytes of a as unsigned integers (bitwise comparison of any dtype)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[a.itemsize])


def check(bh, bw, m, n, ptr, col, vals, *, want_slots=True, reference=scipy_reference):
    got = csr_to_bsr(bh, bw, m, n, ptr, col, vals, BIG, want_slots)
    assert isinstance(got, tuple) and len(got) == 4
    bp, bj, data, slots = got
    rbp, rbj, place = reference(bh, bw, m, n, ptr, col)
    assert bp.dtype == np.int64 and bj.dtype == np.int64
    assert bp.shape == (m // bh + 1,)
    np.testing.assert_array_equal(bp, rbp)
    np.testing.assert_array_equal(bj, rbj)
    if vals is None:
        assert data is None
    else:
        assert data.dtype == vals.dtype and data.shape == (bj.size * bh * bw,)
        np.testing.assert_array_equal(bits(data), bits(expected_data(place, vals)))
    if not want_slots:
        assert slots is None
        return got
    nnz = col.size
    assert slots.dtype == np.int64 and slots.shape == (nnz,)
    # the slots are where the reference put each entry
    where = np.full(nnz, -1, dtype=np.int64)
    hit = np.nonzero(place)[0]
    where[place[hit] - 1] = hit
    np.testing.assert_array_equal(slots, where)
    # and, independently, consistent with each entry's row and column
    bs = bh * bw
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(ptr.astype(np.int64)))
    c = col.astype(np.int64)
    blk, inside = slots // bs, slots % bs
    assert np.unique(slots).size == nnz
    np.testing.assert_array_equal(inside // bw, rows % bh)
    np.testing.assert_array_equal(inside % bw, c % bw)
    np.testing.assert_array_equal(bj[blk], c // bw)
    assert np.all((bp[rows // bh] <= blk) & (blk < bp[rows // bh + 1]))
    if vals is not None:
        np.testing.assert_array_equal(bits(data[slots]), bits(vals))
    return got


# --- conversions against SciPy ------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
def test_random_against_scipy(block, index_dtype):
    bh, bw = block
    rng = np.random.default_rng(bh * 100 + bw)
    m, n = bh * 13, bw * 11
    # empty rows, and block row 2 empty as a whole
    empty = {0, m - 1} | set(range(2 * bh, 3 * bh))
    ptr, col = random_csr(m, n, 0.15, rng, index_dtype=index_dtype, empty_rows=sorted(empty))
    vals = random_values(col.size, np.float64, rng)
    check(bh, bw, m, n, ptr, col, vals)
    check(bh, bw, m, n, ptr, col, None)
    check(bh, bw, m, n, ptr, col, vals, want_slots=False)
    check(bh, bw, m, n, ptr, col, None, want_slots=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128, np.float16])
@pytest.mark.parametrize("block", [(2, 2), (4, 4), (3, 5)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_value_dtypes(block, dtype):
    bh, bw = block
    rng = np.random.default_rng(7)
    m, n = bh * 20, bw * 17
    ptr, col = random_csr(m, n, 0.1, rng)
    check(bh, bw, m, n, ptr, col, random_values(col.size, dtype, rng))


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
def test_dense(block):
    bh, bw = block
    rng = np.random.default_rng(3)
    m, n = bh * 3, bw * 4
    ptr, col = random_csr(m, n, 1.0, rng, dense=True)
    bp, bj, data, _ = check(bh, bw, m, n, ptr, col, random_values(col.size, np.float64, rng))
    assert bj.size == (m // bh) * (n // bw)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_large_sparse_and_wide_spans(index_dtype):
    """Block rows of many entries (the bitmap), and block rows of a few entries far apart in a wide
    matrix (their block columns are sorted), in one matrix."""
    rng = np.random.default_rng(11)
    for bh, bw in [(2, 1), (2, 2), (4, 4), (16, 16), (3, 5)]:
        m, n = bh * 40, bw * 6000
        rows = []
        for r in range(m):
            if r < m // 2:  # many entries
                k = int(rng.integers(50, 400))
                rows.append(np.sort(rng.choice(n, size=k, replace=False)))
            else:  # two entries at the two ends
                rows.append(np.array([int(rng.integers(0, bw)), n - 1 - int(rng.integers(0, bw))]))
        ptr = np.zeros(m + 1, dtype=index_dtype)
        np.cumsum([len(r) for r in rows], out=ptr[1:])
        col = np.concatenate(rows).astype(index_dtype)
        check(bh, bw, m, n, ptr, col, random_values(col.size, np.float32, rng))


@pytest.mark.parametrize("block", [(2, 3), (1, 3), (4, 1)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_hypersparse_beyond_32_bits(block):
    """n past 2**32 (the general division) and far more block columns than entries (no bitmap)."""
    bh, bw = block
    rng = np.random.default_rng(5)
    m, n = bh * 6, bw * (2**33 + 1)
    rows = [np.unique(rng.integers(0, n, size=int(rng.integers(0, 6)))) for _ in range(m)]
    rows[1] = np.array([0, 1, 2, n - 3, n - 2, n - 1])
    ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    col = np.concatenate(rows).astype(np.int64)
    check(bh, bw, m, n, ptr, col, random_values(col.size, np.complex128, rng), reference=numpy_reference)


def test_numpy_reference_agrees_with_scipy():
    rng = np.random.default_rng(0)
    ptr, col = random_csr(24, 30, 0.2, rng)
    for got, want in zip(numpy_reference(4, 3, 24, 30, ptr, col), scipy_reference(4, 3, 24, 30, ptr, col)):
        np.testing.assert_array_equal(got, want)


# --- edge shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_empty_matrix(index_dtype):
    ptr = np.zeros(9, dtype=index_dtype)
    col = np.zeros(0, dtype=index_dtype)
    vals = np.zeros(0, dtype=np.float64)
    bp, bj, data, slots = csr_to_bsr(4, 2, 8, 6, ptr, col, vals, BIG, True)
    np.testing.assert_array_equal(bp, np.zeros(3, dtype=np.int64))
    assert bj.size == 0 and data.size == 0 and data.dtype == np.float64 and slots.size == 0
    assert csr_to_bsr(4, 2, 8, 6, ptr, col, vals, 0, True)[0].size == 3  # 0 blocks <= max_blocks 0


def test_zero_rows_or_columns():
    bp, bj, data, slots = csr_to_bsr(2, 2, 0, 6, np.zeros(1, np.int64), np.zeros(0, np.int64),
                                     np.zeros(0, np.float32), BIG, True)
    assert bp.tolist() == [0] and bj.size == 0 and data.size == 0 and slots.size == 0
    bp, bj, data, slots = csr_to_bsr(3, 5, 6, 0, np.zeros(7, np.int32), np.zeros(0, np.int32), None, BIG, False)
    assert bp.tolist() == [0, 0, 0] and bj.size == 0 and data is None and slots is None


def test_single_entry():
    ptr = np.array([0, 0, 0, 0, 1, 1], dtype=np.int32)  # row 3
    col = np.array([7], dtype=np.int32)
    vals = np.array([2.5])
    bp, bj, data, slots = csr_to_bsr(5, 4, 5, 8, ptr, col, vals, BIG, True)
    assert bp.tolist() == [0, 1] and bj.tolist() == [1]
    assert slots.tolist() == [3 * 4 + 3] and data[15] == 2.5 and np.count_nonzero(data) == 1


# --- bits -------------------------------------------------------------------------------------------
def test_negative_zero_and_nan_payloads_kept():
    rng = np.random.default_rng(2)
    m, n = 8, 8
    ptr, col = random_csr(m, n, 0.5, rng)
    nnz = col.size
    for dtype, specials in [
        (np.float64, [0x8000000000000000, 0x7FF8DEADBEEF0001, 0x7FF0000000000001, 0xFFF8000000000123]),
        (np.float32, [0x80000000, 0x7FC0BEEF, 0x7F800001, 0xFFC00042]),
        (np.float16, [0x8000, 0x7E01, 0x7C01, 0xFE37]),
    ]:
        raw = bits(random_values(nnz, dtype, rng)).copy()
        raw[: len(specials)] = specials
        raw[-len(specials):] = specials
        vals = raw.view(dtype)
        bp, bj, data, slots = check(2, 2, m, n, ptr, col, vals)
        np.testing.assert_array_equal(bits(data)[slots], raw)
    # complex128: each half's bits
    raw = bits(random_values(nnz, np.complex128, rng)).copy()
    raw[:4] = [0x8000000000000000, 0x7FF8DEADBEEF0001, 0x7FF0000000000001, 0x8000000000000000]
    check(4, 4, m, n, ptr, col, raw.view(np.complex128))


def test_values_as_int16_bits():
    """bfloat16 reaches the kernel as int16 (NumPy has no bfloat16): any 2-byte dtype moves."""
    rng = np.random.default_rng(4)
    ptr, col = random_csr(12, 12, 0.3, rng)
    vals = rng.integers(-(2**15), 2**15, size=col.size).astype(np.int16)
    check(3, 4, 12, 12, ptr, col, vals)


# --- max_blocks -------------------------------------------------------------------------------------
def test_max_blocks():
    rng = np.random.default_rng(9)
    m, n = 40, 40
    ptr, col = random_csr(m, n, 0.2, rng)
    vals = random_values(col.size, np.float64, rng)
    full = csr_to_bsr(4, 4, m, n, ptr, col, vals, BIG, True)
    nblocks = full[1].size
    assert nblocks > 1
    over = csr_to_bsr(4, 4, m, n, ptr, col, vals, nblocks - 1, True)
    assert type(over) is int and over == nblocks
    assert csr_to_bsr(4, 4, m, n, ptr, col, None, 0, False) == nblocks
    exact = csr_to_bsr(4, 4, m, n, ptr, col, vals, nblocks, True)
    assert isinstance(exact, tuple)
    for a, b in zip(exact, full):
        np.testing.assert_array_equal(a, b)
    # any Python int is accepted (clamped to int64)
    assert isinstance(csr_to_bsr(4, 4, m, n, ptr, col, vals, 2**80, False), tuple)


# --- declines ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("block", [(1, 1), (2, 2), (4, 4), (3, 5)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_rows_not_strictly_increasing_decline(block, index_dtype):
    bh, bw = block
    m, n = bh * 3, bw * 4
    rng = np.random.default_rng(1)
    ptr, col = random_csr(m, n, 0.6, rng, index_dtype=index_dtype)
    vals = random_values(col.size, np.float64, rng)
    lengths = np.diff(ptr)
    r = int(np.nonzero(lengths >= 2)[0][-1])  # a row of two entries or more, the last one
    a = int(ptr[r])
    swapped = col.copy()
    swapped[a], swapped[a + 1] = col[a + 1], col[a]
    assert csr_to_bsr(bh, bw, m, n, ptr, swapped, vals, BIG, True) is None
    repeated = col.copy()
    repeated[a + 1] = col[a]
    assert csr_to_bsr(bh, bw, m, n, ptr, repeated, vals, BIG, False) is None
    assert csr_to_bsr(bh, bw, m, n, ptr, repeated, None, 0, False) is None  # before counting
    beyond = col.copy()
    beyond[int(ptr[m]) - 1] = n  # the last entry of the last non-empty row
    assert csr_to_bsr(bh, bw, m, n, ptr, beyond, vals, BIG, True) is None
    negative = col.copy()
    negative[0] = -1
    assert csr_to_bsr(bh, bw, m, n, ptr, negative, vals, BIG, True) is None


def test_unsupported_values_decline():
    ptr, col = np.array([0, 1, 2]), np.array([0, 1])
    assert csr_to_bsr(1, 1, 2, 2, ptr, col, np.array([1, 2], dtype=np.int8), BIG, False) is None
    assert csr_to_bsr(1, 1, 2, 2, ptr, col, np.array([None, "x"], dtype=object), BIG, False) is None
    assert csr_to_bsr(1, 1, 2, 2, ptr, col, np.zeros(2, dtype="V3"), BIG, False) is None
    # a misaligned array of float64
    raw = np.zeros(17, dtype=np.uint8)
    misaligned = raw[1:].view(np.float64)
    assert csr_to_bsr(1, 1, 2, 2, ptr, col, misaligned, BIG, False) is None


# --- argument errors --------------------------------------------------------------------------------
def test_wrong_arguments_raise():
    ptr = np.array([0, 1, 3, 3, 4], dtype=np.int64)
    col = np.array([0, 1, 3, 2], dtype=np.int64)
    vals = np.arange(4.0)
    assert isinstance(csr_to_bsr(2, 2, 4, 4, ptr, col, vals, BIG, True), tuple)
    cases = [
        ((2, 2, 4, 4, ptr[:-1], col, vals), "ptr has 4 entries, expected m + 1 = 5"),
        ((2, 2, 4, 4, ptr, col[:-1], vals[:-1]), "col has 3 entries, expected ptr[m] = 4"),
        ((2, 2, 4, 4, ptr, col, vals[:-1]), "vals has 3 entries, expected nnz = 4"),
        ((2, 2, 4, 4, ptr, col.astype(np.int32), vals), "differs from ptr's"),
        ((2, 2, 4, 4, ptr.astype(np.float64), col.astype(np.float64), vals), "ptr must be int32 or int64"),
        ((2, 2, 4, 4, ptr.astype(np.int16), col.astype(np.int16), vals), "ptr must be int32 or int64"),
        ((2, 2, 4, 4, ptr.astype(">i8"), col.astype(">i8"), vals), "ptr must be int32 or int64"),
        ((2, 2, 4, 4, ptr, np.repeat(col, 2)[::2], vals), "col must be contiguous"),
        ((2, 2, 4, 4, ptr, col, np.repeat(vals, 2)[::2]), "vals must be contiguous"),
        ((2, 2, 4, 4, ptr, col.reshape(2, 2), vals), "col must be 1-D"),
        ((2, 2, 4, 4, ptr, col, vals.reshape(2, 2)), "vals must be 1-D"),
        ((3, 2, 4, 4, ptr, col, vals), "not a multiple of the block size"),
        ((2, 3, 4, 4, ptr, col, vals), "not a multiple of the block size"),
        ((0, 2, 4, 4, ptr, col, vals), "block sizes must be positive"),
        ((2, 2, 4, 4, ptr + 1, col, vals), "ptr[0] is 1, expected 0"),
        ((2, 2, 4, 4, np.array([0, 3, 1, 3, 4]), col, vals), "ptr decreases at row 1"),
        ((2, 2, 4, 4, np.array([0, 9, 9, 3, 4]), col, vals), "ptr decreases at row 0: ptr.0. = 0, ptr.1. = 9 .nnz = 4"),
        ((2, 2, 4, 4, list(ptr), col, vals), "ptr must be a NumPy array"),
        ((2, 2, 4, 4, ptr, col, list(vals)), "vals must be a NumPy array or None"),
        ((2, 2, -4, 4, ptr, col, vals), "m = -4 is outside"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
            csr_to_bsr(*args, BIG, True)
    with pytest.raises(ValueError, match="max_blocks must be >= 0"):
        csr_to_bsr(2, 2, 4, 4, ptr, col, vals, -1, True)


# --- threads and the hook ---------------------------------------------------------------------------
def test_concurrent_calls_agree():
    rng = np.random.default_rng(12)
    m, n = 400, 600
    ptr, col = random_csr(m, n, 0.05, rng)
    vals = random_values(col.size, np.float64, rng)
    want = csr_to_bsr(4, 3, m, n, ptr, col, vals, BIG, True)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: csr_to_bsr(4, 3, m, n, ptr, col, vals, BIG, True), range(16)))
    for got in results:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_hook_offers_the_kernel():
    kernels = plugin.sparsetorch_conversion_kernels()
    assert kernels == {"csr_to_bsr": csr_to_bsr}
    from sparsetorch.backend import CONVERSION_KERNELS

    assert set(kernels) <= set(CONVERSION_KERNELS)


# --- through the core ---------------------------------------------------------------------------
@pytest.mark.parametrize("block", [(2, 2), (4, 4), (3, 5)])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_core_conversion_takes_the_kernel(block, index_dtype, monkeypatch):
    """``SparseTensor.convert`` to BSR with this plugin loaded: the compiled routine runs (a spy on the
    extension sees it) and the tensor's buffers equal SciPy's canonical BSR; new values on the same
    pattern (the kept value map) give the dense matrix they should."""
    import torch

    import sparsetorch as st
    import sparsetorch_eigen._lib as elib
    from sparsetorch.backend import get_backends

    if get_backends().conversion_kernel("csr_to_bsr") is None:
        pytest.skip("the eigen plugin is not loaded through its entry point")
    calls = []
    real = elib.lib

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real(), name)

    monkeypatch.setattr(elib, "lib", lambda: Spy())
    rng = np.random.default_rng(5)
    bh, bw = block
    m, n = 12 * bh, 10 * bw
    ptr, col = random_csr(m, n, 0.2, rng, empty_rows=(3,))
    vals = rng.standard_normal(col.size)
    idt = getattr(torch, index_dtype)
    A = st.SparseTensor(st.format.CSR, (m, n), [None, torch.from_numpy(ptr).to(idt)],
                        [None, torch.from_numpy(col).to(idt)], torch.from_numpy(vals))
    got = A.convert(st.format.BSR(bh, bw), max_fill=float("inf"))
    assert "csr_to_bsr" in calls
    ref = sp.csr_array((vals, col, ptr), shape=(m, n)).tobsr(blocksize=block)
    ref.sort_indices()
    assert got.index_dtype == idt
    assert np.array_equal(got.pos(1).numpy(), ref.indptr) and np.array_equal(got.crd(1).numpy(), ref.indices)
    assert np.array_equal(got.values.numpy().view(np.int64), ref.data.reshape(-1).view(np.int64))
    new = torch.arange(1.0, col.size + 1, dtype=torch.float64)
    want = sp.csr_array((new.numpy(), col, ptr), shape=(m, n)).toarray()
    assert np.array_equal(A.with_values(new).convert(st.format.BSR(bh, bw), max_fill=float("inf")).to_dense().numpy(), want)
