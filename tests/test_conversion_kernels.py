"""The conversion-kernel hook (``sparsetorch_conversion_kernels``): the core runs a backend's compiled
conversion step where one is offered and its own code otherwise, honours the contract (the fill
bound before anything is allocated, the lazy value map, declines), and survives a kernel that
raises. The test double implements the ``csr_to_bsr`` contract with SciPy (an independent
reference: ``tobsr`` + ``sort_indices``); the results are compared with the core's own conversion
and with the dense matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch import BackendInfo
from sparsetorch.dispatch import reset_backends
from sparsetorch.dispatch.hookspecs import CONVERSION_KERNELS
from sparsetorch.errors import ConversionError
from sparsetorch.tensor import construct

sp = pytest.importorskip("scipy.sparse")


def scipy_csr_to_bsr(bh, bw, m, n, ptr, col, vals, max_blocks, want_slots):
    """The ``csr_to_bsr`` contract through SciPy (the slots from a second run on entry numbers)."""
    nnz = col.size
    tag = np.arange(1, nnz + 1, dtype=np.float64)
    b = sp.csr_array((tag, col, ptr), shape=(m, n)).tobsr(blocksize=(bh, bw))
    b.sort_indices()
    nblocks = b.indices.size
    if nblocks > max_blocks:
        return nblocks
    flat = b.data.reshape(-1)
    slots = np.empty(nnz, dtype=np.int64)
    where = np.flatnonzero(flat)
    slots[flat[where].astype(np.int64) - 1] = where
    data = None
    if vals is not None:
        data = np.zeros(flat.size, dtype=vals.dtype)
        data[slots] = vals
    return (b.indptr.astype(np.int64), b.indices.astype(np.int64), data, slots if want_slots else None)


class Kernels:
    def __init__(self, name: str, kernels: dict, priority: int = 0) -> None:
        self.name, self.kernels, self.priority = name, kernels, priority
        self.calls: list[tuple] = []

    @st.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="0", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={}, priority=self.priority)

    @st.hookimpl
    def sparsetorch_conversion_kernels(self):
        def wrap(key, fn):
            def call(*args):
                self.calls.append((key, args))
                return fn(*args)
            return call
        return {k: wrap(k, fn) for k, fn in self.kernels.items()}


@pytest.fixture
def backends():
    b = reset_backends(entry_points=False)
    construct._KERNEL_FAILED.clear()
    yield b
    construct._KERNEL_FAILED.clear()
    reset_backends()


def _matrix(m=24, n=30, density=0.15, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    d = torch.where(torch.rand(m, n, generator=g) < density, torch.randn(m, n, generator=g, dtype=torch.float64), 0.0)
    d[5] = 0.0
    return d.to(dtype)


def test_only_named_kernels_are_taken(backends):
    backends.register(Kernels("k", {"csr_to_bsr": scipy_csr_to_bsr, "not_a_step": lambda: None}), "k")
    assert backends.conversion_kernel("not_a_step") is None
    assert backends.conversion_kernel("csr_to_bsr") is not None
    assert "csr_rows" in CONVERSION_KERNELS


def test_the_higher_priority_backend_wins(backends):
    low, high = Kernels("low", {"csr_to_bsr": scipy_csr_to_bsr}), Kernels("high", {"csr_to_bsr": scipy_csr_to_bsr}, priority=5)
    backends.register(low, "low")
    backends.register(high, "high")
    A = st.SparseTensor.from_dense(_matrix(), st.format.CSR)
    A.convert(st.format.BSR(2, 3))
    assert high.calls and not low.calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.complex128, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("blk", [(1, 1), (2, 3), (4, 5), (6, 2)])
def test_csr_to_bsr_through_the_kernel_equals_the_core(backends, dtype, index_dtype, blk):
    dense = _matrix(dtype=dtype if not dtype.is_complex else torch.float64).to(dtype)
    A = st.SparseTensor.from_dense(dense, st.format.CSR, index_dtype=index_dtype)
    mine = A.convert(st.format.BSR(*blk))  # the core's own conversion (no kernel loaded)
    k = Kernels("k", {"csr_to_bsr": scipy_csr_to_bsr})
    backends.register(k, "k")
    B = st.SparseTensor.from_dense(dense, st.format.CSR, index_dtype=index_dtype)
    got = B.convert(st.format.BSR(*blk))
    assert [c[0] for c in k.calls] == ["csr_to_bsr"]
    assert got.index_dtype == index_dtype
    for a, b in zip(got.pos_buffers + got.crd_buffers, mine.pos_buffers + mine.crd_buffers):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    assert torch.equal(got.values, mine.values)
    torch.testing.assert_close(got.to_dense(), dense, rtol=0, atol=0)
    # the value map (used by with_values / re-conversion of new values on the pattern)
    new = torch.arange(1, A.nse + 1, dtype=torch.float64).to(dtype)
    torch.testing.assert_close(B.with_values(new).convert(st.format.BSR(*blk)).to_dense(),
                               A.with_values(new).to_dense(), rtol=0, atol=0)


def test_the_fill_bound_is_kept_before_anything_is_allocated(backends):
    k = Kernels("k", {"csr_to_bsr": scipy_csr_to_bsr})
    backends.register(k, "k")
    A = st.SparseTensor.from_dense(_matrix(512, 512, 0.002), st.format.CSR)
    with pytest.raises(ConversionError, match="max_fill"):
        A.convert(st.format.BSR(16, 16), max_fill=2)
    bound = 2 * A.nse + construct.FILL_SLACK
    assert k.calls and k.calls[0][1][7] == bound // 256  # max_blocks from the bound
    torch.testing.assert_close(A.convert(st.format.BSR(16, 16), max_fill=float("inf")).to_dense(), A.to_dense())


def test_a_declining_kernel_leaves_the_core_path(backends):
    k = Kernels("k", {"csr_to_bsr": lambda *a: None})
    backends.register(k, "k")
    dense = _matrix()
    got = st.SparseTensor.from_dense(dense, st.format.CSR).convert(st.format.BSR(2, 2))
    assert k.calls
    torch.testing.assert_close(got.to_dense(), dense, rtol=0, atol=0)


def test_a_raising_kernel_warns_once_and_is_not_called_again(backends):
    def boom(*a):
        raise RuntimeError("kernel on fire")

    k = Kernels("k", {"csr_to_bsr": boom})
    backends.register(k, "k")
    dense = _matrix()
    with pytest.warns(RuntimeWarning, match="kernel on fire"):
        got = st.SparseTensor.from_dense(dense, st.format.CSR).convert(st.format.BSR(2, 2))
    torch.testing.assert_close(got.to_dense(), dense, rtol=0, atol=0)
    n = len(k.calls)
    st.SparseTensor.from_dense(dense, st.format.CSR).convert(st.format.BSR(2, 2))
    assert len(k.calls) == n


def test_csr_rows_is_asked_only_for_gpu_tensors(backends):
    k = Kernels("k", {"csr_rows": lambda p, o: pytest.fail("called for a CPU tensor")})
    backends.register(k, "k")
    dense = _matrix()
    C = st.SparseTensor.from_dense(dense, st.format.CSR).convert(st.format.COO)
    torch.testing.assert_close(C.to_dense(), dense, rtol=0, atol=0)


def test_info_names_the_kernels_in_use(backends):
    from sparsetorch.cli import _backend_lines

    backends.register(Kernels("low", {"csr_to_bsr": scipy_csr_to_bsr}), "low")
    backends.register(Kernels("high", {"csr_to_bsr": scipy_csr_to_bsr}, priority=3), "high")
    lines = _backend_lines()
    at = next(i for i, line in enumerate(lines) if line.startswith("high"))
    assert "conversion kernels: csr_to_bsr" in "\n".join(lines[at:at + 3])
    assert backends.conversion_kernel_owners() == {"csr_to_bsr": "high"}
