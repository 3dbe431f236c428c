"""SparseLinear / SparseWeight fixes from session 28's sweep, each against a dense twin:

- a layer's planned products evicted from several threads at once (``KeyError`` out of forward);
- ``addmm``/``addmv``/``baddbmm`` with an ``input`` of another dtype: torch raises, sparse promoted;
- ``mv``/``addmv`` under CPU autocast: float32 for dense (not on CPU autocast's list), bfloat16 sparse;
- ``W.to(dtype, copy=True)`` returned W itself;
- a bfloat16 state dict loaded into a float32 module holding a SparseWeight buffer raised;
- ``numel()``/``nelement()``/``element_size()``/``itemsize`` and ``W.data``, which dense-weight
  code calls, raised.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.format import CSR
from sparsetorch.nn import SparseLinear, SparseWeight
from sparsetorch.nn import linear as linear_mod

pytestmark = pytest.mark.usefixtures("single_thread")

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def _twin(shape=(6, 8), dtype=F32, seed: int = 0, fmt=CSR):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < 0.45
    D = (torch.randn(shape, generator=g, dtype=F64) * mask).to(dtype)
    return SparseWeight(st.SparseTensor.from_dense(D, fmt, mask=mask)), D


# planned products evicted from several threads ----------------------------------------------------------
class _MeetingDict(dict):
    """A layer's plan table whose iteration waits (briefly) for a second thread to iterate too, and
    again once both have read the keys: two threads that evict at the same moment pick the same
    oldest key, which the old code then popped twice (KeyError). With the eviction under a lock the
    second thread comes after the first wait ran out (the barrier broken: no more waiting)."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=0.5)

    def _meet(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            pass

    def __iter__(self):
        self._meet()
        keys = list(super().__iter__())
        self._meet()
        return iter(keys)


def test_plan_eviction_from_two_threads_at_once() -> None:
    lin = SparseLinear.from_linear(nn.Linear(16, 16), mask=torch.rand(16, 16) < 0.4)
    Wd, b = lin.to_dense().detach(), lin.bias.detach()
    handles = lin.__dict__["_handles"] = _MeetingDict()
    with torch.no_grad():
        for k in range(1, linear_mod.LAYER_HANDLES + 1):  # a full table
            lin(torch.randn(k, 16))
    assert len(handles) == linear_mod.LAYER_HANDLES
    start = threading.Barrier(2)
    errors: list[str] = []
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def call(k: int) -> None:
        x = torch.randn(k, 16)
        start.wait()
        try:
            with torch.no_grad():
                out[k] = (lin(x), x @ Wd.T + b)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"{type(exc).__name__}: {exc}")

    ts = [threading.Thread(target=call, args=(k,)) for k in (20, 21)]  # two new batch sizes: two evictions
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for y, ref in out.values():
        torch.testing.assert_close(y, ref)
    assert len(handles) == linear_mod.LAYER_HANDLES
    assert {p["batch"] for p in lin.plans()} >= {20, 21}
    _many_batch_sizes_from_many_threads()


def _many_batch_sizes_from_many_threads() -> None:
    """The sweep's reproducer, smaller: 12 threads, 24 batch sizes on one layer."""
    torch.manual_seed(1)
    lin = SparseLinear.from_linear(nn.Linear(32, 32), mask=torch.rand(32, 32) < 0.3)
    Wd, b = lin.to_dense().detach(), lin.bias.detach()
    failures: list[str] = []

    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for i in range(60):
                x = torch.randn(1 + (i * 7 + seed * 3) % 24, 32, generator=g)  # 24 batch sizes > 8 plans kept
                with torch.no_grad():
                    y = lin(x)
                torch.testing.assert_close(y, x @ Wd.T + b, atol=1e-5, rtol=1e-5)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=worker, args=(s,)) for s in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not failures, failures[:3]
    assert len(lin.plans()) <= linear_mod.LAYER_HANDLES


# addmm / addmv / baddbmm: the added input's dtype ---------------------------------------------------------
def _raises_both(dense_call, sparse_call) -> None:
    with pytest.raises(RuntimeError):
        dense_call()
    with pytest.raises(InputError, match="dtype"):
        sparse_call()


@pytest.mark.parametrize("in_dtype", [F64, BF16, torch.int64, torch.complex64])
@pytest.mark.parametrize("beta", [1, 0.5, 0])
def test_addmm_addmv_input_of_another_dtype_raises_as_dense(in_dtype, beta) -> None:
    W, D = _twin()
    x = torch.randn(3, 8)
    v = torch.randn(8)
    inp_mm = torch.ones(3, 6, dtype=in_dtype)
    _raises_both(lambda: torch.addmm(inp_mm, x, D.T, beta=beta), lambda: torch.addmm(inp_mm, x, W.T, beta=beta))
    inp_mv = torch.ones(6, dtype=in_dtype)
    _raises_both(lambda: torch.addmv(inp_mv, D, v, beta=beta), lambda: torch.addmv(inp_mv, W, v, beta=beta))
    _raises_both(lambda: torch.addmm(inp_mm[0, 0], x, D.T), lambda: torch.addmm(inp_mm[0, 0], x, W.T))  # 0-d input


