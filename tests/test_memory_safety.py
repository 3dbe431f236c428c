"""Memory safety of index buffers, safe serialization, and the conversion fill guard (issue 14).

* Index buffers written in place after construction are validated again before compiled code
  reads them (``A @ x``, ``to_package``, ``solve``, conversions): a ValidationError, not a crash.
* ``torch.save``/``torch.load`` (``weights_only=True``, torch's default) and ``pickle`` round-trip
  every named format, and a corrupted pickle raises on load.
* A conversion that would store far more slots than nonzeros raises ConversionError before
  allocating, naming the fill and the option that allows it.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch

import sparsetorch as st
from sparsetorch import ConversionError, ValidationError
from sparsetorch.format import BATCHED_CSR, BSR, COO, CSC, CSR, DELTA, DENSE, DENSE_COL, DIA, DIA_J, ELL, NM
from sparsetorch.tensor import sparse_tensor as sparse_tensor_module
from sparsetorch.tensor.sparse_tensor import rebuild_sparse_tensor

pytestmark = pytest.mark.usefixtures("single_thread")


def _dense(n: int = 8, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """A nonsingular n x n matrix with a few off-diagonal entries (diagonally dominant)."""
    g = torch.Generator().manual_seed(seed)
    off = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.3)
    d = off + torch.eye(n, dtype=torch.float64) * (off.abs().sum(1) + 1)
    return d.to(dtype)


# 1. In-place writes to index buffers ----------------------------------------------------------

def _corrupted_csr():
    d = _dense()
    A = st.SparseTensor.from_dense(d, CSR)
    before = A.crd(1).clone()
    A.crd(1)[3] = 50  # out of range for 8 columns
    return A, d, before


def test_out_of_range_column_written_in_place_raises_in_matmul() -> None:
    A, d, before = _corrupted_csr()
    x = torch.arange(8, dtype=torch.float64)
    with pytest.raises(ValidationError, match=r"crd\[1\]\[3\] = 50 is out of range for level 1.*\[0, 8\)"):
        A @ x
    with pytest.raises(ValidationError, match="written in place"):
        st.matmul(A, x)
    with pytest.raises(ValidationError, match="out of range"):
        x @ A  # through A.T
    A.crd(1).copy_(before)  # repaired: the next call checks again and computes
    torch.testing.assert_close(A @ x, d @ x)


def test_planned_matmul_sees_an_in_place_index_write() -> None:
    """``Matmul.execute`` on a plan made before the write: an invalid write raises before any
    backend reads the buffer; a valid one (another column, still ordered) is planned again and
    the product is the new matrix's (the old plan may hold a copy of the old pattern)."""
    d = _dense()
    A = st.SparseTensor.from_dense(d, CSR)
    x = torch.arange(8, dtype=torch.float64)
    mm = st.Matmul(A, x)
    mm.plan()
    torch.testing.assert_close(mm.execute(), d @ x)
    before = A.crd(1).clone()
    A.crd(1)[3] = 50
    with pytest.raises(ValidationError, match="out of range"):
        mm.execute()
    A.crd(1).copy_(before)
    torch.testing.assert_close(mm.execute(), d @ x)
    # move one stored entry to a free column of its row, keeping the row's columns increasing
    pos, crd = A.pos(1), A.crd(1)
    row = next(r for r in range(8) if int(pos[r + 1] - pos[r]) < 8)
    cols = crd[int(pos[row]):int(pos[row + 1])].tolist()
    free = [c for c in range(8) if c not in cols]
    slot, new_col = None, None
    for k in range(len(cols)):  # an entry whose next-free neighbour keeps the order
        lo = cols[k - 1] if k else -1
        hi = cols[k + 1] if k + 1 < len(cols) else 8
        cand = [f for f in free if lo < f < hi]
        if cand:
            slot, new_col = int(pos[row]) + k, cand[0]
            break
    assert slot is not None
    old_col = int(crd[slot])
    crd[slot] = new_col
    moved = d.clone()
    moved[row, new_col], moved[row, old_col] = d[row, old_col], 0.0
    torch.testing.assert_close(mm.execute(), moved @ x)


