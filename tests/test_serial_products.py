"""Small CPU products run serially in NumPy (``sparsetorch/tensor/_serial.py``): values against dense
float64 references, every row shape (empty first / middle / last rows, no entries), the torch
backend's plan and bound product on both sides of the size threshold, shape errors, inputs left
alone, and threads sharing one plan."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.backends.torch_native.spmm import TorchSpmmPlan
from sparsetorch.tensor import _serial
from sparsetorch.tensor._serial import SerialCsr, serial_ok

DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]


def _random_csr(m: int, n: int, density: float, seed: int, empty_rows=(), dtype=np.float64) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    A = sp.random(m, n, density=density, random_state=rng, format="lil", dtype=np.float64)
    for r in empty_rows:
        A[r, :] = 0
    A = A.tocsr()
    A.eliminate_zeros()
    if np.dtype(dtype).kind == "c":
        B = A.copy()
        B.data = rng.standard_normal(B.nnz)
        A = (A + 1j * B).astype(dtype)
    return A.astype(dtype)


def _tol(dtype):
    return 1e-5 if dtype in (torch.float32, torch.complex64) else 1e-12


@pytest.fixture(params=["scipy", "numpy"])
def kernel(request, monkeypatch):
    """Both serial paths: SciPy's compiled kernel, and NumPy (a core installed without SciPy)."""
    if request.param == "numpy":
        monkeypatch.setattr(_serial, "_KERNELS", [None])
    else:
        assert _serial._scipy_kernels() is not None
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("k", [None, 1, 3])
def test_serial_csr_matches_dense(dtype, index_dtype, k, kernel):
    np_dtype = {torch.float32: np.float32, torch.float64: np.float64, torch.complex64: np.complex64,
                torch.complex128: np.complex128}[dtype]
    A = _random_csr(37, 23, 0.2, 1, empty_rows=(0, 5, 6, 35, 36), dtype=np_dtype)
    crow = torch.from_numpy(A.indptr).to(index_dtype)
    col = torch.from_numpy(A.indices).to(index_dtype)
    vals = torch.from_numpy(A.data.copy())
    rng = torch.Generator().manual_seed(2)
    X = torch.randn(23, *(() if k is None else (k,)), dtype=torch.float64, generator=rng).to(dtype)
    X0, v0 = X.clone(), vals.clone()
    got = SerialCsr(crow, col, (37, 23))(vals, X)
    ref = torch.from_numpy(A.toarray()).to(torch.complex128 if dtype.is_complex else torch.float64) @ X.to(
        torch.complex128 if dtype.is_complex else torch.float64)
    assert got.shape == ref.shape and got.dtype == dtype
    torch.testing.assert_close(got.to(ref.dtype), ref, rtol=_tol(dtype), atol=_tol(dtype))
    assert torch.equal(X, X0) and torch.equal(vals, v0)  # inputs untouched
    # into out=, and on a strided (transposed) X
    if k is not None:
        Xt = X.T.contiguous().T
        out = torch.full(ref.shape, float("nan"), dtype=dtype)
        SerialCsr(crow, col, (37, 23))(vals, Xt, out=out)
        torch.testing.assert_close(out.to(ref.dtype), ref, rtol=_tol(dtype), atol=_tol(dtype))


def test_serial_csr_edge_patterns(kernel):
    # no entries at all; one entry in the last row; every row empty but one in the middle
    for m, n, entries in [(4, 3, []), (4, 3, [(3, 2, 5.0)]), (5, 5, [(2, 0, 1.5), (2, 4, -2.0)])]:
        dense = np.zeros((m, n))
        for i, j, v in entries:
            dense[i, j] = v
        A = sp.csr_matrix(dense)
        X = torch.randn(n, 2, dtype=torch.float64)
        got = SerialCsr(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), (m, n))(
            torch.from_numpy(A.data.astype(np.float64)), X)
        torch.testing.assert_close(got, torch.from_numpy(dense) @ X, rtol=0, atol=1e-15)


def test_serial_csr_nonfinite_x_only_reaches_rows_that_store_its_column(kernel):
    A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]))
    X = torch.tensor([1.0, float("inf"), 2.0], dtype=torch.float64)
    got = SerialCsr(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), (3, 3))(torch.from_numpy(A.data), X)
    assert got[0] == 5.0 and got[1] == float("inf") and got[2] == 0.0


