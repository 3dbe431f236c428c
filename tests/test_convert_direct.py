"""The direct conversions among CSR, CSC and COO (construct._direct): exact against SciPy's
buffers and the dense reference, for both index dtypes, any value dtype and value batches,
with SciPy's compiled kernel and with the pure-torch path; the value map computed on first
use agrees with the values moved in the first pass; outputs are trusted but user input is not."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetorch import SparseTensor, ValidationError
from sparsetorch.format import COO, CSC, CSR, LevelFormat, LevelProperty, TensorFormat
from sparsetorch.format.named import i, j
from sparsetorch.tensor import construct

#: COO ordered by column (column-major coordinates): the direct path handles any dimension order.
COO_T = TensorFormat([i, j], {j: (LevelFormat.COMPRESSED, LevelProperty.NONUNIQUE), i: LevelFormat.SINGLETON})
FORMATS = {"CSR": CSR, "CSC": CSC, "COO": COO, "COO_T": COO_T}
PAIRS = [(a, b) for a in FORMATS for b in FORMATS if a != b]


@pytest.fixture(params=["scipy", "torch"])
def path(request, monkeypatch):
    """Run each test with SciPy's compiled kernel and with the pure-torch path."""
    monkeypatch.setattr(construct, "USE_SCIPY", request.param == "scipy")
    monkeypatch.setattr(construct, "SCIPY_MIN_ENTRIES", 0)  # the small test matrices take SciPy's path too
    return request.param


def random_csr(m: int, n: int, density: float, seed: int) -> sp.csr_array:
    a = sp.random_array((m, n), density=density, format="csr", rng=np.random.default_rng(seed))
    a.sort_indices()
    return a


def reference(a: sp.csr_array, name: str):
    """SciPy's buffers of ``a`` in format ``name`` (sorted), as int64 / the values."""
    if name == "CSR":
        return [a.indptr], [a.indices], a.data
    if name == "CSC":
        c = a.tocsc()
        c.sort_indices()
        return [c.indptr], [c.indices], c.data
    if name == "COO":
        c = a.tocoo()
        return [np.array([0, a.nnz])], [c.row, c.col], c.data
    c = a.tocsc().tocoo()  # column-major order
    return [np.array([0, a.nnz])], [c.col, c.row], c.data


def wrap(a: sp.csr_array, name: str, idt: torch.dtype, dtype: torch.dtype, batch: int = 0) -> SparseTensor:
    pos, crd, vals = reference(a, name)
    fmt = FORMATS[name]
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.int64)).to(idt)  # noqa: E731
    if name in ("CSR", "CSC"):
        p, c = [None, t(pos[0])], [None, t(crd[0])]
    else:
        p, c = [t(pos[0]), None], [t(crd[0]), t(crd[1])]
    v = torch.from_numpy(vals.copy()).to(dtype)
    if batch:
        v = torch.stack([v * (k + 1) for k in range(batch)])
    return SparseTensor(fmt, a.shape, p, c, v, check=True)  # validated: user input


def assert_buffers(out: SparseTensor, a: sp.csr_array, name: str, idt: torch.dtype, dtype: torch.dtype, batch: int = 0):
    pos, crd, vals = reference(a, name)
    assert out.format.levels == FORMATS[name].levels
    got_pos = [b for b in out.pos_buffers if b is not None]
    got_crd = [b for b in out.crd_buffers if b is not None]
    for got, ref in zip(got_pos + got_crd, pos + crd):
        assert got.dtype == idt
        assert np.array_equal(got.numpy(), np.asarray(ref, dtype=np.int64))
    ref_v = torch.from_numpy(vals.copy()).to(dtype)
    if batch:
        ref_v = torch.stack([ref_v * (k + 1) for k in range(batch)])
    assert out.values.dtype == dtype
    assert torch.equal(out.values, ref_v)  # exact: a permutation of the values, no arithmetic


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(0, 40), density=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       seed=st.integers(0, 2**16), src=st.sampled_from(list(FORMATS)), dst=st.sampled_from(list(FORMATS)),
       idt_in=st.sampled_from([torch.int32, torch.int64]), idt_out=st.sampled_from([torch.int32, torch.int64]),
       scipy_path=st.booleans())