def test_bindable_capability_is_asked_by_member() -> None:
    """A plan with a callable ``bind`` has the Bindable capability, one without (or with a
    non-callable attribute) has not."""
    from sparsetorch.backend import Bindable, supports

    class WithBind:
        def bind(self, values, X):
            return None

    class Without:
        bind = None

    assert supports(WithBind(), Bindable)
    assert not supports(Without(), Bindable) and not supports(object(), Bindable)


def test_out_of_range_column_written_in_place_raises_in_to_package_scipy() -> None:
    pytest.importorskip("scipy")
    A, d, before = _corrupted_csr()
    with pytest.raises(ValidationError, match=r"crd\[1\]\[3\] = 50"):
        A.to_package("scipy")
    for package in ("torch", "numpy"):
        with pytest.raises(ValidationError, match="out of range"):
            A.to_package(package)
    A.crd(1).copy_(before)
    sp = A.to_package("scipy")
    torch.testing.assert_close(torch.from_numpy(sp.toarray()), d)


def test_out_of_range_column_written_in_place_raises_in_solve() -> None:
    A, d, before = _corrupted_csr()
    b = torch.ones(8, dtype=torch.float64)
    with pytest.raises(ValidationError, match=r"crd\[1\]\[3\] = 50"):
        st.solve(A, b)
    with pytest.raises(ValidationError, match="out of range"):
        st.Solver(A)
    A.crd(1).copy_(before)
    torch.testing.assert_close(st.solve(A, b), torch.linalg.solve(d, b))


def test_conversions_and_dense_revalidate() -> None:
    A, d, before = _corrupted_csr()
    for step in (lambda: A.convert(COO), lambda: A.convert(CSR, index_dtype=torch.int32), lambda: A.to_dense(),
                 lambda: A.entries(), lambda: A.clone(), lambda: A.T, lambda: A.to(torch.float32), lambda: pickle.dumps(A)):
        with pytest.raises(ValidationError, match="out of range"):
            step()
    A.crd(1).copy_(before)
    torch.testing.assert_close(A.convert(COO).to_dense(), d)


def test_tensors_sharing_the_buffers_see_the_write() -> None:
    """``with_values`` and ``detach`` share index buffers: one write is seen by all of them."""
    d = _dense()
    A = st.SparseTensor.from_dense(d, CSR)
    B = A.detach()
    C = A.with_values(A.values * 2)
    A.crd(1)[0] = -1
    for t in (A, B, C):
        with pytest.raises(ValidationError, match=r"crd\[1\]\[0\] = -1"):
            t.ensure_valid()
    A.crd(1)[0] = st.SparseTensor.from_dense(d, CSR).crd(1)[0]
    x = torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(C @ x, 2 * (d @ x))


def test_non_monotone_pos_written_in_place_names_the_buffer() -> None:
    A = st.SparseTensor.from_dense(_dense(), CSR)
    A.pos(1)[2] = A.pos(1)[4] + 1  # pos[1] no longer non-decreasing
    with pytest.raises(ValidationError, match=r"pos\[1\] must be non-decreasing"):
        A @ torch.ones(8, dtype=torch.float64)


def test_in_place_write_on_a_batch_format_refreshes_its_linear_buffers() -> None:
    """BATCHED_CSR keeps linearized copies of its per-batch pos: a valid in-place write must
    reach them (the result follows the new pattern), an invalid one must raise."""
    # batch 0: rows [x . .], [. x .], [. . x]; batch 1: the same
    pos = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    crd = torch.tensor([[0, 1, 2], [0, 1, 2]])
    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    A = st.SparseTensor(BATCHED_CSR, (2, 3, 3), [None, None, pos], [None, None, crd], vals)
    torch.testing.assert_close(A.to_dense(), torch.stack([torch.diag(vals[0]), torch.diag(vals[1])]))
    # batch 1 becomes: row 0 empty, row 1 holds columns 0 and 1, row 2 column 2
    A.pos(2)[1, 1] = 0
    A.crd(2)[1, 0], A.crd(2)[1, 1] = 0, 1
    want1 = torch.zeros(3, 3, dtype=torch.float64)
    want1[1, 0], want1[1, 1], want1[2, 2] = 4.0, 5.0, 6.0
    torch.testing.assert_close(A.to_dense(), torch.stack([torch.diag(vals[0]), want1]))
    A.crd(2)[0, 2] = 3  # out of range
    with pytest.raises(ValidationError, match=r"crd\[2\]\[0\]\[2\] = 3 is out of range"):
        A.to_dense()


