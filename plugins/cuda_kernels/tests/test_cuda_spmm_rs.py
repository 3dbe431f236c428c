"""The resident-copy tensor-core SpMM (kernels/spmm_rs.cu, _spmm_rs.py).

On the CPU: the per-pattern layout read the way the kernel reads it (a block of row block rb and K-split q holds
the words of its groups [gbase[rb nkb + kb0], gbase[rb nkb + kb1]) in shared memory; lane L = 4 g + t loads header
entry g of tile (rb, kb0 + lb, strip), takes byte t of the map word, its first word at offset - shift + popc of the
bits below, shift = gbase[rb nkb + kb0] - gbase[rb nkb]) and multiplied the way the kernel multiplies (PTX's
m16n8k16 fragments, the B chunk of lane (g, t) X^T[8 j + g][32 blk + 8 t ..]) gives A X exactly, for every K-split,
ragged shapes, empty rows, a dense row and an empty matrix; every word a lane reads lies in its block's copied
range; the groups are 16-byte aligned; repeated entries are declined; the shared-memory size and the K-split choice;
the source compiles with NVRTC for sm_90 and exports every kernel name. On an sm_90+ GPU (skipped otherwise):
:class:`RsSpmm` against the masked dense weight, float16 and bfloat16, int32 and int64 indices, 4096^2 and ragged
shapes, k = 1 / 17 / 64 / 130, bias and none, every configuration and cluster size, misaligned and ragged X, new
values, CUDA-graph replay; every output element is written (the output starts as NaN)."""

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
from test_cuda_spmm_pb import _half, _popc

HALF = (torch.float16, torch.bfloat16)


def _emulate(lay, words: torch.Tensor, X: np.ndarray, m: int, n: int, S: int) -> np.ndarray:
    """Y (m x k) = A X^T as the blocks of K-split S compute it, reading only their segment's words."""
    hdr = lay["hdr"].cpu().numpy()
    w = words.cpu().numpy()
    gbase = lay["gbase"].cpu().numpy().astype(np.int64)
    k = X.shape[0]
    nkb, nrb, nst = lay["nkb"], lay["nrb"], lay["nst"]
    Y = np.zeros((nrb * nst * 16, k))
    Xp = np.zeros((k, nkb * 32))
    Xp[:, :n] = X
    for rb in range(nrb):
        for q in range(S):
            kb0, kb1 = nkb * q // S, nkb * (q + 1) // S
            lo, hi = int(gbase[rb * nkb + kb0]), int(gbase[rb * nkb + kb1])
            seg = w[lo:hi]  # what the block copies
            shift = lo - int(gbase[rb * nkb])
            for lb in range(kb1 - kb0):
                blk = kb0 + lb
                for s in range(nst):
                    tile = (rb * nkb + blk) * nst + s
                    regs = np.zeros((32, 8, 2))
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        mapw, off = int(hdr[tile * 8 + g, 0]) & 0xFFFFFFFF, int(hdr[tile * 8 + g, 1])
                        byte = (mapw >> (8 * t)) & 0xFF
                        pos = off - shift + _popc(mapw & ((1 << (8 * t)) - 1))
                        for i in range(8):
                            if (byte >> i) & 1:
                                j = pos + _popc(byte & ((1 << i) - 1))
                                assert 0 <= j < hi - lo, "a lane reads past its block's copied words"
                                word = int(seg[j]) & 0xFFFFFFFF
                                regs[lane, i] = [_half(word & 0xFFFF), _half(word >> 16)]
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
                            chunk = Xp[:, 32 * blk + 8 * t: 32 * blk + 8 * t + 8]
                            B[2 * t: 2 * t + 2] = chunk[:, 4 * st: 4 * st + 2].T
                            B[2 * t + 8: 2 * t + 10] = chunk[:, 4 * st + 2: 4 * st + 4].T
                        r0 = (rb * nst + s) * 16
                        Y[r0: r0 + 16] += A @ B
    return Y[:m]


