"""The warp-decoded tensor-core SpMM (kernels/spmm_wd.cu, _spmm_wd.py).

On the CPU: the per-pattern layout, decoded the way the kernel decodes it (per (strip, tile) word ranges, the
swizzled place in the warp's A buffer, the value bits), rebuilds A exactly for ragged shapes, empty rows, a dense
row and an empty matrix; repeated entries are declined; the K-split choice; the source compiles with NVRTC for
sm_90 in both half types and exports every kernel name. On an sm_90+ GPU (skipped otherwise): :class:`WdSpmm`
against the masked dense weight in float32 (``X^T W^T + b``), float16 and bfloat16, int32 and int64 CSR
indices, 4096^2, 11008 x 4096 and ragged shapes, k = 1 / 8 / 17 / 64 (and 100 / 130: more than one 64-column
batch), bias and none, every configuration and cluster size, persistent rounds, misaligned X, new values after an
in-place change, CUDA-graph replay; every output element is written (the output starts as NaN)."""

from __future__ import annotations


import pytest
import torch

from _cuda_helpers import TOL, random_dense, rel_err
from _cuda_helpers import sm90
from _cuda_helpers import check_product as _check
from _cuda_helpers import csr_of as _csr
from _cuda_helpers import gpu_matrix as _gpu_matrix
from _cuda_helpers import masked_reference as _reference
from _cuda_helpers import nvrtc_missing as _nvrtc_missing

HALF = (torch.float16, torch.bfloat16)


