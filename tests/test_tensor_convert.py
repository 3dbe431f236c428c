"""Conversion between formats, checked against independent references (NumPy, SciPy, dense torch).

* every pair of formats (named + custom DSL formats): A -> fmt1 -> fmt2 is the same matrix, the
  buffers are valid, explicit zeros are kept (or dropped with drop_zeros=True), the inputs are
  not modified;
* exact storage of the named formats against hand-written / NumPy / SciPy references
  (DELTA gaps and bridges, DIA diagonals, N:M strips, BSR blocks, ELL rows, CSR/CSC/COO);
* N:M constraint errors, 3-D and batched tensors, shared-pattern value batches, transposes
  as views, convert's self/copy contract, dtype / index dtype conversion, gradients;
* the same round trips on CUDA when a GPU is present.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetorch import ConversionError, FormatError, SparseTensor, ValidationError
from sparsetorch.format import (
    BSC, BSR, COO, COO_ND, CSC, CSR, DCSC, DCSR, DELTA, DENSE, DENSE_COL, DENSE_ND, DIA, DIA_J, ELL, NM,
    TensorFormat, batched, named_formats,
)

parse = TensorFormat.parse
pytestmark = pytest.mark.usefixtures("single_thread")

# --------------------------------------------------------------------------------------------
# Formats under test
# --------------------------------------------------------------------------------------------

FORMATS: dict[str, TensorFormat] = dict(named_formats())
FORMATS.update({
    "BSR(1,1)": BSR(1, 1),
    "BSC(2,2)": BSC(2, 2),
    "DELTA(1)": DELTA(1),
    "rowblock2": parse("(i, j) -> (i // 2 : dense, j : compressed, i % 2 : dense)"),
    "colblock3": parse("(i, j) -> (j // 3 : compressed, i : dense, j % 3 : dense)"),
    "COO_col": parse("(i, j) -> (j : compressed(nonunique), i : singleton)"),
    "DCSC_nonunique": parse("(i, j) -> (j : compressed, i : compressed(nonunique))"),
    "antidiag": parse("(i, j) -> (i + j : compressed, j : range)"),
    "loose_DCSR": parse("(i, j) -> (i : compressed, j : loose_compressed)"),
    "CSR_unordered": parse("(i, j) -> (i : dense, j : compressed(unordered))"),
})
NAMES = list(FORMATS)
#: Formats that store exactly the entries they are given: no slot inside the shape is padding.
EXACT = {"COO", "CSR", "CSC", "DCSR", "DCSC", "ELL", "BSR(1,1)", "COO_col", "DCSC_nonunique", "loose_DCSR",
         "CSR_unordered"}
#: Formats that also store zeros they were not given (dense slots, diagonals, blocks, bridges, strips).
PADDED = set(NAMES) - EXACT
assert PADDED == {"DIA", "DIA_J", "DENSE", "DENSE_COL", "BSR(2,3)", "BSC(3,2)", "BSC(2,2)", "DELTA(1)", "DELTA(2)",
                  "DELTA(4)", "NM(2,4)", "rowblock2", "colblock3", "antidiag"}

PROFILE_EXAMPLES = settings().max_examples
PAIR_EXAMPLES = max(3, PROFILE_EXAMPLES // 4)

# --------------------------------------------------------------------------------------------
# Random COO cases and references
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    m: int
    n: int
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray  # complex128 or float64 numbers, exactly representable in `dtype`
    dtype: torch.dtype
    idt: torch.dtype

    def dense(self) -> torch.Tensor:
        ref = np.zeros((self.m, self.n), dtype=np.complex128 if self.dtype.is_complex else np.float64)
        np.add.at(ref, (self.rows, self.cols), self.vals)
        return torch.from_numpy(ref).to(self.dtype)

    def values(self) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.vals)).to(self.dtype)

    def build(self, fmt, **kw) -> SparseTensor:
        return SparseTensor.from_coo(self.values(), torch.from_numpy(self.rows), torch.from_numpy(self.cols),
                                     shape=(self.m, self.n), format=fmt, index_dtype=self.idt, **kw)

    def stored(self) -> set:
        return set(zip(self.rows.tolist(), self.cols.tolist()))

    def nonzero(self) -> set:
        nz = np.nonzero(self.dense().numpy())
        return set(zip(nz[0].tolist(), nz[1].tolist()))


def prune_nm(mask: np.ndarray, n: int, m: int) -> np.ndarray:
    """Keep at most ``n`` of the set entries in every strip of ``m`` consecutive columns."""
    mask = mask.copy()
    for r in range(mask.shape[0]):
        for s in range(0, mask.shape[1], m):
            on = np.flatnonzero(mask[r, s:s + m])
            mask[r, s + on[n:]] = False
    return mask


@st.composite
def coo_cases(draw, nm: tuple[int, int] | None = None, max_side: int = 12, zeros: bool = True,
              dtypes=(torch.float32, torch.float64, torch.complex128), min_side: int = 0):
    m = draw(st.integers(min_side, max_side))
    n = draw(st.integers(min_side, max_side))
    density = draw(st.sampled_from([0.0, 0.15, 0.4, 0.8, 1.0]))
    zero_frac = draw(st.sampled_from([0.0, 0.25, 1.0])) if zeros else 0.0
    dtype = draw(st.sampled_from(dtypes))
    idt = draw(st.sampled_from([torch.int32, torch.int64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((m, n)) < density
    if nm is not None:
        mask = prune_nm(mask, *nm)
    rows, cols = np.nonzero(mask)
    k = rows.size
    # Small integers and halves: exact in float32, sums exact too.
    vals = rng.integers(-8, 9, size=k) / 2.0
    vals[vals == 0] = 1.5
    if dtype.is_complex:
        vals = vals + 1j * (rng.integers(-8, 9, size=k) / 2.0)
    vals[rng.random(k) < zero_frac] = 0  # explicit zeros
    perm = rng.permutation(k)  # entries in no particular order
    return Case(m, n, rows[perm].astype(np.int64), cols[perm].astype(np.int64), vals[perm], dtype, idt)


def coord_set(t: SparseTensor) -> set:
    idx, _ = t.coordinates()
    pairs = list(zip(*idx.cpu().tolist())) if idx.shape[1] else []
    assert len(pairs) == len(set(pairs)), f"coordinates repeat in {t.format}"
    return set(pairs)


def buffers(t: SparseTensor) -> list[torch.Tensor]:
    return [b for b in (*t.pos_buffers, *t.crd_buffers) if b is not None]


def snapshot(t: SparseTensor) -> list:
    return [None if b is None else b.clone() for b in (*t.pos_buffers, *t.crd_buffers)] + [t.values.detach().clone()]


def unchanged(t: SparseTensor, snap: list) -> bool:
    now = [*t.pos_buffers, *t.crd_buffers, t.values.detach()]
    return all((a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                               and torch.equal(a, b)) for a, b in zip(now, snap))


def revalidate(t: SparseTensor) -> None:
    """The buffers pass the full content checks of the constructor."""
    SparseTensor(t.format, t.shape, t.pos_buffers, t.crd_buffers, t.values, check=True)


def assert_dense(t: SparseTensor, ref: torch.Tensor) -> None:
    d = t.to_dense()
    assert d.dtype == ref.dtype, (d.dtype, ref.dtype)
    assert tuple(d.shape) == tuple(ref.shape)
    assert torch.equal(d.cpu(), ref.cpu()), f"{t.format}:\n{d}\n!=\n{ref}"


def nm_of(*names: str) -> tuple[int, int] | None:
    return (2, 4) if "NM(2,4)" in names else None


# --------------------------------------------------------------------------------------------
# Every pair of formats
# --------------------------------------------------------------------------------------------

PAIRS = [(a, b) for a in NAMES for b in NAMES if not (b == "NM(2,4)" and a in PADDED and a != b)]


@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
@settings(max_examples=PAIR_EXAMPLES)
@given(data=st.data())
def test_convert_every_pair(src, dst, data):
    case = data.draw(coo_cases(nm=nm_of(src, dst)), label="case")
    ref = case.dense()
    f1, f2 = FORMATS[src], FORMATS[dst]
    t1 = case.build(f1)
    assert t1.format == f1 and tuple(t1.shape) == (case.m, case.n) and t1.dtype == case.dtype
    if buffers(t1):
        assert t1.index_dtype == case.idt and all(b.dtype == case.idt for b in buffers(t1))
    assert_dense(t1, ref)
    assert case.stored() <= coord_set(t1)  # every given entry is stored, explicit zeros included
    before = snapshot(t1)

    t2 = t1.convert(f2)
    assert unchanged(t1, before), "convert modified its input"
    assert t2.format == f2 and tuple(t2.shape) == (case.m, case.n) and t2.dtype == case.dtype
    assert all(b.dtype == t1.index_dtype for b in buffers(t2))
    revalidate(t2)
    assert_dense(t2, ref)
    c1, c2 = coord_set(t1), coord_set(t2)
    assert c1 <= c2, "explicit zeros (stored entries) were lost"
    if dst in EXACT:
        assert c2 == c1
        if dst not in ("ELL", "loose_DCSR"):  # loose levels count their padding slots in nse
            assert t2.nse == len(c1)
    # The values reported by coordinates() are the matrix entries at those coordinates.
    idx, vals = t2.coordinates()
    assert torch.equal(vals.cpu(), ref[idx[0], idx[1]]) if idx.shape[1] else vals.numel() == 0

    t3 = t1.convert(f2, drop_zeros=True)
    assert unchanged(t1, before)
    revalidate(t3)
    assert_dense(t3, ref)
    c3 = coord_set(t3)
    assert case.nonzero() <= c3
    if dst in EXACT:
        assert c3 == case.nonzero()

    # And back again.
    if not (src == "NM(2,4)" and dst in PADDED):  # padded -> N:M is test_convert_padded_formats_to_nm's
        back = t2.convert(f1)
        assert back.format == f1
        assert_dense(back, ref)
    # The transpose of the converted tensor is the transposed matrix, in any format.
    assert_dense(t2.T, ref.T)
    assert_dense(t2.T.convert(CSR), ref.T)


@settings(max_examples=max(5, PROFILE_EXAMPLES // 2))
@given(case=coo_cases(nm=(2, 4)))
def test_convert_padded_formats_to_nm(case):
    """A matrix that satisfies 2:4 converts to NM(2,4) from every format, including formats that
    store zeros of their own (DENSE slots, DIA diagonals, blocks, DELTA bridges): those zeros are
    not entries of the matrix and must not count against the N:M budget."""
    ref = case.dense()
    failures = {}
    for name in sorted(PADDED):
        try:
            t = case.build(FORMATS[name]).convert(NM(2, 4))
            assert_dense(t, ref)
        except (FormatError, AssertionError) as err:
            failures[name] = str(err).split("\n")[0][:160]
    assert not failures, f"{len(failures)} formats cannot convert a valid 2:4 matrix to NM(2,4): {failures}"


# --------------------------------------------------------------------------------------------
# Exact storage: the 4 x 8 example of the issue (the values nvmath-python's UST produces)
# --------------------------------------------------------------------------------------------

def example_4x8() -> torch.Tensor:
    A = torch.zeros(4, 8, dtype=torch.float64)
    A[0, 0], A[0, 7] = 1, 2
    A[1, 2], A[1, 3] = 3, 4
    A[2, 7] = 5
    A[3, 0], A[3, 6] = 6, 7
    return A


def _l(t: torch.Tensor | None) -> list:
    return t.tolist()


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_example_delta2_storage(idt):
    A = example_4x8()
    t = SparseTensor.from_dense(A, DELTA(2), index_dtype=idt)
    assert t.pos(0) is None and t.crd(0) is None
    assert _l(t.pos(1)) == [0, 3, 5, 7, 10]
    assert _l(t.crd(1)) == [0, 3, 2, 2, 0, 3, 3, 0, 3, 1]
    assert _l(t.values) == [1, 0, 2, 3, 4, 0, 5, 6, 0, 7]
    assert t.pos(1).dtype == t.crd(1).dtype == idt
    assert torch.equal(t.to_dense(), A)


def test_example_dia_storage():
    A = example_4x8()
    t = SparseTensor.from_dense(A, DIA)
    assert _l(t.pos(0)) == [0, 7]
    assert _l(t.crd(0)) == [-3, 0, 1, 2, 3, 5, 7]
    assert t.pos(1) is None and t.crd(1) is None
    assert t.nse == 28 and t.values.shape == (28,)
    # values[k * 4 + i] = A[i, i + offset_k] (zero where i + offset_k is outside the matrix)
    expected = torch.zeros(7, 4, dtype=torch.float64)
    for k, off in enumerate([-3, 0, 1, 2, 3, 5, 7]):
        for i in range(4):
            if 0 <= i + off < 8:
                expected[k, i] = A[i, i + off]
    assert torch.equal(t.values.reshape(7, 4), expected)
    assert torch.equal(t.to_dense(), A)


def test_example_nm_storage():
    A = example_4x8()
    t = SparseTensor.from_dense(A, NM(2, 4))
    assert [t.pos(k) for k in range(3)] == [None, None, None]
    assert t.crd(0) is None and t.crd(1) is None
    assert _l(t.crd(2)) == [0, 1, 0, 3, 2, 3, 0, 1, 0, 1, 0, 3, 0, 1, 0, 2]
    assert _l(t.values) == [1, 0, 0, 2, 3, 4, 0, 0, 0, 0, 0, 5, 6, 0, 0, 7]
    assert torch.equal(t.to_dense(), A)


def test_example_bsr22_storage():
    A = example_4x8()
    t = SparseTensor.from_dense(A, BSR(2, 2))
    assert _l(t.pos(1)) == [0, 3, 5]
    assert _l(t.crd(1)) == [0, 1, 3, 0, 3]
    assert t.nse == 20
    blocks = t.values.reshape(5, 2, 2)
    for (br, bc), blk in zip([(0, 0), (0, 1), (0, 3), (1, 0), (1, 3)], blocks):
        assert torch.equal(blk, A[2 * br:2 * br + 2, 2 * bc:2 * bc + 2])
    # SciPy's BSR of the same matrix (indices sorted): same indptr, indices and blocks.
    ref = sp.bsr_array(A.numpy(), blocksize=(2, 2))
    ref.sort_indices()
    assert _l(t.pos(1)) == ref.indptr.tolist() and _l(t.crd(1)) == ref.indices.tolist()
    assert np.array_equal(blocks.numpy(), ref.data)


def test_convert_example_to_nm_from_every_format():
    """The 4 x 8 example satisfies 2:4, so every format holding it converts to NM(2,4)."""
    A = example_4x8()
    failures = {}
    for name, f in FORMATS.items():
        try:
            t = SparseTensor.from_dense(A, f).convert(NM(2, 4))
            if not torch.equal(t.to_dense(), A):
                failures[name] = "wrong values"
        except FormatError as err:
            failures[name] = str(err)[:120]
    assert not failures, f"{sorted(failures)} cannot convert the 2:4 example to NM(2,4): {failures}"


def test_example_other_named_storage():
    A = example_4x8()
    ell = SparseTensor.from_dense(A, ELL)
    assert _l(ell.pos(1)) == [0, 2, 2, 4, 4, 5, 6, 8]
    assert _l(ell.crd(1))[0:2] == [0, 7] and _l(ell.crd(1))[2:4] == [2, 3]
    assert _l(ell.crd(1))[4:5] == [7] and _l(ell.crd(1))[6:8] == [0, 6]
    assert _l(ell.values) == [1, 2, 3, 4, 5, 0, 6, 7]
    coo = SparseTensor.from_dense(A, COO)
    assert _l(coo.pos(0)) == [0, 7] and _l(coo.crd(0)) == [0, 0, 1, 1, 2, 3, 3]
    assert _l(coo.crd(1)) == [0, 7, 2, 3, 7, 0, 6] and coo.pos(1) is None
    dia_j = SparseTensor.from_dense(A, DIA_J)
    assert _l(dia_j.crd(0)) == [-3, 0, 1, 2, 3, 5, 7] and dia_j.nse == 56
    ref = sp.dia_array(A.numpy())
    assert ref.offsets.tolist() == [-3, 0, 1, 2, 3, 5, 7]
    assert np.array_equal(dia_j.values.reshape(7, 8).numpy(), ref.data)


# --------------------------------------------------------------------------------------------
# Exact storage against NumPy / SciPy references on random matrices
# --------------------------------------------------------------------------------------------

def delta_reference(dense: np.ndarray, stored: np.ndarray, bits: int):
    """pos, crd (gaps) and values of DELTA(bits): gap = col - prev - 1, a gap wider than
    2**bits - 1 is bridged by zero entries carrying the gap 2**bits - 1."""
    top = (1 << bits) - 1
    pos, crd, vals = [0], [], []
    for r in range(dense.shape[0]):
        prev = -1
        for c in np.flatnonzero(stored[r]):
            gap = c - prev - 1
            while gap > top:
                crd.append(top)
                vals.append(0)
                gap -= top + 1
            crd.append(gap)
            vals.append(dense[r, c])
            prev = c
        pos.append(len(crd))
    return pos, crd, vals


def nm_reference(dense: np.ndarray, stored: np.ndarray, n: int, m: int):
    """crd and values of NM(n, m): per row and strip, the stored offsets plus the smallest free
    offsets up to n, sorted; padding slots hold zeros."""
    rows, cols = dense.shape
    nstrips = -(-cols // m)
    crd, vals = [], []
    for r in range(rows):
        for s in range(nstrips):
            occ = [o for o in range(m) if s * m + o < cols and stored[r, s * m + o]]
            free = [o for o in range(m) if o not in occ]
            pick = sorted(occ + free[: n - len(occ)])
            crd += pick
            vals += [dense[r, s * m + o] if s * m + o < cols else 0 for o in pick]
    return crd, vals


@settings(max_examples=PROFILE_EXAMPLES)
@given(case=coo_cases(max_side=40), bits=st.integers(1, 5))
def test_delta_storage_matches_reference(case, bits):
    t = case.build(DELTA(bits))
    stored = np.zeros((case.m, case.n), dtype=bool)
    stored[case.rows, case.cols] = True
    pos, crd, vals = delta_reference(case.dense().numpy(), stored, bits)
    assert _l(t.pos(1)) == pos
    assert _l(t.crd(1)) == crd
    assert np.array_equal(t.values.numpy(), np.array(vals, dtype=t.values.numpy().dtype).reshape(-1))
    assert max(crd, default=0) <= (1 << bits) - 1
    # Decode the gaps independently: columns are cumulative (gap + 1) - 1 per row.
    dense = np.zeros((case.m, case.n), dtype=t.values.numpy().dtype)
    for r in range(case.m):
        col = -1
        for q in range(pos[r], pos[r + 1]):
            col += crd[q] + 1
            dense[r, col] += t.values.numpy()[q]
    assert np.array_equal(dense, case.dense().numpy())


@settings(max_examples=PROFILE_EXAMPLES)
@given(data=st.data(), nm=st.sampled_from([(1, 1), (1, 2), (2, 4), (3, 4), (1, 4), (4, 4), (3, 8)]))
def test_nm_storage_matches_reference(data, nm):
    n, m = nm
    case = data.draw(coo_cases(nm=nm, max_side=14))
    t = case.build(NM(n, m))
    stored = np.zeros((case.m, case.n), dtype=bool)
    stored[case.rows, case.cols] = True
    crd, vals = nm_reference(case.dense().numpy(), stored, n, m)
    assert _l(t.crd(2)) == crd
    assert np.array_equal(t.values.numpy(), np.array(vals, dtype=t.values.numpy().dtype).reshape(-1))
    assert t.nse == case.m * -(-case.n // m) * n
    assert_dense(t, case.dense())
    revalidate(t)


@settings(max_examples=PROFILE_EXAMPLES)
@given(data=st.data())
def test_nm_violation_names_the_strip(data):
    n, m = data.draw(st.sampled_from([(1, 2), (2, 4), (1, 4), (3, 8)]))
    case = data.draw(coo_cases(max_side=12, zeros=False))
    stored = np.zeros((case.m, case.n), dtype=bool)
    stored[case.rows, case.cols] = True
    over = [(r, s) for r in range(case.m) for s in range(0, case.n, m) if stored[r, s:s + m].sum() > n]
    if not over:
        t = case.build(NM(n, m))
        assert_dense(t, case.dense())
        return
    with pytest.raises(FormatError) as info:
        case.build(NM(n, m))
    msg = str(info.value)
    assert f"at most {n} stored entries per strip of {m}" in msg
    got = re.search(r"strip holding entry \((\d+), (\d+)\) has (\d+)", msg)
    assert got, msg
    r, c, count = map(int, got.groups())
    assert stored[r, c], "the entry named is not an entry of the matrix"
    strip = stored[r, (c // m) * m:(c // m) * m + m]
    assert strip.sum() == count > n, "the strip named does not hold too many entries"
    # The same error from convert.
    with pytest.raises(FormatError, match="per strip"):
        case.build(CSR).convert(NM(n, m))


@settings(max_examples=PROFILE_EXAMPLES)
@given(case=coo_cases(max_side=15))
def test_dia_storage_matches_reference(case):
    dense = case.dense().numpy()
    stored = np.zeros((case.m, case.n), dtype=bool)
    stored[case.rows, case.cols] = True
    offsets = sorted(set((case.cols - case.rows).tolist()))
    for fmt, by_row in ((DIA, True), (DIA_J, False)):
        t = case.build(fmt)
        assert _l(t.crd(0)) == offsets and _l(t.pos(0)) == [0, len(offsets)]
        width = case.m if by_row else case.n
        ref = np.zeros((len(offsets), width), dtype=dense.dtype)
        for k, off in enumerate(offsets):
            for x in range(width):
                i, j = (x, x + off) if by_row else (x - off, x)
                if 0 <= i < case.m and 0 <= j < case.n:
                    ref[k, x] = dense[i, j]
        assert np.array_equal(t.values.numpy().reshape(len(offsets), width), ref)
        assert_dense(t, case.dense())
    if case.nonzero() and case.nonzero() == case.stored():
        scipy_dia = sp.dia_array(dense)
        t = case.build(DIA_J)
        assert _l(t.crd(0)) == scipy_dia.offsets.tolist()
        ours = t.values.numpy().reshape(len(offsets), case.n)
        w = scipy_dia.data.shape[1]  # SciPy may trim trailing columns no diagonal reaches
        assert w <= case.n and np.array_equal(ours[:, :w], scipy_dia.data) and not ours[:, w:].any()


@settings(max_examples=PROFILE_EXAMPLES)
@given(case=coo_cases(max_side=12, zeros=False), bh=st.integers(1, 4), bw=st.integers(1, 4))
def test_bsr_bsc_storage_matches_scipy(case, bh, bw):
    dense = case.dense().numpy()
    M, N = -(-case.m // bh) * bh, -(-case.n // bw) * bw
    padded = np.zeros((M, N), dtype=dense.dtype)
    padded[: case.m, : case.n] = dense
    ref = sp.bsr_array(padded, blocksize=(bh, bw)) if M and N else None
    t = case.build(BSR(bh, bw))
    assert_dense(t, case.dense())
    if ref is not None:
        ref.sort_indices()
        assert _l(t.pos(1)) == ref.indptr.tolist()
        assert _l(t.crd(1)) == ref.indices.tolist()
        assert np.array_equal(t.values.numpy().reshape(-1, bh, bw), ref.data)
    # BSC: block columns outer, row-major blocks inside (torch's BSC layout).
    u = case.build(BSC(bh, bw))
    assert_dense(u, case.dense())
    if ref is not None:
        refc = sp.bsr_array(padded.T, blocksize=(bw, bh))
        refc.sort_indices()
        assert _l(u.pos(1)) == refc.indptr.tolist()
        assert _l(u.crd(1)) == refc.indices.tolist()
        assert np.array_equal(u.values.numpy().reshape(-1, bh, bw), refc.data.transpose(0, 2, 1))


@settings(max_examples=PROFILE_EXAMPLES)
@given(case=coo_cases(max_side=12))
def test_csr_csc_coo_ell_storage_match_scipy(case):
    """With explicit zeros stored: SciPy keeps them too when built from triplets."""
    dense = case.dense().numpy()
    ref = sp.coo_array((case.vals.astype(dense.dtype), (case.rows, case.cols)), shape=(case.m, case.n)).tocsr()
    ref.sort_indices()
    t = case.build(CSR)
    assert _l(t.pos(1)) == ref.indptr.tolist() and _l(t.crd(1)) == ref.indices.tolist()
    assert np.array_equal(t.values.numpy(), ref.data.astype(t.values.numpy().dtype))
    refc = ref.tocsc()
    refc.sort_indices()
    u = case.build(CSC)
    assert _l(u.pos(1)) == refc.indptr.tolist() and _l(u.crd(1)) == refc.indices.tolist()
    assert np.array_equal(u.values.numpy(), refc.data.astype(u.values.numpy().dtype))
    coo = case.build(COO)
    refo = ref.tocoo()
    assert _l(coo.crd(0)) == refo.row.tolist() and _l(coo.crd(1)) == refo.col.tolist()
    assert _l(coo.pos(0)) == [0, ref.nnz]
    dcsr = case.build(DCSR)
    rows_present = np.flatnonzero(np.diff(ref.indptr))
    assert _l(dcsr.crd(0)) == rows_present.tolist()
    assert _l(dcsr.pos(0)) == [0, rows_present.size]
    assert _l(dcsr.crd(1)) == ref.indices.tolist()
    ell = case.build(ELL)
    counts = np.diff(ref.indptr)
    width = int(counts.max()) if counts.size else 0
    assert ell.nse == case.m * width
    expected_pos = np.stack([np.arange(case.m) * width, np.arange(case.m) * width + counts], 1).reshape(-1)
    assert _l(ell.pos(1)) == expected_pos.tolist()
    crd, vals = ell.crd(1).numpy(), ell.values.numpy()
    for r in range(case.m):
        lo, hi = ref.indptr[r], ref.indptr[r + 1]
        assert crd[r * width: r * width + hi - lo].tolist() == ref.indices[lo:hi].tolist()
        assert np.array_equal(vals[r * width: r * width + hi - lo], ref.data[lo:hi].astype(vals.dtype))
        assert not vals[r * width + hi - lo: (r + 1) * width].any()  # padding holds zeros


# --------------------------------------------------------------------------------------------
# Explicit zeros, drop_zeros
# --------------------------------------------------------------------------------------------

def test_explicit_zeros_kept_unless_dropped():
    v = torch.tensor([1.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    r, c = torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 2, 0])
    t = SparseTensor.from_coo(v, r, c, shape=(3, 3))
    assert t.nse == 4 and coord_set(t) == {(0, 0), (1, 1), (1, 2), (2, 0)}
    for name in ["CSR", "CSC", "DCSR", "DCSC", "COO", "ELL", "DELTA(2)"]:
        u = t.convert(FORMATS[name])
        assert coord_set(u) == {(0, 0), (1, 1), (1, 2), (2, 0)}, name
        d = t.convert(FORMATS[name], drop_zeros=True)
        assert coord_set(d) == {(0, 0), (1, 2)}, name
        assert torch.equal(d.to_dense(), u.to_dense())
    assert t.convert(CSR).nse == 4 and t.convert(CSR, drop_zeros=True).nse == 2
    assert t.convert(COO, drop_zeros=True).nse == 2  # same format: new buffers without the zeros
    with pytest.raises(ConversionError, match="copy=False"):
        t.convert(COO, drop_zeros=True, copy=False)


def test_drop_zeros_with_value_batch_keeps_entries_nonzero_in_any_batch():
    vals = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    t = SparseTensor.from_coo(vals, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), shape=(3, 3))
    d = t.convert(CSR, drop_zeros=True)
    assert coord_set(d) == {(0, 0), (2, 2)}
    assert torch.equal(d.to_dense(), t.to_dense())


# --------------------------------------------------------------------------------------------
# 3-D tensors, batched formats, shared-pattern value batches
# --------------------------------------------------------------------------------------------

THREE_D = {
    "COO_ND(3)": COO_ND(3),
    "DENSE_ND(3)": DENSE_ND(3),
    "slices_CSR": parse("(k, i, j) -> (k : dense, i : dense, j : compressed)"),
    "CSF": parse("(k, i, j) -> (k : compressed, i : compressed, j : compressed)"),
    "diag_slices": parse("(k, i, j) -> (k : dense, j - i : compressed, i : range)"),
    "k_blocks": parse("(k, i, j) -> (k // 2 : compressed, i : dense, j : compressed, k % 2 : dense)"),
    "mode2_COO": parse("(a, b, c) -> (c : compressed(nonunique), a : singleton(nonunique), b : singleton)"),
}


@settings(max_examples=max(3, PROFILE_EXAMPLES // 4))
@given(shape=st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(0, 6)),
       density=st.sampled_from([0.0, 0.2, 0.6]), seed=st.integers(0, 2**31))
def test_three_d_formats_round_trip(shape, density, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(-4, 5, shape, generator=g).double() * (torch.rand(shape, generator=g) < density)
    ref = X.numpy()
    for name, f in THREE_D.items():
        t = SparseTensor.from_dense(X, f)
        assert t.format == f and tuple(t.shape) == shape
        assert torch.equal(t.to_dense(), X), name
        revalidate(t)
        for name2, f2 in THREE_D.items():
            assert torch.equal(t.convert(f2).to_dense(), X), (name, name2)
        p = t.permute(2, 0, 1)
        assert np.array_equal(p.to_dense().numpy(), ref.transpose(2, 0, 1))
        assert torch.equal(p.convert(COO_ND(3)).to_dense(), X.permute(2, 0, 1))
    coo = SparseTensor.from_dense(X, COO_ND(3))
    nz = np.nonzero(ref)
    assert coo.coordinates()[0].tolist() == [x.tolist() for x in nz]


@pytest.mark.parametrize("inner", ["CSR", "CSC", "COO", "DCSR", "BSR(2,3)", "DELTA(2)", "DIA", "DIA_J", "ELL", "NM(2,4)"])
def test_batched_format_same_pattern_per_batch(inner):
    g = torch.Generator().manual_seed(3)
    mask = torch.from_numpy(prune_nm((torch.rand(5, 7, generator=g) < 0.4).numpy(), 2, 4))
    Y = torch.randint(1, 9, (3, 5, 7), generator=g).double() * mask
    f = batched(FORMATS[inner])
    t = SparseTensor.from_dense(Y, f)
    assert t.format == f and tuple(t.shape) == (3, 5, 7) and t.batch_shape == ()
    assert torch.equal(t.to_dense(), Y)
    revalidate(t)
    for k in range(f.num_levels):
        for buf in (t.pos(k), t.crd(k)):
            if buf is not None:
                assert buf.dim() == 2 and buf.shape[0] == 3  # a leading batch axis
    # Every batch member stores what the unbatched format stores for that slice.
    for b in range(3):
        one = SparseTensor.from_dense(Y[b], FORMATS[inner])
        for x, y in zip((*one.pos_buffers, *one.crd_buffers), (*t.pos_buffers[1:], *t.crd_buffers[1:])):
            assert (x is None) == (y is None)
            if x is not None:
                assert torch.equal(x, y[b])
        assert torch.equal(one.values, t.values[b])
    assert torch.equal(t.convert(COO_ND(3)).to_dense(), Y)
    assert torch.equal(SparseTensor.from_dense(Y, COO_ND(3)).convert(f).to_dense(), Y)
    assert torch.equal(t.T.to_dense(), Y.transpose(-1, -2))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("inner", ["CSR", "CSC", "COO", "ELL"])
def test_batched_format_equal_nnz_different_patterns(inner):
    g = torch.Generator().manual_seed(4)
    Y = torch.zeros(3, 5, 7, dtype=torch.float64)
    for b in range(3):  # 6 nonzeros in every batch, at different places
        idx = torch.randperm(35, generator=g)[:6]
        Y[b].view(-1)[idx] = torch.arange(1.0, 7.0, dtype=torch.float64) + 10 * b
    f = batched(FORMATS[inner])
    t = SparseTensor.from_dense(Y, f)
    assert torch.equal(t.to_dense(), Y)
    revalidate(t)
    if inner == "CSR":
        # torch's own batched CSR layout: per-batch crow offsets starting at 0.
        ref = Y.to_sparse_csr()
        assert torch.equal(t.pos(2), ref.crow_indices()) and torch.equal(t.crd(2), ref.col_indices())
        assert torch.equal(t.values, ref.values())
    assert torch.equal(t.convert(COO_ND(3)).to_dense(), Y)
    assert torch.equal(SparseTensor.from_dense(Y, COO_ND(3)).convert(f).to_dense(), Y)
    assert torch.equal(t.T.to_dense(), Y.transpose(-1, -2))


def test_batched_format_rejects_unequal_nnz_per_batch():
    Y = torch.zeros(2, 3, 4, dtype=torch.float64)
    Y[0, 0, 1], Y[0, 2, 3] = 1, 2
    Y[1, 1, 1], Y[1, 1, 2], Y[1, 2, 0] = 3, 4, 5
    with pytest.raises(FormatError, match=r"same number of stored entries in every batch.*\[2, 3\]"):
        SparseTensor.from_dense(Y, batched(CSR))
    with pytest.raises(FormatError, match="same number of stored entries in every batch"):
        SparseTensor.from_dense(Y, COO_ND(3)).convert(batched(CSR))
    # ELL pads every row to one width, so any batch fits.
    assert torch.equal(SparseTensor.from_dense(Y, batched(ELL)).to_dense(), Y)


def test_batched_format_with_empty_batch():
    for shape in [(0, 3, 4), (2, 0, 4), (2, 3, 0)]:
        Y = torch.zeros(shape, dtype=torch.float64)
        t = SparseTensor.from_dense(Y, batched(CSR))
        assert tuple(t.shape) == shape and torch.equal(t.to_dense(), Y)


@pytest.mark.parametrize("dst", NAMES)
@settings(max_examples=max(3, PROFILE_EXAMPLES // 4))
@given(data=st.data())
def test_shared_pattern_value_batches(dst, data):
    """values of shape (B, nse): one pattern (the union over the batch), B value sets."""
    nbatch = data.draw(st.sampled_from([(1,), (3,), (2, 2)]), label="batch")
    # Empty matrices with a value batch: test_value_batch_of_empty_matrices.
    base = data.draw(coo_cases(nm=nm_of(dst), max_side=8, zeros=False, min_side=1), label="pattern")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    mask = base.dense() != 0
    X = torch.randint(-4, 5, (*nbatch, base.m, base.n), generator=g).to(base.dtype) * mask
    t = SparseTensor.from_dense(X, CSR, index_dtype=base.idt)
    assert t.batch_shape == nbatch and tuple(t.shape) == (*nbatch, base.m, base.n)
    union = mask & (X != 0).reshape(-1, base.m, base.n).any(0)
    assert coord_set(t) == {tuple(x) for x in torch.nonzero(union).tolist()}
    assert t.values.shape == (*nbatch, int(union.sum()))
    assert torch.equal(t.to_dense(), X)
    before = snapshot(t)
    u = t.convert(FORMATS[dst])
    assert unchanged(t, before)
    assert u.batch_shape == nbatch and u.values.shape[:-1] == nbatch
    assert torch.equal(u.to_dense(), X)
    revalidate(u)
    assert torch.equal(u.convert(COO).to_dense(), X)
    # Batch member k of the converted tensor is the conversion of batch member k.
    flat = X.reshape(-1, base.m, base.n)
    for k in range(flat.shape[0]):
        member = u.with_values(u.values.reshape(math.prod(nbatch), u.values.shape[-1])[k])
        assert torch.equal(member.to_dense(), flat[k])
    assert torch.equal(u.T.to_dense(), X.transpose(-1, -2))


@pytest.mark.parametrize("shape", [(2, 0, 3), (2, 3, 0), (2, 0, 0), (0, 3, 4)])
def test_value_batch_of_empty_matrices(shape):
    X = torch.zeros(shape, dtype=torch.float64)
    t = SparseTensor.from_dense(X, CSR)
    assert t.batch_shape == shape[:1] and tuple(t.shape) == shape and t.nse == 0
    assert torch.equal(t.to_dense(), X)
    assert torch.equal(t.convert(COO).to_dense(), X)


def test_from_dense_batch_dims_into_batched_format():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 5, generator=g) < 0.4
    mask[0, 0] = True
    mask = mask.expand(3, 4, 5)  # the same pattern in every slice: equal nnz per batch
    D = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) * mask
    t = SparseTensor.from_dense(D, batched(CSR), batch_dims=1)
    assert t.batch_shape == (2,) and tuple(t.shape) == (2, 3, 4, 5)
    assert torch.equal(t.to_dense(), D)
    assert torch.equal(t.convert(COO_ND(3)).to_dense(), D)
    assert torch.equal(t.T.to_dense(), D.transpose(-1, -2))


# --------------------------------------------------------------------------------------------
# Transposes are views
# --------------------------------------------------------------------------------------------

def _shares_memory(a: SparseTensor, b: SparseTensor) -> None:
    for x, y in zip((*a.pos_buffers, *a.crd_buffers), (*b.pos_buffers, *b.crd_buffers)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.data_ptr() == y.data_ptr() and x.shape == y.shape
    assert a.values.data_ptr() == b.values.data_ptr()


@pytest.mark.parametrize("name", NAMES)
def test_transpose_is_a_view(name):
    g = torch.Generator().manual_seed(1)
    A = torch.randint(-3, 4, (5, 7), generator=g).double() * (torch.rand(5, 7, generator=g) < 0.5)
    if name == "NM(2,4)":
        A = A * torch.from_numpy(prune_nm((A != 0).numpy(), 2, 4))
    t = SparseTensor.from_dense(A, FORMATS[name])
    tt = t.T
    assert tuple(tt.shape) == (7, 5)
    assert torch.equal(tt.to_dense(), A.T)
    _shares_memory(t, tt)
    assert tt.T.format == t.format and torch.equal(tt.T.to_dense(), A)
    p = t.permute(1, 0)
    assert p.format == tt.format and torch.equal(p.to_dense(), A.T)
    _shares_memory(t, p)
    assert torch.equal(t.transpose(0, 1).to_dense(), A.T)
    assert torch.equal(t.mT.to_dense(), A.T)


def test_csr_transpose_is_csc_and_transposes_of_value_batches():
    A = example_4x8()
    t = SparseTensor.from_dense(A, CSR)
    assert t.T.format == CSC and SparseTensor.from_dense(A, CSC).T.format == CSR
    assert SparseTensor.from_dense(A, DCSR).T.format == DCSC
    vb = t.with_values(torch.stack([t.values, -t.values, 2 * t.values]))
    assert torch.equal(vb.T.to_dense(), torch.stack([A.T, -A.T, 2 * A.T]))
    _shares_memory(vb, vb.T)
    with pytest.raises(ValidationError, match="permutation"):
        t.permute(0, 0)
    with pytest.raises(ValidationError, match="can only transpose the format's dims"):
        vb.transpose(0, 1)


def test_permute_three_d_is_a_view():
    X = torch.arange(60, dtype=torch.float64).reshape(3, 4, 5) * (torch.arange(60).reshape(3, 4, 5) % 3 == 0)
    for f in (COO_ND(3), DENSE_ND(3), batched(CSR)):
        # batched(CSR) needs equal nnz per batch: the same pattern in every slice
        X2 = X if not f.num_batch_levels else (1 + X) * (X[0] != 0)
        t = SparseTensor.from_dense(X2, f)
        for order in [(0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1)]:
            p = t.permute(*order)
            assert torch.equal(p.to_dense(), X2.permute(*order)), (f, order)
            _shares_memory(t, p)


# --------------------------------------------------------------------------------------------
# convert's contract: self, copy, dtype, index dtype
# --------------------------------------------------------------------------------------------

def test_convert_returns_self_when_nothing_changes_and_clone_on_copy():
    t = SparseTensor.from_dense(example_4x8(), CSR)
    assert t.convert(CSR) is t
    assert t.convert() is t
    assert t.convert("(r, c) -> (r : dense, c : compressed)") is t
    assert t.convert(CSR, copy=False) is t
    assert t.convert(CSR, index_dtype=torch.int64) is t
    assert t.convert(CSR, dtype=torch.float64) is t
    c = t.convert(CSR, copy=True)
    assert c is not t and c.equal(t)
    for a, b in zip(buffers(c) + [c.values], buffers(t) + [t.values]):
        assert a.data_ptr() != b.data_ptr()
    c.values.mul_(2)
    assert torch.equal(t.to_dense(), example_4x8())


@pytest.mark.parametrize("dst", ["CSR", "CSC", "COO", "DIA", "ELL", "BSR(2,3)"])
def test_convert_copy_true_never_shares_memory_with_the_source(dst):
    A = example_4x8()
    for src in ["COO", "CSR", "CSC"]:
        t = SparseTensor.from_dense(A, FORMATS[src])
        u = t.convert(FORMATS[dst], copy=True)
        mine = {b.data_ptr() for b in buffers(t) + [t.values] if b.numel()}
        assert not any(b.data_ptr() in mine for b in buffers(u) + [u.values] if b.numel()), (src, dst)
        u.values.mul_(-1)
        assert torch.equal(t.to_dense(), A), f"{src} -> {dst} with copy=True: writing the result changed the source"


@pytest.mark.parametrize("name", NAMES)
def test_convert_index_dtype_and_value_dtype(name):
    A = example_4x8()
    t = SparseTensor.from_dense(A, FORMATS[name])
    for idt in (torch.int32, torch.int64):
        u = t.convert(FORMATS[name], index_dtype=idt)
        assert all(b.dtype == idt for b in buffers(u))
        assert torch.equal(u.to_dense(), A)
        v = t.convert(CSR if name != "CSR" else COO, index_dtype=idt)
        assert all(b.dtype == idt for b in buffers(v)) and v.index_dtype == idt
        assert torch.equal(v.to_dense(), A)
    for dt in (torch.float32, torch.complex128):
        u = t.convert(FORMATS[name], dtype=dt)
        assert u.dtype == dt and torch.equal(u.to_dense(), A.to(dt))
        assert t.dtype == torch.float64
    with pytest.raises(ConversionError, match="index_dtype must be torch.int32 or torch.int64"):
        t.convert(CSR, index_dtype=torch.int16)
    with pytest.raises(ConversionError, match="dtype must be floating point or complex"):
        t.convert(CSR, dtype=torch.int64)


def test_index_dtype_request_kept_by_dense_formats():
    """A tensor built with index_dtype=int32 keeps that preference when its format happens to
    have no index buffers, so a later conversion (index_dtype=None: keep the source's) is int32."""
    A = example_4x8()
    for f in (DENSE, DENSE_COL):
        t = SparseTensor.from_dense(A, f, index_dtype=torch.int32)
        assert t.index_dtype == torch.int32
        u = t.convert(CSR)
        assert u.crd(1).dtype == torch.int32


def test_int32_overflow_is_refused():
    v = torch.ones(1, dtype=torch.float64)
    big = 2**31 + 5
    with pytest.raises(ConversionError, match=r"int32 indices cannot address .*index_dtype=torch.int64"):
        SparseTensor.from_coo(v, torch.tensor([0]), torch.tensor([big - 1]), shape=(1, big), format=CSR,
                              index_dtype=torch.int32)
    t = SparseTensor.from_coo(v, torch.tensor([0]), torch.tensor([big - 1]), shape=(1, big), format=CSR)
    assert t.crd(1).tolist() == [big - 1]
    with pytest.raises(ConversionError, match="int32 indices cannot address"):
        t.convert(CSR, index_dtype=torch.int32)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dst", NAMES)
def test_gradcheck_values_through_convert(dst):
    g = torch.Generator().manual_seed(7)
    A = torch.randn(5, 7, generator=g, dtype=torch.float64) * (torch.rand(5, 7, generator=g) < 0.5)
    if dst == "NM(2,4)":
        A = A * torch.from_numpy(prune_nm((A != 0).numpy(), 2, 4))
    t = SparseTensor.from_dense(A, CSR)
    pos, crd = t.pos_buffers, t.crd_buffers

    def f(values):
        s = SparseTensor(CSR, (5, 7), pos, crd, values)
        return s.convert(FORMATS[dst]).to_dense()

    v = t.values.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (v,))
    out = SparseTensor(CSR, (5, 7), pos, crd, v).convert(FORMATS[dst])
    assert out.values.requires_grad and out.requires_grad


