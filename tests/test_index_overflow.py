"""Shapes whose element count does not fit a packed int64 key (``m * n >= 2**63``: a 2**32 x 2**32
hypersparse graph, a 4 x 2**62 matrix): conversion to CSR / COO, ``get_value`` and ``validate`` must
order and find entries by their coordinate tuples, not by ``i * n + j`` (which wraps). Every expectation
is computed independently, from Python ints and sorted tuples; ordinary shapes are checked alike.
"""

from __future__ import annotations

import io

import pytest
import torch

from sparsetorch import InputError, SparseTensor, ValidationError
from sparsetorch.format import COO, CSC, CSR, DCSC, DCSR, TensorFormat

pytestmark = pytest.mark.usefixtures("single_thread")

I = torch.tensor  # noqa: E741 - index tensors, as in the reproducers
CSR_UNORDERED = TensorFormat.parse("(i, j) -> (i : dense, j : compressed(unordered))")


def _entries(t: SparseTensor) -> list[tuple[int, int, float]]:
    """(i, j, value) of every stored entry, duplicates summed, sorted (Python ints)."""
    coords, vals = t.coordinates()
    acc: dict[tuple[int, int], float] = {}
    for i, j, v in zip(coords[0].tolist(), coords[1].tolist(), vals.tolist()):
        acc[(i, j)] = acc.get((i, j), 0.0) + v
    return sorted((i, j, v) for (i, j), v in acc.items())


def _reference(rows, cols, vals) -> list[tuple[int, int, float]]:
    acc: dict[tuple[int, int], float] = {}
    for i, j, v in zip(rows, cols, vals):
        acc[(i, j)] = acc.get((i, j), 0.0) + v
    return sorted((i, j, v) for (i, j), v in acc.items())


def _csr_reference(nrows, rows, cols, vals):
    """CSR buffers from Python ints: (row pointers, columns in row order, values in that order)."""
    ref = _reference(rows, cols, vals)
    ptr = [0] * (nrows + 1)
    for i, _, _ in ref:
        ptr[i + 1] += 1
    for k in range(nrows):
        ptr[k + 1] += ptr[k]
    return ptr, [j for _, j, _ in ref], [v for _, _, v in ref]


def _strictly_increasing(pairs) -> bool:
    return all(a < b for a, b in zip(pairs, pairs[1:]))


# Shapes: (m, n) with m * n >= 2**63 (wide), and ordinary ones with the same entries where they fit.
WIDE = [(4, 2**62), (2**32, 2**32), (2**40, 2**40)]
SMALL = [(4, 16), (9, 11)]


def _triplets(shape):
    m, n = shape
    rows = [3, 0, m - 1, 1, 0]
    cols = [7 % n, 5 % n, 0, n - 1, n - 2]
    return rows, cols, [30.0, 5.0, 2.0, -1.5, 4.0]


@pytest.mark.parametrize(("shape", "fmt"), [(s, COO) for s in WIDE + SMALL] + [(s, CSR) for s in [(4, 2**62), *SMALL]],
                         ids=lambda x: getattr(x, "name", None))
def test_convert_unordered_triplets(shape, fmt):
    """bug_csr_wide_overflow: unordered triplets -> CSR / COO put every value at its own coordinate,
    in the target's order (CSR: the columns of each row increasing; COO: (i, j) strictly increasing)."""
    rows, cols, vals = _triplets(shape)
    T = SparseTensor.from_coo(torch.tensor(vals, dtype=torch.float64), I(rows), I(cols), shape=shape)
    A = T.convert(fmt)
    A.validate()
    assert _entries(A) == _reference(rows, cols, vals)
    if fmt is CSR:
        ptr, col, v = _csr_reference(shape[0], rows, cols, vals)
        assert A.pos_buffers[1].tolist() == ptr
        assert A.crd_buffers[1].tolist() == col
        assert A.values.tolist() == v
    else:
        stored = list(zip(A.crd(0).tolist(), A.crd(1).tolist()))
        assert _strictly_increasing(stored)
        assert stored == [(i, j) for i, j, _ in _reference(rows, cols, vals)]
    for i, j, v in _reference(rows, cols, vals):
        got = A.get_value((i, j))
        assert got is not None and float(got) == v