def test_ensure_valid_on_an_unchanged_tensor_does_no_validation(monkeypatch) -> None:
    A = st.SparseTensor.from_dense(_dense(), CSR)
    B = A.with_values(A.values * 3)
    calls = []
    real = sparse_tensor_module._check_levels

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sparse_tensor_module, "_check_levels", counting)
    for _ in range(5):
        assert A.ensure_valid() is A
        assert B.ensure_valid() is B
    A.values.mul_(2)  # values are not index buffers
    A.ensure_valid()
    assert calls == []
    A.crd(1)[0] = A.crd(1)[0]  # an in-place write (same value): one full check, then none
    A.ensure_valid()
    A.ensure_valid()
    assert len(calls) == 1


def test_check_false_trusts_the_buffers_until_written_and_validate_checks_in_full() -> None:
    d = _dense()
    A = st.SparseTensor.from_dense(d, CSR)
    bad = A.crd(1).clone()
    bad[1] = 99
    T = st.SparseTensor(CSR, (8, 8), [None, A.pos(1)], [None, bad], A.values.clone(), check=False)
    T.ensure_valid()  # trusted as constructed (documented)
    with pytest.raises(ValidationError, match=r"validate\(\).*|crd\[1\]\[1\] = 99"):
        T.validate()
    with pytest.raises(ValidationError, match=r"crd\[1\]\[1\] = 99"):
        st.SparseTensor(CSR, (8, 8), [None, A.pos(1)], [None, bad], A.values.clone())
    assert A.validate() is A


# 2. Serialization -------------------------------------------------------------------------------

def _examples() -> dict[str, st.SparseTensor]:
    d = _dense(9, seed=3)
    A = st.SparseTensor.from_dense(d, CSR)
    out = {f.name: A.convert(f) for f in (COO, CSR, CSC, BSR(3, 3), DIA, DIA_J, ELL, DELTA(2))}
    out["NM"] = st.SparseTensor.from_dense(torch.tensor([[1.0, 0, 2, 0], [0, 3, 0, 4]], dtype=torch.float64), NM(2, 4))
    out["batch of values"] = A.with_values(torch.stack([A.values, 2 * A.values, -A.values]))
    bd = torch.stack([d, d.T.contiguous() * (d != 0).T])
    out["BATCHED_CSR"] = st.SparseTensor.from_dense(bd, BATCHED_CSR)
    out["complex"] = A.with_values(A.values * (1 + 2j)).convert(COO)
    out["int32"] = A.convert(CSR, index_dtype=torch.int32)
    out["requires_grad"] = A.with_values(A.values.clone().requires_grad_(True))
    return out


def _same(a: st.SparseTensor, b: st.SparseTensor) -> None:
    assert type(b) is st.SparseTensor
    assert b.format == a.format and b.format.name == a.format.name and b.shape == a.shape
    assert b.index_dtype == a.index_dtype and b.dtype == a.dtype
    for x, y in zip((*a.pos_buffers, *a.crd_buffers), (*b.pos_buffers, *b.crd_buffers)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y)
    assert torch.equal(a.values.detach(), b.values.detach())
    assert b.requires_grad == a.requires_grad
    if a.requires_grad:
        assert b.values.is_leaf
    torch.testing.assert_close(b.to_dense().detach(), a.to_dense().detach())


@pytest.mark.parametrize("name", list(_examples()))
def test_torch_save_load_weights_only_round_trips(name: str, tmp_path) -> None:
    A = _examples()[name]
    path = tmp_path / "a.pt"
    torch.save(A, path)
    _same(A, torch.load(path))  # torch's default: weights_only=True
    _same(A, torch.load(path, weights_only=True))
    buf = io.BytesIO()
    torch.save({"A": A, "step": 3}, buf)
    buf.seek(0)
    got = torch.load(buf, weights_only=True)
    assert got["step"] == 3
    _same(A, got["A"])


