"""Package interop: from_package / to_package with torch, SciPy, NumPy (and CuPy/CUDA where present).

Every round trip asserts dense values against the original; "zero-copy" claims are asserted by
comparing data pointers (torch) or ``np.shares_memory`` (NumPy/SciPy).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsetorch
from sparsetorch import InteropError, SparseTensor, TensorFormat, ValidationError
from sparsetorch.format import (
    BSC, BSR, COO, COO_ND, CSC, CSR, DELTA, DENSE, DENSE_COL, DENSE_ND, DIA, DIA_J, ELL, batched,
)

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")

UNORDERED_COO = TensorFormat.parse("(i, j) -> (i : compressed(nonunique, unordered), j : singleton(nonunique, unordered))")
FLOATS = [torch.float64, torch.float32]
INDEX = [torch.int64, torch.int32]
NP_INDEX = [np.int64, np.int32]


def rand_dense(m: int, n: int, dtype: torch.dtype = torch.float64, density: float = 0.4, seed: int = 0,
               batch: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(*batch, m, n, generator=g, dtype=torch.float64) + 3.0
    mask = torch.rand(*batch, m, n, generator=g) < density
    return (vals * mask).to(dtype)


def ptr(x: torch.Tensor | None) -> int:
    assert x is not None
    return x.data_ptr()


def shares(a: torch.Tensor, b: np.ndarray) -> bool:
    return np.shares_memory(a.detach().numpy(), b)


# torch -> sparsetorch -> torch ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_torch_coo_coalesced_is_zero_copy_both_ways(dtype):
    dense = rand_dense(5, 7, dtype)
    t = dense.to_sparse().coalesce()
    s = sparsetorch.from_package(t)
    assert s.format == COO and s.shape == (5, 7) and s.dtype == dtype
    idx = t._indices()
    nnz = idx.shape[1]
    assert ptr(s.crd(0)) == idx.data_ptr() and ptr(s.crd(1)) == idx.data_ptr() + nnz * idx.element_size()
    assert s.values.data_ptr() == t._values().data_ptr()
    assert s.pos(0).tolist() == [0, nnz]
    assert torch.equal(s.to_dense(), dense)
    back = s.to_package("torch")
    assert back.layout == torch.sparse_coo and back.is_coalesced()
    assert back._indices().data_ptr() == idx.data_ptr()  # the (2, nnz) base is reused, not stacked
    assert back._values().data_ptr() == t._values().data_ptr()
    assert torch.equal(back.to_dense(), dense)


def test_torch_coo_uncoalesced_keeps_duplicates_and_sums_them():
    idx = torch.tensor([[2, 0, 2, 1, 0], [1, 3, 1, 0, 3]])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    t = torch.sparse_coo_tensor(idx, vals, (3, 4), check_invariants=True)
    assert not t.is_coalesced()
    s = sparsetorch.from_package(t)
    assert s.format == UNORDERED_COO
    assert ptr(s.crd(0)) == idx.data_ptr() and s.values.data_ptr() == vals.data_ptr()
    assert torch.equal(s.to_dense(), t.to_dense())
    assert s.to_dense()[2, 1] == 4.0 and s.to_dense()[0, 3] == 7.0
    back = s.to_package("torch")
    assert not back.is_coalesced() and back._indices().data_ptr() == idx.data_ptr()
    assert torch.equal(back.to_dense(), t.to_dense())
    assert torch.equal(s.convert(COO).to_dense(), t.to_dense())


def test_torch_coo_nd_and_false_coalesced_flag():
    dense = rand_dense(4, 5, batch=(3,))
    t = dense.to_sparse().coalesce()
    s = sparsetorch.from_package(t)
    assert s.format == COO_ND(3) and torch.equal(s.to_dense(), dense)
    assert torch.equal(s.to_package("torch").to_dense(), dense)
    liar = torch.sparse_coo_tensor(torch.tensor([[0, 0], [2, 1]]), torch.ones(2), (2, 3),
                                   is_coalesced=True, check_invariants=False)
    with pytest.raises(ValidationError, match="is_coalesced"):
        sparsetorch.from_package(liar)


def _torch_compressed(dense: torch.Tensor, layout: str, idx_dtype: torch.dtype) -> torch.Tensor:
    blocks = {"bsr": (2, 3), "bsc": (3, 2)}
    t = {"csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc}.get(layout)
    t = t() if t else getattr(dense, f"to_sparse_{layout}")(blocks[layout])
    ctor = {"csr": torch.sparse_csr_tensor, "csc": torch.sparse_csc_tensor,
            "bsr": torch.sparse_bsr_tensor, "bsc": torch.sparse_bsc_tensor}[layout]
    comp = t.crow_indices() if layout in ("csr", "bsr") else t.ccol_indices()
    plain = t.col_indices() if layout in ("csr", "bsr") else t.row_indices()
    return ctor(comp.to(idx_dtype), plain.to(idx_dtype), t.values(), t.shape, check_invariants=True)


EXPECTED = {"csr": CSR, "csc": CSC, "bsr": BSR(2, 3), "bsc": BSC(3, 2)}


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc"])
@pytest.mark.parametrize("idx_dtype", INDEX)
@pytest.mark.parametrize("dtype", FLOATS)
def test_torch_compressed_round_trip_is_zero_copy(layout, idx_dtype, dtype):
    dense = rand_dense(6, 6, dtype, seed=3)
    t = _torch_compressed(dense, layout, idx_dtype)
    comp, plain = (t.crow_indices(), t.col_indices()) if layout in ("csr", "bsr") else (t.ccol_indices(), t.row_indices())
    s = sparsetorch.from_package(t)
    assert s.format == EXPECTED[layout] and s.index_dtype == idx_dtype and s.dtype == dtype
    assert ptr(s.pos(1)) == comp.data_ptr() and ptr(s.crd(1)) == plain.data_ptr()
    assert s.values.data_ptr() == t.values().data_ptr() and s.values.dim() == 1
    assert torch.equal(s.to_dense(), dense)
    back = s.to_package("torch")
    assert back.layout == t.layout
    bcomp = back.crow_indices() if layout in ("csr", "bsr") else back.ccol_indices()
    assert bcomp.data_ptr() == comp.data_ptr() and back.values().data_ptr() == t.values().data_ptr()
    assert torch.equal(back.to_dense(), dense)


@pytest.mark.parametrize("layout,inner", [("csr", CSR), ("csc", CSC), ("bsr", BSR(2, 2))])
def test_torch_batched_compressed(layout, inner):
    mask = rand_dense(4, 6, seed=1) != 0
    dense = torch.stack([mask * (k + 1.0) for k in range(3)]).double()
    t = dense.to_sparse_csr() if layout == "csr" else dense.to_sparse_csc() if layout == "csc" else dense.to_sparse_bsr((2, 2))
    s = sparsetorch.from_package(t)
    assert s.format == batched(inner) and s.shape == (3, 4, 6) and s.batch_shape == ()
    comp = t.ccol_indices() if layout == "csc" else t.crow_indices()
    assert s.pos(2).shape == comp.shape and ptr(s.pos(2)) == comp.data_ptr()
    assert s.values.data_ptr() == t.values().data_ptr()
    assert torch.equal(s.to_dense(), dense)
    back = s.to_package("torch")
    assert back.layout == t.layout and torch.equal(back.to_dense(), dense)
    assert back.values().data_ptr() == t.values().data_ptr()


def test_torch_hybrid_is_refused():
    hyb = torch.ones(3, 4, 2).to_sparse_csr(dense_dim=1)
    with pytest.raises(InteropError, match="hybrid"):
        sparsetorch.from_package(hyb)
    with pytest.raises(InteropError, match="hybrid"):
        sparsetorch.from_package(torch.ones(3, 4, 2).to_sparse(sparse_dim=2))


def test_torch_strided_dense_layouts():
    a = torch.randn(4, 5, dtype=torch.float64)
    s = sparsetorch.from_package(a)
    assert s.format == DENSE and s.values.data_ptr() == a.data_ptr() and torch.equal(s.to_dense(), a)
    back = s.to_package("torch")
    assert back.data_ptr() == a.data_ptr() and torch.equal(back, a)

    at = a.t()  # transposed-contiguous: DENSE_COL, zero-copy
    s = sparsetorch.from_package(at)
    assert s.format == DENSE_COL and s.values.data_ptr() == a.data_ptr() and torch.equal(s.to_dense(), at)
    back = s.to_package("torch")
    assert back.data_ptr() == a.data_ptr() and back.stride() == at.stride() and torch.equal(back, at)

    sl = a[:, ::2]  # not a permutation of row-major: copied
    s = sparsetorch.from_package(sl)
    assert s.format == DENSE and s.values.data_ptr() != a.data_ptr() and torch.equal(s.to_dense(), sl)

    x = torch.randn(2, 3, 4)
    s = sparsetorch.from_package(x)
    assert s.format == DENSE_ND(3) and s.values.data_ptr() == x.data_ptr() and torch.equal(s.to_dense(), x)
    xp = x.permute(2, 0, 1)
    s = sparsetorch.from_package(xp)
    assert s.values.data_ptr() == x.data_ptr() and torch.equal(s.to_dense(), xp)
    assert torch.equal(s.to_package("torch"), xp)


def test_torch_dense_errors():
    with pytest.raises(InteropError, match="floating point"):
        sparsetorch.from_package(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(InteropError, match="0-d"):
        sparsetorch.from_package(torch.tensor(1.0))


def test_gradients_flow_through_torch_interop():
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    t = torch.sparse_csr_tensor(torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), v, (2, 3), check_invariants=True)
    s = sparsetorch.from_package(t)
    assert s.requires_grad
    (s.to_dense() * torch.arange(6.0, dtype=torch.float64).reshape(2, 3)).sum().backward()
    assert torch.equal(v.grad, torch.tensor([0.0, 2.0, 4.0], dtype=torch.float64))
    back = s.to_package("torch")
    assert back.requires_grad


# sparsetorch -> torch ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,layout", [
    (COO, torch.sparse_coo), (CSR, torch.sparse_csr), (CSC, torch.sparse_csc), (BSR(2, 3), torch.sparse_bsr),
    (BSC(3, 2), torch.sparse_bsc), (DENSE, torch.strided), (DENSE_COL, torch.strided),
])
@pytest.mark.parametrize("idx_dtype", INDEX)
def test_formats_to_torch(fmt, layout, idx_dtype):
    dense = rand_dense(6, 6, seed=5)
    s = SparseTensor.from_dense(dense, fmt, index_dtype=idx_dtype)
    t = s.to_package("torch")
    assert t.layout == layout
    out = t if layout == torch.strided else t.to_dense()
    assert torch.equal(out, dense)
    if layout == torch.strided:
        assert t.data_ptr() == s.values.data_ptr()
    elif layout == torch.sparse_coo:
        assert t._values().data_ptr() == s.values.data_ptr() and t.is_coalesced()
    else:
        comp = t.crow_indices() if layout in (torch.sparse_csr, torch.sparse_bsr) else t.ccol_indices()
        assert comp.data_ptr() == ptr(s.pos(1)) and comp.dtype == idx_dtype
        assert t.values().data_ptr() == s.values.data_ptr()


def test_to_torch_shared_batch_and_errors():
    dense = rand_dense(4, 5, batch=(2,))
    s = SparseTensor.from_dense(dense, CSR)  # two value sets sharing one pattern
    assert s.batch_shape == (2,)
    with pytest.raises(InteropError, match="value sets sharing one pattern"):
        s.to_package("torch")
    d = SparseTensor.from_dense(dense, DENSE)
    assert torch.equal(d.to_package("torch"), dense)  # dense: the batch is just leading dims
    one = s.with_values(s.values[1]).to_package("torch")
    assert torch.equal(one.to_dense(), dense[1])
    for fmt in (DELTA(4), ELL, DIA, DIA_J):
        with pytest.raises(InteropError, match=r"no counterpart in torch.*t\.convert\(sparsetorch\.format\.CSR\)"):
            SparseTensor.from_dense(dense[0], fmt).to_package("torch")
    ragged = SparseTensor.from_dense(rand_dense(5, 5), BSR(2, 2))
    with pytest.raises(InteropError, match="multiple of the block"):
        ragged.to_package("torch")
    with pytest.raises(InteropError, match="unknown option"):
        d.to_package("torch", kind="array")
    with pytest.raises(InteropError, match="unknown package"):
        d.to_package("jax")


def test_transposed_views_match_by_structure(sp):
    dense = rand_dense(4, 6, seed=9)
    csr = SparseTensor.from_dense(dense, CSR)
    t = csr.T.to_package("torch")  # CSR.T is CSC over the same buffers
    assert t.layout == torch.sparse_csc and t.ccol_indices().data_ptr() == ptr(csr.pos(1))
    assert torch.equal(t.to_dense(), dense.T)
    coo_t = SparseTensor.from_dense(dense, COO).T  # rows of a transposed COO are not sorted
    t = coo_t.to_package("torch")
    assert not t.is_coalesced() and torch.equal(t.to_dense(), dense.T)
    B = coo_t.to_package("scipy")
    assert B.format == "coo" and not B.has_canonical_format and np.array_equal(B.toarray(), dense.T.numpy())


def test_coo_from_coo_with_duplicates_is_coalesced_in_torch():
    row, col = torch.tensor([1, 0, 1, 2]), torch.tensor([2, 1, 2, 0])
    s = SparseTensor.from_coo(torch.tensor([1.0, 2.0, 3.0, 4.0]), row, col, shape=(3, 3), format=COO)
    t = s.to_package("torch")
    assert t.is_coalesced() and torch.equal(t._indices(), torch.tensor([[0, 1, 2], [1, 2, 0]]))
    assert torch.equal(t.to_dense(), s.to_dense())
    # without a format the triplets are kept as given: torch's uncoalesced COO, the same matrix
    u = SparseTensor.from_coo(torch.tensor([1.0, 2.0, 3.0, 4.0]), row, col, shape=(3, 3)).to_package("torch")
    assert not u.is_coalesced() and torch.equal(u.to_dense(), s.to_dense())


# SciPy ---------------------------------------------------------------------------------------------

@pytest.fixture
def sp():
    return pytest.importorskip("scipy.sparse")


def _scipy_obj(sp, dense: np.ndarray, fmt: str, kind: str, np_idx):
    cls = getattr(sp, f"{fmt}_{kind}")
    A = cls(dense, blocksize=(2, 3)) if fmt == "bsr" else cls(dense)
    if fmt == "coo":
        A.coords = tuple(c.astype(np_idx) for c in A.coords)
    elif fmt == "dia":
        A.offsets = A.offsets.astype(np_idx)
    else:
        A.sort_indices()  # scipy's dense -> bsr leaves block columns unsorted
        A.indices, A.indptr = A.indices.astype(np_idx), A.indptr.astype(np_idx)
    return A


SCIPY_EXPECTED = {"csr": CSR, "csc": CSC, "coo": COO, "bsr": BSR(2, 3), "dia": DIA_J}


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "bsr", "dia"])
@pytest.mark.parametrize("kind", ["array", "matrix"])
@pytest.mark.parametrize("np_idx", NP_INDEX)
@pytest.mark.parametrize("np_dtype", [np.float64, np.float32])
def test_scipy_round_trip_is_zero_copy(sp, fmt, kind, np_idx, np_dtype):
    dense = rand_dense(6, 9, seed=7).numpy().astype(np_dtype)
    A = _scipy_obj(sp, dense, fmt, kind, np_idx)
    s = sparsetorch.from_package(A)
    assert s.format == SCIPY_EXPECTED[fmt]
    assert s.index_dtype == {np.int64: torch.int64, np.int32: torch.int32}[np_idx]
    assert np.array_equal(s.to_dense().numpy(), dense)
    assert shares(s.values, A.data)
    if fmt == "coo":
        assert shares(s.crd(0), A.coords[0]) and shares(s.crd(1), A.coords[1])
    elif fmt == "dia":
        assert shares(s.crd(0), A.offsets)
    else:
        assert shares(s.crd(1), A.indices) and shares(s.pos(1), A.indptr)
    B = s.to_package("scipy", kind=kind)
    assert B.format == fmt and isinstance(B, sp.sparray) == (kind == "array")
    assert np.array_equal(B.toarray(), dense)
    assert np.shares_memory(B.data, A.data)
    if fmt == "coo":
        assert np.shares_memory(B.coords[0], A.coords[0]) and B.coords[0].dtype == np_idx
        assert B.has_canonical_format
    elif fmt == "dia":
        assert np.shares_memory(B.offsets, A.offsets) and B.offsets.dtype == np_idx
    else:
        assert np.shares_memory(B.indices, A.indices) and np.shares_memory(B.indptr, A.indptr)
        assert B.indices.dtype == np_idx


def test_scipy_csr_unsorted_and_duplicate_indices(sp):
    indptr = np.array([0, 3, 5], dtype=np.int32)
    indices = np.array([2, 0, 1, 3, 1], dtype=np.int32)
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    A = sp.csr_array((data, indices, indptr), shape=(2, 4))
    s = sparsetorch.from_package(A)
    assert s.format == TensorFormat.parse("(i, j) -> (i : dense, j : compressed(unordered))")
    assert not shares(s.crd(1), A.indices)  # copied: SciPy sorts unsorted indices in place (session 26)
    assert np.array_equal(s.to_dense().numpy(), A.toarray())
    with pytest.raises(InteropError, match=r"t\.convert\(sparsetorch\.format\.CSR\)"):
        s.to_package("torch")
    assert torch.equal(s.convert(CSR).to_package("torch").to_dense(), s.to_dense())
    B = s.to_package("scipy")
    assert not np.shares_memory(B.indices, s.crd(1).numpy()) and np.array_equal(B.toarray(), A.toarray())

    dup = sp.csr_array((data, np.array([0, 0, 2, 1, 1], dtype=np.int32), indptr), shape=(2, 4))
    s = sparsetorch.from_package(dup)
    assert s.format == TensorFormat.parse("(i, j) -> (i : dense, j : compressed(nonunique))")
    assert np.array_equal(s.to_dense().numpy(), dup.toarray())
    dup_unsorted = sp.csr_array((data, np.array([2, 0, 2, 1, 1], dtype=np.int32), indptr), shape=(2, 4))
    s = sparsetorch.from_package(dup_unsorted)
    assert s.format == TensorFormat.parse("(i, j) -> (i : dense, j : compressed(nonunique, unordered))")
    assert np.array_equal(s.to_dense().numpy(), dup_unsorted.toarray())


def test_scipy_coo_non_canonical(sp):
    row = np.array([2, 0, 2, 1], dtype=np.int32)
    col = np.array([1, 3, 1, 0], dtype=np.int32)
    A = sp.coo_array((np.array([1.0, 2.0, 3.0, 4.0]), (row, col)), shape=(3, 4))
    s = sparsetorch.from_package(A)
    assert s.format == UNORDERED_COO and shares(s.crd(0), A.coords[0])
    assert np.array_equal(s.to_dense().numpy(), A.toarray())
    B = s.to_package("scipy")
    assert not B.has_canonical_format and np.array_equal(B.toarray(), A.toarray())
    assert np.array_equal(s.to_package("torch").to_dense().numpy(), A.toarray())


def test_scipy_dia_irregular(sp):
    data = np.arange(1.0, 13.0).reshape(3, 4)
    unsorted = sp.dia_array((data, np.array([1, -1, 0])), shape=(4, 4))
    s = sparsetorch.from_package(unsorted)
    assert s.format == TensorFormat.parse("(i, j) -> (j - i : compressed(unordered), j : range)")
    assert shares(s.values, unsorted.data) and np.array_equal(s.to_dense().numpy(), unsorted.toarray())
    assert np.array_equal(s.to_package("scipy").toarray(), unsorted.toarray())

    repeated = sp.dia_array((data, np.array([0, 1, 2])), shape=(4, 4))
    repeated.offsets = np.array([0, 1, 0], dtype=np.int32)  # scipy's constructor refuses this, attributes don't
    s = sparsetorch.from_package(repeated)
    assert s.format == TensorFormat.parse("(i, j) -> (j - i : compressed(nonunique, unordered), j : range)")
    expect = np.diag(data[0]) + np.diag(data[2]) + np.diag(data[1, 1:], 1)
    assert np.array_equal(s.to_dense().numpy(), expect)
    with pytest.raises(InteropError, match=r"t\.convert\(sparsetorch\.format\.DIA_J\)"):
        s.to_package("scipy")
    assert np.array_equal(s.convert(DIA_J).to_package("scipy").toarray(), expect)

    narrow = sp.dia_array((np.ones((2, 3)), np.array([0, 2])), shape=(4, 6))  # width 3 < 6 columns
    s = sparsetorch.from_package(narrow)
    assert s.format == DIA_J and np.array_equal(s.to_dense().numpy(), narrow.toarray())
    wide = sp.dia_array((np.arange(16.0).reshape(2, 8), np.array([-1, 10])), shape=(4, 6))  # width 8 > 6, offset 10 misses
    s = sparsetorch.from_package(wide)
    assert s.format == DIA_J and s.crd(0).tolist() == [-1]
    assert np.array_equal(s.to_dense().numpy(), wide.toarray())


def test_scipy_mixed_index_dtypes_become_int64(sp):
    A = sp.csr_array(rand_dense(4, 5).numpy())
    A.indptr = A.indptr.astype(np.int32)
    A.indices = A.indices.astype(np.int64)
    s = sparsetorch.from_package(A)
    assert s.index_dtype == torch.int64 and s.pos(1).dtype == s.crd(1).dtype == torch.int64
    assert shares(s.crd(1), A.indices) and not shares(s.pos(1), A.indptr)
    assert np.array_equal(s.to_dense().numpy(), A.toarray())


def test_scipy_nd_and_1d(sp):
    x = rand_dense(3, 4, batch=(2,)).numpy()
    A = sp.coo_array(x)
    s = sparsetorch.from_package(A)
    assert s.format == COO_ND(3) and np.array_equal(s.to_dense().numpy(), x)
    B = s.to_package("scipy")
    assert B.shape == x.shape and np.array_equal(B.toarray(), x) and np.shares_memory(B.coords[2], A.coords[2])
    with pytest.raises(InteropError, match="coo_matrix is 2-D"):
        s.to_package("scipy", kind="matrix")
    v = sp.csr_array(np.array([1.0, 0.0, 2.0]))
    if v.ndim == 1:  # SciPy >= 1.15
        s = sparsetorch.from_package(v)
        assert s.shape == (3,) and np.array_equal(s.to_dense().numpy(), [1.0, 0.0, 2.0])


def test_scipy_assembly_formats_are_refused(sp):
    for A in (sp.lil_array((3, 3)), sp.dok_array((3, 3)), sp.lil_matrix((3, 3))):
        with pytest.raises(InteropError, match=r"\.tocsr\(\)"):
            sparsetorch.from_package(A)
    with pytest.raises(InteropError, match="astype"):
        sparsetorch.from_package(sp.csr_array(np.eye(3, dtype=np.int64)))


def test_scipy_bad_data_raises_validation_error(sp):
    data = np.array([1.0, 2.0, 3.0])
    bad_index = sp.csr_array((data, np.array([0, 5, 1]), np.array([0, 2, 3])), shape=(2, 3))
    with pytest.raises(ValidationError, match="out of range"):
        sparsetorch.from_package(bad_index)
    bad_ptr = sp.csr_array((data, np.array([0, 2, 1]), np.array([0, 2, 3])), shape=(2, 3))
    bad_ptr.indptr = np.array([0, 3, 2])
    with pytest.raises(ValidationError, match="non-decreasing"):
        sparsetorch.from_package(bad_ptr)
    short = sp.csr_array((data, np.array([0, 2, 1]), np.array([0, 2, 3])), shape=(2, 3))
    short.data = short.data[:2]
    with pytest.raises(ValidationError):
        sparsetorch.from_package(short)
    coo = sp.coo_array((data, (np.array([0, 1, 1]), np.array([0, 1, 2]))), shape=(2, 3))
    coo.coords = (np.array([0, 1, 7]), coo.coords[1])
    with pytest.raises(ValidationError):
        sparsetorch.from_package(coo)
    dia = sp.dia_array((np.ones((2, 3)), np.array([0, 1])), shape=(3, 3))
    dia.offsets = np.array([0, 1, 2])
    with pytest.raises(ValidationError, match="one row per offset"):
        sparsetorch.from_package(dia)


def test_to_scipy_errors_and_detach(sp):
    dense = rand_dense(4, 6)
    with pytest.raises(InteropError, match=r"DIA_J"):
        SparseTensor.from_dense(dense, DIA).to_package("scipy")
    with pytest.raises(InteropError, match=r"no counterpart in scipy.*csr, csc, coo, bsr and dia.*t\.convert"):
        SparseTensor.from_dense(dense, BSC(2, 2)).to_package("scipy")
    with pytest.raises(InteropError, match="no counterpart in scipy"):
        SparseTensor.from_dense(dense, DELTA(2)).to_package("scipy")
    with pytest.raises(InteropError, match="scipy sparse matrices have no batch"):
        SparseTensor.from_dense(rand_dense(4, 6, batch=(2,)), CSR).to_package("scipy")
    mask = dense != 0
    bt = sparsetorch.from_package(torch.stack([mask * 1.0, mask * 2.0]).double().to_sparse_csr())
    with pytest.raises(InteropError, match="batched"):
        bt.to_package("scipy")
    with pytest.raises(InteropError, match="kind must be"):
        SparseTensor.from_dense(dense, CSR).to_package("scipy", kind="dense")
    with pytest.raises(InteropError, match="multiple of the block"):
        SparseTensor.from_dense(rand_dense(5, 5), BSR(2, 2)).to_package("scipy")
    s = SparseTensor.from_dense(dense, CSR).requires_grad_()
    B = s.to_package("scipy")
    assert np.shares_memory(B.data, s.values.detach().numpy()) and np.array_equal(B.toarray(), dense.numpy())


def test_convert_chain_to_scipy(sp):
    g = torch.Generator().manual_seed(11)
    row, col = torch.randint(0, 8, (20,), generator=g), torch.randint(0, 40, (20,), generator=g)
    s = SparseTensor.from_coo(torch.randn(20, generator=g, dtype=torch.float64), row, col, shape=(8, 40), format=COO)
    assert s.format == COO
    csr = s.convert(DELTA(4)).convert(CSR)
    B = csr.to_package("scipy")
    assert B.format == "csr" and np.allclose(B.toarray(), s.to_dense().numpy())
    assert np.shares_memory(B.indices, csr.crd(1).numpy())
    # explicit zeros that DELTA(4) inserted to bridge gaps stay explicit through the chain
    assert np.allclose(sparsetorch.from_package(B).to_dense().numpy(), s.to_dense().numpy())


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 7), density=st.floats(0.0, 1.0), seed=st.integers(0, 10_000),
       fmt=st.sampled_from(["csr", "csc", "coo", "bsr", "dia"]))
def test_scipy_round_trip_property(m, n, density, seed, fmt):
    sp = pytest.importorskip("scipy.sparse")
    dense = rand_dense(m, n, density=density, seed=seed).numpy()
    A = getattr(sp, f"{fmt}_array")(dense, **({"blocksize": (1, 1)} if fmt == "bsr" else {}))
    s = sparsetorch.from_package(A)
    assert np.array_equal(s.to_dense().numpy(), dense)
    assert np.array_equal(s.to_package("scipy").toarray(), dense)
    if fmt != "dia":
        assert torch.equal(s.to_package("torch").to_dense(), torch.from_numpy(dense))


def test_empty_matrices_wrap(sp):
    for fmt in ("csr", "csc", "coo", "bsr", "dia"):
        A = getattr(sp, f"{fmt}_array")((4, 6))
        s = sparsetorch.from_package(A)
        assert s.shape == (4, 6) and s.nse == 0
        assert s.to_package("scipy").nnz == 0 and s.to_package("scipy").shape == (4, 6)
    t = sparsetorch.from_package(sp.csr_array((4, 6))).to_package("torch")
    assert t.layout == torch.sparse_csr and t._nnz() == 0


def test_empty_matrix_to_dense():
    s = sparsetorch.from_package(torch.zeros(3, 4).to_sparse_csr())
    assert torch.equal(s.to_dense(), torch.zeros(3, 4))


# NumPy -------------------------------------------------------------------------------------------

def test_numpy_dense_layouts():
    a = np.arange(12.0).reshape(3, 4)
    s = sparsetorch.from_package(a)
    assert s.format == DENSE and shares(s.values, a) and np.array_equal(s.to_dense().numpy(), a)
    back = s.to_package("numpy")
    assert np.shares_memory(back, a) and np.array_equal(back, a)

    f = np.asfortranarray(a)
    s = sparsetorch.from_package(f)
    assert s.format == DENSE_COL and shares(s.values, f) and np.array_equal(s.to_dense().numpy(), a)
    back = s.to_package("numpy")
    assert np.shares_memory(back, f) and back.flags.f_contiguous and np.array_equal(back, a)

    x = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    s = sparsetorch.from_package(x)
    assert s.format == DENSE_ND(3) and shares(s.values, x) and np.array_equal(s.to_package("numpy"), x)

    for view in (a[:, ::2], a[::-1]):  # strided / negative strides: copied
        s = sparsetorch.from_package(view)
        assert not shares(s.values, a) and np.array_equal(s.to_dense().numpy(), view)


def test_numpy_errors_and_batch():
    with pytest.raises(InteropError, match=r"t\.convert\(sparsetorch\.format\.DENSE\)"):
        SparseTensor.from_dense(rand_dense(3, 3), CSR).to_package("numpy")
    with pytest.raises(InteropError, match="astype"):
        sparsetorch.from_package(np.ones((2, 2), dtype=np.int32))
    with pytest.raises(InteropError, match="mask"):
        sparsetorch.from_package(np.ma.masked_array(np.ones((2, 2)), mask=[[0, 1], [0, 0]]))
    with pytest.raises(InteropError, match="0-d"):
        sparsetorch.from_package(np.array(1.0))
    dense = rand_dense(3, 4, batch=(2,))
    s = SparseTensor.from_dense(dense, DENSE_COL)
    assert np.array_equal(s.to_package("numpy"), dense.numpy())


# Dispatch, lazy imports, devices ------------------------------------------------------------------

def test_dispatch_and_methods():
    s = SparseTensor.from_dense(rand_dense(3, 3), CSR)
    assert sparsetorch.from_package(s) is s
    t = s.to_package(torch)  # the module itself is accepted
    assert SparseTensor.from_package(t).equal(s)
    with pytest.raises(InteropError, match="scipy.sparse csr/csc/coo/bsr/dia"):
        sparsetorch.from_package([[1.0, 2.0]])
    with pytest.raises(InteropError, match="takes a SparseTensor"):
        sparsetorch.tensor.interop.to_package(t, "scipy")


def test_dlpack_objects_are_taken_as_dense():
    class Box:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    x = torch.randn(3, 2, dtype=torch.float64)
    s = sparsetorch.from_package(Box(x))
    assert s.format == DENSE and s.values.data_ptr() == x.data_ptr()


def test_import_stays_lazy():
    code = textwrap.dedent("""
        import sys, torch
        import sparsetorch
        t = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).to_sparse_csr()
        s = sparsetorch.from_package(t)
        s.to_package("torch"); sparsetorch.from_package(t.to_dense()).to_package("numpy")
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "cupy", "cupyx"))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cpu_tensor_to_cupy_says_cuda():
    with pytest.raises(InteropError, match=r"\.cuda\(\)"):
        SparseTensor.from_dense(rand_dense(3, 3), CSR).to_package("cupy")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_cuda_round_trip_and_host_errors():
    dense = rand_dense(6, 6).cuda()
    t = dense.to_sparse_csr()
    s = sparsetorch.from_package(t)
    assert s.device.type == "cuda" and ptr(s.pos(1)) == t.crow_indices().data_ptr()
    assert torch.equal(s.to_dense(), dense) and torch.equal(s.to_package("torch").to_dense(), dense)
    with pytest.raises(InteropError, match=r"\.cpu\(\)"):
        s.to_package("scipy")
    with pytest.raises(InteropError, match=r"\.cpu\(\)"):
        sparsetorch.from_package(dense).to_package("numpy")