def test_direct_conversions_match_scipy(m, n, density, seed, src, dst, idt_in, idt_out, scipy_path):
    a = random_csr(m, n, density, seed)
    t = wrap(a, src, idt_in, torch.float64)
    old = construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES
    construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES = scipy_path, 0
    try:
        out = t.convert(FORMATS[dst], index_dtype=idt_out)
    finally:
        construct.USE_SCIPY, construct.SCIPY_MIN_ENTRIES = old
    assert_buffers(out, a, dst, idt_out, torch.float64)
    assert torch.equal(out.to_dense(), torch.from_numpy(a.toarray()))
    out.validate()  # the trusted output passes the full checks


@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.complex128, torch.float16, torch.bfloat16])
def test_every_pair_and_value_dtype(path, src, dst, dtype):
    a = random_csr(57, 31, 0.2, 3)
    if dtype.is_complex:
        a = a + 1j * random_csr(57, 31, 0.2, 3)
        a.sort_indices()
    out = wrap(a, src, torch.int64, dtype).convert(FORMATS[dst])
    assert_buffers(out, a, dst, torch.int64, dtype)


@pytest.mark.parametrize("src,dst", PAIRS)
def test_value_batches(path, src, dst):
    a = random_csr(23, 45, 0.15, 5)
    out = wrap(a, src, torch.int32, torch.float64, batch=3).convert(FORMATS[dst])
    assert out.shape == (3, 23, 45)
    assert_buffers(out, a, dst, torch.int32, torch.float64, batch=3)


@pytest.mark.parametrize("src,dst", PAIRS)
def test_cached_conversion_moves_new_values_like_the_first(path, src, dst):
    """The first conversion may move the values in the kernel's pass and compute the value map
    later: the map must give what the first pass gave, for new values and for values written
    in place after the conversion was planned."""
    a = random_csr(40, 40, 0.1, 7)
    t = wrap(a, src, torch.int64, torch.float64)
    first = t.convert(FORMATS[dst])
    again = t.convert(FORMATS[dst])  # cached: through the value map
    assert torch.equal(again.values, first.values)
    conv = construct.conversion(t, FORMATS[dst], torch.int64)
    new = torch.randn(t.nse, dtype=torch.float64)
    got = conv.apply(t.with_values(new))
    transposed = FORMATS[src].levels[0].expr != FORMATS[dst].levels[0].expr
    assert (conv.src is not None) == transposed  # same major: the value slots keep their order
    assert torch.equal(got.values, new if conv.src is None else new[conv.src])
    assert torch.equal(got.to_dense(), t.with_values(new).to_dense())
    # planned with the values moved, then those values written in place: the next apply sees the write
    t2 = wrap(a, src, torch.int64, torch.float64)
    conv2 = construct.conversion(t2, FORMATS[dst], torch.int64, values_too=True)
    t2.values.mul_(-2.0)
    assert torch.equal(conv2.apply(t2).to_dense(), -2.0 * torch.from_numpy(a.toarray()))


@pytest.mark.parametrize("src,dst", PAIRS)
def test_gradient_flows_through_direct_conversion(path, src, dst):
    a = random_csr(12, 9, 0.3, 11)
    t = wrap(a, src, torch.int64, torch.float64)
    v = t.values.clone().requires_grad_(True)
    out = t.with_values(v).convert(FORMATS[dst])
    w = torch.randn(out.nse, dtype=torch.float64)
    (out.values * w).sum().backward()
    # d/dv of sum(w * P v) = P^T w: each source slot gets the weight of the target slot it went to
    back = out.with_values(w).convert(FORMATS[src])
    assert torch.equal(v.grad, back.values)