@pytest.mark.parametrize("name", list(_examples()))
def test_pickle_round_trips(name: str) -> None:
    A = _examples()[name]
    _same(A, pickle.loads(pickle.dumps(A)))


def test_gradient_flows_through_a_loaded_tensor(tmp_path) -> None:
    d = _dense()
    A = st.SparseTensor.from_dense(d, CSR)
    A = A.with_values(A.values.clone().requires_grad_(True))
    torch.save(A, tmp_path / "a.pt")
    B = torch.load(tmp_path / "a.pt")
    x = torch.randn(8, dtype=torch.float64)
    (B @ x).sum().backward()
    # d(sum(A x))/dA[i, j] = x[j] on the pattern
    rows, cols = B.entries()[0]
    torch.testing.assert_close(B.values.grad, x[cols])


class _Forged:
    """Pickles as a SparseTensor would, with the buffers it is given (a corrupted file)."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (rebuild_sparse_tensor, self.args)


def _forged(crd_value: int) -> _Forged:
    A = st.SparseTensor.from_dense(_dense(), CSR)
    crd = A.crd(1).clone()
    crd[2] = crd_value
    return _Forged(str(A.format), A.format.name, (8, 8), [None, A.pos(1).clone()], [None, crd], A.values.clone())


def test_corrupted_pickle_raises_on_load(tmp_path) -> None:
    blob = pickle.dumps(_forged(1000))
    with pytest.raises(ValidationError, match=r"not loaded.*crd\[1\]\[2\] = 1000 is out of range"):
        pickle.loads(blob)
    torch.save(_forged(-7), tmp_path / "bad.pt")
    with pytest.raises(ValidationError, match=r"crd\[1\]\[2\] = -7 is out of range"):
        torch.load(tmp_path / "bad.pt", weights_only=True)
    # the same forged structure with valid data loads: the check is what failed above
    ok = _forged(int(st.SparseTensor.from_dense(_dense(), CSR).crd(1)[2]))
    torch.testing.assert_close(pickle.loads(pickle.dumps(ok)).to_dense(), _dense())


def test_rebuild_takes_plain_data_only() -> None:
    A = st.SparseTensor.from_dense(_dense(), CSR)
    assert rebuild_sparse_tensor in torch.serialization.get_safe_globals()
    with pytest.raises(ValidationError, match="format as a string"):
        rebuild_sparse_tensor(A.format, None, (8, 8), [None, A.pos(1)], [None, A.crd(1)], A.values)
    with pytest.raises(ValidationError, match="shape as integers"):
        rebuild_sparse_tensor(str(A.format), None, "8x8", [None, A.pos(1)], [None, A.crd(1)], A.values)


def test_weights_only_load_still_refuses_other_globals(tmp_path) -> None:
    """A file that would run code on load (os.system) is refused by the default load."""

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"A": st.SparseTensor.from_dense(_dense(), CSR), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "evil.pt")


def test_fresh_process_loads_after_import(tmp_path) -> None:
    """The rebuild is registered as a safe global when sparsetorch is imported."""
    A = st.SparseTensor.from_dense(_dense()).convert(DIA)
    torch.save(A, tmp_path / "a.pt")
    torch.save(A.to_dense(), tmp_path / "d.pt")
    code = (
        "import sys, torch, sparsetorch as st\n"
        "A = torch.load(sys.argv[1]); d = torch.load(sys.argv[2])\n"
        "assert isinstance(A, st.SparseTensor) and A.format.name == 'DIA'\n"
        "assert torch.equal(A.to_dense(), d)\n"
        "print('loaded', A.nse)\n"
    )
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.pt"), str(tmp_path / "d.pt")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"loaded {A.nse}"


# 3. The conversion fill guard ---------------------------------------------------------------------

def _numbers(message: str) -> tuple[int, int]:
    m = re.search(r"would store ([\d,]+) slots for ([\d,]+) nonzeros", message)
    assert m, message
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def _coo(rows, cols, shape, seed=0) -> st.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
    vals = torch.rand(rows.numel(), generator=g, dtype=torch.float64) + 1
    return st.SparseTensor.from_coo(vals, rows, cols, shape=shape, format=CSR)


def test_dia_fill_small_matrix_with_explicit_bound(monkeypatch) -> None:
    monkeypatch.delenv("SPARSETORCH_MAX_FILL", raising=False)
    # 300 x 300, 300 entries on 300 distinct diagonals: DIA stores 300 x 300 slots
    n = k = 300
    rows = torch.arange(k)
    cols = (2 * rows) % n
    A = _coo(rows, cols, (n, n))
    diagonals = {int(c) - int(r) for r, c in zip(rows, cols)}
    want = len(diagonals) * n
    assert want > 8 * k + 65536  # the default bound refuses it too
    for bound in (None, 1, 8.0):
        with pytest.raises(ConversionError) as e:
            A.convert(DIA, max_fill=bound)
        slots, nnz = _numbers(str(e.value))
        assert (slots, nnz) == (want, k)
        assert "max_fill=" in str(e.value) and "SPARSETORCH_MAX_FILL" in str(e.value)
        assert f"{want * 8 / 1e3:.1f} kB" in str(e.value)  # the bytes of float64 values
        assert "nothing of that size was allocated" in str(e.value)
    D = A.convert(DIA, max_fill=want / k)  # exactly the fill: allowed
    assert D.nse == want
    torch.testing.assert_close(D.to_dense(), A.to_dense())
    torch.testing.assert_close(A.convert(DIA, max_fill=math.inf).to_dense(), A.to_dense())


def test_ell_and_bsr_fill_counts() -> None:
    # ELL: one full row of 400 and one entry in each other row -> 400 x 400 slots
    n = 400
    rows = torch.cat([torch.zeros(n, dtype=torch.int64), torch.arange(1, n)])
    cols = torch.cat([torch.arange(n), torch.arange(1, n)])
    A = _coo(rows, cols, (n, n))
    counts = torch.bincount(rows, minlength=n)
    with pytest.raises(ConversionError) as e:
        A.convert(ELL)
    assert _numbers(str(e.value)) == (int(counts.max()) * n, rows.numel())
    torch.testing.assert_close(A.convert(ELL, max_fill=n).to_dense(), A.to_dense())
    # BSR(32, 32) of a 4000 x 4000 diagonal: 125 blocks of 1024 slots for 4000 nonzeros
    m = 4000
    I = _coo(torch.arange(m), torch.arange(m), (m, m))
    blocks = len({(i // 32, i // 32) for i in range(m)})
    with pytest.raises(ConversionError) as e:
        I.convert(BSR(32, 32))
    assert _numbers(str(e.value)) == (blocks * 1024, m)
    B = I.convert(BSR(32, 32), max_fill=32 * 32)
    assert B.nse == blocks * 1024
    torch.testing.assert_close(B.to_dense(), I.to_dense())
    assert I.convert(BSR(2, 2)).nse == m // 2 * 4  # 2x fill: under the default bound


def test_all_dense_formats_are_not_bounded() -> None:
    """DENSE stores the shape's size whatever the pattern (what the caller named): no bound."""
    n = 400
    A = _coo([0, 5, 399], [3, 5, 0], (n, n))
    for fmt in (DENSE, DENSE_COL):
        D = A.convert(fmt)
        assert D.nse == n * n
        torch.testing.assert_close(D.to_dense(), A.to_dense())