LAYOUT_CASES = [(40, 70, 0.1, 3, 1, 1), (17, 33, 0.3, 1, 1, 2), (80, 260, 0.2, 2, 1, 4), (20, 40, 0.0, 0, 0, 1),
                (16, 32, 1.0, 0, 0, 1), (5, 600, 0.05, 1, 1, 8), (70, 300, 0.1, 0, 1, 3)]


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_layout_decoded_and_multiplied_as_the_kernel_does(case):
    from sparsetorch_cuda._spmm_pb import pack_pairs
    from sparsetorch_cuda._spmm_rs import rs_layout

    m, n, density, empty, full, nst = case
    D = random_dense(m, n, density, torch.float16, seed=m + n, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    lay = rs_layout(rowptr, col, m, n, nst)
    assert lay is not None and lay["stats"]["nnz"] == int(val.numel())
    gbase = lay["gbase"].numpy()
    assert (gbase % 4 == 0).all() and (np.diff(gbase) >= 0).all(), "groups must start 16-byte aligned, in order"
    words = pack_pairs(lay, val.to(torch.float16))
    assert words.dtype == torch.int32 and words.numel() >= int(gbase[-1])
    # every stored entry lands in exactly one half-word slot
    assert torch.unique(lay["dest"]).numel() == int(val.numel())
    X = np.random.default_rng(m * n).standard_normal((7, n)).astype(np.float16).astype(np.float64)
    for S in (1, 2, 4, 8):
        if S > 1 and lay["nkb"] < 2 * S:
            continue
        Y = _emulate(lay, words, X, m, n, S)
        np.testing.assert_allclose(Y, D.numpy() @ X.T, rtol=1e-12, atol=1e-12)


def test_layout_declines_repeated_entries_and_index_types_agree():
    from sparsetorch_cuda._spmm_rs import rs_layout

    rowptr = torch.tensor([0, 2, 3])
    col = torch.tensor([1, 1, 0])
    assert rs_layout(rowptr, col, 2, 4, 8) is None
    D = random_dense(100, 300, 0.1, torch.float16, seed=3, empty_rows=2, long_rows=1)
    r, c, _v = _csr(D)
    a, b = rs_layout(r, c, 100, 300, 16), rs_layout(r.int(), c.int(), 100, 300, 16)
    assert torch.equal(a["hdr"], b["hdr"]) and torch.equal(a["gbase"], b["gbase"]) and torch.equal(a["dest"], b["dest"])


def test_shared_memory_and_choice():
    from sparsetorch_cuda._spmm_rs import RS_SMEM_MAX, rs_choose, rs_layout, rs_smem_bytes

    D = random_dense(512, 4096, 0.1, torch.float16, seed=5)
    r, c, _v = _csr(D)
    lay = rs_layout(r, c, 512, 4096, 16)
    # S = 8 at 10 %: X^T slice 64 x (17 x 64) bytes, headers 16 x 16 x 64, words of 16 groups
    sizes = {s: rs_smem_bytes(lay, (2, 8), s) for s in (1, 2, 4, 8)}
    assert sizes[1] > sizes[2] > sizes[4] > sizes[8] and sizes[1] > RS_SMEM_MAX >= sizes[8]
    g = lay["gbase_host"]
    widest = max(g[rb * 128 + 16 * (q + 1)] - g[rb * 128 + 16 * q] for rb in range(2) for q in range(8))
    assert sizes[8] == 128 + 64 * 1088 + 16 * 16 * 64 + 4 * widest
    # the largest S that fits the wave; none fits where a row block is too dense for shared memory
    fits = [s for s in (1, 2, 4, 8) if sizes[s] <= RS_SMEM_MAX]
    assert rs_choose(lay, (2, 8), 132, {s: 132 for s in fits}) == 8
    assert rs_choose(lay, (2, 8), 4, {s: 4 for s in fits}) == fits[0]  # 2 row blocks x S past one wave of 4
    Dd = random_dense(256, 4096, 1.0, torch.float16, seed=6)
    r, c, _v = _csr(Dd)
    dense = rs_layout(r, c, 256, 4096, 16)
    assert rs_choose(dense, (2, 8), 132, {}) is None


@pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
@pytest.mark.parametrize("value", ["float16", "bfloat16"])
def test_host_compiles_for_sm90(value):
    from sparsetorch_cuda import _spmm_rs

    cubin = _spmm_rs.compile_cubin(value, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in _spmm_rs.kernel_names():
        assert name.encode() + b"\x00" in cubin, f"spmm_rs.cu does not export {name} for {value}"


# GPU ---------------------------------------------------------------------------------------------------------
SHAPES = [(4096, 4096, 0.1, 0, 0), (300, 200, 0.1, 5, 1), (77, 131, 0.3, 3, 1), (1000, 1000, 0.05, 0, 1),
          (50, 96, 0.0, 0, 0), (129, 4104, 0.1, 2, 1)]


@sm90
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("k", [1, 17, 64, 130])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_masked_dense(shape, dtype, index, k, bias):
    from sparsetorch_cuda._spmm_rs import RsSpmm

    m, n, density, empty, full = shape
    W = _gpu_matrix(m, n, density, dtype, empty, full, m + n)
    rowptr, col, val = _csr(W, index)
    _check(RsSpmm(rowptr, col, val, (m, n)), W, k, bias)


@sm90
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("clusters", [1, 2, 4, 8])
@pytest.mark.parametrize("config", [(1, 8), (2, 4), (2, 8), (1, 16)])
def test_every_kernel(config, clusters, dtype):
    from sparsetorch_cuda._spmm_rs import RsSpmm

    m, n = 515, 1000
    W = _gpu_matrix(m, n, 0.1, dtype, 3, 1, 11)
    rowptr, col, val = _csr(W, torch.int32)
    from sparsetorch_cuda._spmm_rs import RS_SMEM_MAX, rs_layout, rs_smem_bytes

    if rs_smem_bytes(rs_layout(rowptr, col, m, n, config[0] * config[1]), config, clusters) > RS_SMEM_MAX:
        with pytest.raises(ValueError, match="shared memory"):
            RsSpmm(rowptr, col, val, (m, n), config=config, clusters=clusters)
        return
    op = RsSpmm(rowptr, col, val, (m, n), config=config, clusters=clusters)
    assert op.S == clusters
    for k in (5, 64, 100):
        _check(op, W, k, True)


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_misaligned_and_ragged_x(dtype):
    """X^T at an address that is not 16-byte aligned, and n not a multiple of 8 (the element-wise fill)."""
    from sparsetorch_cuda._spmm_rs import RsSpmm

    for m, n in ((333, 1024), (200, 1003)):
        W = _gpu_matrix(m, n, 0.1, dtype, 2, 1, 13)
        rowptr, col, val = _csr(W, torch.int32)
        op = RsSpmm(rowptr, col, val, (m, n))
        for k in (17, 64, 130):
            buf = torch.randn(k * n + 1, device="cuda").to(dtype)
            _check(op, W, k, True, x=buf[1:].view(k, n))


@sm90
@pytest.mark.parametrize("dtype", HALF)
def test_set_values_and_graph_replay(dtype):
    from sparsetorch_cuda._spmm_rs import RsSpmm

    m, n, k = 1030, 4096, 64
    W = _gpu_matrix(m, n, 0.1, dtype, 0, 0, 14).clone()
    rowptr, col, val = _csr(W, torch.int32)
    values = val.clone()
    op = RsSpmm(rowptr, col, values, (m, n))
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
def test_declines_and_flags_run():
    from sparsetorch_cuda._spmm_rs import RsSpmm

    W = _gpu_matrix(512, 4096, 0.1, torch.float16, 0, 0, 16)
    rowptr, col, val = _csr(W, torch.int32)
    with pytest.raises(ValueError):
        RsSpmm(rowptr, col, val.float(), (512, 4096))
    with pytest.raises(ValueError):
        RsSpmm(rowptr, col, val, (512, 4096), config=(3, 3))
    with pytest.raises(ValueError):
        RsSpmm(rowptr, col, val, (512, 4096), clusters=4, flags=1)
    with pytest.raises(ValueError, match="shared memory"):
        RsSpmm(rowptr, col, val, (512, 4096), clusters=1)
    x = torch.randn(64, 4096, device="cuda").to(torch.float16)
    for flags in (1, 2, 4, 8):
        RsSpmm(rowptr, col, val, (512, 4096), clusters=8, flags=flags)(x)
    torch.cuda.synchronize()