def test_outputs_are_trusted_but_user_input_is_still_checked():
    a = random_csr(30, 30, 0.2, 1)
    t = wrap(a, "CSR", torch.int64, torch.float64)
    t.convert(CSC)
    # nothing of the conversion's trust leaks into a user's later construction
    bad_pos = torch.from_numpy(a.indptr.astype(np.int64)).clone()
    bad_pos[-1] += 1
    with pytest.raises(ValidationError):
        SparseTensor(CSR, a.shape, [None, bad_pos], [None, torch.from_numpy(a.indices.astype(np.int64))],
                     torch.from_numpy(a.data), check=False)
    unsorted = torch.from_numpy(a.indices.astype(np.int64)).flip(0)
    with pytest.raises(ValidationError):
        SparseTensor(CSR, a.shape, [None, torch.from_numpy(a.indptr.astype(np.int64))], [None, unsorted],
                     torch.from_numpy(a.data), check=True)


def test_converting_a_tensor_whose_buffers_were_written_revalidates():
    a = random_csr(20, 20, 0.3, 2)
    t = wrap(a, "CSR", torch.int64, torch.float64)
    t.crd(1)[0] = 10_000  # out of range, written in place after validation
    with pytest.raises(ValidationError):
        t.convert(CSC)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_direct_conversions_on_cuda_equal_scipy(src, dst, idt):
    a = random_csr(300, 200, 0.05, 9)
    t = wrap(a, src, idt, torch.float64)
    tc = SparseTensor(t.format, t.shape, [None if b is None else b.cuda() for b in t.pos_buffers],
                      [None if b is None else b.cuda() for b in t.crd_buffers], t.values.cuda(), check=True)
    out = tc.convert(FORMATS[dst]).cpu()
    assert_buffers(out, a, dst, idt, torch.float64)
    out.validate()


# BSR and DIA through the kernel paths -------------------------------------------------------

from sparsetorch.format import BSR, DIA, DIA_J  # noqa: E402


def csr_tensor(a: sp.csr_array, idt: torch.dtype = torch.int64) -> SparseTensor:
    return wrap(a, "CSR", idt, torch.float64)


def dense_ref(a: sp.csr_array) -> torch.Tensor:
    return torch.from_numpy(a.toarray())


@pytest.mark.parametrize("shape,blk", [((40, 60), (2, 2)), ((40, 60), (4, 3)), ((41, 61), (2, 2)), ((0, 8), (2, 2))])
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_bsr_both_ways_match_scipy(path, shape, blk, idt):
    a = random_csr(*shape, 0.1, 21)
    t = csr_tensor(a, idt)
    out = t.convert(BSR(*blk), max_fill=float("inf"))
    if shape[0] % blk[0] == 0 and shape[1] % blk[1] == 0 and a.nnz:
        ref = a.tobsr(blocksize=blk)
        ref.sort_indices()
        assert np.array_equal(out.pos(1).numpy(), ref.indptr)
        assert np.array_equal(out.crd(1).numpy(), ref.indices)
        assert torch.equal(out.values, torch.from_numpy(ref.data.reshape(-1)))
    assert out.pos(1).dtype == idt
    assert torch.equal(out.to_dense(), dense_ref(a))
    out.validate()
    back = out.convert(CSR)  # keeps the blocks' explicit zeros, as SciPy's bsr.tocsr does
    assert torch.equal(back.to_dense(), dense_ref(a))
    back.validate()
    if shape[0] % blk[0] == 0 and shape[1] % blk[1] == 0 and a.nnz:
        sb = a.tobsr(blocksize=blk)
        sb.sort_indices()
        ref_back = sb.tocsr()
        assert np.array_equal(back.pos(1).numpy(), ref_back.indptr)
        assert np.array_equal(back.crd(1).numpy(), ref_back.indices)
        assert torch.equal(back.values, torch.from_numpy(ref_back.data))
    # the value maps (computed on first use) agree with the values moved in the first pass
    new = torch.randn(t.nse, dtype=torch.float64)
    assert torch.equal(t.with_values(new).convert(BSR(*blk), max_fill=float("inf")).to_dense(),
                       t.with_values(new).to_dense())
    newb = torch.randn(out.nse, dtype=torch.float64)
    assert torch.equal(out.with_values(newb).convert(CSR).to_dense(), out.with_values(newb).to_dense())


