"""spmm_bm's scheme split over the column tiles without clusters (kernels/spmm_bmk.cu, _spmm_bmk.py).

On the CPU: the split choice (one wave, at least BMK_MIN_TILES tiles per block) and a Python emulation of
what the kernel does per block (its column-tile range [T rank / KS, T (rank + 1) / KS), the bitmaps and value
slots read as the kernel reads them, the float32 partials added into the workspace, the ticket, the last
block's Y with bias and the workspace re-zeroed) against a dense float64 product, for several KS, twice in a
row on the same workspace. On a GPU (skipped without one): ``plan.mma_kernel = "bmk"`` against dense float64
references, float16 and bfloat16, int32 and int64 indices, k = 1 .. 130, shapes not multiples of 64, empty
rows, bias and none, every block shape and several splits, two calls in a row (the workspace and counters zero
after each), new and in-place values, CUDA-graph capture with X changed in place; "auto" never runs it."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import CSR

from _cuda_helpers import TOL, gpu, random_dense, random_x, rel_err, to_format

HALF = (torch.float16, torch.bfloat16)
CASES = [(300, 512, 0.1, 5, 1), (129, 136, 0.3, 3, 0), (72, 200, 0.9, 0, 2), (40, 64, 0.02, 10, 0)]


def _csr(D: torch.Tensor):
    nz = D != 0
    rowptr = torch.zeros(D.shape[0] + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(nz.sum(1), 0)
    col = torch.nonzero(nz)[:, 1]
    return rowptr, col, D[nz]


def _toff(rowptr: torch.Tensor, col: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """spmm_fl's per (tile, row) offsets ((T + 1) x m), written independently of _mma.py."""
    T = -(-n // 64)
    out = torch.zeros(T + 1, m, dtype=torch.int64)
    for r in range(m):
        cs = col[int(rowptr[r]):int(rowptr[r + 1])]
        for t in range(T + 1):
            out[t, r] = int((cs < 64 * t).sum())
    return out.to(torch.int16)


def _emulate(lay, rowptr, toff, val, X, bias, m, n, ks, ws, cnt):
    """Y^T (k x m, float64) as spmm_bmk computes it: per block (row block, rank, column block of 64) the
    tiles of its rank, A's entries read from the bitmaps and 8-aligned value units as the kernel reads them,
    the partial added into ``ws`` (k x mp, float32), the ticket on ``cnt``, the last block's Y + bias."""
    T, mp = -(-n // 64), lay["mp"]
    k = X.shape[0]
    bits = lay["bits"]
    Y = torch.full((k, m), float("nan"), dtype=torch.float64)
    for rb in range(-(-m // 128)):
        for cb in range(-(-k // 64)):
            bsl = slice(64 * cb, min(64 * cb + 64, k))
            for rank in range(ks):
                ta, te = T * rank // ks, T * (rank + 1) // ks
                part = torch.zeros(128, bsl.stop - bsl.start, dtype=torch.float64)
                for t in range(ta, te):
                    for rl in range(128):
                        r = 128 * rb + rl
                        w = int(bits[t * mp + r]) & ((1 << 64) - 1)
                        if r >= m:
                            assert w == 0
                            continue
                        es = int(rowptr[r]) + (int(toff[t, r]) & 0xFFFF)
                        for j in range(64):
                            if w >> j & 1:
                                pos = (es >> 3) * 8 + (es & 7) + bin(w & ((1 << j) - 1)).count("1")
                                part[rl] += float(val[pos]) * X[bsl, 64 * t + j].double()
                rows = min(128, m - 128 * rb)
                ws.view(k, mp)[bsl, 128 * rb:128 * rb + rows] += part[:rows].T.float()
                cnt[rb * -(-k // 64) + cb] += 1
                if int(cnt[rb * -(-k // 64) + cb]) == ks:  # the last ticket
                    s = ws.view(k, mp)[bsl, 128 * rb:128 * rb + rows].double()
                    Y[bsl, 128 * rb:128 * rb + rows] = s + (bias[128 * rb:128 * rb + rows] if bias is not None else 0.0)
                    ws.view(k, mp)[bsl, 128 * rb:128 * rb + rows] = 0.0
                    cnt[rb * -(-k // 64) + cb] = 0
    return Y


@pytest.mark.parametrize("ks", [1, 2, 3, 8])
@pytest.mark.parametrize("case", [(129, 136, 0.3, 3, 0), (200, 520, 0.1, 6, 1)])
def test_emulated_split_matches_dense(case, ks):
    from sparsetorch_cuda._spmm_bm import bm_layout

    m, n, density, empty, full = case
    D = random_dense(m, n, density, torch.float16, seed=m + n + ks, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    toff = _toff(rowptr, col, m, n)
    lay = bm_layout(rowptr, col, toff, m, n)
    assert lay is not None
    T = -(-n // 64)
    ks = min(ks, T)
    k = 70  # two column blocks, the second partial
    X = random_x(k, n, torch.float16, ks).double()
    bias = torch.randn(m, dtype=torch.float64)
    ws = torch.zeros(k * lay["mp"], dtype=torch.float32)
    cnt = torch.zeros(-(-m // 128) * -(-k // 64), dtype=torch.int32)
    ref = X @ D.T + bias
    for _ in range(2):  # the second call finds the workspace and counters as the first left them
        Y = _emulate(lay, rowptr, toff, val, X, bias, m, n, ks, ws, cnt)
        assert rel_err(Y, ref) < 1e-5
        assert not bool(ws.any()) and not bool(cnt.any())


def test_choose_split():
    from sparsetorch_cuda._spmm_bmk import BMK_MIN_TILES, bmk_choose

    # 4096^2, k = 64: 32 row blocks, 64 tiles; 2 blocks per SM x 132: KS = 8 (256 blocks, one wave)
    assert bmk_choose(4096, 4096, 64, ("bmk",), lambda v: 264) == ("bmk", 8)
    # 4 blocks per SM (bmk1): 528 // 32 = 16 splits of 4 tiles
    assert bmk_choose(4096, 4096, 64, ("bmk1",), lambda v: 528) == ("bmk1", 16)
    # 4096 -> 11008: 86 row blocks: KS = 3 (258 blocks)
    assert bmk_choose(11008, 4096, 64, ("bmk",), lambda v: 264) == ("bmk", 3)
    # more row blocks than resident blocks: no split
    assert bmk_choose(65536, 4096, 64, ("bmk",), lambda v: 264) == ("bmk", 1)
    # a small matrix: at least BMK_MIN_TILES tiles per block
    v, ks = bmk_choose(100, 512, 16, ("bmk",), lambda v: 264)
    assert ks == -(-8 // BMK_MIN_TILES)
    # forced splits, clipped to T
    assert bmk_choose(4096, 4096, 64, ("bmk",), lambda v: 264, splits=5) == ("bmk", 5)
    assert bmk_choose(100, 128, 64, ("bmk",), lambda v: 264, splits=9) == ("bmk", 2)
    # a variant that does not fit (capacity 0) is never chosen
    assert bmk_choose(4096, 4096, 64, ("bmk", "bmk1"), lambda v: 0 if v == "bmk" else 528)[0] == "bmk1"


def _plan(D, dtype, index_dtype=torch.int32, kind="bmk"):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    A = to_format(D, CSR, dtype, index_dtype)
    p = CudaSpmmPlan(A)
    p.set_values(A.values)
    p.mma_kernel = kind
    return A, p


def _ws_zero(p) -> bool:
    torch.cuda.synchronize()
    return all(not bool(w.any()) and not bool(c.any()) for w, c in p.__dict__.get("_bmk_ws", {}).values())


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("case", CASES + [(1000, 4104, 0.1, 20, 1)])
def test_bmk_matches_dense(case, dtype, index_dtype):
    m, n, density, empty, full = case
    D = random_dense(m, n, density, dtype, seed=7 * m + n, empty_rows=empty, long_rows=full)
    A, p = _plan(D, dtype, index_dtype)
    bias = random_x(m, 1, dtype, 3).squeeze(1).cuda()
    for k in (1, 16, 64, 130):
        x = random_x(k, n, dtype, k)
        xc = x.cuda()
        if k >= 8:
            assert p._mma_ok(k) and p._bmk_ok(k), (case, k)
        for b in (None, bias):
            y = p.apply(xc.mT, bias=b).mT if b is not None else p.apply(xc.mT).mT
            ref = x.double() @ D.T + (b.double().cpu() if b is not None else 0.0)
            assert rel_err(y, ref) < TOL[dtype], (case, k, b is not None, p.bmk_split(k) if k >= 8 else None)
        yc = p.apply(xc.T.contiguous())  # a contiguous X (transposed by the plan)
        assert rel_err(yc.T, x.double() @ D.T) < TOL[dtype]
    assert _ws_zero(p)


@gpu
@pytest.mark.parametrize("dtype", HALF)
def test_bmk_every_variant_and_split(dtype):
    from sparsetorch_cuda._spmm_bmk import BMK_VARIANTS

    m, n = 520, 1032  # T = 17
    D = random_dense(m, n, 0.1, dtype, seed=11, empty_rows=4, long_rows=1)
    A, p = _plan(D, dtype)
    bias = random_x(m, 1, dtype, 4).squeeze(1).cuda()
    x = random_x(64, n, dtype, 5)
    ref = x.double() @ D.T + bias.double().cpu()
    for v in BMK_VARIANTS:
        for s in (1, 2, 3, 5, 8, 17):
            p.bmk_variant_override = v
            p.bmk_split_override = s
            assert p.bmk_split(64) == (v, s)
            y = p.apply(x.cuda().mT, bias=bias).mT
            assert rel_err(y, ref) < TOL[dtype], (v, s)
            y2 = p.apply(x.cuda().mT, bias=bias).mT  # the same workspace again
            assert rel_err(y2, ref) < TOL[dtype], (v, s)
            assert rel_err(y2, y.double()) < TOL[dtype], (v, s)
            assert _ws_zero(p), (v, s)
    p.bmk_split_override = None
    p.bmk_variant_override = None
    assert p.bmk_split(64)[1] >= 1
    assert rel_err(p.apply(x.cuda().mT, bias=bias).mT, ref) < TOL[dtype]


@gpu
def test_bmk_sees_new_and_in_place_values():
    dtype = torch.float16
    D = random_dense(256, 384, 0.1, dtype, seed=2)
    A, p = _plan(D, dtype)
    x = random_x(64, 384, dtype, 9)
    xc = x.cuda()
    y0 = p.apply(xc.mT).mT
    assert rel_err(y0, x.double() @ D.T) < TOL[dtype]
    v = A.values.clone()
    p.set_values(v)
    v.mul_(-2.0)
    assert rel_err(p.apply(xc.mT).mT, x.double() @ (-2.0 * D).T) < TOL[dtype]
    p.set_values(A.values * 0.5)
    assert rel_err(p.apply(xc.mT).mT, x.double() @ (0.5 * D).T) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", HALF)
def test_bmk_cuda_graph(dtype):
    m, n = 1000, 2056
    D = random_dense(m, n, 0.1, dtype, seed=4, empty_rows=3)
    A, p = _plan(D, dtype)
    assert p.bmk_split(64)[1] > 1  # the workspace path
    bias = random_x(m, 1, dtype, 1).squeeze(1).cuda()
    x = random_x(64, n, dtype, 8).cuda()
    p.apply(x.mT, bias=bias)  # the first call records its launch (and makes the workspace) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = p.apply(x.mT, bias=bias)
        y2 = p.apply(x.mT, bias=bias)  # two calls in one graph: the first re-zeroes the workspace for the second
    for seed in (9, 10):
        x2 = random_x(64, n, dtype, seed)
        x.copy_(x2.cuda())
        g.replay()
        torch.cuda.synchronize()
        ref = x2.double() @ D.T + bias.double().cpu()
        assert rel_err(y.mT, ref) < TOL[dtype], seed
        assert rel_err(y2.mT, ref) < TOL[dtype], seed
    assert _ws_zero(p)


@gpu
def test_auto_never_runs_bmk():
    from sparsetorch_cuda import _spmm_bmk

    assert _spmm_bmk.BMK_AUTO is False
    D = random_dense(512, 1024, 0.1, torch.float16, seed=6)
    A, p = _plan(D, torch.float16, kind="auto")
    assert not p._bmk_ok(64)
    x = random_x(64, 1024, torch.float16, 2)
    assert rel_err(p.apply(x.cuda().mT).mT, x.double() @ D.T) < TOL[torch.float16]
    assert not p.__dict__.get("_bmk_ws")


@gpu
def test_bmk_first_call_inside_a_capture_is_still_right():
    dtype = torch.float16
    m, n = 600, 1024
    D = random_dense(m, n, 0.1, dtype, seed=12)
    A, p = _plan(D, dtype)
    x = random_x(64, n, dtype, 3).cuda()
    _ = p._mma_layout(), p._bm_layout()  # pattern data made outside the capture
    p.mma_kernel = "tile"
    p.apply(x.mT)  # the fallback kernel (the tile kernel, mma_kernel "bmk" after bm / sp / fl decline) loaded
    p.mma_kernel = "bmk"
    p._prepared.clear()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = p.apply(x.mT)  # no workspace yet: spmm_bmk declines inside the capture
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y.mT, x.double().cpu() @ D.T) < TOL[dtype]
    assert not p.__dict__.get("_bmk_ws")