@needs_cuda
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dia"])
def test_cupy_round_trip(fmt):
    cupy = pytest.importorskip("cupy")
    csp = pytest.importorskip("cupyx.scipy.sparse")
    sp = pytest.importorskip("scipy.sparse")
    host = rand_dense(6, 7, seed=2).numpy()
    A = getattr(csp, f"{fmt}_matrix")(getattr(sp, f"{fmt}_matrix")(host))
    s = sparsetorch.from_package(A)
    assert s.device.type == "cuda" and s.format == SCIPY_EXPECTED[fmt]
    assert s.values.data_ptr() == A.data.data.ptr
    assert np.array_equal(s.to_dense().cpu().numpy(), host)
    B = s.to_package("cupy")
    assert B.format == fmt and B.data.data.ptr == A.data.data.ptr
    assert np.array_equal(cupy.asnumpy(B.toarray()), host)


@needs_cuda
def test_cupy_dense():
    cupy = pytest.importorskip("cupy")
    a = cupy.arange(12.0).reshape(3, 4)
    s = sparsetorch.from_package(a)
    assert s.format == DENSE and s.values.data_ptr() == a.data.ptr
    back = s.to_package("cupy")
    assert back.data.ptr == a.data.ptr and bool((back == a).all())
    s = sparsetorch.from_package(cupy.asfortranarray(a))
    assert s.format == DENSE_COL