def test_baddbmm_input_of_another_dtype_raises_as_dense() -> None:
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(5, 6, generator=g) < 0.5
    Db = torch.randn(2, 5, 6, generator=g) * mask
    A = st.SparseTensor.from_dense(Db[0], mask=mask)
    W3 = SparseWeight(A.with_values(torch.stack([Db[i][A.entries()[0][0], A.entries()[0][1]] for i in range(2)])))
    X = torch.randn(2, 6, 3)
    inp = torch.zeros(2, 5, 3, dtype=F64)
    _raises_both(lambda: torch.baddbmm(inp, Db, X), lambda: torch.baddbmm(inp, W3, X))
    ok = torch.baddbmm(inp.float(), W3, X)  # same dtype: the product
    torch.testing.assert_close(ok, torch.baddbmm(inp.float(), Db, X))


def test_addmm_same_dtype_and_autocast_input_cast() -> None:
    W, D = _twin()
    x = torch.randn(3, 8)
    inp = torch.randn(3, 6)
    torch.testing.assert_close(torch.addmm(inp, x, W.T, beta=0.5, alpha=2), torch.addmm(inp, x, D.T, beta=0.5, alpha=2))
    with torch.autocast("cpu", dtype=BF16):
        for i in (inp, inp.half()):  # autocast casts addmm's input with the operands (a float16 one too)
            dense, sparse = torch.addmm(i, x, D.T), torch.addmm(i, x, W.T)
            assert sparse.dtype == dense.dtype == BF16
            torch.testing.assert_close(sparse.float(), dense.float(), atol=0.1, rtol=0.05)
        _raises_both(lambda: torch.addmm(inp.double(), x, D.T), lambda: torch.addmm(inp.double(), x, W.T))


# autocast: each op's dtype as torch's CPU lists give it ---------------------------------------------------
def test_cpu_autocast_dtypes_follow_dense() -> None:
    W, D = _twin()
    v, v6 = torch.randn(8), torch.randn(6)
    X, x = torch.randn(8, 3), torch.randn(3, 8)
    cases = {
        "mv": (lambda M: torch.mv(M, v)),
        "Tensor.mv": (lambda M: M.mv(v)),
        "addmv": (lambda M: torch.addmv(v6, M, v)),
        "addmv beta/alpha": (lambda M: torch.addmv(v6, M, v, beta=0.5, alpha=2.0)),
        "matmul 2-D @ 1-D": (lambda M: M @ v),
        "matmul 1-D @ 2-D": (lambda M: v6 @ M),
        "mm": (lambda M: torch.mm(M, X)),
        "matmul": (lambda M: M @ X),
        "rmatmul": (lambda M: x @ M.T),
        "addmm": (lambda M: torch.addmm(torch.zeros(6, 3), M, X)),
        "linear": (lambda M: F.linear(x, M)),
    }
    with torch.autocast("cpu", dtype=BF16):
        for name, op in cases.items():
            dense, sparse = op(D), op(W)
            assert sparse.dtype == dense.dtype, (name, sparse.dtype, dense.dtype)
            tol = dict(atol=0.1, rtol=0.05) if dense.dtype == BF16 else {}
            torch.testing.assert_close(sparse.float(), dense.float(), **tol)
    assert torch.mv(W, v).dtype == F32  # and outside autocast


def test_cpu_autocast_mv_gradient_in_float32() -> None:
    A = _twin()[0].sparse
    vals = A.values.clone().requires_grad_(True)
    W = SparseWeight(A.with_values(vals))
    Dw = A.to_dense().clone().requires_grad_(True)
    v = torch.randn(8)
    with torch.autocast("cpu", dtype=BF16):
        ys, yd = torch.mv(W, v), torch.mv(Dw, v)
    ys.square().sum().backward()
    yd.square().sum().backward()
    coords, slot = A.entries()
    assert vals.grad.dtype == F32
    torch.testing.assert_close(vals.grad[slot], Dw.grad[coords[0], coords[1]])