@pytest.mark.parametrize("N", [2**32, 64])
def test_dcsr_to_coo_order(N):
    """bug_coo_order_overflow: a hypersparse N x N DCSR -> COO holds its entries in (i, j) order, and
    the conversions onward from that COO (which trust the order) keep every entry."""
    rows = [0, 1, N // 2, N // 2 + 5, N - 1]
    cols = [7, 3, 1, 9, 0]
    vals = [1.0, 2.0, 3.0, 4.0, 5.0]
    A = SparseTensor.from_coo(torch.tensor(vals, dtype=torch.float64), I(rows), I(cols), shape=(N, N), format=DCSR)
    C = A.convert(COO)
    stored = list(zip(C.crd(0).tolist(), C.crd(1).tolist()))
    assert stored == sorted(zip(rows, cols))
    C.validate()
    ref = _reference(rows, cols, vals)
    assert _entries(C) == ref
    for f in (DCSC, DCSR):
        assert _entries(C.convert(f)) == ref


@pytest.mark.parametrize("B", [2**40, 100])
def test_from_coo_and_convert_coo_order(B):
    """bug_fromcoo_overflow: from_coo(format=COO) and convert(COO) of unsorted triplets are sorted."""
    vals = torch.tensor([1.0, 2.0], dtype=torch.float64)
    rows, cols = [B - 1, 0], [0, 0]
    A = SparseTensor.from_coo(vals, I(rows), I(cols), shape=(B, B), format=COO)
    assert A.crd(0).tolist() == [0, B - 1] and A.values.tolist() == [2.0, 1.0]
    T = SparseTensor.from_coo(vals, I(rows), I(cols), shape=(B, B))
    C = T.convert(COO)
    assert C.crd(0).tolist() == [0, B - 1] and C.crd(1).tolist() == [0, 0]
    assert C.values.tolist() == [2.0, 1.0]
    C.validate()


@pytest.mark.parametrize("shape", [(2**40, 2**40), (4, 2**62), (2**33, 2**33)])
def test_convert_wide_duplicates_summed(shape):
    """Duplicate triplets of a wide shape (the general path) are summed at their own coordinate."""
    m, n = shape
    rows, cols = [m - 1, 0, m - 1, 0, 1], [0, n - 1, 0, 0, 0]
    vals = [1.0, 2.0, 10.0, 100.0, 1000.0]
    T = SparseTensor.from_coo(torch.tensor(vals, dtype=torch.float64), I(rows), I(cols), shape=shape)
    for f in (COO, DCSR, DCSC):
        A = T.convert(f)
        A.validate()
        assert _entries(A) == _reference(rows, cols, vals)
    assert float(T.get_value((m - 1, 0))) == 11.0


@pytest.mark.parametrize("B", [2**40, 2**32, 2**31, 2**25])
def test_get_value(B):
    """bug_get_value_overflow: entries whose packed keys collide mod 2**64 are told apart; absent
    coordinates give None."""
    rows, cols = [0, 2**24, B - 1, 5], [0, 0, B - 1, 7]
    vals = [1.0, 2.0, 3.0, 4.0]
    A = SparseTensor.from_coo(torch.tensor(vals, dtype=torch.float64), I(rows), I(cols), shape=(B, B), format=COO)
    for i, j, v in zip(rows, cols, vals):
        got = A.get_value((i, j))
        assert got is not None and float(got) == v, (i, j)
    for i, j in [(1, 0), (0, 1), (B - 1, B - 2), (2**24, 1), (5, 8), (B - 2, B - 1)]:
        assert A.get_value((i, j)) is None, (i, j)


def test_get_value_wide_3d_and_unordered_duplicates():
    """Three wide dimensions (2**96 elements) and an unordered COO with a repeated coordinate."""
    B = 2**32
    coords = I([[B - 1, 0, B - 1, 0], [0, B - 1, 0, 0], [7, 7, 7, 7]])
    vals = torch.tensor([1.0, 2.0, 10.0, 100.0], dtype=torch.float64)
    T = SparseTensor.from_coo(vals, coords, shape=(B, B, B))  # kept as given: (B-1, 0, 7) twice
    assert float(T.get_value((B - 1, 0, 7))) == 11.0
    assert float(T.get_value((0, B - 1, 7))) == 2.0
    assert float(T.get_value((0, 0, 7))) == 100.0
    assert T.get_value((0, 0, 6)) is None and T.get_value((B - 1, B - 1, 7)) is None


@pytest.mark.parametrize("shape", [(2**40, 2**40), (4, 5)])
def test_get_value_out_of_range_is_input_error(shape):
    """A coordinate outside the shape: InputError naming the coordinate and the shape (no bare
    ValueError from an int64 that does not fit)."""
    A = SparseTensor.from_coo(torch.tensor([1.0], dtype=torch.float64), I([0]), I([0]), shape=shape, format=COO)
    for bad in [(shape[0], 0), (0, shape[1]), (-1, 0), (2**70, 0)]:
        with pytest.raises(InputError, match=rf"index {bad[0] if bad[0] != 0 else bad[1]} .*outside.*shape"):
            A.get_value(bad)


def test_validate_wide_valid_tensor_and_pickle():
    """bug_validate_overflow (1): a valid sorted COO of a 2**40 x 2**40 shape validates, and
    survives torch.save / torch.load."""
    B = 2**40
    v = torch.tensor([1.0, 2.0], dtype=torch.float64)
    A = SparseTensor.from_coo(v, I([5, B - 2]), I([5, B - 1]), shape=(B, B), format=COO)
    assert A.crd(0).tolist() == [5, B - 2]
    A.validate()
    SparseTensor(COO, (B, B), [I([0, 2]), None], [I([5, B - 2]), I([5, B - 1])], v)  # check=True
    buf = io.BytesIO()
    torch.save(A, buf)
    buf.seek(0)
    L = torch.load(buf, weights_only=False)
    assert _entries(L) == [(5, 5, 1.0), (B - 2, B - 1, 2.0)]


@pytest.mark.parametrize("B", [2**40, 2**32, 50])
def test_validate_rejects_unsorted_and_duplicate_coo(B):
    """bug_validate_overflow (2): an unsorted / repeating COO declared ordered and unique is rejected."""
    v = torch.tensor([1.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValidationError, match=r"strictly increasing.*\(%d, 0\) then \(0, 0\)" % (B - 1)):
        SparseTensor(COO, (B, B), [I([0, 2]), None], [I([B - 1, 0]), I([0, 0])], v)
    with pytest.raises(ValidationError, match=r"strictly increasing.*\(3, %d\) then \(3, %d\)" % (B - 1, B - 1)):
        SparseTensor(COO, (B, B), [I([0, 2]), None], [I([3, 3]), I([B - 1, B - 1])], v)
    with pytest.raises(ValidationError, match=r"strictly increasing"):  # same row, columns decreasing
        SparseTensor(COO, (B, B), [I([0, 2]), None], [I([3, 3]), I([B - 1, 0])], v)
    SparseTensor(COO, (B, B), [I([0, 2]), None], [I([3, 3]), I([0, B - 1])], v)  # valid: accepted


@pytest.mark.parametrize("shape", [(4, 2**61), (4, 2**62), (4, 16)])
def test_validate_unordered_unique_duplicates(shape):
    """An unordered unique level of a wide shape (segment * radix past 2**62): duplicates are found,
    distinct columns in any order are accepted."""
    m, n = shape
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    ptr = I([0, 0, 0, 0, 3])
    with pytest.raises(ValidationError, match=r"repeat the coordinate \(%d,\)" % (n - 1)):
        SparseTensor(CSR_UNORDERED, shape, [None, ptr], [None, I([n - 1, 0, n - 1])], v)
    ok = SparseTensor(CSR_UNORDERED, shape, [None, ptr], [None, I([n - 1, 0, n - 2])], v)
    assert _entries(ok) == [(3, 0, 2.0), (3, n - 2, 3.0), (3, n - 1, 1.0)]
    C = ok.convert(CSR)
    assert C.crd_buffers[1].tolist() == [0, n - 2, n - 1] and C.values.tolist() == [2.0, 3.0, 1.0]


@pytest.mark.parametrize("seed", range(4))
def test_ordinary_shapes_unchanged(seed):
    """Ordinary shapes (the packed fast paths): conversions and lookups equal the Python reference."""
    g = torch.Generator().manual_seed(seed)
    m, n, nnz = 13, 17, 60
    rows = torch.randint(0, m, (nnz,), generator=g)
    cols = torch.randint(0, n, (nnz,), generator=g)
    vals = torch.randn(nnz, generator=g, dtype=torch.float64)
    ref = _reference(rows.tolist(), cols.tolist(), vals.tolist())
    T = SparseTensor.from_coo(vals, rows, cols, shape=(m, n))
    for f in (CSR, CSC, COO, DCSR, DCSC):
        A = T.convert(f)
        A.validate()
        got = _entries(A)
        assert [(i, j) for i, j, _ in got] == [(i, j) for i, j, _ in ref]
        assert torch.allclose(torch.tensor([x for _, _, x in got]), torch.tensor([x for _, _, x in ref]))
        if f is COO:
            assert _strictly_increasing(list(zip(A.crd(0).tolist(), A.crd(1).tolist())))
    C = T.convert(COO)
    dense = T.to_dense()
    for i in range(m):
        for j in range(n):
            got = C.get_value((i, j))
            if got is None:
                assert dense[i, j] == 0
            else:
                assert torch.allclose(got, dense[i, j])


@pytest.mark.parametrize("shape", [(2**62, 4), (4, 2**62), (2**32, 3)])
def test_hypersparse_csc_csr_coo_round_trip(shape):
    """CSC <-> COO and CSR <-> COO where the sparse dimension is far longer than the entries: no pointer
    array over it (2**62 row pointers cannot be allocated), every entry at its place, COO in (i, j) order."""
    m, n = shape
    rows, cols, vals = [m - 1, 0, m // 2, 0, 1], [0, n - 1, n // 2, 0, n - 1], [1.0, 2.0, 3.0, 4.0, 5.0]
    ref = _reference(rows, cols, vals)
    T = SparseTensor.from_coo(torch.tensor(vals, dtype=torch.float64), I(rows), I(cols), shape=shape)
    dense_fmt = CSC if n < m else CSR
    A = T.convert(dense_fmt)
    C = A.convert(COO)
    C.validate()
    assert list(zip(C.crd(0).tolist(), C.crd(1).tolist())) == [(i, j) for i, j, _ in ref]
    assert C.values.tolist() == [v for _, _, v in ref]
    back = C.convert(dense_fmt)
    back.validate()
    assert _entries(back) == ref