def test_scipy_csr_with_repeated_indices_is_copied_not_shared(sp):
    """SciPy sums repeated entries in place, inside the arrays, from calls that look read-only: a tensor
    sharing them then read a compacted prefix with the old length (to_dense wrong, solve crashed;
    session 23's sweep). Such a matrix's arrays are copied; canonical ones stay shared."""
    import numpy as np
    import scipy.sparse.linalg as sl

    A = sp.csr_array((np.array([4.0, -1.0, 1.0, -1.0, 4.0]), np.array([0, 1, 0, 0, 1]), np.array([0, 3, 5])),
                     shape=(2, 2))
    At = sparsetorch.from_package(A)
    assert not At.format.is_unique and not np.shares_memory(A.data, At.values.numpy())
    sl.norm(A, 1)  # sums the repeats in place
    ref = torch.tensor([[5.0, -1.0], [-1.0, 4.0]], dtype=torch.float64)
    assert torch.equal(At.to_dense(), ref)
    torch.testing.assert_close(sparsetorch.solve(At, torch.ones(2, dtype=torch.float64)),
                               torch.linalg.solve(ref, torch.ones(2, dtype=torch.float64)))
    B = sp.random_array((6, 6), density=0.5, format="csr", random_state=0)
    assert np.shares_memory(B.data, sparsetorch.from_package(B).values.numpy())


