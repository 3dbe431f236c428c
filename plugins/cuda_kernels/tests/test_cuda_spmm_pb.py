"""The pair-bitmap tensor-core SpMM (kernels/spmm_pb.cu, _spmm_pb.py).

On the CPU: the per-pattern layout read the way the kernel reads it (lane L = 4 g + t loads header entry g, takes
byte t of the map word, its first pair word at offset + popc of the bits below) and multiplied the way the
kernel multiplies (the lanes' registers placed by PTX's m16n8k16 fragment layout, X^T permuted as spmm_pb_xperm
permutes it) gives A X exactly, for ragged shapes, empty rows, a dense row and an empty matrix; repeated entries
are declined; the K-split choice; the source compiles with NVRTC for sm_90 and exports every kernel name. On an
sm_90+ GPU (skipped otherwise): :class:`PbSpmm` against the masked dense weight in float32, float16 and bfloat16,
int32 and int64 indices, 4096^2, 11008 x 4096 and ragged shapes, k = 1 / 8 / 17 / 64 / 100 / 130, bias and none,
every configuration and cluster size, misaligned and ragged X, new values, CUDA-graph replay; every output element
is written (the output starts as NaN)."""

from __future__ import annotations


import numpy as np
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


def _popc(x: int) -> int:
    return bin(x & 0xFFFFFFFF).count("1")


