"""UST's element access and in-place updates on SparseTensor: ``get_value``, ``copy_``,
``set_kernel`` / ``run_kernel`` (nvmath-python 1.0 semantics, docs/coming-from-ust.md).

The reference is a dense float64 matrix built independently (random entries, a random mask):
``get_value`` at every coordinate against it, ``copy_`` against the source's dense form,
``run_kernel`` against the same transformation applied to the dense matrix on its mask.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.format import BATCHED_CSR, BSR, COO, COO_ND, CSC, CSR, DCSR, DELTA, DIA, ELL, NM

pytestmark = pytest.mark.usefixtures("single_thread")

# formats that store exactly the nonzeros (None <=> zero) and those that pad (None => zero)
EXACT = [CSR, CSC, COO, DCSR, ELL, DELTA(8)]
PADDED = [BSR(2, 2), DIA]


def _dense(seed: int = 0, m: int = 6, n: int = 8, density: float = 0.4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    vals = torch.randn(m, n, generator=gen, dtype=torch.float64)
    mask = torch.rand(m, n, generator=gen) < density
    return torch.where(mask, vals + torch.sign(vals), torch.zeros((), dtype=torch.float64))  # |v| >= 1 where kept


def _name(f) -> str:
    return f.name


# get_value ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", EXACT + PADDED, ids=_name)
def test_get_value_matches_dense_at_every_coordinate(fmt) -> None:
    D = _dense(1)
    A = st.SparseTensor.from_dense(D, fmt)
    for i in range(D.shape[0]):
        for j in range(D.shape[1]):
            v = A.get_value([i, j])
            if v is None:
                assert D[i, j] == 0, (fmt.name, i, j)
            else:
                assert v.dim() == 0 and v.dtype == torch.float64
                assert float(v) == float(D[i, j]), (fmt.name, i, j)
            if fmt in EXACT:
                assert (v is None) == bool(D[i, j] == 0), (fmt.name, i, j)


def test_get_value_of_a_stored_zero_is_zero_not_none() -> None:
    D = torch.zeros(4, 4, dtype=torch.float64)
    D[0, 1] = 3.0
    A = st.SparseTensor.from_dense(D, BSR(2, 2))  # the 2x2 block holds (0, 0), (1, 0), (1, 1) as zeros
    assert float(A.get_value((0, 1))) == 3.0
    assert float(A.get_value((1, 0))) == 0.0
    assert A.get_value((2, 2)) is None


def test_get_value_value_batch_and_batch_format() -> None:
    D = _dense(2, 4, 5)
    mask = D != 0
    Db = torch.stack([D, 2 * D, -D])
    A = st.SparseTensor.from_dense(Db, mask=mask.expand(3, 4, 5), batch_dims=1)
    assert tuple(A.shape) == (3, 4, 5)
    for b in range(3):
        for i in range(4):
            for j in range(5):
                v = A.get_value([b, i, j])
                assert (v is None) == (not bool(mask[i, j]))
                if v is not None:
                    assert float(v) == float(Db[b, i, j])
    B = st.SparseTensor.from_dense(Db, BATCHED_CSR)
    for b, i, j in [(0, 0, 0), (1, 2, 3), (2, 3, 4), (2, 1, 1)]:
        v = B.get_value([b, i, j])
        assert (v is None) == bool(Db[b, i, j] == 0) and (v is None or float(v) == float(Db[b, i, j]))


def test_get_value_sums_duplicates_of_a_nonunique_coo() -> None:
    # COO buffers with (1, 2) stored twice: the entry is their sum, as to_dense sees it
    pos0 = torch.tensor([0, 3])
    crd0 = torch.tensor([0, 1, 1])
    crd1 = torch.tensor([0, 2, 2])
    dup = "(i, j) -> (i : compressed(nonunique), j : singleton(nonunique))"
    A = st.SparseTensor(dup, (3, 3), [pos0, None], [crd0, crd1], torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
    assert float(A.get_value([1, 2])) == 7.0 == float(A.to_dense()[1, 2])
    assert float(A.get_value([0, 0])) == 1.0 and A.get_value([2, 2]) is None


def test_get_value_3d_and_tensor_indices() -> None:
    gen = torch.Generator().manual_seed(3)
    D = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64) * (torch.rand(3, 4, 5, generator=gen) < 0.3)
    A = st.SparseTensor.from_dense(D, COO_ND(3))
    for idx in [(0, 0, 0), (2, 3, 4), (1, 2, 3)]:
        v = A.get_value(torch.tensor(idx))
        assert (v is None) == bool(D[idx] == 0) and (v is None or float(v) == float(D[idx]))
    nz = D.nonzero()[0].tolist()
    assert float(A.get_value([torch.tensor(nz[0]), nz[1], nz[2]])) == float(D[tuple(nz)])


def test_get_value_is_differentiable_in_the_values() -> None:
    D = _dense(4)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone().requires_grad_(True)
    i, j = (int(x) for x in D.nonzero()[2])
    out = A.with_values(v).get_value([i, j]) * 3.0
    out.backward()
    # the gradient lands on the one slot that holds (i, j): scattered back it is 3 at (i, j) only
    expect = torch.zeros_like(D)
    expect[i, j] = 3.0
    torch.testing.assert_close(A.with_values(v.grad).to_dense(), expect, rtol=0, atol=0)


def test_get_value_errors_name_the_bad_index() -> None:
    A = st.SparseTensor.from_dense(_dense(5))
    with pytest.raises(InputError, match=r"3 indices .* 2 dimensions"):
        A.get_value([0, 1, 2])
    with pytest.raises(InputError, match=r"index 8 of dimension 1 is outside \[0, 8\)"):
        A.get_value([0, 8])
    with pytest.raises(InputError, match=r"index -1 of dimension 0 is outside \[0, 6\)"):
        A.get_value([-1, 0])
    with pytest.raises(InputError, match="index 1 is 1.5"):
        A.get_value([0, 1.5])
    with pytest.raises(InputError, match="is a bool"):
        A.get_value([True, 0])
    with pytest.raises(InputError, match="one index per dimension"):
        A.get_value(3)


# copy_ -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [CSR, CSC, COO, BSR(2, 2), DIA, ELL, NM(2, 4)], ids=_name)
def test_copy_writes_the_source_values_in_place(fmt) -> None:
    D = _dense(6)
    if fmt == NM(2, 4):
        D = _dense(6, 6, 8, density=0.45)
        D = D.reshape(6, 2, 4)
        keep = D.abs().topk(2, -1).indices
        D = torch.zeros_like(D).scatter_(-1, keep, D.gather(-1, keep)).reshape(6, 8)
    A = st.SparseTensor.from_dense(D, fmt)
    B = A.with_values(A.values * -2.5 + 1.0).clone()  # same pattern in fresh buffers, new values
    expect = B.to_dense()
    values_before = A.values
    out = A.copy_(B)
    assert out is A and A.values is values_before  # in place
    torch.testing.assert_close(A.to_dense(), expect, rtol=0, atol=0)
    assert B.values.data_ptr() != A.values.data_ptr()


def test_copy_keeps_autograd_through_the_source() -> None:
    D = _dense(7)
    A = st.SparseTensor.from_dense(D)
    w = torch.randn(A.values.shape, dtype=torch.float64, requires_grad=True)
    dst = A.with_values(torch.zeros_like(A.values))
    dst.copy_(A.with_values(w * 2.0))
    loss = (dst.to_dense() * D).sum()
    loss.backward()
    expect = 2.0 * D[D != 0]  # CSR order is row-major order of the nonzeros
    torch.testing.assert_close(w.grad, expect, rtol=1e-12, atol=1e-12)


def test_copy_refuses_what_is_not_compatible_and_writes_nothing() -> None:
    D = _dense(8)
    A = st.SparseTensor.from_dense(D)
    before = A.values.clone()
    other = _dense(9)
    cases = [
        (st.SparseTensor.from_dense(D, CSC), "format CSC differs from this tensor's CSR"),
        (st.SparseTensor.from_dense(D[:, :7]), r"shape \(6, 7\) differs"),
        (A.to(torch.float32), r"dtype float32 differs .*src\.to"),
        (A.convert(index_dtype=torch.int32), "index dtype int32 differs"),
        (D, "copy_ takes a SparseTensor"),
    ]
    for src, msg in cases:
        with pytest.raises(InputError, match=msg):
            A.copy_(src)
    # same format, shape and stored count, different pattern
    nz = int((D != 0).sum())
    flat = torch.zeros(D.numel(), dtype=torch.float64)
    flat[torch.randperm(D.numel(), generator=torch.Generator().manual_seed(0))[:nz]] = 1.0
    moved = st.SparseTensor.from_dense(flat.reshape(D.shape))
    assert moved.nse == A.nse and not torch.equal(moved.crd(1), A.crd(1))
    with pytest.raises(InputError, match="sparsity patterns differ"):
        A.copy_(moved)
    with pytest.raises(InputError, match="patterns differ"):
        A.copy_(st.SparseTensor.from_dense(other))
    torch.testing.assert_close(A.values, before, rtol=0, atol=0)


def test_copy_into_a_parameter_needs_no_grad() -> None:
    A = st.SparseTensor.from_dense(_dense(10))
    p = torch.nn.Parameter(A.values.clone())
    dst = A.with_values(p)
    src = A.with_values(A.values * 3)
    with pytest.raises(InputError, match="under torch.no_grad"):
        dst.copy_(src)
    with torch.no_grad():
        dst.copy_(src)
    torch.testing.assert_close(p.detach(), A.values * 3)


# set_kernel / run_kernel --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [CSR, COO, BSR(2, 2), DIA], ids=_name)
def test_run_kernel_with_indices_matches_the_dense_transformation(fmt) -> None:
    D = _dense(11)
    A = st.SparseTensor.from_dense(D, fmt)
    A.set_kernel(lambda v, i, j: torch.where(j >= i, v * (1 + i + 10 * j), -v))
    A.run_kernel()
    i = torch.arange(D.shape[0]).unsqueeze(1)
    j = torch.arange(D.shape[1]).unsqueeze(0)
    expect = torch.where(j >= i, D * (1 + i + 10 * j), -D)
    torch.testing.assert_close(A.to_dense(), expect, rtol=1e-14, atol=0)


def test_run_kernel_value_only_touches_stored_entries_and_runs_again() -> None:
    D = _dense(12)
    A = st.SparseTensor.from_dense(D, ELL)  # ELL pads short rows: padding stays zero
    A.set_kernel(lambda v: v * 2 + 1, with_indices=False)
    A.run_kernel()
    A.run_kernel()
    expect = torch.where(D != 0, (D * 2 + 1) * 2 + 1, torch.zeros((), dtype=torch.float64))
    torch.testing.assert_close(A.to_dense(), expect, rtol=1e-14, atol=0)


def test_run_kernel_on_a_value_batch_and_a_parameter() -> None:
    D = _dense(13, 4, 5)
    mask = D != 0
    Db = torch.stack([D, 3 * D])
    A = st.SparseTensor.from_dense(Db, mask=mask.expand(2, 4, 5), batch_dims=1)
    p = torch.nn.Parameter(A.values.clone())
    W = A.with_values(p)
    W.set_kernel(lambda v, i, j: v * (i == j))
    W.run_kernel()  # under no_grad: a data update, as an optimizer's
    eye = torch.eye(4, 5, dtype=torch.bool)
    torch.testing.assert_close(W.to_dense().detach(), torch.where(eye, Db, torch.zeros((), dtype=torch.float64)))
    assert p.grad is None and p.requires_grad


def test_kernel_errors_and_copy_drops_the_kernel() -> None:
    A = st.SparseTensor.from_dense(_dense(14))
    with pytest.raises(InputError, match="no kernel has been set"):
        A.run_kernel()
    with pytest.raises(InputError, match="takes a callable"):
        A.set_kernel(b"\x00lto")
    A.set_kernel(lambda v, i, j: torch.ones(3, dtype=v.dtype))
    with pytest.raises(InputError, match=r"returned shape \(3,\)"):
        A.run_kernel()
    A.set_kernel(lambda v: v * 1j, with_indices=False)
    with pytest.raises(InputError, match="complex values"):
        A.run_kernel()
    A.copy_(A.clone())
    with pytest.raises(InputError, match="no kernel has been set"):
        A.run_kernel()


# UST's metadata names and from_file ---------------------------------------------------------------
def test_ust_metadata_names() -> None:
    D = _dense(15, 6, 8)
    A = st.SparseTensor.from_dense(D, BSR(2, 4))
    assert A.num_dimensions == 2 and A.num_levels == 4
    assert A.levels == [3, 2, 2, 4] == A.format.dim2lvl([6, 8], as_size=True)
    assert A.index_type == "int64" and A.convert(index_dtype=torch.int32).index_type == "int32"
    assert A.device_id == "cpu"
    assert st.SparseTensor.from_dense(D).levels == [6, 8]


def test_from_file_frostt_and_matrix_market(tmp_path) -> None:
    tns = tmp_path / "t.tns"
    tns.write_text("# a 3-D tensor, 1-based\n1 1 1 2.5\n2 3 4 -1.0\n2 3 4 0.5\n3 1 2 4.0\n")
    T = st.SparseTensor.from_file(str(tns))
    expect = torch.zeros(3, 3, 4, dtype=torch.float64)
    expect[0, 0, 0], expect[1, 2, 3], expect[2, 0, 1] = 2.5, -0.5, 4.0  # the duplicate summed
    torch.testing.assert_close(T.to_dense(), expect, rtol=0, atol=0)
    bad = tmp_path / "bad.tns"
    bad.write_text("0 1 2.0\n")
    with pytest.raises(InputError, match="1-based"):
        st.SparseTensor.from_file(str(bad))
    with pytest.raises(InputError, match="neither"):
        st.SparseTensor.from_file(str(tmp_path / "x.csv"))
    pytest.importorskip("scipy")
    mtx = tmp_path / "m.mtx"
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n3 4 3\n1 1 1.5\n3 4 -2.0\n2 2 7.0\n")
    M = st.SparseTensor.from_file(str(mtx))
    expect = torch.zeros(3, 4, dtype=torch.float64)
    expect[0, 0], expect[2, 3], expect[1, 1] = 1.5, -2.0, 7.0
    torch.testing.assert_close(M.to_dense(), expect, rtol=0, atol=0)


def test_convert_takes_ust_spelling_of_dtypes() -> None:
    A = st.SparseTensor.from_dense(_dense(16))
    B = A.convert(CSC, index_type="int32", dtype="float32")
    assert B.index_dtype == torch.int32 and B.dtype == torch.float32 and B.index_type == "int32"
    torch.testing.assert_close(B.to_dense(), A.to_dense().float(), rtol=0, atol=0)
    with pytest.raises(st.ConversionError, match="not a torch dtype"):
        A.convert(CSC, index_type="int33")
    with pytest.raises(st.ConversionError, match="not both"):
        A.convert(CSC, index_type="int32", index_dtype=torch.int32)
