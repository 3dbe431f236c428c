"""User kernels for one format (sparsetorch.kernels.register_kernel, examples/user_kernel.py).

The example's DIA kernel is registered through the public plugin registration; dispatch must
choose it for DIA tensors only (explain's chosen row, and a call counter on the kernel), its
products and both gradients must match dense float64, other formats and value batches must be
declined with a reason, and remove() must hand DIA products back to the built-in backends.
"""

from __future__ import annotations

import re

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import sparsetorch as st
import sparsetorch.kernels as K
from sparsetorch.errors import InputError
from sparsetorch.format import CSR, DIA, ELL

pytestmark = pytest.mark.usefixtures("single_thread")

_PATH = Path(__file__).resolve().parents[1] / "examples" / "user_kernel.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("user_kernel_example", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


@pytest.fixture
def counted(example):
    """The example's DIA kernel, registered with a call counter; removed after the test."""
    calls = {"kernel": 0}

    def kernel(A, X):
        calls["kernel"] += 1
        return example.dia_matmul(A, X)

    handle = K.register_kernel(DIA, kernel, name="test-dia")
    yield handle, calls
    handle.remove()


def _rect(m: int = 30, n: int = 41, offsets=(-7, -1, 0, 2, 19), seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    D = torch.zeros(m, n, dtype=torch.float64)
    for off in offsets:
        i = torch.arange(m)
        j = i + off
        ok = (j >= 0) & (j < n)
        D[i[ok], j[ok]] = torch.randn(int(ok.sum()), generator=gen, dtype=torch.float64)
    return D


def test_dispatch_chooses_the_kernel_for_its_format(counted) -> None:
    handle, calls = counted
    D = _rect()
    A = st.SparseTensor.from_dense(D, DIA)
    x = torch.randn(41, 3, dtype=torch.float64)
    table = st.explain("matmul", A, x)
    assert table.chosen.backend == "test-dia"
    for y, ref in [(A @ x, D @ x), (st.matmul(A, x[:, 0]), D @ x[:, 0]), (st.Matmul(A, x).execute(), D @ x)]:
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    assert calls["kernel"] == 3
    assert handle.is_active() and handle in K.registered_kernels()


def test_gradients_through_the_kernel_match_dense(counted) -> None:
    handle, calls = counted
    D = _rect(seed=1)
    A = st.SparseTensor.from_dense(D, DIA)
    v = A.values.clone().requires_grad_(True)
    x = torch.randn(41, 2, dtype=torch.float64, requires_grad=True)
    Dw = D.clone().requires_grad_(True)
    xd = x.detach().clone().requires_grad_(True)
    (st.matmul(A.with_values(v), x).sin().sum()).backward()
    ((Dw @ xd).sin().sum()).backward()
    torch.testing.assert_close(x.grad, xd.grad, rtol=1e-12, atol=1e-12)  # the adjoint product (reference_adjoint)
    coords, slot = A.entries()
    torch.testing.assert_close(v.grad[slot], Dw.grad[coords[0], coords[1]], rtol=1e-12, atol=1e-12)
    assert calls["kernel"] >= 1


def test_a_given_adjoint_is_used(example) -> None:
    used = {"adjoint": 0}

    def adjoint(A, G):
        used["adjoint"] += 1
        return K.reference_adjoint(A, G)

    D = _rect(seed=2)
    A = st.SparseTensor.from_dense(D, DIA)
    with K.register_kernel(DIA, example.dia_matmul, adjoint=adjoint, name="test-dia-adj"):
        x = torch.randn(41, 2, dtype=torch.float64, requires_grad=True)
        st.matmul(A, x).sum().backward()
        torch.testing.assert_close(x.grad, D.T @ torch.ones(30, 2, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        assert used["adjoint"] == 1


def test_other_formats_and_batches_are_declined_with_a_reason(counted) -> None:
    handle, calls = counted
    D = _rect(seed=3)
    x = torch.randn(41, 2, dtype=torch.float64)
    for fmt in (CSR, ELL):
        A = st.SparseTensor.from_dense(D, fmt)
        table = st.explain("matmul", A, x)
        row = next(r for r in table.rows if r.backend == "test-dia")
        assert row.offer is None and "for format DIA only" in row.reason
        assert table.chosen.backend != "test-dia"
        torch.testing.assert_close(A @ x, D @ x, rtol=1e-12, atol=1e-12)
    Ab = st.SparseTensor.from_dense(torch.stack([D, 2 * D]), DIA)
    row = next(r for r in st.explain("matmul", Ab, torch.stack([x, x])).rows if r.backend == "test-dia")
    assert "value batch" in row.reason and "batched=True" in row.reason
    A32 = st.SparseTensor.from_dense(D.to(torch.bfloat16), DIA)
    row = next(r for r in st.explain("matmul", A32, x.to(torch.bfloat16)).rows if r.backend == "test-dia")
    assert "bfloat16" in row.reason
    assert calls["kernel"] == 0


def test_pinning_and_removing(example) -> None:
    D = _rect(seed=4)
    A = st.SparseTensor.from_dense(D, DIA)
    x = torch.randn(41, 1, dtype=torch.float64)
    handle = K.register_kernel(DIA, example.dia_matmul, cost=1.0)  # an expensive estimate: not chosen ...
    try:
        assert handle.name == "kernel-DIA"
        assert st.explain("matmul", A, x).chosen.backend != "kernel-DIA"
        torch.testing.assert_close(st.matmul(A, x, backend="kernel-DIA"), D @ x, rtol=1e-12, atol=1e-12)  # ... unless pinned
        with pytest.raises(InputError, match="already loaded"):
            K.register_kernel(DIA, example.dia_matmul)
    finally:
        handle.remove()
    assert not handle.is_active() and "kernel-DIA" not in st.backend.get_backends().names
    assert st.explain("matmul", A, x).chosen.backend != "kernel-DIA"
    handle.remove()  # idempotent


def test_sparse_linear_on_dia_runs_the_kernel(counted) -> None:
    handle, calls = counted
    D = _rect(30, 41, seed=5).to(torch.float32)
    layer = st.nn.SparseLinear(st.SparseTensor.from_dense(D, DIA))
    x = torch.randn(5, 41)
    torch.testing.assert_close(layer(x), x @ D.T, rtol=1e-5, atol=1e-5)
    assert calls["kernel"] == 1


def test_bad_registrations_raise() -> None:
    f = lambda A, X: X  # noqa: E731
    with pytest.raises(InputError, match="matrix formats"):
        K.register_kernel(st.format.COO_ND(3), f)
    with pytest.raises(InputError, match="callables"):
        K.register_kernel(DIA, "not a function")
    with pytest.raises(InputError, match="cost must be"):
        K.register_kernel(DIA, f, cost=-1.0)
    with pytest.raises(InputError, match="letters, digits"):
        K.register_kernel(DIA, f, name="bad name")
    with pytest.raises(InputError, match="torch dtypes"):
        K.register_kernel(DIA, f, dtypes=("float32",))


def test_the_example_runs(example, capsys) -> None:
    example.main()
    out = capsys.readouterr().out
    assert "->kernel-DIA" in out
    # the kernel sums a row's diagonals in its own order, a dense BLAS product in another: equal
    # to rounding, not bit for bit
    err = float(re.search(r"max \|A @ x - dense\| = (\S+)", out).group(1))
    assert err <= 1e-13
    assert "after remove(): torch" in out or "after remove(): scipy" in out


def test_a_batched_kernel_takes_value_batches() -> None:
    seen = []

    def dense_kernel(A, X):  # a kernel that handles (*batch, n, k): here through the dense form
        seen.append(tuple(X.shape))
        return A.to_dense() @ X

    D = _rect(seed=6)
    Ab = st.SparseTensor.from_dense(torch.stack([D, -3 * D]), DIA)
    X = torch.randn(2, 41, 3, dtype=torch.float64)
    with K.register_kernel(DIA, dense_kernel, name="test-dia-batched", batched=True):
        assert st.explain("matmul", Ab, X).chosen.backend == "test-dia-batched"
        torch.testing.assert_close(st.matmul(Ab, X), torch.stack([D @ X[0], -3 * D @ X[1]]), rtol=1e-12, atol=1e-12)
    assert seen and seen[-1] == (2, 41, 3)