def _decode(lay, words: torch.Tensor, m: int, n: int, rw: int) -> torch.Tensor:
    """A (m x n, float64) from the layout, read as the kernel reads it (independently of _spmm_wd.py)."""
    toff = lay["toff"].to(torch.int64).cpu()
    w = words.cpu().to(torch.int64) & 0xFFFFFFFF
    T = -(-n // 64)
    strips = -(-m // rw)
    assert toff.numel() == strips * T + 1 and int(toff[0]) == 0
    out = torch.zeros(strips * rw, T * 64, dtype=torch.float64)
    seen = torch.zeros(strips * rw, T * 64, dtype=torch.bool)
    nnz = int(toff[-1])
    for s in range(strips):
        for t in range(T):
            a, b = int(toff[s * T + t]), int(toff[s * T + t + 1])
            assert a <= b
            if a == b:
                continue
            x = w[a:b]
            place = x >> 16
            assert bool((place < rw * 64).all())
            r = place // 64
            chunk = ((place % 64) >> 3) ^ (r & 7)  # the swizzle undone
            c = (chunk << 3) | (place & 7)
            bits = (x & 0xFFFF).to(torch.int32)
            vals = torch.where(bits >= 2**15, bits - 2**16, bits).to(torch.int16).view(torch.float16).to(torch.float64)
            rows, cols = s * rw + r, t * 64 + c
            assert not bool(seen[rows, cols].any()), "a place twice"
            seen[rows, cols] = True
            out[rows, cols] = vals
    assert int(seen.sum()) == nnz
    assert not bool(out[m:].any()) and not bool(out[:, n:].any())
    return out[:m, :n]


LAYOUT_CASES = [(300, 200, 0.1, 5, 1), (77, 131, 0.3, 3, 1), (64, 64, 0.5, 0, 0), (50, 96, 0.0, 0, 0), (33, 1000, 0.05, 2, 1)]


@pytest.mark.parametrize("rw", [16, 32, 64])
@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_layout_rebuilds_A(case, rw):
    from sparsetorch_cuda._spmm_wd import pack_words, wd_layout

    m, n, density, empty, full = case
    D = random_dense(m, n, density, torch.float16, seed=m + n + rw, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    lay = wd_layout(rowptr, col, m, n, rw)
    assert lay is not None and lay["stats"]["nnz"] == int(val.numel())
    words = pack_words(lay, val.to(torch.float16))
    assert words.dtype == torch.int32 and words.numel() >= 1
    assert torch.equal(_decode(lay, words[: int(val.numel())], m, n, rw), D)


def test_layout_int32_and_int64_indices_agree():
    from sparsetorch_cuda._spmm_wd import wd_layout

    D = random_dense(100, 300, 0.1, torch.float16, seed=5)
    a = wd_layout(*_csr(D, torch.int32)[:2], 100, 300, 32)
    b = wd_layout(*_csr(D, torch.int64)[:2], 100, 300, 32)
    assert torch.equal(a["toff"], b["toff"]) and torch.equal(a["hi"], b["hi"]) and torch.equal(a["perm"], b["perm"])


def test_layout_declines_repeated_entries():
    from sparsetorch_cuda._spmm_wd import wd_layout

    rowptr = torch.tensor([0, 2, 3])
    col = torch.tensor([1, 1, 0])
    assert wd_layout(rowptr, col, 2, 4, 32) is None


def test_choose():
    from sparsetorch_cuda._spmm_wd import WD_KR_MAX, wd_choose

    assert wd_choose(4096) == (8, 512)
    assert wd_choose(64) == (1, 64)
    assert wd_choose(100) == (1, 128)
    assert wd_choose(1000) == (2, 512)
    assert wd_choose(4096, 4) == (4, 1024)
    assert wd_choose(11008) == (8, 1408)
    assert wd_choose(8 * WD_KR_MAX + 1) is None


@pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
@pytest.mark.parametrize("value", ["float16", "bfloat16"])
def test_host_compiles_for_sm90(value):
    from sparsetorch_cuda import _spmm_wd

    cubin = _spmm_wd.compile_cubin(value, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in _spmm_wd.kernel_names():
        assert name.encode() + b"\x00" in cubin, f"spmm_wd.cu does not export {name} for {value}"


# GPU ---------------------------------------------------------------------------------------------------------
SHAPES = [(4096, 4096, 0.1, 0, 0), (11008, 4096, 0.1, 0, 0), (300, 200, 0.1, 5, 1), (77, 131, 0.3, 3, 1),
          (1000, 1000, 0.05, 0, 1), (50, 96, 0.0, 0, 0), (129, 4104, 0.1, 2, 1)]


@sm90
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k", [1, 8, 17, 64])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_masked_dense(shape, dtype, index, k, bias):
    from sparsetorch_cuda._spmm_wd import WdSpmm

    m, n, density, empty, full = shape
    W = _gpu_matrix(m, n, density, dtype, empty, full, m + n)
    rowptr, col, val = _csr(W, index)
    op = WdSpmm(rowptr, col, val, (m, n))
    _check(op, W, k, bias)


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("clusters", [1, 2, 4, 8])
@pytest.mark.parametrize("config", [(1, 8, 1), (2, 4, 1), (2, 8, 1), (4, 2, 1), (4, 4, 1), (2, 5, 1), (1, 8, 2), (2, 4, 2),
                                    (2, 8, 2), (2, 5, 2)])
def test_every_kernel(config, clusters, dtype):
    from sparsetorch_cuda._spmm_wd import WdSpmm

    m, n = 515, 1000
    W = _gpu_matrix(m, n, 0.1, dtype, 3, 1, 11)
    rowptr, col, val = _csr(W, torch.int32)
    op = WdSpmm(rowptr, col, val, (m, n), config=config[:2], clusters=clusters, prefetch=config[2])
    assert op.S == clusters and op.kernel_name().endswith("_f2") == (config[2] == 2)
    for k in (5, 64, 100):
        _check(op, W, k, True)


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("ncl", [1, 3])
def test_persistent_rounds(ncl, dtype):
    """Fewer clusters than row blocks: each cluster walks several row blocks with one X slice."""
    from sparsetorch_cuda._spmm_wd import WdSpmm

    m, n = 1100, 4096
    W = _gpu_matrix(m, n, 0.1, dtype, 4, 1, 12)
    rowptr, col, val = _csr(W, torch.int32)
    op = WdSpmm(rowptr, col, val, (m, n), ncl=ncl)
    assert op.launch_shape(64)[4] == ncl
    _check(op, W, 64, True)
    _check(op, W, 130, False)


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_misaligned_x_and_wide_k(dtype):
    """X^T at an address that is not 16-byte aligned (the element-wise copy path) and k > 64."""
    from sparsetorch_cuda._spmm_wd import WdSpmm

    m, n = 333, 1024
    W = _gpu_matrix(m, n, 0.1, dtype, 2, 1, 13)
    rowptr, col, val = _csr(W, torch.int32)
    op = WdSpmm(rowptr, col, val, (m, n))
    for k in (17, 64, 130):
        buf = torch.randn(k * n + 1, device="cuda").to(dtype)
        x = buf[1:].view(k, n)
        assert x.data_ptr() % 16 != 0
        _check(op, W, k, True, x=x)


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_set_values_after_in_place_change_and_graph_replay(dtype):
    from sparsetorch_cuda._spmm_wd import WdSpmm

    m, n, k = 1030, 4096, 64
    W = _gpu_matrix(m, n, 0.1, dtype, 0, 0, 14).clone()
    rowptr, col, val = _csr(W, torch.int32)
    values = val.clone()
    op = WdSpmm(rowptr, col, values, (m, n))
    _check(op, W, k, True)
    # in-place change of the values tensor: seen after set_values
    values.mul_(-2.0)
    W2 = torch.zeros_like(W)
    W2[W != 0] = values
    op.set_values(values)
    _check(op, W2, k, True)
    # CUDA graph: captured once, replayed after X and the values change in place (set_values repacks into new words,
    # so the graph is captured after it)
    x = torch.randn(k, n, device="cuda").to(dtype)
    b = torch.randn(m, device="cuda").to(dtype)
    out = torch.full((k, m), float("nan"), dtype=dtype, device="cuda")
    op(x, b, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, b, out=out)
    x.copy_(torch.randn(k, n, device="cuda").to(dtype))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out).all())
    assert rel_err(out, _reference(W2, x, b)) < TOL[dtype]
    # the words in place: a new value set copied into the same words tensor is seen by the replay
    values.mul_(0.5)
    W3 = torch.zeros_like(W)
    W3[W != 0] = values
    from sparsetorch_cuda._spmm_wd import pack_words

    op.words.copy_(pack_words(op.layout, values))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, _reference(W3, x, b)) < TOL[dtype]


@sm90
def test_declines():
    from sparsetorch_cuda._spmm_wd import WdSpmm

    W = _gpu_matrix(64, 128, 0.2, torch.float16, 0, 0, 15)
    rowptr, col, val = _csr(W, torch.int32)
    with pytest.raises(ValueError):
        WdSpmm(rowptr, col, val.float(), (64, 128))
    with pytest.raises(ValueError):
        WdSpmm(rowptr, col, val, (64, 128), config=(3, 3))
    with pytest.raises(ValueError):
        WdSpmm(rowptr, col, val, (64, 128), clusters=4, flags=1)
    with pytest.raises(ValueError):
        WdSpmm(rowptr, col, val, (64, 128), config=(4, 4), prefetch=2)
    dup_col = col.clone()
    dup_col[1] = dup_col[0]
    if int(rowptr[1]) >= 2:
        with pytest.raises(ValueError):
            WdSpmm(rowptr, dup_col, val, (64, 128))


@sm90
def test_benchmark_flags_run():
    """The _abl builds launch with every flag (their results are wrong by design; only that they run)."""
    from sparsetorch_cuda._spmm_wd import WdSpmm

    W = _gpu_matrix(512, 4096, 0.1, torch.float16, 0, 0, 16)
    rowptr, col, val = _csr(W, torch.int32)
    x = torch.randn(64, 4096, device="cuda").to(torch.float16)
    for flags in (1, 2, 4, 8, 16, 12):
        WdSpmm(rowptr, col, val, (512, 4096), flags=flags)(x)
    torch.cuda.synchronize()