# W.to(..., copy=True) ------------------------------------------------------------------------------------
def test_to_copy_true_copies_as_dense() -> None:
    W, D = _twin()
    d = D.clone()
    for call in (lambda t: t.to(F32, copy=True), lambda t: t.to(dtype=F32, copy=True),
                 lambda t: t.to("cpu", copy=True), lambda t: t.to(F32, False, True)):
        c, cd = call(W), call(d)
        assert c is not W and cd is not d
        assert isinstance(c, SparseWeight) and c.dtype == F32
        c.mul_(2.0)
        cd.mul_(2.0)
        torch.testing.assert_close(W.to_dense(), D)  # the original is unchanged, as the dense one
        torch.testing.assert_close(d, D)
        torch.testing.assert_close(c.to_dense(), cd)
    assert W.to(F32) is W and d.to(F32) is d  # without copy: itself, as torch
    c = W.to(F64, copy=True)
    assert c.dtype == F64
    torch.testing.assert_close(c.to_dense(), D.double())
    # the copy stays in the graph (differentiable in the values), as a dense .to(copy=True)
    A = _twin()[0].sparse
    vals = A.values.clone().requires_grad_(True)
    c = SparseWeight(A.with_values(vals)).to(F32, copy=True)
    (c @ torch.ones(8)).sum().backward()
    assert vals.grad is not None and torch.count_nonzero(vals.grad) > 0


# load_state_dict of another dtype --------------------------------------------------------------------------
class _M(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        D = torch.randn(8, 16, generator=g) * (torch.rand(8, 16, generator=g) < 0.4)
        self.register_buffer("w", SparseWeight(st.SparseTensor.from_dense(D)) if sparse else D)
        self.b = nn.Parameter(torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.b)


@pytest.mark.parametrize("dtype", [BF16, F64, torch.float16])
def test_load_state_dict_of_another_dtype_casts_as_dense(dtype) -> None:
    sparse_src, dense_src = _M(True).to(dtype), _M(False).to(dtype)
    with torch.no_grad():
        sparse_src.w.sparse.values.mul_(3)
        dense_src.w.mul_(3)
    sparse, dense = _M(True), _M(False)
    sparse.load_state_dict(sparse_src.state_dict())
    dense.load_state_dict(dense_src.state_dict())
    assert sparse.w.dtype == dense.w.dtype == F32
    torch.testing.assert_close(sparse.w.to_dense(), dense.w)
    x = torch.randn(2, 16)
    torch.testing.assert_close(sparse(x), dense(x))


def test_copy_from_sparse_weight_of_another_dtype() -> None:
    W, D = _twin()
    src = SparseWeight(W.sparse.to(F64).with_values(W.sparse.values.double() * 2 + 0.125))
    d = D.clone()
    W.copy_(src)
    d.copy_(src.to_dense())
    assert W.dtype == F32
    torch.testing.assert_close(W.to_dense(), d)
    other, _ = _twin(seed=5)  # another pattern still refuses
    with pytest.raises(InputError):
        W.copy_(other.to(F64))


# numel / nelement / element_size / itemsize / data -----------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F64, BF16, torch.complex64])
def test_sizes_as_dense(dtype) -> None:
    W, D = _twin((5, 7), dtype=dtype, seed=2)
    assert W.numel() == W.nelement() == torch.numel(W) == D.numel() == 35
    assert W.element_size() == D.element_size()
    assert W.itemsize == D.itemsize
    Wt = W.T
    assert Wt.numel() == 35 and Wt.element_size() == D.element_size()
    # layout queries stay refused: a sparse weight has no strides (torch's sparse layouts disagree on them)
    for call in (lambda: W.is_contiguous(), lambda: W.contiguous(), lambda: W.stride()):
        with pytest.raises(InputError, match="to_dense"):
            call()


def test_sizes_of_1d_and_3d_weights() -> None:
    v = SparseWeight(st.SparseTensor.from_dense(torch.tensor([0.0, 1.0, 0.0, 2.0])))
    assert v.numel() == 4
    A = st.SparseTensor.from_dense(torch.eye(4))
    W3 = SparseWeight(A.with_values(torch.ones(3, A.values.shape[-1])))
    assert tuple(W3.shape) == (3, 4, 4) and W3.numel() == W3.nelement() == 48
    assert sum(b.numel() for b in _M(True).buffers()) == sum(b.numel() for b in _M(False).buffers())


def test_data_is_detach() -> None:
    A = _twin()[0].sparse
    vals = A.values.clone().requires_grad_(True)
    W = SparseWeight(A.with_values(vals))
    D = A.to_dense().requires_grad_(True)
    d, dd = W.data, D.data
    assert isinstance(d, SparseWeight) and d is not W
    assert not d.requires_grad and not dd.requires_grad and W.requires_grad
    assert d.sparse.values.data_ptr() == vals.data_ptr()  # shares the values, as dense .data shares storage
    torch.testing.assert_close(d.to_dense(), dd)
    with torch.no_grad():
        d.mul_(0.5)  # writes through, as dense .data
    torch.testing.assert_close(W.to_dense(), (A.to_dense() * 0.5))