def test_serial_csr_checks_shapes(kernel):
    A = sp.identity(4, format="csr")
    f = SerialCsr(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), (4, 4))
    with pytest.raises(ValueError, match="shapes"):
        f(torch.from_numpy(A.data), torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="shapes"):
        f(torch.from_numpy(A.data), torch.ones(4, 2, dtype=torch.float64), out=torch.empty(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="values"):
        f(torch.ones(3, dtype=torch.float64), torch.ones(4, dtype=torch.float64))


@pytest.fixture
def serial_calls(monkeypatch):
    """Counts SerialCsr products."""
    calls = []
    real = SerialCsr.__call__

    def counted(self, *args, **kw):
        calls.append(self.m)
        return real(self, *args, **kw)

    monkeypatch.setattr(SerialCsr, "__call__", counted)
    return calls


@pytest.fixture
def two_threads():
    """serial_ok needs more than one intra-op thread (CI machines may give torch one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    yield
    torch.set_num_threads(threads)


def test_serial_ok_rules(two_threads):
    v = torch.ones(10, dtype=torch.float64)
    x = torch.ones(5, 2, dtype=torch.float64)
    assert serial_ok(v, x)
    assert not serial_ok(v.float(), x)  # dtypes differ
    assert not serial_ok(v.half(), x.half())  # half: products upcast before they get here
    assert not serial_ok(torch.ones(2, 10, dtype=torch.float64), x)  # a value batch
    assert not serial_ok(v.requires_grad_(), x)  # autograd has something to record
    with torch.no_grad():
        assert serial_ok(v, x)
    big = torch.ones(_serial.SERIAL_MAX + 1, dtype=torch.float64)
    assert not serial_ok(big, torch.ones(3, dtype=torch.float64))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # no parallel region in torch's kernel: it is faster then
        assert not serial_ok(v.detach(), x)
    finally:
        torch.set_num_threads(threads)
    c = torch.ones(4, dtype=torch.complex128)
    assert not serial_ok(c, torch.ones(3, 1, dtype=torch.complex128).conj())  # a lazily conjugated view


@pytest.mark.parametrize("serial_max", [0, 1 << 15])
def test_torch_backend_plan_both_sides_of_the_threshold(monkeypatch, serial_max, two_threads, serial_calls, kernel):
    monkeypatch.setattr(_serial, "SERIAL_MAX", serial_max)
    A = _random_csr(60, 45, 0.1, 3, empty_rows=(0, 59))
    T = st.from_package(A)
    plan = TorchSpmmPlan(T)
    plan.set_values(T.values)
    D = torch.from_numpy(A.toarray())
    for X in (torch.randn(45, 1, dtype=torch.float64), torch.randn(45, 4, dtype=torch.float64)):
        torch.testing.assert_close(plan.apply(X), D @ X, rtol=1e-12, atol=1e-12)
    Xa = torch.randn(60, 3, dtype=torch.float64)
    torch.testing.assert_close(plan.apply(Xa, adjoint=True), D.T @ Xa, rtol=1e-12, atol=1e-12)
    # the bound product (Matmul.execute's path) into Y
    X = torch.randn(45, 2, dtype=torch.float64)
    bound = plan.bind(T.values, X)
    Y = torch.empty(60, 2, dtype=torch.float64)
    assert bound(X, Y)
    torch.testing.assert_close(Y, D @ X, rtol=1e-12, atol=1e-12)
    y = torch.empty(60, dtype=torch.float64)
    assert bound(X[:, :1], y)
    torch.testing.assert_close(y, (D @ X[:, :1])[:, 0], rtol=1e-12, atol=1e-12)
    # the one-shot product through dispatch
    torch.testing.assert_close(st.matmul(T, X, backend="torch"), D @ X, rtol=1e-12, atol=1e-12)
    assert (len(serial_calls) > 0) == (serial_max > 0)


def test_matmul_execute_sees_values_written_in_place():
    A = _random_csr(30, 30, 0.2, 4)
    T = st.from_package(A)
    x = torch.randn(30, dtype=torch.float64)
    mm = st.Matmul(T, x, backend="torch")
    mm.plan()
    ref = torch.from_numpy(A.toarray()) @ x
    torch.testing.assert_close(mm.execute(), ref)
    T.values.mul_(2.0)  # (A.data too: the tensor is a view of SciPy's buffers)
    torch.testing.assert_close(mm.execute(), 2.0 * ref)


def test_threads_share_one_plan(two_threads):
    A = _random_csr(200, 200, 0.05, 5)
    T = st.from_package(A)
    plan = TorchSpmmPlan(T)
    plan.set_values(T.values)
    D = torch.from_numpy(A.toarray())
    errors: list[str] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(50):
            X = torch.randn(200, 1 + seed % 3, dtype=torch.float64, generator=g)
            if not torch.allclose(plan.apply(X), D @ X, rtol=1e-12, atol=1e-12):
                errors.append(f"thread {seed}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_solve_residual_check_uses_the_serial_product_and_stays_exact(two_threads, serial_calls):
    # a small SPD system solved by default: the answer to direct-solver accuracy (the residual check
    # multiplies by A through the serial product)
    k = 12
    Tm = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    A = (sp.kron(sp.eye(k), Tm) + sp.kron(Tm, sp.eye(k))).tocsr()
    b = torch.randn(k * k, dtype=torch.float64)
    x = st.solve(st.from_package(A), b)
    r = b.numpy() - A @ x.numpy()
    assert serial_calls  # the accuracy check's product
    assert np.linalg.norm(r) <= 1e-13 * (np.linalg.norm(A.toarray(), 2) * np.linalg.norm(x.numpy()) + np.linalg.norm(b.numpy()))