def test_gradcheck_from_coo_with_duplicates():
    r = torch.tensor([0, 2, 1, 0, 2, 0])
    c = torch.tensor([1, 2, 0, 1, 2, 3])

    def f(v):
        return SparseTensor.from_coo(v, r, c, shape=(3, 4)).to_dense().sum()

    def g(v):
        return SparseTensor.from_coo(v, r, c, shape=(3, 4), format=DIA).to_dense()

    v = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (v,))
    assert torch.autograd.gradcheck(g, (v,))
    # d(sum)/dv = 1 for every triplet, duplicates included.
    f(v).backward()
    assert torch.equal(v.grad, torch.ones(6, dtype=torch.float64))


def test_from_dense_gradient_lives_on_the_pattern():
    A = example_4x8().requires_grad_(True)
    W = torch.arange(32, dtype=torch.float64).reshape(4, 8)
    for f in (CSR, DIA, BSR(2, 2), DELTA(2), NM(2, 4), COO):
        if A.grad is not None:
            A.grad = None
        (SparseTensor.from_dense(A, f).to_dense() * W).sum().backward()
        assert torch.equal(A.grad, W * (A.detach() != 0)), f


def test_gradient_through_value_batch_and_complex():
    t = SparseTensor.from_dense(example_4x8(), CSR)
    vb = torch.randn(2, t.nse, dtype=torch.complex128, requires_grad=True)

    def f(v):
        return t.with_values(v).convert(DIA).convert(COO).to_dense()

    assert torch.autograd.gradcheck(f, (vb,))