def test_default_bound_refuses_dia_of_a_large_random_matrix_before_allocating() -> None:
    """The case of the issue: 20000^2 with 200k random nonzeros would need ~720M DIA slots
    (5.8 GB). The count comes from the distinct diagonals, before any slot is allocated."""
    n, nnz = 20000, 200_000
    g = torch.Generator().manual_seed(1)
    r = torch.randint(0, n, (nnz,), generator=g)
    c = torch.randint(0, n, (nnz,), generator=g)
    A = st.SparseTensor.from_coo(torch.ones(nnz, dtype=torch.float64), r, c, shape=(n, n), format=CSR)
    distinct = int(torch.unique(r * n + c).numel())
    diagonals = int(torch.unique(c - r).numel())
    with pytest.raises(ConversionError, match="SPARSETORCH_MAX_FILL") as e:
        A.convert(DIA)
    assert _numbers(str(e.value)) == (diagonals * n, distinct)
    assert re.search(r"\d\.\d GB of values", str(e.value))
    blocks = int(torch.unique((r // 4) * (n // 4) + c // 4).numel())
    with pytest.raises(ConversionError) as e:
        A.convert(BSR(4, 4))
    assert _numbers(str(e.value)) == (blocks * 16, distinct)


def test_environment_variable_sets_the_default(monkeypatch) -> None:
    n = 300
    rows = torch.arange(300)
    A = _coo(rows, (2 * rows) % n, (n, n))
    monkeypatch.setenv("SPARSETORCH_MAX_FILL", "inf")
    torch.testing.assert_close(A.convert(DIA).to_dense(), A.to_dense())
    monkeypatch.setenv("SPARSETORCH_MAX_FILL", "2")
    with pytest.raises(ConversionError, match="over the bound of 2x"):
        A.convert(DIA)
    monkeypatch.setenv("SPARSETORCH_MAX_FILL", "lots")
    with pytest.raises(ConversionError, match="SPARSETORCH_MAX_FILL = 'lots' is not a number"):
        A.convert(DIA)
    monkeypatch.delenv("SPARSETORCH_MAX_FILL")
    with pytest.raises(ConversionError, match="max_fill must be a non-negative number"):
        A.convert(DIA, max_fill=-1)


def test_cached_conversion_is_held_to_each_calls_bound() -> None:
    n = 300
    rows = torch.arange(300)
    A = _coo(rows, (2 * rows) % n, (n, n))
    A.convert(DIA, max_fill=math.inf)  # cached on the pattern
    with pytest.raises(ConversionError):
        A.convert(DIA)


def test_from_coo_and_from_dense_are_guarded_too() -> None:
    n = 300
    rows = torch.arange(300)
    cols = (2 * rows) % n
    vals = torch.ones(300, dtype=torch.float64)
    with pytest.raises(ConversionError, match="from_coo"):
        st.SparseTensor.from_coo(vals, rows, cols, shape=(n, n), format=DIA)
    d = st.SparseTensor.from_coo(vals, rows, cols, shape=(n, n), format=DIA, max_fill=300).to_dense()
    want = torch.zeros(n, n, dtype=torch.float64)
    want[rows, cols] = 1
    torch.testing.assert_close(d, want)
    with pytest.raises(ConversionError, match="from_dense"):
        st.SparseTensor.from_dense(want, DIA)
    torch.testing.assert_close(st.SparseTensor.from_dense(want, DIA, max_fill=300).to_dense(), want)


def test_fill_bytes_count_every_value_set() -> None:
    n = 300
    rows = torch.arange(300)
    A = _coo(rows, (2 * rows) % n, (n, n))
    B = A.with_values(torch.stack([A.values] * 4))  # 4 value sets of complex128
    B = B.with_values(B.values.to(torch.complex128))
    with pytest.raises(ConversionError) as e:
        B.convert(DIA)
    slots, _ = _numbers(str(e.value))
    assert f"{slots * 16 * 4 / 1e6:.1f} MB" in str(e.value)


def test_sparse_tensor_list_round_trips(tmp_path) -> None:
    a = st.SparseTensor.from_dense(_dense(5, seed=1), CSR)
    b = st.SparseTensor.from_dense(_dense(7, seed=2), CSR).convert(COO)
    L = st.SparseTensorList([a, b])
    torch.save(L, tmp_path / "l.pt")
    for got in (torch.load(tmp_path / "l.pt"), pickle.loads(pickle.dumps(L))):
        assert isinstance(got, st.SparseTensorList) and len(got) == 2
        _same(a, got[0])
        _same(b, got[1])