@pytest.mark.parametrize("kind", ["csr", "csc", "bsr"])
def test_scipy_unsorted_indices_are_copied_both_ways(sp, kind):
    """SciPy sorts unsorted indices in place (scipy.sparse.linalg.norm): a tensor sharing them kept its cached
    coordinates and product plan of the old order (A @ x, to_dense and convert answered another matrix; session
    26's sweep). Unsorted or repeated arrays are copied by from_package and by to_package('scipy')."""
    import numpy as np
    import scipy.sparse.linalg as sl

    from sparsetorch.format import CSC as CSC_, TensorFormat

    rng = np.random.default_rng(1)
    dense = rng.standard_normal((4, 4)) * (rng.random((4, 4)) < 0.7)
    S = sp.bsr_array(dense, blocksize=(2, 2)) if kind == "bsr" else getattr(sp, f"{kind}_array")(dense)
    # reverse each segment: unsorted (the same matrix)
    for r in range(len(S.indptr) - 1):
        a, b = S.indptr[r], S.indptr[r + 1]
        S.indices[a:b] = S.indices[a:b][::-1].copy()
        S.data[a:b] = S.data[a:b][::-1].copy()
    S.has_sorted_indices = False
    x = torch.tensor(rng.standard_normal(4))
    ref = torch.tensor(dense)
    A = sparsetorch.from_package(S)
    assert not A.format.is_ordered
    torch.testing.assert_close(A @ x, ref @ x)
    sl.norm(S)  # sorts S's arrays in place
    assert S.has_sorted_indices
    assert torch.equal(A.to_dense(), ref)
    torch.testing.assert_close(A @ x, ref @ x)
    assert torch.equal(A.convert(CSC_).to_dense(), ref)
    # the other direction: a tensor of unordered format handed to SciPy
    fmt = TensorFormat.parse("(i, j) -> (i : dense, j : compressed(unordered))")
    crow, col, vals = torch.tensor([0, 2, 4]), torch.tensor([1, 0, 1, 0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    B = sparsetorch.SparseTensor(fmt, (2, 2), [None, crow], [None, col], vals.double())
    y = torch.tensor([1.0, 10.0], dtype=torch.float64)
    torch.testing.assert_close(B @ y, torch.tensor([12.0, 34.0], dtype=torch.float64))
    sl.norm(B.to_package("scipy"))
    torch.testing.assert_close(B @ y, torch.tensor([12.0, 34.0], dtype=torch.float64))
    assert torch.equal(col, torch.tensor([1, 0, 1, 0]))


def test_scipy_repeated_indices_handed_to_scipy_are_copied(sp):
    import scipy.sparse.linalg as sl

    from sparsetorch.format import TensorFormat

    fmt = TensorFormat.parse("(i, j) -> (i : dense, j : compressed(nonunique))")
    A = sparsetorch.SparseTensor(fmt, (2, 2), [None, torch.tensor([0, 2, 4])], [None, torch.tensor([0, 0, 1, 1])],
                                 torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    sl.norm(A.to_package("scipy"))  # SciPy sums the repeats in place
    assert torch.equal(A.to_dense(), torch.tensor([[3.0, 0.0], [0.0, 7.0]], dtype=torch.float64))
    A.validate()


def test_validate_after_a_numpy_write_drops_what_was_derived(sp):
    """A write through NumPy into shared index arrays (documented: call validate() after it) left A @ x on the
    plan of the old contents, validate() passing (session 26's sweep): validate() moves the counters on."""
    import numpy as np

    S = sp.csr_array((np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 0, 1]), np.array([0, 2, 4])), shape=(2, 3))
    A = sparsetorch.from_package(S)
    x = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    torch.testing.assert_close(A @ x, torch.tensor([21.0, 43.0], dtype=torch.float64))
    A.to_dense()
    S.indices[:] = [0, 2, 1, 2]  # still valid, another matrix
    A.validate()
    torch.testing.assert_close(A @ x, torch.tensor(S @ x.numpy()))
    assert torch.equal(A.to_dense(), torch.tensor(S.toarray()))


def test_scipy_1d_csr_array_with_unsorted_indices_is_copied(sp):
    import numpy as np

    a = sp.csr_array((np.array([1.0, 2.0, 3.0]), np.array([4, 1, 1]), np.array([0, 3])), shape=(6,))
    T = sparsetorch.from_package(a)
    a.sum()  # SciPy sorts and sums in place
    assert torch.equal(T.to_dense(), torch.tensor([0.0, 5.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64))
    b = sp.csr_array((np.array([1.0, 2.0, 3.0]), np.array([1, 2, 4]), np.array([0, 3])), shape=(6,))
    assert np.shares_memory(b.data, sparsetorch.from_package(b).values.numpy())


def test_validate_of_unchanged_buffers_keeps_plans_and_saved_graphs(sp):
    """validate() moves the counters on only where the contents changed since their fingerprint was taken: a
    second validate() of unchanged buffers keeps the plans and lets a graph that saved the buffers run backward."""
    import numpy as np

    S = sp.csr_array((np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 0, 1]), np.array([0, 2, 4])), shape=(2, 3))
    A = sparsetorch.from_package(S)
    A.validate()
    versions = [b._version for b in A._index]
    A.validate()
    assert [b._version for b in A._index] == versions
    v = A.values.clone().requires_grad_()
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    y = (v * x[A.crd(1)]).sum()  # autograd saves the index buffer
    A.validate()
    y.backward()
    torch.testing.assert_close(v.grad, x[A.crd(1)])


def test_validate_sees_a_write_through_arrays_exported_to_scipy(sp):
    """A torch-built tensor handed to SciPy zero-copy, its indices then written there: validate() (the documented
    step) must rebuild what was derived from the old contents (the fingerprint is taken at the export; session 26's
    review)."""
    import numpy as np

    A = sparsetorch.from_package(torch.sparse_csr_tensor(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 0, 1]),
                                                         torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
                                                         (2, 3)))
    x = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    A @ x
    A.to_dense()
    S = A.to_package("scipy")
    assert np.shares_memory(S.indices, A.crd(1).numpy())
    S.indices[:] = [0, 2, 1, 2]
    A.validate()
    torch.testing.assert_close(A @ x, torch.tensor(S @ x.numpy()))
    assert torch.equal(A.to_dense(), torch.tensor(S.toarray()))
