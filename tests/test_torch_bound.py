"""The torch backend's bound product (``TorchSpmmPlan.bind``, torch's CSR ``mv`` / ``mm`` with ``out=``):
``Matmul.execute`` and a repeated one-shot ``st.matmul`` / ``A @ x`` on a CSR matrix take it; every result
against the dense float64 product; what it declines (formats reached by a conversion, half precision,
value batches) and what makes the core bind again (values written in place are seen; values swapped,
index buffers written, gradients recorded are not served by the bound call)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import sparsetorch as st
from sparsetorch.backends.torch_native.spmm import TorchSpmmPlan, _BoundCsr
from sparsetorch.format import COO, CSC, CSR

M = sys.modules["sparsetorch.ops.matmul"]


@pytest.fixture(autouse=True)
def _fresh():
    st.clear_caches()
    yield
    st.clear_caches()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]


def _matrix(m=37, n=29, density=0.15, dtype=torch.float64, seed=0, fmt=CSR, index_dtype=torch.int64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(m, n, generator=g, dtype=torch.float64) * (torch.rand(m, n, generator=g) < density)
    d[3] = 0  # an empty row
    A = st.SparseTensor.from_dense(d.to(dtype).to(device), format=fmt, index_dtype=index_dtype)
    return A, d.to(device)


def _dense(A):
    return A.to_dense().to(torch.float64) if not A.dtype.is_complex else A.to_dense().to(torch.complex128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("k", [None, 1, 4])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("device", DEVICES)
def test_execute_takes_the_bound_product(dtype, k, index_dtype, device):
    A, _ = _matrix(dtype=dtype, index_dtype=index_dtype, device=device)
    g = torch.Generator().manual_seed(1)
    shape = (A.shape[1],) if k is None else (A.shape[1], k)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    mm = st.Matmul(A, x, backend="torch")
    mm.plan()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for _ in range(3):
        y = mm.execute()
        torch.testing.assert_close(y.to(_dense(A).dtype), _dense(A) @ x.to(_dense(A).dtype), **tol)
    assert mm._direct is not None and isinstance(mm._direct.bound, _BoundCsr)
    assert y.shape == (A.shape[0],) + (() if k is None else (k,))
    # values written in place are seen by the next bound call
    with torch.no_grad():
        A.values.mul_(-2)
    torch.testing.assert_close(mm.execute().to(_dense(A).dtype), _dense(A) @ x.to(_dense(A).dtype), **tol)
    # b written in place too
    x.add_(1)
    torch.testing.assert_close(mm.execute().to(_dense(A).dtype), _dense(A) @ x.to(_dense(A).dtype), **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_one_shot_and_operator_take_it_and_stay_right(device):
    A, d = _matrix(device=device)
    x = torch.randn(A.shape[1], dtype=torch.float64, device=device)
    X = torch.randn(A.shape[1], 3, dtype=torch.float64, device=device)
    for _ in range(4):
        torch.testing.assert_close(st.matmul(A, x, backend="torch"), d @ x, rtol=1e-12, atol=1e-12)
    once = M._ONE_SHOT.get(id(A))
    assert once is not None and isinstance(once.bound, _BoundCsr)
    for _ in range(3):
        torch.testing.assert_close(A @ x, d @ x, rtol=1e-12, atol=1e-12)  # whichever backend the dispatcher picks
        torch.testing.assert_close(st.matmul(A, X, backend="torch"), d @ X, rtol=1e-12, atol=1e-12)
    # a non-contiguous X (a transposed block): the kernel takes the strides
    Xt = torch.randn(3, A.shape[1], dtype=torch.float64, device=device).T
    for _ in range(3):
        torch.testing.assert_close(st.matmul(A, Xt, backend="torch"), d @ Xt, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        A.values.copy_(torch.arange(A.nse, dtype=torch.float64))
    torch.testing.assert_close(st.matmul(A, x, backend="torch"), A.to_dense() @ x, rtol=1e-12, atol=1e-12)


def test_values_swapped_or_index_written_are_not_served():
    A, d = _matrix()
    x = torch.randn(A.shape[1], dtype=torch.float64)
    mm = st.Matmul(A, x, backend="torch")
    mm.plan()
    mm.execute()
    bound = mm._direct.bound
    new = torch.randn(A.nse, dtype=torch.float64)
    A.values.data = new  # another buffer behind the same tensor: the bound call declines
    assert not bound(x[:, None], torch.empty(A.shape[0], dtype=torch.float64))
    torch.testing.assert_close(mm.execute(), A.to_dense() @ x, rtol=1e-12, atol=1e-12)
    # a valid new pattern written into the column buffer: the core re-validates, plans again, and the
    # answer follows the new columns (row 0's last entry moved to the last column)
    ptr, cols = A.pos(1), A.crd(1)
    r = next(i for i in range(A.shape[0]) if ptr[i + 1] - ptr[i] >= 1 and int(cols[ptr[i + 1] - 1]) < A.shape[1] - 1)
    with torch.no_grad():
        cols[int(ptr[r + 1]) - 1] = A.shape[1] - 1
    dense = torch.zeros(A.shape, dtype=torch.float64)
    rows = torch.repeat_interleave(torch.arange(A.shape[0]), ptr.diff())
    dense[rows, cols] = A.values
    assert dense[r, -1] != 0
    torch.testing.assert_close(mm.execute(), dense @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(A @ x, dense @ x, rtol=1e-12, atol=1e-12)


def test_gradients_take_the_general_path():
    A, d = _matrix()
    A = A.with_values(A.values.clone().requires_grad_())
    x = torch.randn(A.shape[1], dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        y = A @ x
    w = torch.randn_like(y)
    gv, gx = torch.autograd.grad((y * w).sum(), (A.values, x))
    rows, cols = A.convert(COO).crd(0), A.convert(COO).crd(1)
    torch.testing.assert_close(gx, d.T @ w, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gv, w[rows] * x.detach()[cols], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["half", "batch"])
def test_bind_declines_per_call_work_on_the_values(case):
    if case == "half":
        A, d = _matrix(dtype=torch.float32)
        A = A.with_values(A.values.to(torch.bfloat16))
    else:
        A, d = _matrix()
        A = A.with_values(torch.stack([A.values, 2 * A.values]))
    plan = TorchSpmmPlan(A)
    X = torch.ones(A.shape[-1], 1, dtype=A.dtype)
    assert plan.bind(A.values, X) is None  # half: a float32 copy; batch: 2-D
    x = torch.randn(A.shape[-1], dtype=torch.float64)
    for _ in range(3):
        y = A @ x.to(A.dtype)
    ref = (A.to_dense().to(torch.float64) @ x)
    tol = dict(rtol=2e-2, atol=2e-2) if case == "half" else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y.to(torch.float64), ref, **tol)


def test_bound_product_from_several_threads():
    A, d = _matrix(m=300, n=300, density=0.05)
    xs = [torch.randn(300, dtype=torch.float64) for _ in range(8)]
    refs = [d @ x for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(200):
                y = A @ xs[i]
                if not torch.allclose(y, refs[i], rtol=1e-12, atol=1e-12):
                    errors.append(i)
                    return
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_no_notice_of_torch_reaches_the_user():
    """torch's "in beta" / invariant-check notices about compressed tensors built over the core's checked
    buffers (tensor.interop.torch_io.compressed_tensor: silenced around a kind's first construction) do not
    reach the user: a fresh process with warnings as errors runs products, a solve and to_package."""
    import subprocess  # noqa: PLC0415

    code = (
        "import warnings, torch, sparsetorch as st\n"
        "warnings.simplefilter('error')\n"
        "d = torch.eye(6, dtype=torch.float64) * 3 + torch.diag(torch.ones(5, dtype=torch.float64), 1)\n"
        "A = st.SparseTensor.from_dense(d, format=st.format.CSR)\n"
        "x = torch.ones(6, dtype=torch.float64)\n"
        "for _ in range(3):\n"
        "    y = A @ x\n"
        "    z = st.solve(A, x)\n"
        "mm = st.Matmul(A, x, backend='torch'); mm.plan(); mm.execute(); mm.execute()\n"
        "t = A.to_package('torch')\n"
        "assert torch.allclose(y, d @ x) and torch.allclose(d @ z, x)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_a_converted_format_binds_with_its_values_gathered_per_call():
    """CSC (reached by a conversion) binds since session 23: the values are gathered into CSR order at each
    call, so in-place writes are seen."""
    A, d = _matrix(fmt=CSC)
    plan = TorchSpmmPlan(A)
    plan.set_values(A.values)
    X = torch.randn(A.shape[-1], 2, dtype=A.dtype)
    bound = plan.bind(A.values, X)
    assert bound is not None
    Y = torch.empty(A.shape[0], 2, dtype=A.dtype)
    assert bound(X, Y)
    torch.testing.assert_close(Y, d @ X, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        A.values.mul_(3)
    assert bound(X, Y)
    torch.testing.assert_close(Y, 3 * d @ X, rtol=1e-12, atol=1e-12)