# --------------------------------------------------------------------------------------------
# CUDA: the same conversions on the GPU, results equal the CPU ones, buffers stay on the GPU
# --------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCuda:
    @pytest.mark.parametrize("dst", NAMES)
    def test_round_trip_on_cuda_equals_cpu(self, dst):
        g = torch.Generator().manual_seed(11)
        A = torch.randint(-4, 5, (9, 11), generator=g).double() * (torch.rand(9, 11, generator=g) < 0.4)
        if dst == "NM(2,4)":
            A = A * torch.from_numpy(prune_nm((A != 0).numpy(), 2, 4))
        for src in ["COO", "CSR", "CSC", "DIA", "ELL", "BSR(2,3)"] if dst != "NM(2,4)" else ["COO", "CSR", "CSC", "ELL"]:
            cpu = SparseTensor.from_dense(A, FORMATS[src]).convert(FORMATS[dst])
            gpu = SparseTensor.from_dense(A.cuda(), FORMATS[src]).convert(FORMATS[dst])
            assert gpu.device.type == "cuda"
            for b in buffers(gpu) + [gpu.values]:
                assert b.device.type == "cuda"
            for x, y in zip((*cpu.pos_buffers, *cpu.crd_buffers), (*gpu.pos_buffers, *gpu.crd_buffers)):
                assert (x is None) == (y is None)
                if x is not None:
                    assert torch.equal(x, y.cpu()), (src, dst)
            assert torch.equal(cpu.values, gpu.values.cpu())
            back = gpu.convert(FORMATS[src])
            assert back.device.type == "cuda"
            assert torch.equal(back.to_dense().cpu(), A)
            assert torch.equal(gpu.T.to_dense().cpu(), A.T)

    def test_from_coo_and_gradient_on_cuda(self):
        r = torch.tensor([0, 2, 1, 0], device="cuda")
        c = torch.tensor([1, 2, 0, 1], device="cuda")
        v = torch.randn(4, dtype=torch.float64, device="cuda", requires_grad=True)
        t = SparseTensor.from_coo(v, r, c, shape=(3, 3), format=DELTA(1))
        assert all(b.device.type == "cuda" for b in buffers(t))
        cpu = SparseTensor.from_coo(v.detach().cpu(), r.cpu(), c.cpu(), shape=(3, 3), format=DELTA(1))
        assert torch.equal(t.to_dense().detach().cpu(), cpu.to_dense())
        t.convert(CSR).to_dense().sum().backward()
        assert torch.equal(v.grad.cpu(), torch.ones(4, dtype=torch.float64))

    def test_dense_format_on_cuda(self):
        """A DENSE-format tensor has no index buffers; its coordinates must still be made on its
        own device."""
        A = example_4x8()
        for f in (DENSE, DENSE_COL):
            t = SparseTensor.from_dense(A.cuda(), f)
            assert t.device.type == "cuda"
            assert torch.equal(t.to_dense().cpu(), A)
            assert t.coordinates()[0].device.type == "cuda"
            u = t.convert(CSR)
            assert u.crd(1).device.type == "cuda" and torch.equal(u.to_dense().cpu(), A)

    def test_batched_on_cuda(self):
        Y = torch.zeros(2, 3, 4, dtype=torch.float64)
        Y[0, 0, 1], Y[0, 2, 3], Y[1, 1, 1], Y[1, 1, 2] = 1, 2, 3, 4
        t = SparseTensor.from_dense(Y.cuda(), batched(CSR))
        assert t.pos(2).device.type == "cuda"
        assert torch.equal(t.to_dense().cpu(), Y)
        assert torch.equal(t.convert(COO_ND(3)).to_dense().cpu(), Y)


