"""Building tensors: from_coo (duplicates summed), from_dense (threshold, mask, batches),
the raw constructor, with_values and pattern_key, and the rule that inputs are never modified.

References are NumPy (np.add.at for duplicate sums) and dense torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsetorch
from sparsetorch import SparseTensor, ValidationError
from sparsetorch.format import (
    BSR, COO, COO_ND, CSC, CSR, DELTA, DENSE, DIA, ELL, NM, batched, named_formats,
)

pytestmark = pytest.mark.usefixtures("single_thread")
EXAMPLES = settings().max_examples


def clones(*xs):
    return [x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True) for x in xs]


def same(xs, ys) -> bool:
    for x, y in zip(xs, ys):
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def tensor_state(t: SparseTensor) -> list:
    return [b.clone() for b in (*t.pos_buffers, *t.crd_buffers) if b is not None] + [t.values.detach().clone()]


def tensor_unchanged(t: SparseTensor, state: list) -> bool:
    now = [b for b in (*t.pos_buffers, *t.crd_buffers) if b is not None] + [t.values.detach()]
    return len(now) == len(state) and all(torch.equal(a, b) for a, b in zip(now, state))


# --------------------------------------------------------------------------------------------
# from_coo
# --------------------------------------------------------------------------------------------

@st.composite
def triplets(draw, ndim=2):
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    n = draw(st.integers(0, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Few distinct positions, so duplicates are frequent.
    pool = draw(st.integers(1, 6))
    base = np.stack([rng.integers(0, s, size=pool) for s in shape])
    pick = rng.integers(0, pool, size=n)
    idx = base[:, pick]
    vals = rng.integers(-6, 7, size=n).astype(np.float64) / 4
    return shape, idx, vals


@settings(max_examples=EXAMPLES)
@given(case=triplets(), fmt=st.sampled_from(["COO", "CSR", "CSC", "DIA", "ELL", "DELTA(2)", "BSR(2,3)", "DCSR"]),
       stacked=st.booleans())
def test_from_coo_sums_duplicates_like_numpy(case, fmt, stacked):
    shape, idx, vals = case
    ref = np.zeros(shape)
    np.add.at(ref, tuple(idx), vals)
    v = torch.from_numpy(vals.copy())
    rows, cols = torch.from_numpy(idx[0].copy()), torch.from_numpy(idx[1].copy())
    before = clones(v, rows, cols)
    f = named_formats()[fmt]
    if stacked:
        t = SparseTensor.from_coo(v, torch.stack([rows, cols]), shape=shape, format=f)
    else:
        t = SparseTensor.from_coo(v, rows, cols, shape=shape, format=f)
    assert same([v, rows, cols], before), "from_coo modified its input"
    assert t.format == f and tuple(t.shape) == shape
    assert np.array_equal(t.to_dense().numpy(), ref)
    # One stored entry per distinct position (explicit zeros from cancelling duplicates included).
    distinct = {tuple(p) for p in idx.T.tolist()}
    got, _ = t.convert(COO).coordinates()
    got = {tuple(p) for p in got.T.tolist()}
    if fmt in ("COO", "CSR", "CSC", "ELL", "DCSR"):
        assert got == distinct
    else:  # formats with padding slots of their own (diagonals, blocks, gap bridges) store more
        assert distinct <= got
    if fmt == "COO":
        assert t.nse == len(distinct)
        r, c = t.crd(0).tolist(), t.crd(1).tolist()
        assert list(zip(r, c)) == sorted(distinct)  # sorted and coalesced


@settings(max_examples=EXAMPLES // 2)
@given(case=triplets(ndim=3))
def test_from_coo_three_d_infers_shape_and_sums(case):
    shape, idx, vals = case
    ref = np.zeros(shape)
    np.add.at(ref, tuple(idx), vals)
    t = SparseTensor.from_coo(torch.from_numpy(vals), torch.from_numpy(idx), shape=shape, format=COO_ND(3))
    assert t.format == COO_ND(3)
    assert np.array_equal(t.to_dense().numpy(), ref)
    if idx.shape[1]:
        inferred = SparseTensor.from_coo(torch.from_numpy(vals), *[torch.from_numpy(x) for x in idx])
        assert tuple(inferred.shape) == tuple(int(x.max()) + 1 for x in idx)
        assert np.array_equal(inferred.to_dense().numpy(), ref[tuple(slice(0, s) for s in inferred.shape)])


def test_from_coo_accepted_index_spellings():
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    r, c = [0, 2, 2], [1, 0, 3]
    expected = torch.zeros(3, 4, dtype=torch.float64)
    expected[0, 1], expected[2, 0], expected[2, 3] = 1, 2, 3
    spellings = [
        SparseTensor.from_coo(v, torch.tensor(r), torch.tensor(c)),
        SparseTensor.from_coo(v, torch.tensor([r, c])),
        SparseTensor.from_coo(v, np.array(r), np.array(c)),
        SparseTensor.from_coo(v, r, c),
        SparseTensor.from_coo(v, torch.tensor(r, dtype=torch.int32), torch.tensor(c, dtype=torch.int32)),
        sparsetorch.Tensor.from_coo(v, torch.tensor([r, c]), shape=(3, 4)),
    ]
    for t in spellings:
        assert tuple(t.shape) == (3, 4)  # inferred: max index + 1
        assert torch.equal(t.to_dense(), expected)
        assert t.format == COO
    big = SparseTensor.from_coo(v, torch.tensor([r, c]), shape=(5, 6))
    assert tuple(big.shape) == (5, 6) and torch.equal(big.to_dense()[:3, :4], expected)
    empty = SparseTensor.from_coo(torch.zeros(0, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.int64))
    assert tuple(empty.shape) == (0, 0) and empty.nse == 0
    e2 = SparseTensor.from_coo(torch.zeros(0, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.int64),
                               shape=(3, 4), format=DIA)
    assert torch.equal(e2.to_dense(), torch.zeros(3, 4, dtype=torch.float64))
    s = SparseTensor.from_coo(v, torch.tensor(r), torch.tensor(c), format="(i, j) -> (j : dense, i : compressed)")
    assert s.format == CSC and torch.equal(s.to_dense(), expected)
    i32 = SparseTensor.from_coo(v, torch.tensor(r), torch.tensor(c), format=CSR, index_dtype=torch.int32)
    assert i32.pos(1).dtype == i32.crd(1).dtype == torch.int32 and i32.index_dtype == torch.int32
    pref = SparseTensor.from_coo(v, torch.tensor(r), torch.tensor(c), format=CSR.replace(index_dtype=torch.int32))
    assert pref.crd(1).dtype == torch.int32


def test_from_coo_value_batch_and_dtypes():
    r, c = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 2, 2, 0])
    vb = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    t = SparseTensor.from_coo(vb, r, c, shape=(2, 3), format=CSR)
    assert t.batch_shape == (3,) and tuple(t.shape) == (3, 2, 3) and t.values.shape == (3, 2)
    for b in range(3):
        ref = np.zeros((2, 3))
        np.add.at(ref, (r.numpy(), c.numpy()), vb[b].numpy())
        assert np.array_equal(t.to_dense()[b].numpy(), ref)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.complex64, torch.complex128):
        v = torch.tensor([1, 2, 3, 4]).to(dt)
        u = SparseTensor.from_coo(v, r, c, shape=(2, 3))
        assert u.dtype == dt
        assert torch.equal(u.to_dense(), torch.tensor([[5, 0, 0], [0, 0, 5]]).to(dt))


@pytest.mark.parametrize(
    "args, kw, message",
    [
        ((torch.ones(2, dtype=torch.float64), torch.tensor([0, 3]), torch.tensor([0, 0])), dict(shape=(3, 3)),
         r"index array 0 has 3 at position 1, outside \[0, 3\) for shape \(3, 3\)"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([0, 1]), torch.tensor([-1, 0])), dict(shape=(3, 3)),
         r"index array 1 has -1 at position 0, outside \[0, 3\)"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([0, 1]), torch.tensor([0])), {},
         r"index arrays differ in length: array 0 has 2, array 1 has 1"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([0.0, 1.0]), torch.tensor([0, 1])), {},
         r"index array 0 has dtype torch.float32; indices must be integers"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([True, False]), torch.tensor([0, 1])), {},
         r"index array 0 has dtype torch.bool"),
        ((torch.ones(3, dtype=torch.float64), torch.tensor([0, 1]), torch.tensor([0, 1])), {},
         r"values must have 2 entries in their last dimension \(one per index\), got shape \(3,\)"),
        ((torch.ones(2, dtype=torch.int64), torch.tensor([0, 1]), torch.tensor([0, 1])), {},
         r"values have dtype torch.int64; use a floating point or complex dtype"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([0, 1]), torch.tensor([0, 1])), dict(shape=(3, 3, 3)),
         r"shape \(3, 3, 3\) has 3 dims but 2 index arrays were given"),
        ((torch.ones(2, dtype=torch.float64),), {}, r"from_coo needs index arrays"),
        ((torch.ones(2, dtype=torch.float64), torch.tensor([[0, 1]]).T, torch.tensor([0, 1])), {},
         r"index array 0 must be 1-D"),
    ],
)
def test_from_coo_errors(args, kw, message):
    before = clones(*args)
    with pytest.raises(ValidationError, match=message):
        SparseTensor.from_coo(*args, **kw)
    assert same(list(args), before)


def test_from_coo_format_dimension_mismatch():
    with pytest.raises(sparsetorch.FormatError, match="format .* has 2 dimensions but the data has 3"):
        SparseTensor.from_coo(torch.ones(1, dtype=torch.float64), torch.tensor([[0], [0], [0]]), format=CSR)


def test_from_coo_check_false_skips_the_range_check():
    v = torch.ones(1, dtype=torch.float64)
    with pytest.raises(ValidationError):
        SparseTensor.from_coo(v, torch.tensor([0]), torch.tensor([5]), shape=(2, 2))
    # check=False trusts the caller; the cheap path must not raise on in-range data either.
    t = SparseTensor.from_coo(v, torch.tensor([1]), torch.tensor([1]), shape=(2, 2), check=False)
    assert torch.equal(t.to_dense(), torch.tensor([[0.0, 0.0], [0.0, 1.0]], dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# from_dense
# --------------------------------------------------------------------------------------------

@settings(max_examples=EXAMPLES)
@given(shape=st.tuples(st.integers(0, 8), st.integers(0, 8)), seed=st.integers(0, 2**31),
       threshold=st.sampled_from([None, 0.0, 0.3, 0.9, 10.0]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.complex128]))
def test_from_dense_threshold_against_numpy(shape, seed, threshold, dtype):
    g = torch.Generator().manual_seed(seed)
    A = (torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < 0.6)).to(dtype)
    if dtype.is_complex:
        A = A + 1j * torch.randn(shape, generator=g, dtype=torch.float64) * (A != 0)
    before = A.clone()
    t = SparseTensor.from_dense(A, threshold=threshold)
    assert torch.equal(A, before)
    a = A.numpy()
    keep = np.abs(a) > threshold if threshold is not None else a != 0
    assert t.format == CSR and t.dtype == dtype
    assert np.array_equal(t.to_dense().numpy(), np.where(keep, a, 0))
    coords, vals = t.coordinates()
    nz = np.nonzero(keep)
    assert coords.tolist() == [x.tolist() for x in nz]
    assert np.array_equal(vals.numpy(), a[nz])
    assert t.nse == int(keep.sum())


def test_from_dense_mask_and_defaults():
    A = torch.tensor([[0.1, -2.0, 0.0], [0.5, 0.0, -0.05]], dtype=torch.float64)
    m = torch.tensor([[True, False, True], [False, False, False]])
    t = SparseTensor.from_dense(A, mask=m)
    coords, vals = t.coordinates()
    assert coords.tolist() == [[0, 0], [0, 2]] and vals.tolist() == [0.1, 0.0]  # masked-in zero is stored
    assert torch.equal(t.to_dense(), A * m)
    # A full-shape mask with a batch: the union over the batch.
    B = torch.stack([A, 2 * A])
    mb = torch.zeros(2, 2, 3, dtype=torch.bool)
    mb[0, 0, 0] = mb[1, 1, 2] = True
    tb = SparseTensor.from_dense(B, mask=mb)
    assert tb.coordinates()[0].tolist() == [[0, 1], [0, 2]]
    assert tb.values.tolist() == [[0.1, -0.05], [0.2, -0.1]]
    with pytest.raises(ValidationError, match=r"mask must have shape \(2, 3\) or \(2, 2, 3\)"):
        SparseTensor.from_dense(B, mask=torch.ones(3, 3, dtype=torch.bool))
    # Defaults: CSR for matrices, COO of the right order otherwise.
    assert SparseTensor.from_dense(A).format == CSR
    assert SparseTensor.from_dense(torch.ones(2, 2, 2, dtype=torch.float64), COO_ND(3)).format == COO_ND(3)
    v = SparseTensor.from_dense(torch.tensor([0.0, 1.0, 0.0, 2.0]))
    assert v.format == COO_ND(1) and v.to_dense().tolist() == [0.0, 1.0, 0.0, 2.0]
    assert SparseTensor.from_dense(A, "(i, j) -> (j : dense, i : compressed)").format == CSC
    assert SparseTensor.from_dense(A, index_dtype=torch.int32).crd(1).dtype == torch.int32


def test_from_dense_batch_dims():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) * (torch.rand(2, 3, 4, 5, generator=g) < 0.3)
    t = SparseTensor.from_dense(X, CSR)  # batch_dims defaults to dim - 2
    assert t.batch_shape == (2, 3) and torch.equal(t.to_dense(), X)
    union = (X != 0).reshape(6, 4, 5).any(0)
    assert t.nse == int(union.sum())
    u = SparseTensor.from_dense(X, COO_ND(3), batch_dims=1)
    assert u.batch_shape == (2,) and torch.equal(u.to_dense(), X)
    w = SparseTensor.from_dense(X, COO_ND(4))
    assert w.batch_shape == () and torch.equal(w.to_dense(), X) and w.nse == int((X != 0).sum())
    for bad in (-1, 4):
        with pytest.raises(ValidationError, match=f"batch_dims={bad} is invalid"):
            SparseTensor.from_dense(X, COO_ND(1), batch_dims=bad)


def test_from_dense_errors_and_inputs():
    with pytest.raises(ValidationError, match="dense has dtype torch.int64; use a floating point or complex dtype"):
        SparseTensor.from_dense(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValidationError, match="from_dense takes a torch.Tensor, got ndarray"):
        SparseTensor.from_dense(np.ones((2, 2)))
    with pytest.raises(ValidationError, match="takes a strided tensor, got layout torch.sparse_coo"):
        SparseTensor.from_dense(torch.eye(2).to_sparse())
    with pytest.raises(sparsetorch.FormatError, match="has 2 dimensions but the data has 1"):
        SparseTensor.from_dense(torch.ones(2, 3, dtype=torch.float64), CSR, batch_dims=1)


def test_from_dense_keeps_non_contiguous_input_intact():
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6) % 5
    A = base.T  # non-contiguous view
    before = A.clone()
    for f in (CSR, CSC, DIA, BSR(2, 2), DELTA(1), ELL, COO):
        t = SparseTensor.from_dense(A, f)
        assert torch.equal(t.to_dense(), before)
    assert torch.equal(A, before) and torch.equal(base.T, before)


# --------------------------------------------------------------------------------------------
# The raw constructor, with_values, pattern_key
# --------------------------------------------------------------------------------------------

def test_constructor_wraps_buffers_without_copying():
    pos = torch.tensor([0, 1, 1, 3])
    crd = torch.tensor([2, 0, 3])
    vals = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    t = SparseTensor(CSR, (3, 4), [None, pos], [None, crd], vals)
    assert t.pos(1) is pos and t.crd(1) is crd and t.values is vals
    assert t.pos(0) is None and t.crd(0) is None
    assert t.pos_buffers == (None, pos) and t.crd_buffers == (None, crd)
    assert torch.equal(t.to_dense(), torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0], [2, 0, 0, 3]], dtype=torch.float64))
    s = SparseTensor("(i, j) -> (i : dense, j : compressed)", (3, 4), [None, pos], [None, crd], vals)
    assert s.format == CSR
    # UST spellings.
    assert t.tensor_format == t.format and t.extents == t.shape and t.val is t.values
    assert t.nse == t.nnz == 3 and t.ndim == t.dim() == 2 and len(t) == 3
    assert t.dtype == torch.float64 and t.index_dtype == torch.int64 and t.device.type == "cpu"
    assert "CSR" in repr(t) and "nse=3" in repr(t)


def test_with_values_shares_the_pattern():
    A = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    for f in (CSR, COO, DIA, BSR(2, 2), NM(2, 4), ELL, DENSE, batched(CSR)):
        t = SparseTensor.from_dense(A if f.ndim == 2 else A[None].expand(2, 2, 3).clone(), f)
        before = tensor_state(t)
        w = t.with_values(t.values * 3)
        assert w.pattern_key == t.pattern_key and hash(w.pattern_key) == hash(t.pattern_key)
        for a, b in zip((*t.pos_buffers, *t.crd_buffers), (*w.pos_buffers, *w.crd_buffers)):
            assert a is b
        assert torch.equal(w.to_dense(), 3 * t.to_dense())
        assert tensor_unchanged(t, before)
        if f.ndim == 2:
            batch = t.with_values(torch.stack([t.values, -t.values]))
            assert batch.batch_shape == (2,) and batch.pattern_key == t.pattern_key
            assert torch.equal(batch.to_dense(), torch.stack([A, -A]))
    t = SparseTensor.from_dense(A, CSR)
    with pytest.raises(ValidationError, match=r"new values must end with shape \(3,\)"):
        t.with_values(torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValidationError, match="values must be a torch.Tensor"):
        t.with_values([1.0, 2.0, 3.0])


def test_pattern_key_identity_and_in_place_writes():
    A = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    t = SparseTensor.from_dense(A, CSR)
    k0 = t.pattern_key
    assert k0 == t.pattern_key and k0.alive()
    assert k0.format == CSR and k0.shape == (2, 3) and k0.index_dtype == torch.int64
    same_content = SparseTensor.from_dense(A, CSR)
    assert same_content.pattern_key != k0  # other buffers, even with equal contents
    assert t.clone().pattern_key != k0
    assert t.T.pattern_key != k0  # another format over the same buffers
    t.values.mul_(2)  # values are not part of the pattern
    assert t.pattern_key == k0
    t.crd(1)[0] = 1  # an in-place write to an index buffer
    assert t.pattern_key != k0
    k1 = t.pattern_key
    t.pos(1).add_(0)
    assert t.pattern_key != k1


def test_in_place_index_write_is_seen_by_to_dense_and_convert():
    """pattern_key notices an in-place write to an index buffer, and so must every result that
    depends on the pattern: to_dense, coordinates and convert read the buffers as they are now."""
    A = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    t = SparseTensor.from_dense(A, CSR)
    assert torch.equal(t.to_dense(), A)
    assert torch.equal(t.convert(COO).to_dense(), A)
    t.crd(1)[0] = 1  # entry (0, 0) moves to (0, 1)
    expected = torch.tensor([[0.0, 1, 2], [0, 3, 0]], dtype=torch.float64)
    fresh = SparseTensor(CSR, (2, 3), t.pos_buffers, [None, t.crd(1).clone()], t.values.clone())
    assert torch.equal(fresh.to_dense(), expected)
    assert torch.equal(t.to_dense(), expected)
    assert t.coordinates()[0].tolist() == [[0, 0, 1], [1, 2, 1]]
    assert torch.equal(t.convert(COO).to_dense(), expected)


# --------------------------------------------------------------------------------------------
# Inputs are never modified, by any constructor or conversion
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(named_formats()))
def test_no_operation_modifies_its_inputs(name):
    f = named_formats()[name]
    g = torch.Generator().manual_seed(9)
    A = torch.randint(-3, 4, (6, 8), generator=g).double()
    A[:, 2::4] = 0
    A[:, 3::4] = 0  # 2:4 along rows
    A_before = A.clone()
    t = SparseTensor.from_dense(A, f)
    assert torch.equal(A, A_before)
    r, c = torch.nonzero(A, as_tuple=True)
    v = A[r, c]
    ins = clones(v, r, c)
    u = SparseTensor.from_coo(v, r, c, shape=A.shape, format=f)
    assert same([v, r, c], ins)
    state = tensor_state(t)
    for op in (lambda: t.to_dense(), lambda: t.coordinates(), lambda: t.coordinates(keep_padding=True),
               lambda: t.T.to_dense(), lambda: t.convert(CSR), lambda: t.convert(COO, drop_zeros=True),
               lambda: t.convert(f, index_dtype=torch.int32), lambda: t.convert(f, dtype=torch.float32),
               lambda: t.convert(f, copy=True), lambda: t.with_values(t.values + 1), lambda: t.clone(),
               lambda: t.to(torch.float32), lambda: t.allclose(u), lambda: t.equal(u), lambda: t.pattern_key,
               lambda: repr(t)):
        op()
        assert tensor_unchanged(t, state), name
    assert torch.equal(t.to_dense(), A_before) and torch.equal(u.to_dense(), A_before)


# --------------------------------------------------------------------------------------------
# equal / allclose / clone / to / coordinates
# --------------------------------------------------------------------------------------------

def test_equal_allclose_clone_and_to():
    A = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    t = SparseTensor.from_dense(A, CSR)
    assert t.equal(SparseTensor.from_dense(A, CSR))
    assert t.equal(t.convert(CSR, index_dtype=torch.int32))  # same buffers up to the index dtype
    assert not t.equal(SparseTensor.from_dense(A, CSC))  # another format
    assert not t.equal(SparseTensor.from_dense(2 * A, CSR))
    assert not t.equal(t.to(torch.float32))
    assert not t.equal(A)
    for f in (CSC, DIA, COO, BSR(2, 2), DENSE):
        assert t.allclose(SparseTensor.from_dense(A, f)) and t.allclose(A)
    assert not t.allclose(SparseTensor.from_dense(A + 1e-3, DIA))
    assert t.allclose(SparseTensor.from_dense(A + 1e-9, DIA))
    assert not t.allclose(SparseTensor.from_dense(A[:, :2].contiguous(), CSR))  # other shape
    c = t.clone()
    assert c.equal(t) and all(a.data_ptr() != b.data_ptr()
                              for a, b in zip((c.pos(1), c.crd(1), c.values), (t.pos(1), t.crd(1), t.values)))
    f32 = t.to(torch.float32)
    assert f32.dtype == torch.float32 and f32.crd(1) is t.crd(1)
    assert t.to(torch.float64) is t and t.to("cpu") is t
    assert t.double() is t and t.float().dtype == torch.float32
    with pytest.raises(sparsetorch.ConversionError, match="values must stay floating point or complex"):
        t.to(torch.int64)
    d = t.with_values(t.values.clone().requires_grad_()).detach()
    assert not d.requires_grad and d.pattern_key == t.pattern_key


def test_coordinates_storage_order_and_padding():
    A = torch.tensor([[1.0, 0, 0], [0, 0, 2], [3, 0, 0]], dtype=torch.float64)
    dia = SparseTensor.from_dense(A, DIA)  # diagonals -2, 0, 1; three slots each
    assert dia.crd(0).tolist() == [-2, 0, 1]
    coords, vals = dia.coordinates()
    # storage order: diagonal by diagonal, row by row; slots outside the matrix are left out
    assert coords.tolist() == [[2, 0, 1, 2, 0, 1], [0, 0, 1, 2, 1, 2]]
    assert vals.tolist() == [3.0, 1.0, 0.0, 0.0, 0.0, 2.0]
    padded, pvals = dia.coordinates(keep_padding=True)
    assert padded.shape[1] == 9 and pvals.shape == (9,)
    outside = [(i, j) for i, j in padded.T.tolist() if not (0 <= i < 3 and 0 <= j < 3)]
    assert sorted(outside) == [(0, -2), (1, -1), (2, 3)]
    csc = SparseTensor.from_dense(A, CSC)
    assert csc.coordinates()[0].tolist() == [[0, 2, 1], [0, 0, 2]]  # column by column