def _lane_registers(hdr: np.ndarray, words: np.ndarray, tile: int) -> np.ndarray:
    """The 8 A registers (as (lo, hi) float16 pairs) of every lane for one tile, decoded as the kernel decodes."""
    regs = np.zeros((32, 8, 2), dtype=np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        mapw, off = int(hdr[tile * 8 + g, 0]) & 0xFFFFFFFF, int(hdr[tile * 8 + g, 1])
        byte = (mapw >> (8 * t)) & 0xFF
        pos = off + _popc(mapw & ((1 << (8 * t)) - 1))
        for i in range(8):
            if (byte >> i) & 1:
                w = int(words[pos + _popc(byte & ((1 << i) - 1))]) & 0xFFFFFFFF
                regs[lane, i] = [_half(w & 0xFFFF), _half(w >> 16)]
    return regs


def _lane_registers_csr(hdr: np.ndarray, vals: np.ndarray, tile: int) -> np.ndarray:
    """spmm_pbr's decode: lane (g, t) reads header entry g (row g's and row g + 8's 32 column bits and the CSR
    index of their first entry in the block), takes columns 8 t .. 8 t + 7 of both rows, and packs slot
    (st, sub) from columns 4 st + 2 (sub >> 1) + {0, 1} of row g + 8 (sub & 1)."""
    regs = np.zeros((32, 8, 2), dtype=np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        hv = np.zeros((2, 8))
        for rr in range(2):
            w = int(hdr[tile * 8 + g, 2 * rr]) & 0xFFFFFFFF
            pos = int(hdr[tile * 8 + g, 2 * rr + 1]) + _popc(w & ((1 << (8 * t)) - 1))
            byte = (w >> (8 * t)) & 0xFF
            for c in range(8):
                if (byte >> c) & 1:
                    hv[rr, c] = vals[pos + _popc(byte & ((1 << c) - 1))]
        for st in range(2):
            for sub in range(4):
                c0 = 4 * st + 2 * (sub >> 1)
                regs[lane, 4 * st + sub] = hv[sub & 1, c0: c0 + 2]
    return regs


def _half(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def _emulate(lay, words: torch.Tensor, X: np.ndarray, m: int, n: int, csr: bool = False) -> np.ndarray:
    """Y (m x k) = A X^T as the kernel computes it: per tile and k16 step, A's and B's logical 16 x 16 and 16 x 8
    matrices assembled from the lanes' registers by PTX's m16n8k16 layout (a0: row g, k 2t..2t+1; a1: row g + 8;
    a2: row g, k 2t + 8..; a3: row g + 8, k 2t + 8..; b0: k 2t..2t+1, column g; b1: k 2t + 8..), X^T's chunks
    as spmm_pb_xperm makes them (chunk of lane L: X^T[8 j + g][32 blk + 8 t .. + 7], zero past n)."""
    hdr = lay["hdr"].cpu().numpy()
    w = words.cpu().double().numpy() if csr else words.cpu().numpy()
    k = X.shape[0]
    nkb = lay["nkb"]
    strips = -(-m // 16)
    Y = np.zeros((strips * 16, k))
    Xp = np.zeros((k, nkb * 32))
    Xp[:, :n] = X
    for s in range(strips):
        for blk in range(nkb):
            regs = (_lane_registers_csr if csr else _lane_registers)(hdr, w, s * nkb + blk)
            for st in range(2):
                A = np.zeros((16, 16))
                B = np.zeros((16, k))
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    a = regs[lane, 4 * st: 4 * st + 4]
                    A[g, 2 * t: 2 * t + 2] = a[0]
                    A[g + 8, 2 * t: 2 * t + 2] = a[1]
                    A[g, 2 * t + 8: 2 * t + 10] = a[2]
                    A[g + 8, 2 * t + 8: 2 * t + 10] = a[3]
                    chunk = Xp[:, 32 * blk + 8 * t: 32 * blk + 8 * t + 8]  # every batch row's chunk of lane t
                    B[2 * t: 2 * t + 2] = chunk[:, 4 * st: 4 * st + 2].T
                    B[2 * t + 8: 2 * t + 10] = chunk[:, 4 * st + 2: 4 * st + 4].T
                Y[16 * s: 16 * s + 16] += A @ B
    return Y[:m]


LAYOUT_CASES = [(40, 70, 0.1, 3, 1), (17, 33, 0.3, 1, 1), (32, 64, 0.5, 0, 0), (20, 40, 0.0, 0, 0), (16, 32, 1.0, 0, 0),
                (5, 100, 0.05, 1, 1)]


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_layout_decoded_and_multiplied_as_the_kernel_does(case):
    from sparsetorch_cuda._spmm_pb import pack_pairs, pb_layout

    m, n, density, empty, full = case
    D = random_dense(m, n, density, torch.float16, seed=m + n, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    lay = pb_layout(rowptr, col, m, n)
    assert lay is not None and lay["stats"]["nnz"] == int(val.numel())
    words = pack_pairs(lay, val.to(torch.float16))
    assert words.dtype == torch.int32 and words.numel() >= 1
    # every pair word is read exactly once across the lanes, and the map counts match the offsets
    hdr = lay["hdr"].numpy()
    cnt = np.array([_popc(int(v)) for v in hdr[:, 0]])
    assert np.array_equal(hdr[:, 1], np.concatenate([[0], np.cumsum(cnt)[:-1]]))
    assert int(cnt.sum()) == lay["npairs"]
    X = np.random.default_rng(m * n).standard_normal((7, n)).astype(np.float16).astype(np.float64)
    Y = _emulate(lay, words, X, m, n)
    np.testing.assert_allclose(Y, D.numpy() @ X.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_csr_layout_decoded_and_multiplied_as_the_kernel_does(case):
    from sparsetorch_cuda._spmm_pb import pbr_layout

    m, n, density, empty, full = case
    D = random_dense(m, n, density, torch.float16, seed=m + n + 1, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    lay = pbr_layout(rowptr, col, m, n)
    assert lay is not None and lay["hdr"].shape == (max(lay["stats"]["tiles"], 1) * 8 if lay["stats"]["tiles"] else 1, 4)
    X = np.random.default_rng(m * n + 1).standard_normal((5, n)).astype(np.float16).astype(np.float64)
    Y = _emulate(lay, val, X, m, n, csr=True)
    np.testing.assert_allclose(Y, D.numpy() @ X.T, rtol=1e-12, atol=1e-12)


def test_csr_layout_declines_unsorted_rows():
    from sparsetorch_cuda._spmm_pb import pbr_layout

    assert pbr_layout(torch.tensor([0, 2, 3]), torch.tensor([3, 1, 0]), 2, 4) is None
    assert pbr_layout(torch.tensor([0, 2, 3]), torch.tensor([1, 3, 0]), 2, 4) is not None


def test_layout_int32_and_int64_indices_agree():
    from sparsetorch_cuda._spmm_pb import pb_layout

    D = random_dense(100, 300, 0.1, torch.float16, seed=5)
    a = pb_layout(*_csr(D, torch.int32)[:2], 100, 300)
    b = pb_layout(*_csr(D, torch.int64)[:2], 100, 300)
    assert torch.equal(a["hdr"], b["hdr"]) and torch.equal(a["dest"], b["dest"])


def test_layout_declines_repeated_entries():
    from sparsetorch_cuda._spmm_pb import pb_layout

    assert pb_layout(torch.tensor([0, 2, 3]), torch.tensor([1, 1, 0]), 2, 4) is None


def test_choose():
    from sparsetorch_cuda._spmm_pb import pb_choose

    # 11008 rows in blocks of 128: 86 row blocks; 264 resident blocks -> S = 2 (4 would need 344)
    assert pb_choose(11008, 4096, (2, 4), 132, 264) == 2
    assert pb_choose(4096, 4096, (2, 4), 132, 264) == 8
    assert pb_choose(4096, 64, (2, 4), 132, 264) == 1  # two column blocks: one split
    assert pb_choose(100, 4096, (1, 4), 132, 396) == 8


@pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
@pytest.mark.parametrize("value", ["float16", "bfloat16"])
def test_host_compiles_for_sm90(value):
    from sparsetorch_cuda import _spmm_pb

    cubin = _spmm_pb.compile_cubin(value, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in _spmm_pb.kernel_names():
        assert name.encode() + b"\x00" in cubin, f"spmm_pb.cu does not export {name} for {value}"


# GPU ---------------------------------------------------------------------------------------------------------
SHAPES = [(4096, 4096, 0.1, 0, 0), (11008, 4096, 0.1, 0, 0), (300, 200, 0.1, 5, 1), (77, 131, 0.3, 3, 1),
          (1000, 1000, 0.05, 0, 1), (50, 96, 0.0, 0, 0), (129, 4104, 0.1, 2, 1)]


@sm90
@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k", [1, 17, 64, 130])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_masked_dense(shape, dtype, index, k, bias, csr):
    from sparsetorch_cuda._spmm_pb import PbSpmm

    m, n, density, empty, full = shape
    W = _gpu_matrix(m, n, density, dtype, empty, full, m + n)
    rowptr, col, val = _csr(W, index)
    op = PbSpmm(rowptr, col, val, (m, n), csr=csr)
    _check(op, W, k, bias)
    if k in (17, 64):  # the deep pipeline: short and long K ranges (4096 columns: 128 blocks of 32)
        _check(PbSpmm(rowptr, col, val, (m, n), csr=csr, config=(1, 4), deep=True), W, k, bias)


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("clusters", [1, 2, 4, 8])
@pytest.mark.parametrize("config", [(1, 4), (1, 8), (2, 4), (2, 8), (1, 4, "deep"), (1, 8, "deep")])
@pytest.mark.parametrize("csr", [False, True])
def test_every_kernel(csr, config, clusters, dtype):
    from sparsetorch_cuda._spmm_pb import PbSpmm

    m, n = 515, 1000
    W = _gpu_matrix(m, n, 0.1, dtype, 3, 1, 11)
    rowptr, col, val = _csr(W, torch.int32)
    op = PbSpmm(rowptr, col, val, (m, n), config=config[:2], clusters=clusters, csr=csr, deep=len(config) == 3)
    assert op.S == clusters
    for k in (5, 64, 100):
        _check(op, W, k, True)
    op.pdl = True  # launched with programmatic dependent launch behind the permute (waits before reading it)
    for k in (5, 64):
        _check(op, W, k, True)


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("csr", [False, True])
def test_misaligned_and_ragged_x(dtype, csr):
    """X^T at an address that is not 16-byte aligned, and n not a multiple of 8 (the element-wise permute)."""
    from sparsetorch_cuda._spmm_pb import PbSpmm

    for m, n in ((333, 1024), (200, 1003)):
        W = _gpu_matrix(m, n, 0.1, dtype, 2, 1, 13)
        rowptr, col, val = _csr(W, torch.int32)
        op = PbSpmm(rowptr, col, val, (m, n), csr=csr)
        for k in (17, 64, 130):
            buf = torch.randn(k * n + 1, device="cuda").to(dtype)
            x = buf[1:].view(k, n)
            _check(op, W, k, True, x=x)


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_set_values_and_graph_replay(dtype):
    from sparsetorch_cuda._spmm_pb import PbSpmm

    m, n, k = 1030, 4096, 64
    W = _gpu_matrix(m, n, 0.1, dtype, 0, 0, 14).clone()
    rowptr, col, val = _csr(W, torch.int32)
    values = val.clone()
    op = PbSpmm(rowptr, col, values, (m, n))
    _check(op, W, k, True)
    values.mul_(-2.0)
    W2 = torch.zeros_like(W)
    W2[W != 0] = values
    op.set_values(values)
    _check(op, W2, k, True)
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


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_csr_values_in_place_seen_by_graph_replay(dtype):
    """spmm_pbr reads the values where they lie: an in-place change is seen by the next replay, no set_values."""
    from sparsetorch_cuda._spmm_pb import PbSpmm

    m, n, k = 700, 2048, 64
    W = _gpu_matrix(m, n, 0.1, dtype, 0, 0, 17).clone()
    rowptr, col, val = _csr(W, torch.int32)
    values = val.clone()
    op = PbSpmm(rowptr, col, values, (m, n), csr=True)
    x = torch.randn(k, n, device="cuda").to(dtype)
    out = torch.full((k, m), float("nan"), dtype=dtype, device="cuda")
    op(x, None, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, None, out=out)
    values.mul_(-0.5)
    W2 = torch.zeros_like(W)
    W2[W != 0] = values
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, _reference(W2, x, None)) < TOL[dtype]


@sm90
def test_declines_and_flags_run():
    from sparsetorch_cuda._spmm_pb import PbSpmm

    W = _gpu_matrix(512, 4096, 0.1, torch.float16, 0, 0, 16)
    rowptr, col, val = _csr(W, torch.int32)
    with pytest.raises(ValueError):
        PbSpmm(rowptr, col, val.float(), (512, 4096))
    with pytest.raises(ValueError):
        PbSpmm(rowptr, col, val, (512, 4096), config=(3, 3))
    with pytest.raises(ValueError):
        PbSpmm(rowptr, col, val, (512, 4096), clusters=2, flags=1)
    x = torch.randn(64, 4096, device="cuda").to(torch.float16)
    for flags in (1, 2, 4, 8, 16):
        for csr in (False, True):
            PbSpmm(rowptr, col, val, (512, 4096), clusters=4, flags=flags, csr=csr)(x)
            PbSpmm(rowptr, col, val, (512, 4096), config=(1, 4), clusters=4, flags=flags, csr=csr, deep=True)(x)
    torch.cuda.synchronize()


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(1100, 4096), (300, 200), (129, 1000)])
def test_plan_route(shape, dtype):
    """``plan.mma_kernel = "pb"``: the plan's product runs spmm_pbr (X^T permuted first),
    with the bias, the non-finite fix-up (an Inf in X gives the sparse answer) and in-place value writes seen."""
    import sparsetorch as st
    from sparsetorch.format import CSR
    from sparsetorch_cuda.plan import CudaSpmmPlan

    m, n = shape
    W = _gpu_matrix(m, n, 0.1, dtype, 2, 1, 21).clone()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.mma_kernel = "pb"
    values = A.values
    plan.set_values(values)
    assert plan._pb_ok(64)
    x = torch.randn(64, n, device="cuda").to(dtype)
    b = torch.randn(m, device="cuda").to(dtype)
    y = plan.apply(x.mT, bias=b).mT
    assert rel_err(y, _reference(W, x, b)) < TOL[dtype]
    values.mul_(-1.5)  # in place: seen by the next product
    W2 = torch.zeros_like(W)
    W2[W != 0] = values
    y = plan.apply(x.mT, bias=b).mT
    assert rel_err(y, _reference(W2, x, b)) < TOL[dtype]
    x[3, 5] = float("inf")  # the sparse answer: only rows storing column 5 see it
    y = plan.apply(x.mT).mT.float()
    hit = W2[:, 5] != 0
    assert bool(torch.isinf(y[3, hit]).all()) and bool(torch.isfinite(y[3, ~hit]).all())
    assert bool(torch.isfinite(y[torch.arange(64, device="cuda") != 3]).all())
