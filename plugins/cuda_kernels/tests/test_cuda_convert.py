"""The plugin's conversion steps (convert.py, ``sparsetorch_conversion_kernels``): ``csr_rows``
against the rows NumPy repeats from the same pointers, for row-length mixes that take each of the
kernel's paths (rows in shared memory, many empty rows between a block's entries, one row longer
than many blocks), and through the core's CSR -> COO conversion on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import CONVERSION_KERNELS

import sparsetorch_cuda.plugin as plugin
from _cuda_helpers import gpu


def _ptr(counts: np.ndarray) -> np.ndarray:
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    many_empty = np.zeros(50_000, dtype=np.int64)
    many_empty[rng.choice(50_000, 300, replace=False)] = rng.integers(1, 40, 300)
    skew = rng.integers(0, 4, 3000)
    skew[1234] = 9000  # one row over four blocks
    return {
        "uniform": np.full(4000, 50),
        "random": rng.integers(0, 120, 7001),
        "one_entry": np.array([0, 0, 1, 0]),
        "single_row": np.array([5000]),
        "many_empty_rows": many_empty,  # a block's rows exceed the shared-memory copy
        "skew": skew,
        "empty_tail": np.concatenate([rng.integers(1, 9, 500), np.zeros(5000, dtype=np.int64)]),
        "block_edges": np.full(4096, 1),  # block boundaries fall on row boundaries
    }


def test_the_hook_offers_only_named_kernels():
    got = plugin.sparsetorch_conversion_kernels()
    assert set(got) <= set(CONVERSION_KERNELS)


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("case", list(_cases()))
def test_csr_rows_matches_numpy(case, index_dtype):
    from sparsetorch_cuda.convert import csr_rows  # noqa: PLC0415

    counts = _cases()[case]
    ptr = _ptr(counts)
    want = np.repeat(np.arange(counts.size), counts)
    p = torch.from_numpy(ptr).to(device="cuda", dtype=index_dtype)
    out = torch.full((int(ptr[-1]),), -7, dtype=index_dtype, device="cuda")
    assert csr_rows(p, out)
    np.testing.assert_array_equal(out.cpu().numpy(), want)


@gpu
def test_csr_rows_declines_what_it_does_not_take():
    from sparsetorch_cuda.convert import csr_rows  # noqa: PLC0415

    p = torch.tensor([0, 2, 3], device="cuda")
    assert not csr_rows(p.cpu(), torch.empty(3, dtype=torch.int64))  # a CPU tensor
    assert not csr_rows(p, torch.empty(3, dtype=torch.int32, device="cuda"))  # mismatched dtypes
    assert not csr_rows(torch.tensor([0, 0, 2, 0, 3], device="cuda")[::2], torch.empty(3, dtype=torch.int64, device="cuda"))


@gpu
def test_csr_rows_is_captured_by_a_cuda_graph():
    from sparsetorch_cuda.convert import csr_rows  # noqa: PLC0415

    counts = _cases()["random"]
    ptr = torch.from_numpy(_ptr(counts)).cuda()
    out = torch.empty(int(ptr[-1]), dtype=torch.int64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        csr_rows(ptr, out)  # loads the module outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        csr_rows(ptr, out)
    out.fill_(-1)
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), np.repeat(np.arange(counts.size), counts))


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_core_csr_to_coo_on_the_gpu_uses_it_and_is_right(index_dtype, cuda_backend, monkeypatch):
    from sparsetorch_cuda import convert  # noqa: PLC0415

    calls = []
    real = convert.kernel
    monkeypatch.setattr(convert, "_KERNELS", {})  # csr_rows keeps what it loaded: emptied, it looks the kernel up once
    monkeypatch.setattr(convert, "kernel", lambda *a: calls.append(a[1]) or real(*a))
    g = torch.Generator().manual_seed(3)
    dense = torch.where(torch.rand(300, 200, generator=g) < 0.1, torch.randn(300, 200, generator=g), 0.0)
    dense[17] = 0.0
    A = st.SparseTensor.from_dense(dense.cuda(), st.format.CSR, index_dtype=index_dtype)
    C = A.convert(st.format.COO)
    assert calls == ["csr_rows"], "the plugin's csr_rows was not used"
    coords = C.coordinates()[0].cpu()
    torch.testing.assert_close(coords, dense.nonzero().T.to(coords.dtype), rtol=0, atol=0)
    torch.testing.assert_close(C.to_dense().cpu(), dense, rtol=0, atol=0)
