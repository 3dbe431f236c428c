"""The lean path of the direct CSR / CSC / COO conversions (construct._convert_direct) and the
checks of wrapping (validate's per-format plans): index dtypes kept, canonical output, what is
shared with the source and what is copied, edge shapes, user input still checked, and on a GPU
the kept ``arange`` and ``[0, nnz]`` buffers. Each test runs the GPU path's torch code on CPU
tensors too (``_on_host`` off), against SciPy / dense float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparsetorch import SparseTensor, ValidationError
from sparsetorch.format import COO, CSC, CSR, LevelFormat, LevelProperty, TensorFormat
from sparsetorch.format.named import i, j
from sparsetorch.tensor import construct

FORMATS = {"CSR": CSR, "CSC": CSC, "COO": COO}
PAIRS = [(a, b) for a in FORMATS for b in FORMATS if a != b]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=["numpy", "torch", "numpy-general", "torch-general"])
def path(request, monkeypatch):
    """NumPy/SciPy on the CPU, or the torch code a GPU runs (here on CPU tensors); "-general": the
    direct pairs through the general steps instead of the short path (construct.FAST_DIRECT)."""
    if request.param.endswith("-general"):
        monkeypatch.setattr(construct, "FAST_DIRECT", False)
    if request.param.startswith("torch"):
        monkeypatch.setattr(construct, "USE_SCIPY", False)
        monkeypatch.setattr(construct, "_on_host", lambda *bufs: False)
    else:
        monkeypatch.setattr(construct, "SCIPY_MIN_ENTRIES", 0)
    return request.param


def scipy_of(a: sp.csr_array, name: str):
    """``(pos, crd, values)`` of ``a`` in format ``name`` as SciPy sorts them."""
    if name == "CSR":
        return [a.indptr], [a.indices], a.data
    if name == "CSC":
        c = a.tocsc()
        c.sort_indices()
        return [c.indptr], [c.indices], c.data
    c = a.tocoo()
    return [np.array([0, a.nnz])], [c.row, c.col], c.data


def tensor(a: sp.csr_array, name: str, idt: torch.dtype, device: str = "cpu") -> SparseTensor:
    pos, crd, vals = scipy_of(a, name)
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.int64)).to(device=device, dtype=idt)  # noqa: E731
    if name == "COO":
        p, c = [t(pos[0]), None], [t(crd[0]), t(crd[1])]
    else:
        p, c = [None, t(pos[0])], [None, t(crd[0])]
    return SparseTensor(FORMATS[name], a.shape, p, c, torch.from_numpy(vals.copy()).to(device), check=True)


def random_csr(m: int, n: int, density: float, seed: int) -> sp.csr_array:
    a = sp.random_array((m, n), density=density, format="csr", rng=np.random.default_rng(seed))
    a.sort_indices()
    return a


def check(out: SparseTensor, a: sp.csr_array, name: str, idt: torch.dtype) -> None:
    pos, crd, vals = scipy_of(a, name)
    assert out.format.levels == FORMATS[name].levels
    assert out.index_dtype == idt
    bufs = [b for b in (*out.pos_buffers, *out.crd_buffers) if b is not None]
    for got, ref in zip(bufs, pos + crd):
        assert got.dtype == idt
        assert got.is_contiguous()
        assert np.array_equal(got.cpu().numpy(), np.asarray(ref, dtype=np.int64))
    assert torch.equal(out.values.cpu(), torch.from_numpy(vals))
    assert torch.equal(out.to_dense().cpu(), torch.from_numpy(a.toarray()))
    out.validate()  # canonical: the full content checks pass


SHAPES = [(0, 0), (0, 5), (5, 0), (6, 6), (1, 30), (30, 1), (37, 23)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_pairs_keep_the_index_dtype_and_are_canonical(path, shape, src, dst, idt):
    a = random_csr(*shape, 0.0 if shape == (6, 6) else 0.3, 4)  # (6, 6): no entries at all
    out = tensor(a, src, idt).convert(FORMATS[dst])  # no index_dtype given: the source's is kept
    check(out, a, dst, idt)


@pytest.mark.parametrize("src,dst", PAIRS)
def test_an_asked_index_dtype_is_given(path, src, dst):
    a = random_csr(19, 27, 0.2, 5)
    for idt_in, idt_out in ((torch.int32, torch.int64), (torch.int64, torch.int32)):
        check(tensor(a, src, idt_in).convert(FORMATS[dst], index_dtype=idt_out), a, dst, idt_out)


def test_same_major_shares_the_minor_indices_and_values(path):
    """CSR -> COO (and back) moves no entry: the columns and the values are the source's own
    buffers; a transpose (CSR -> CSC) writes new ones; copy=True shares nothing."""
    a = random_csr(25, 40, 0.2, 6)
    t = tensor(a, "CSR", torch.int64)
    coo = t.convert(COO)
    assert coo.crd(1) is t.crd(1) and coo.values is t.values
    back = coo.convert(CSR)
    assert back.crd(1) is t.crd(1) and back.values is t.values
    csc = t.convert(CSC)
    assert csc.values.data_ptr() != t.values.data_ptr()
    own = t.convert(COO, copy=True)
    src_ptrs = {b.data_ptr() for b in (*t.pos_buffers, *t.crd_buffers, t.values) if b is not None and b.numel()}
    assert not src_ptrs & {b.data_ptr() for b in (*own.pos_buffers, *own.crd_buffers, own.values) if b is not None}
    check(own, a, "COO", torch.int64)


COO_COLS = TensorFormat([i, j], {j: (LevelFormat.COMPRESSED, LevelProperty.NONUNIQUE), i: LevelFormat.SINGLETON},
                        name="COO by columns")


@pytest.mark.parametrize("src,dst", [(CSR, COO), (CSC, COO_COLS), (COO, CSR), (COO_COLS, CSC)])
@pytest.mark.parametrize("idt_in,idt_out", [(torch.int64, None), (torch.int32, None), (torch.int64, torch.int32),
                                            (torch.int32, torch.int64)])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_short_path_gives_the_general_steps_buffers(monkeypatch, src, dst, idt_in, idt_out, batch):
    """CSR <-> COO (and CSC <-> COO by columns) by the short path (construct._same_major) and by the
    general steps: equal buffers, the same sharing with the source, a value batch kept, and the
    cached conversion applied to new values afterwards."""
    a = random_csr(23, 31, 0.25, 8)
    d = torch.from_numpy(a.toarray())
    base = SparseTensor.from_dense(d, format=src, index_dtype=idt_in)
    vals = torch.stack([base.values * (k + 1) for k in range(batch[0])]) if batch else base.values
    outs = []
    for fast in (True, False):
        monkeypatch.setattr(construct, "FAST_DIRECT", fast)
        t = base.with_values(vals.clone())
        out = t.convert(dst, index_dtype=idt_out)
        want = idt_out or idt_in
        assert out.index_dtype == want and out.format.levels == dst.levels
        assert out.values is t.values  # the same major: the values move as they are
        assert (out.crd(1) is t.crd(1)) == (want == idt_in)  # the minor indices: the source's own buffer
        ref = d if not batch else torch.stack([d * (k + 1) for k in range(batch[0])])
        assert torch.equal(out.to_dense(), ref)
        out.validate()
        again = t.convert(dst, index_dtype=idt_out)  # cached: the same index buffers
        assert all(a is b for a, b in zip((*again.pos_buffers, *again.crd_buffers), (*out.pos_buffers, *out.crd_buffers)))
        new = torch.randn(*batch, t.nse, dtype=torch.float64)
        assert torch.equal(t.with_values(new).convert(dst, index_dtype=idt_out).to_dense(),
                           t.with_values(new).to_dense())
        outs.append(out)
    for b1, b2 in zip((*outs[0].pos_buffers, *outs[0].crd_buffers), (*outs[1].pos_buffers, *outs[1].crd_buffers)):
        assert (b1 is None) == (b2 is None)
        assert b1 is None or (b1.dtype == b2.dtype and torch.equal(b1, b2))
    assert outs[0].format == outs[1].format and outs[0].shape == outs[1].shape


def test_the_conversion_is_cached_per_pattern_and_applied_to_new_values(path):
    a = random_csr(30, 30, 0.2, 7)
    t = tensor(a, "CSR", torch.int32)
    first = t.convert(CSC)
    again = t.convert(CSC)
    assert again.pos(1) is first.pos(1) and again.crd(1) is first.crd(1)
    new = torch.randn(t.nse, dtype=torch.float64)
    moved = t.with_values(new).convert(CSC)
    assert torch.equal(moved.to_dense(), t.with_values(new).to_dense())


def test_unsorted_and_duplicate_user_coordinates(path):
    """from_coo sums duplicates and sorts; the conversions then see canonical input. Buffers a
    user wraps unsorted are refused (check=True), never converted as if sorted."""
    rows = torch.tensor([3, 0, 3, 1, 0, 3])
    cols = torch.tensor([2, 4, 2, 0, 4, 1])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    dense = torch.zeros(4, 5, dtype=torch.float64)
    dense.index_put_((rows, cols), vals, accumulate=True)
    for name in FORMATS:
        t = SparseTensor.from_coo(vals, rows, cols, shape=(4, 5), format=FORMATS[name])
        for dst in FORMATS:
            out = t.convert(FORMATS[dst])
            assert torch.equal(out.to_dense(), dense)
            out.validate()
    with pytest.raises(ValidationError):
        SparseTensor(COO, (4, 5), [torch.tensor([0, 6]), None], [rows, cols], vals, check=True)


def test_wrap_checks_still_refuse_bad_structure():
    """The per-format plans of the structural checks (check=False) refuse what the full checks do."""
    a = random_csr(10, 10, 0.3, 8)
    ptr, col = torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64))
    vals = torch.from_numpy(a.data)
    SparseTensor(CSR, a.shape, [None, ptr], [None, col], vals, check=False)  # fine
    bad_end = ptr.clone()
    bad_end[-1] += 1
    cases = [
        ([None, bad_end], [None, col], vals, "pos\\[1\\]\\[-1\\]"),
        ([None, ptr[:-1]], [None, col], vals, "pos\\[1\\] must have"),
        ([None, ptr.int()], [None, col], vals, "mix dtypes"),
        ([None, ptr.double()], [None, col], vals, "dtype"),
        ([ptr, None], [None, col], vals, "must be None"),
        ([None, ptr], [None, None], vals, "missing"),
        ([None, ptr], [None, col], vals[:-1], "entries in its last dimension"),
        ([None, ptr], [None, col[:, None]], vals, "1-D"),
    ]
    for pos, crd, v, match in cases:
        with pytest.raises(ValidationError, match=match):
            SparseTensor(CSR, a.shape, pos, crd, v, check=False)


def test_a_rewrapped_pointer_buffer_is_read_again_once_written():
    """The structural check remembers pos[-1] per buffer and version: wrapping the same buffers
    again does not read it back, a write in place (a new version) does, and the remembered value
    is still held against the length of the crd buffer it comes with."""
    a = random_csr(12, 9, 0.3, 12)
    ptr = torch.from_numpy(a.indptr.astype(np.int64))
    col = torch.from_numpy(a.indices.astype(np.int64))
    vals = torch.from_numpy(a.data)
    for _ in range(2):
        t = SparseTensor(CSR, a.shape, [None, ptr], [None, col], vals, check=False)
        assert torch.equal(t.to_dense(), torch.from_numpy(a.toarray()))
    with pytest.raises(ValidationError, match="pos\\[1\\]\\[-1\\]"):
        SparseTensor(CSR, a.shape, [None, ptr], [None, col[:-1]], vals[:-1], check=False)
    ptr[-1] += 1  # written in place: read again
    with pytest.raises(ValidationError, match="pos\\[1\\]\\[-1\\]"):
        SparseTensor(CSR, a.shape, [None, ptr], [None, col], vals, check=False)
    ptr[-1] -= 1
    SparseTensor(CSR, a.shape, [None, ptr], [None, col], vals, check=False)
    with torch.inference_mode():  # no version counter: read each time
        p2 = ptr.clone()
        c2 = col.clone()
        SparseTensor(CSR, a.shape, [None, p2], [None, c2], vals, check=False)
        p2[-1] += 1
        with pytest.raises(ValidationError):
            SparseTensor(CSR, a.shape, [None, p2], [None, c2], vals, check=False)


# On a GPU ---------------------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("shape", SHAPES + [(3, 40000), (40000, 3)])
@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_pairs_on_cuda(shape, src, dst, idt):
    a = random_csr(*shape, 0.3 if shape[0] * shape[1] < 10**5 else 0.01, 9)
    out = tensor(a, src, idt, "cuda").convert(FORMATS[dst])
    assert out.device.type == "cuda"
    check(out, a, dst, idt)


@CUDA
def test_kept_arange_grows_and_stays_right(monkeypatch):
    """Expansions of growing sizes (past the first kept buffer, past the cap) give the same
    rows as SciPy; the int16 keys of a transpose up to 32767 columns too."""
    monkeypatch.setattr(construct, "ARANGE_CACHE_MAX", 1 << 17)
    for nnz in (1, 5, 70_000, 140_000, 300_000, 10):
        m = nnz // 7 + 1
        a = random_csr(m, 100, min(1.0, nnz / (m * 100)), nnz)
        for idt in (torch.int32, torch.int64):
            check(tensor(a, "CSR", idt, "cuda").convert(COO), a, "COO", idt)
    a = random_csr(50, 32767, 0.01, 3)
    check(tensor(a, "CSR", torch.int32, "cuda").convert(CSC), a, "CSC", torch.int32)


@CUDA
def test_kept_top_pointers_are_shared_until_written():
    a = random_csr(40, 40, 0.2, 10)
    b = random_csr(40, 40, 0.2, 10)  # same number of entries
    x = tensor(a, "CSR", torch.int64, "cuda").convert(COO)
    y = tensor(b, "CSR", torch.int64, "cuda").convert(COO)
    assert x.pos(0) is y.pos(0)
    assert x.pos(0).tolist() == [0, a.nnz]
    x.pos(0).add_(0)  # a write (same contents): the kept buffer is not handed out again
    z = tensor(b, "CSR", torch.int64, "cuda").convert(COO)
    assert z.pos(0) is not x.pos(0)
    check(z, b, "COO", torch.int64)
    x.validate()  # the write kept the contents: still valid
