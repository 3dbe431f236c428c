"""The everyday tensor API of SparseTensor (tensor/_elementwise.py; docs/tensor.md, "Everyday tensor
operations"): every operation against the dense reference ``A.to_dense().<op>``, on several formats, random
patterns with empty rows, an all-zero matrix, duplicated COO entries, value batches, a BATCH-level format,
complex128, float16 / bfloat16, gradients (gradcheck on float64 values) and the error paths."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import CSR, batched

DT = torch.float64
FORMATS = ["CSR", "COO", "CSC", "BSR(2,3)", "DIA", "ELL", "DCSR", "DELTA(4)", "DENSE"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _dense(m=7, n=9, seed=0, dtype=DT, density=0.35, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(m, n, generator=g, dtype=torch.float64)
    D = D * (torch.rand(m, n, generator=g) < density)
    D[min(3, m - 1)] = 0  # an empty row
    if dtype.is_complex:
        D = D + 1j * D.flip(1) * (D != 0)
    return D.to(dtype=dtype, device=device)


def _mats(fmt, device="cpu"):
    out = []
    for D in (_dense(device=device), _dense(seed=1, density=0.8, device=device), torch.zeros(7, 9, dtype=DT, device=device)):
        out.append((st.SparseTensor.from_dense(D).convert(fmt), D))
    return out


def close(got, want, **kw):
    if isinstance(got, st.SparseTensor):
        got = got.to_dense()
    torch.testing.assert_close(got, want, **kw)


# Facts -------------------------------------------------------------------------------------------
def test_facts_and_casts():
    D = _dense()
    A = st.SparseTensor.from_dense(D)
    assert A.size() == torch.Size([7, 9]) and A.size(0) == 7 and A.size(-1) == 9
    assert A.numel() == 63 and A.is_sparse and not A.is_complex() and A.is_floating_point()
    assert A.element_size() == 8
    assert A.layout == torch.sparse_csr
    assert A.convert("CSC").layout == torch.sparse_csc
    assert A.convert("COO").layout == torch.sparse_coo
    assert A.convert("BSR(2,3)").layout == torch.sparse_bsr
    assert A.convert("DIA").layout == torch.sparse_coo and A.convert("ELL").layout == torch.sparse_coo
    assert A.half().dtype == torch.float16 and A.bfloat16().dtype == torch.bfloat16
    assert A.half().element_size() == 2
    assert A.to(torch.complex128).is_complex()
    with pytest.raises(IndexError, match="dimension 2"):
        A.size(2)
    for fmt in ("CSR", "COO", "DIA", "BSR(2,3)"):
        B = A.convert(fmt)
        csr, coo, csc = B.to_sparse_csr(), B.to_sparse_coo(), B.to_sparse_csc()
        assert (csr.layout, coo.layout, csc.layout) == (torch.sparse_csr, torch.sparse_coo, torch.sparse_csc)
        for t in (csr, coo, csc):
            close(t.to_dense(), D)
    Ab = st.SparseTensor.from_dense(torch.stack([D, 2 * D]), batch_dims=1)
    close(Ab.to_sparse_csr().to_dense(), torch.stack([D, 2 * D]))
    close(Ab.to_sparse_coo().to_dense(), torch.stack([D, 2 * D]))


# Unary maps --------------------------------------------------------------------------------------
ZERO_MAPS = ["abs", "neg", "sqrt", "square", "sign", "sin", "tan", "tanh", "asin", "atan", "sinh", "asinh", "relu",
             "expm1", "log1p"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_unary_maps_keep_pattern_and_format(fmt, device):
    for A, D in _mats(fmt, device):
        v0 = A.values.clone()
        for name in ZERO_MAPS:
            arg = A.abs() if name == "sqrt" else (A * 0.3 if name in ("asin", "log1p") else A)
            ref = arg.to_dense()
            got = getattr(arg, name)()
            assert got.format == arg.format, name
            close(got, getattr(torch, name)(ref), equal_nan=True)
            close(getattr(torch, name)(arg), getattr(torch, name)(ref), equal_nan=True)
        close(A ** 2, D ** 2)
        close(A.abs() ** 0.5, D.abs() ** 0.5)
        close(A.pow(3), D.pow(3))
        close(A.clamp(-0.5, 0.5), D.clamp(-0.5, 0.5))
        close(A.clamp(min=-0.1), D.clamp(min=-0.1))
        close(abs(A), D.abs())
        close(torch.nn.functional.relu(A), D.relu())
        assert torch.real(A) is A
        close(-A, -D)
        assert A.conj() is A and A.real is A
        close(A.H if A.ndim == 2 else A, D.T)
        close(A.mH, D.mT)
        assert torch.equal(A.values, v0)  # the user's tensor is never modified


def test_complex128():
    D = _dense(dtype=torch.complex128)
    E = _dense(seed=2, dtype=torch.complex128)
    for fmt in ("CSR", "COO", "DIA"):
        A = st.SparseTensor.from_dense(D).convert(fmt)
        B = st.SparseTensor.from_dense(E).convert(fmt)
        assert A.is_complex() and not A.is_floating_point() and A.element_size() == 16
        close(A.conj(), D.conj())
        close(A.H, D.mH)
        close(A.mH, D.mH)
        close(A.adjoint(), D.adjoint())
        close(A.real, D.real)
        close(A.imag, D.imag)
        close(A.abs(), D.abs())
        close(A.sgn(), D.sgn())
        close(A * B, D * E)
        close(A * E, D * E)
        close(A + E, D + E)
        close(E - A, E - D)
        close(A.sum(), D.sum())
        close(A.sum(1), D.sum(1))
        close(A.mean(0), D.mean(0))
        close(A.diagonal(1), D.diagonal(1))
        close(A.trace(), D.trace())
        close(A[2], D[2])
        close(A[1:5, 2:8], D[1:5, 2:8])
        close(A ** 2, D ** 2)
        Full = st.SparseTensor.from_dense(D + 0.5).convert(fmt)
        close(Full.prod(1), (D + 0.5).prod(1))
        close(Full.prod(), (D + 0.5).prod())
        close(A.prod(0), D.prod(0))
        assert torch.equal(A, D) and torch.equal(A, A.convert("CSC"))
        with pytest.raises(st.InputError, match="complex"):
            A.amax()
    Ar = st.SparseTensor.from_dense(_dense())
    with pytest.raises(st.InputError, match="imag.*float64"):
        Ar.imag


# Binary ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_binary_with_sparse_and_dense(fmt, device):
    (A, D), (B, E), (Z, Zd) = _mats(fmt, device)
    av, bv = A.values.clone(), B.values.clone()
    P = A * B
    close(P, D * E)
    assert P.format.name in ("CSR", "CSC", "COO", "DCSR", "DCSC") or P.format == A.format
    close(torch.mul(A, B), D * E)
    same = A * A.with_values(2 * A.values)
    assert same.format == A.format
    close(same, 2 * D * D)
    close(A * Z, D * Zd)
    close(A + B, D + E)
    close(A - B, D - E)
    close(torch.add(A, B), D + E)
    close(torch.sub(A, B, alpha=2), D - 2 * E)
    # dense operands: products and quotients stay on A's pattern, sums are dense
    AD = A * E
    assert isinstance(AD, st.SparseTensor) and AD.format == A.format
    close(AD, D * E)
    close(E * A, D * E)
    close(torch.mul(E, A), D * E)
    row = torch.arange(1.0, 10.0, dtype=DT, device=device)
    close(A * row, D * row)  # broadcast along the rows
    col = torch.arange(1.0, 8.0, dtype=DT, device=device)[:, None]
    close(A * col, D * col)  # broadcast along the columns
    close(A / (E.abs() + 1), D / (E.abs() + 1))
    close(torch.div(A, E.abs() + 1), D / (E.abs() + 1))
    for got, want in ((A + E, D + E), (A - E, D - E), (E + A, E + D), (E - A, E - D), (torch.add(E, A), E + D),
                      (torch.sub(E, A), E - D), (A + row, D + row)):
        assert type(got) is torch.Tensor
        close(got, want)
    close(A * torch.tensor(3.0, dtype=DT), 3 * D)
    close(torch.tensor(3.0, dtype=DT) * A, 3 * D)
    assert torch.equal(A.values, av) and torch.equal(B.values, bv)


def test_equal_and_identity():
    D = _dense()
    A = st.SparseTensor.from_dense(D)
    for fmt in ("COO", "CSC", "DIA", "ELL", "BSR(2,3)"):
        assert torch.equal(A, A.convert(fmt))
        assert torch.equal(A.convert(fmt), A)
    assert torch.equal(A, D) and torch.equal(D, A)
    E = D.clone()
    E[0, 0] += 1
    assert not torch.equal(A, st.SparseTensor.from_dense(E))
    assert not torch.equal(A, st.SparseTensor.from_dense(D[:6]))
    # an explicit zero is the same content as an implicit one
    Z = st.SparseTensor.from_dense(D, mask=torch.ones_like(D, dtype=torch.bool))
    assert Z.nse == 63 and torch.equal(A, Z)
    same = A
    assert (A == same) is True and (A == A.convert("CSC")) is False  # identity, not content
    assert A.equal(A.with_values(A.values.clone()))


# Reductions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_reductions(fmt, device):
    for A, D in _mats(fmt, device):
        close(A.sum(), D.sum())
        close(torch.sum(A), D.sum())
        for dim in (0, 1, -1, (0, 1), (-2,)):
            for keep in (False, True):
                close(A.sum(dim, keep), D.sum(dim, keep))
                close(A.sum(dim=dim, keepdim=keep), D.sum(dim=dim, keepdim=keep))
                close(A.mean(dim, keep), D.mean(dim, keep))
                close(A.amax(dim, keep), D.amax(dim, keep))
                close(A.amin(dim, keep), D.amin(dim, keep))
                close(torch.amax(A, dim, keep), D.amax(dim, keep))
        close(A.sum(dtype=torch.float32), D.sum(dtype=torch.float32))
        close(A.mean(), D.mean())
        close(A.max(), D.max())
        close(A.min(), D.min())
        close(torch.max(A), D.max())
        close(A.amax(), D.amax())
        v, i = A.max(1)
        close(v, D.max(1).values)
        close(A.prod(), D.prod())
        close(A.prod(1), D.prod(1))
        close(A.diagonal(), D.diagonal())
        for off in (-3, -1, 1, 4, 9):
            close(A.diagonal(off), D.diagonal(off))
            close(torch.diagonal(A, off), D.diagonal(off))
        close(A.T.diagonal(2), D.T.diagonal(2))
        close(A.trace(), D.trace())
        close(torch.trace(A), D.trace())


def test_reductions_full_rows_and_negative_entries():
    # a fully stored row of negative values: its max is negative (no implicit zero in it)
    D = torch.tensor([[-1.0, -2.0, -3.0], [0.0, -4.0, 0.0], [2.0, 1.0, 3.0]], dtype=DT)
    for fmt in ("CSR", "COO", "CSC", "ELL"):
        A = st.SparseTensor.from_dense(D).convert(fmt)
        close(A.amax(1), D.amax(1))
        close(A.amin(1), D.amin(1))
        close(A.amax(0), D.amax(0))
        close(A.prod(1), D.prod(1))
        close(A.prod(0), D.prod(0))
        close(A.max(), D.max())
    sq = st.SparseTensor.from_dense(torch.full((3, 3), -2.0, dtype=DT))
    close(sq.max(), torch.tensor(-2.0, dtype=DT))
    close(sq.prod(), torch.tensor(-512.0, dtype=DT))


def test_duplicated_coo_entries_are_summed():
    row = torch.tensor([0, 2, 0, 1, 2, 0])
    col = torch.tensor([1, 2, 1, 0, 2, 3])
    val = torch.tensor([2.0, -1.0, -5.0, 1.5, 4.0, 0.5], dtype=DT)
    A = st.SparseTensor.from_coo(val, row, col, shape=(3, 4))
    assert not A.format.is_unique
    D = A.to_dense()
    close(D[0, 1], torch.tensor(-3.0, dtype=DT))
    close(A.abs(), D.abs())
    close(A ** 2, D ** 2)
    close(A.relu(), D.relu())
    close(A.amax(), D.amax())
    close(A.amin(1), D.amin(1))
    close(A.amax(0), D.amax(0))
    close(A.sum(0), D.sum(0))
    close(A.mean(1), D.mean(1))
    close(A * A, D * D)
    close(A * D, D * D)
    close(A[0], D[0])
    close(A[0, 1], D[0, 1])
    close(A[0:2, 1:], D[0:2, 1:])
    close(A.diagonal(), D.diagonal())
    assert torch.equal(A, st.SparseTensor.from_dense(D))
    assert torch.equal(A.values, val)


# Indexing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_indexing(fmt, device):
    for A, D in _mats(fmt, device):
        for key in (0, 3, -1, (0, 1), (2, -3), (-7, 8), (slice(None), 2), (slice(1, 4),), (slice(1, 6, 2), slice(0, 9, 3)),
                    (slice(None), slice(2, 7)), (slice(2, 5), 4), (Ellipsis, 1), (slice(-3, None), slice(None, -2))):
            got = A[key]
            want = D[key]
            if want.dim() >= 2:
                assert isinstance(got, st.SparseTensor), key
            else:
                assert type(got) is torch.Tensor, key
            close(got, want)
        rows = torch.tensor([4, 0, 0, 6])
        close(A[rows], D[rows])
        close(A[[1, 5]], D[[1, 5]])
        close(A[:, [8, 0, 3]], D[:, [8, 0, 3]])
        assert A[1:4].format.name in ("CSR", "CSC", "COO", "DCSR") or A[1:4].format == A.format
        for bad, what in ((7, "index 7"), ((0, 9), "index 9"), (-8, "index -8"), ([0, 7], "index 7")):
            with pytest.raises(IndexError, match=what):
                A[bad]


def test_source_format_kept_where_simple():
    D = _dense()
    for fmt in ("CSR", "CSC", "COO", "DCSR"):
        A = st.SparseTensor.from_dense(D).convert(fmt)
        assert A[1:5].format.name == fmt and A[:, 2:6].format.name == fmt
    assert st.SparseTensor.from_dense(D).convert("DIA")[1:5].format.name == "CSR"


# Batches -----------------------------------------------------------------------------------------
def test_value_batches():
    D0, D1 = _dense(), _dense(seed=3)
    Db = torch.stack([D0, D1 * 2, D0 - D1])
    A = st.SparseTensor.from_dense(Db, batch_dims=1)
    assert A.batch_shape == (3,) and A.shape == (3, 7, 9)
    for dim in (None, 0, 1, 2, (0, 2), (1, 2), -1):
        for keep in (False, True):
            kw = {} if dim is None else {"dim": dim, "keepdim": keep}
            close(A.sum(**kw), Db.sum(**kw))
            close(A.mean(**kw), Db.mean(**kw))
            close(A.amax(**kw), Db.amax(**kw))
            close(A.amin(**kw), Db.amin(**kw))
    close(A.prod(2), Db.prod(2))
    close(A.abs(), Db.abs())
    close(A * Db, Db * Db)
    close(A * D0, Db * D0)  # a matrix broadcast over the batch
    close(A + D0, Db + D0)
    close(A * A, Db * Db)
    close(A.diagonal(), Db.diagonal(dim1=-2, dim2=-1))
    close(A.diagonal(1, 0, 2), Db.diagonal(1, 0, 2))
    close(A.trace(), Db.diagonal(dim1=-2, dim2=-1).sum(-1))
    member = A[1]
    assert isinstance(member, st.SparseTensor) and member.shape == (7, 9)
    close(member, Db[1])
    close(A[2, 4], Db[2, 4])
    close(A[0, 1, 2], Db[0, 1, 2])
    close(A[:, 2:5], Db[:, 2:5])
    close(A[1:, :, 3], Db[1:, :, 3])
    close(A[..., 0], Db[..., 0])
    assert torch.equal(A, Db)


def test_batch_level_format():
    m = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) < 0.4
    D = torch.randn(2, 4, 6, dtype=DT, generator=torch.Generator().manual_seed(6)) * m
    A = st.SparseTensor.from_dense(D, batched(CSR), batch_dims=0, mask=m.expand(2, 4, 6))
    assert A.layout == torch.sparse_csr
    close(A.sum(1), D.sum(1))
    close(A.amax((0, 2)), D.amax((0, 2)))
    close(A[1], D[1])
    close(A[1, 2], D[1, 2])
    close(A[:, 1:3], D[:, 1:3])
    close(A * D, D * D)
    close(A.abs(), D.abs())
    close(A.diagonal(), D.diagonal(dim1=-2, dim2=-1))


# Low precision and devices -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    D = _dense().to(dtype)
    E = _dense(seed=4).to(dtype)
    tol = {"atol": 2e-2, "rtol": 2e-2}
    for fmt in ("CSR", "COO", "ELL"):
        A = st.SparseTensor.from_dense(D).convert(fmt)
        B = st.SparseTensor.from_dense(E).convert(fmt)
        Df, Ef = D.double(), E.double()
        close(A.sum().double(), Df.sum(), **tol)
        close(A.sum(1).double(), Df.sum(1), **tol)
        close(A.mean(0).double(), Df.mean(0), **tol)
        close(A.amax(1).double(), Df.amax(1), **tol)
        close(A.abs().to_dense().double(), Df.abs(), **tol)
        close((A * B).to_dense().double(), Df * Ef, **tol)
        close((A * E).to_dense().double(), Df * Ef, **tol)
        close(A[2:6].to_dense().double(), Df[2:6], **tol)
        close(A[1].double(), Df[1], **tol)
        close(A.diagonal().double(), Df.diagonal(), **tol)
        assert A.abs().dtype == dtype and A.sum().dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_devices(device):
    D = _dense(device=device)
    E = _dense(seed=2, device=device)
    A = st.SparseTensor.from_dense(D)
    B = st.SparseTensor.from_dense(E).convert("COO")
    assert A.device.type == device
    close(A * B, D * E)
    close(A * E, D * E)
    close(A + E, D + E)
    close(A.sum(0), D.sum(0))
    close(A.amax(1), D.amax(1))
    close(A.prod(0), D.prod(0))
    close(A[2:5, 1:], D[2:5, 1:])
    close(A[[0, 3]], D[[0, 3]])
    close(A[1, 2], D[1, 2])
    close(A.diagonal(1), D.diagonal(1))
    close(A.abs(), D.abs())
    assert torch.equal(A, A.convert("COO")) and not torch.equal(A, B)
    assert torch.equal(A, D)
    Ac = st.SparseTensor.from_dense(D.to(torch.complex128))
    close(Ac.H, D.to(torch.complex128).mH)
    close(Ac.prod(0), D.to(torch.complex128).prod(0))
    Ah = A.half()
    close(Ah.sum(1).double(), D.sum(1), atol=2e-2, rtol=2e-2)
    close(Ah.amax(0).double(), D.amax(0), atol=2e-2, rtol=2e-2)
    if device != "cpu":
        with pytest.raises(st.ValidationError, match=r"cuda.*cpu"):
            A * D.cpu()


# Gradients ---------------------------------------------------------------------------------------
def _grad_case():
    D = _dense(density=0.5)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone().requires_grad_(True)
    return A, D, v


def test_gradcheck():
    A, D, v = _grad_case()
    E = _dense(seed=7, density=0.6)
    B = st.SparseTensor.from_dense(E).convert("COO")
    w = B.values.detach().clone().requires_grad_(True)
    Dd = torch.randn(7, 9, dtype=DT, generator=torch.Generator().manual_seed(8))
    fns = {
        "sum0": lambda v: A.with_values(v).sum(0),
        "sum01k": lambda v: A.with_values(v).sum((0, 1), keepdim=True),
        "mean1": lambda v: A.with_values(v).mean(1),
        "mul_dense": lambda v: (A.with_values(v) * Dd).to_dense(),
        "div_dense": lambda v: (A.with_values(v) / (Dd.abs() + 1)).values,
        "add_dense": lambda v: A.with_values(v) + Dd,
        "index_row": lambda v: A.with_values(v)[2],
        "index_entry": lambda v: A.with_values(v)[0, int(A.entries()[0][1, 0])],
        "index_slice": lambda v: A.with_values(v)[1:6:2, [8, 1, 4]].to_dense(),
        "abs": lambda v: A.with_values(v).abs().values,
        "pow": lambda v: (A.with_values(v) ** 3).sum(1),
        "diag": lambda v: A.with_values(v).diagonal(1),
        "trace": lambda v: A.with_values(v).trace(),
        "amax": lambda v: A.with_values(v).amax(1),
    }
    for name, fn in fns.items():
        assert torch.autograd.gradcheck(fn, (v,)), name
    assert torch.autograd.gradcheck(lambda v, w: (A.with_values(v) * B.with_values(w)).to_dense(), (v, w))
    w2 = torch.randn(v.shape, dtype=DT, generator=torch.Generator().manual_seed(9)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, w: (A.with_values(v) * A.with_values(w)).values, (v, w2))


# Errors ------------------------------------------------------------------------------------------
def test_dense_maps_raise_with_the_fix():
    A = st.SparseTensor.from_dense(_dense())
    for name in ("exp", "cos", "log", "sigmoid", "cosh", "reciprocal"):
        with pytest.raises(st.InputError, match=rf"{name} maps 0 to .*dense.*to_dense\(\)\.{name}\(\).*with_values"):
            getattr(A, name)()
        with pytest.raises(st.InputError, match=name):
            getattr(torch, name)(A)
    for p in (0, -1, -0.5):
        with pytest.raises(st.InputError, match=rf"exponent {p}.*dense"):
            A ** p
    with pytest.raises(st.InputError, match="clamp.*min=0.5"):
        A.clamp(0.5)
    with pytest.raises(st.InputError, match="clamp.*max=-1"):
        A.clamp(max=-1)
    with pytest.raises(st.InputError, match="dense"):
        2 ** A


def test_errors_name_the_values():
    A = st.SparseTensor.from_dense(_dense())
    B = st.SparseTensor.from_dense(_dense(6, 9))
    with pytest.raises(st.ValidationError, match=r"\(7, 9\).*\(6, 9\)"):
        A * B
    with pytest.raises(st.ValidationError, match=r"\(7, 9\).*\(6, 9\)"):
        A + B
    with pytest.raises(st.ValidationError, match=r"float64.*float32"):
        A * A.float()
    with pytest.raises(st.ValidationError, match=r"\(7, 9\).*\(5,\)"):
        A * torch.ones(5, dtype=DT)
    with pytest.raises(st.ValidationError, match=r"\(7, 9\).*\(2, 7, 9\)"):
        A * torch.ones(2, 7, 9, dtype=DT)  # would grow A
    with pytest.raises(st.ValidationError, match=r"\(7, 9\).*\(4, 4\)"):
        A + torch.ones(4, 4, dtype=DT)
    with pytest.raises(IndexError, match="index 7 is out of range for dimension 0 with size 7"):
        A[7]
    with pytest.raises(IndexError, match="index -10 is out of range for dimension 1 with size 9"):
        A[0, -10]
    with pytest.raises(IndexError, match="too many indices"):
        A[0, 0, 0]
    with pytest.raises(IndexError, match="dimension 3"):
        A.sum(3)
    with pytest.raises(TypeError, match="A / B"):
        A / A


def test_unhandled_torch_functions_still_decline():
    A = st.SparseTensor.from_dense(_dense())
    with pytest.raises(TypeError):
        torch.cumsum(A, 0)
    with pytest.raises(TypeError):
        torch.softmax(A, 0)
    x = torch.ones(9, dtype=DT)
    close(torch.matmul(A, x), A.to_dense() @ x)
    close(A @ x, A.to_dense() @ x)
    close(torch.ones(7, dtype=DT) @ A, torch.ones(7, dtype=DT) @ A.to_dense())


# found by the session's outside sweep
def test_prod_derivatives_nonfinite_and_empty_match_dense():
    D = torch.tensor([[2.0, 3.0], [4.0, 5.0]], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone()
    tangent = torch.func.jvp(lambda v: A.with_values(v).prod(1), (v,), (torch.ones_like(v),))[1]
    torch.testing.assert_close(tangent, torch.tensor([5.0, 9.0], dtype=torch.float64))  # d(ab) = a + b
    vc = torch.tensor([1 + 1j, 0j, 0.5j, 3], dtype=torch.complex128)
    rows, cols = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
    vv = vc.clone().requires_grad_()
    st.SparseTensor.from_coo(vv, rows, cols, shape=(2, 2)).prod(1).real.sum().backward()
    Dd = torch.zeros(2, 2, dtype=torch.complex128).index_put((rows, cols), vc).requires_grad_()
    Dd.prod(1).real.sum().backward()
    torch.testing.assert_close(vv.grad, Dd.grad[rows, cols])  # an exact zero entry keeps its gradient
    N = torch.tensor([[1.0, 0, float("inf")], [0, 2, 0], [float("nan"), 0, 3]], dtype=torch.float64)
    torch.testing.assert_close(st.SparseTensor.from_dense(N).prod(1), N.prod(1), equal_nan=True)  # 0 * inf
    E = torch.zeros(0, 3, dtype=torch.float64)
    torch.testing.assert_close(st.SparseTensor.from_dense(E).prod(0), E.prod(0))


def test_two_index_lists_raise_instead_of_an_outer_block():
    D = torch.arange(1.0, 13.0, dtype=torch.float64).view(3, 4)
    A = st.SparseTensor.from_dense(D)
    with pytest.raises(IndexError, match="one index list"):
        A[[0, 2], [1, 3]]
    torch.testing.assert_close(A[[0, 2]][:, [1, 3]].to_dense(), D[[0, 2]][:, [1, 3]])
    np = pytest.importorskip("numpy")
    torch.testing.assert_close(A[np.int64(2)], D[2])
    torch.testing.assert_close(A[np.array([1, 2])].to_dense(), D[[1, 2]])
    assert A[[]].shape == (0, 4)


def test_products_with_a_dense_tensor_compile():
    # after this file's earlier tests the compiled t - E returned the product E * t while the handler lookup was
    # traced (run after test_unhandled_torch_functions_still_decline / test_value_batches, as pytest does)
    E = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64) * 2)
    t = torch.arange(3.0, dtype=torch.float64)
    fs = {"E * t": lambda t: (E * t).to_dense(), "t * E": lambda t: (t * E).to_dense(),
          "mul": lambda t: torch.mul(E, t).to_dense(), "E + t": lambda t: E + t, "t - E": lambda t: t - E}
    for name, f in fs.items():  # E * t recursed without end under dynamo
        got, want = torch.compile(f)(t), f(t)
        assert type(got) is type(want) is torch.Tensor, (name, type(got), type(want))
        torch.testing.assert_close(got, want)


def test_mean_refuses_an_integer_dtype_as_torch():
    A = st.SparseTensor.from_dense(torch.tensor([[1.5, 0], [0, 2.5]], dtype=torch.float64))
    with pytest.raises(st.InputError, match="floating point"):
        A.mean(dtype=torch.int64)