def banded(m: int, n: int, offsets, seed: int, zeros: bool = False) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((len(offsets), n))
    if zeros:
        data[:, ::3] = 0.0
    a = sp.dia_array((data, offsets), shape=(m, n)).tocsr()
    a.sort_indices()
    return a


@pytest.mark.parametrize("kind", ["DIA", "DIA_J"])
@pytest.mark.parametrize("shape,offsets", [((30, 30), [-3, 0, 2]), ((20, 35), [-19, -1, 0, 5, 34]),
                                          ((35, 20), [-30, 0, 1, 19]), ((10, 10), [0])])
def test_dia_both_ways(path, kind, shape, offsets):
    fmt = DIA if kind == "DIA" else DIA_J
    a = banded(*shape, offsets, 4)
    t = csr_tensor(a)
    out = t.convert(fmt, max_fill=float("inf"))
    assert out.crd(0).tolist() == sorted(set(np.sort(a.todia().offsets).tolist()))
    width = shape[0] if kind == "DIA" else shape[1]
    assert out.nse == len(out.crd(0)) * width
    assert torch.equal(out.to_dense(), dense_ref(a))
    out.validate()
    back = out.convert(CSR)
    assert torch.equal(back.to_dense(), dense_ref(a))
    back.validate()
    # every slot of a diagonal inside the shape is an entry (SciPy's tocsr drops zeros; we keep them)
    inside = sum(max(0, min(shape[1], shape[0] + o) - max(0, o)) for o in out.crd(0).tolist())
    assert back.nse == inside
    new = torch.randn(out.nse, dtype=torch.float64)
    assert torch.equal(out.with_values(new).convert(CSR).to_dense(), out.with_values(new).to_dense())
    newc = torch.randn(t.nse, dtype=torch.float64)
    assert torch.equal(t.with_values(newc).convert(fmt, max_fill=float("inf")).to_dense(), t.with_values(newc).to_dense())


@pytest.mark.parametrize("kind", ["DIA", "DIA_J"])
def test_dia_explicit_zeros_stay_entries(path, kind):
    """SciPy's dia_tocsr drops zeros: the kernel path must fall back to the value map."""
    fmt = DIA if kind == "DIA" else DIA_J
    a = banded(25, 25, [-2, 0, 3], 8, zeros=True)
    d = csr_tensor(a).convert(fmt)
    vals = d.values.clone()
    vals[::2] = 0.0
    z = d.with_values(vals)
    back = SparseTensor(z.format, z.shape, z.pos_buffers, z.crd_buffers, z.values, check=True).convert(CSR)
    inside = sum(max(0, min(25, 25 + o) - max(0, o)) for o in d.crd(0).tolist())
    assert back.nse == inside
    assert torch.equal(back.to_dense(), z.to_dense())


def test_fill_guard_still_refuses_through_the_kernel_paths(path):
    from sparsetorch import ConversionError

    a = random_csr(2000, 2000, 0.0005, 3)  # 2000 nonzeros: the bound is 8 x 2000 + 65536 slots
    with pytest.raises(ConversionError):
        csr_tensor(a).convert(BSR(8, 8))  # ~2000 blocks of 64 slots
    with pytest.raises(ConversionError):
        csr_tensor(a).convert(DIA)


@pytest.mark.parametrize("fmt", [BSR(2, 2), DIA, DIA_J])
def test_kernel_paths_keep_gradients(path, fmt):
    a = banded(12, 12, [-1, 0, 2], 5)
    t = csr_tensor(a)
    v = t.values.clone().requires_grad_(True)
    out = t.with_values(v).convert(fmt)
    w = torch.randn(out.nse, dtype=torch.float64)
    (out.values * w).sum().backward()
    # each source value went to one slot: its gradient is that slot's weight
    back = out.with_values(w).convert(CSR)
    ref = back.to_dense()
    assert torch.equal(v.grad, ref[torch.from_numpy(np.repeat(np.arange(12), np.diff(a.indptr))),
                                   torch.from_numpy(a.indices.astype(np.int64))])