def test_complex_values_with_an_infinite_part_convert_exactly():
    """torch's index_add multiplies a complex source by alpha = 1 + 0j, which turned 1 + inf j into nan + inf j in
    every conversion that scatters values (to DENSE, BSR, BSC, DIA_J, NM; session 26's sweep)."""
    import sparsetorch as st
    from sparsetorch.format import BSC, BSR, COO, CSR, DENSE, DIA_J

    v = torch.tensor([1 + 1j, complex(1, float("inf")), complex(float("-inf"), 2)], dtype=torch.complex128)
    A = st.SparseTensor.from_coo(v, torch.tensor([0, 1, 3]), torch.tensor([0, 1, 2]), shape=(4, 4), format=CSR)
    ref = A.to_dense()
    assert ref[1, 1] == complex(1, float("inf")) and ref[3, 2] == complex(float("-inf"), 2)
    for fmt in (DENSE, BSR(2, 2), BSC(2, 2), DIA_J, COO):
        got = A.convert(fmt).to_dense()
        assert torch.equal(torch.view_as_real(got), torch.view_as_real(ref)), fmt
    vg = v.clone().requires_grad_()
    B = st.SparseTensor.from_coo(vg, torch.tensor([0, 1, 3]), torch.tensor([0, 1, 2]), shape=(4, 4), format=CSR)
    assert torch.equal(torch.view_as_real(B.convert(DENSE).to_dense().detach()), torch.view_as_real(ref))
