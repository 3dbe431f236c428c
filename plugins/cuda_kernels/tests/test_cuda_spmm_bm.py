"""The bitmap tensor-core SpMM (kernels/spmm_bm.cu, _spmm_bm.py).

On the CPU: the per-pattern bitmaps, read the way the kernel reads them (a row's entry of column
64 t + j at rowptr + toff + popc(bits below j), from its 16-byte-unit slot), rebuild A exactly, for
patterns with empty rows, a full row and m / n not multiples of the block; unsorted columns are
declined; the cluster-size choice. On a GPU (skipped without one): ``plan.mma_kernel = "bm"`` against
dense float64 references, float16 and bfloat16, int32 and int64 indices, every cluster size, bias and
none, k = 1 .. 130, new and in-place values, CUDA-graph capture, and "auto"'s choice."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import CSR

from _cuda_helpers import TOL, gpu, random_dense, random_x, rel_err, to_format

HALF = (torch.float16, torch.bfloat16)


def _csr(D: torch.Tensor):
    """rowptr, col (int64) and the values (float64) of a dense matrix's nonzeros, row-major."""
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


CASES = [(300, 512, 0.1, 5, 1), (129, 136, 0.3, 3, 0), (72, 200, 0.9, 0, 2), (40, 64, 0.02, 10, 0)]


@pytest.mark.parametrize("case", CASES)
def test_bitmaps_rebuild_A(case):
    from sparsetorch_cuda._spmm_bm import BM_ROWS, bm_layout

    m, n, density, empty, full = case
    D = random_dense(m, n, density, torch.float16, seed=m + n, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    toff = _toff(rowptr, col, m, n)
    lay = bm_layout(rowptr, col, toff, m, n)
    assert lay is not None and lay["mp"] % BM_ROWS == 0 and lay["mp"] >= m
    T, mp, slot = -(-n // 64), lay["mp"], lay["slot"]
    assert slot % 8 == 0 and (slot // 8) % 2 == 1
    bits = lay["bits"]
    out = torch.zeros(m, n, dtype=torch.float64)
    for t in range(T):
        for r in range(mp):
            w = int(bits[t * mp + r]) & ((1 << 64) - 1)
            if r >= m:
                assert w == 0
                continue
            es = int(rowptr[r]) + (int(toff[t, r]) & 0xFFFF)
            ee = int(rowptr[r]) + (int(toff[t + 1, r]) & 0xFFFF)
            assert bin(w).count("1") == ee - es
            if ee > es:  # the staged units fit the slot
                assert 8 * (((ee + 7) >> 3) - (es >> 3)) <= slot
            for j in range(64):
                if w >> j & 1:
                    local = (es & 7) + bin(w & ((1 << j) - 1)).count("1")  # the kernel's slot index
                    pos = (es >> 3) * 8 + local
                    out[r, 64 * t + j] = float(val[pos])
    assert torch.equal(out, D)


def test_layout_declines_unsorted_columns():
    from sparsetorch_cuda._spmm_bm import bm_layout

    rowptr = torch.tensor([0, 3, 4])
    col = torch.tensor([5, 2, 9, 1])
    assert bm_layout(rowptr, col, torch.zeros(2, 2, dtype=torch.int16), 2, 16) is None


def test_choose_split():
    from sparsetorch_cuda._spmm_bm import BM_SPLITS, bm_choose

    def cap(per_sm: dict):
        return lambda v, s: per_sm[v] * 132

    both = ("bm", "bm1")
    # 4096^2, k = 64: 32 row blocks x 64 column tiles; bm (2 blocks per SM): S = 6 fits one wave (192 blocks)
    assert bm_choose(4096, 4096, 64, ("bm",), BM_SPLITS, cap({"bm": 2})) == ("bm", 8)
    assert bm_choose(4096, 4096, 64, ("bm1",), BM_SPLITS, cap({"bm1": 3})) == ("bm1", 8)
    # 4096 -> 11008: 86 row blocks; bm1 at 3 per SM holds S = 4 (344 blocks) in one wave, bm (240 resident,
    # clusters placed per GPC) only S = 2 (32 tiles per block)
    assert bm_choose(11008, 4096, 64, both, BM_SPLITS, lambda v, s: 396 if v == "bm1" else 240) == ("bm1", 4)
    assert bm_choose(11008, 4096, 64, both, (1,), cap({"bm": 2, "bm1": 3})) == ("bm", 1)
    # a variant that does not fit (capacity 0) is never chosen
    assert bm_choose(4096, 4096, 64, both, BM_SPLITS, lambda v, s: 0 if v == "bm" else 396)[0] == "bm1"


def _plan(D, dtype, index_dtype=torch.int32, kind="bm"):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    A = to_format(D, CSR, dtype, index_dtype)
    p = CudaSpmmPlan(A)
    p.set_values(A.values)
    p.mma_kernel = kind
    return A, p


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("case", CASES + [(1000, 4104, 0.1, 20, 1)])
def test_bm_matches_dense(case, dtype, index_dtype):
    m, n, density, empty, full = case
    D = random_dense(m, n, density, dtype, seed=7 * m + n, empty_rows=empty, long_rows=full)
    A, p = _plan(D, dtype, index_dtype)
    bias = random_x(m, 1, dtype, 3).squeeze(1).cuda()
    for k in (1, 7, 8, 17, 64, 65, 130):
        x = random_x(k, n, dtype, k)
        xc = x.cuda()
        if k >= 8:
            assert p._mma_ok(k) and p._bm_ok(k), (case, k)
        for b in (None, bias):
            y = p.apply(xc.mT, bias=b).mT if b is not None else p.apply(xc.mT).mT
            ref = x.double() @ D.T + (b.double().cpu() if b is not None else 0.0)
            assert rel_err(y, ref) < TOL[dtype], (case, k, b is not None)
        yc = p.apply(xc.T.contiguous())  # a contiguous X (transposed by the plan)
        assert rel_err(yc.T, x.double() @ D.T) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", HALF)
def test_bm_every_variant_and_cluster_size(dtype):
    from sparsetorch_cuda._spmm_bm import BM_SPLITS, BM_VARIANTS, _cluster_ok

    m, n = 520, 1032
    D = random_dense(m, n, 0.1, dtype, seed=11, empty_rows=4, long_rows=1)
    A, p = _plan(D, dtype)
    x = random_x(64, n, dtype, 5)
    ref = x.double() @ D.T
    splits = BM_SPLITS if _cluster_ok(p.dev_index) else (1,)
    for v in BM_VARIANTS:
        for s in splits:
            p.bm_variant_override = v
            p.bm_split_override = s
            assert p.bm_split(64) == (v, s)
            y = p.apply(x.cuda().mT).mT
            assert rel_err(y, ref) < TOL[dtype], (v, s)
    p.bm_split_override = None
    p.bm_variant_override = None


@gpu
def test_bm_sees_new_and_in_place_values():
    dtype = torch.float16
    D = random_dense(256, 384, 0.1, dtype, seed=2)
    A, p = _plan(D, dtype)
    x = random_x(64, 384, dtype, 9)
    xc = x.cuda()
    y0 = p.apply(xc.mT).mT  # records the launch
    assert rel_err(y0, x.double() @ D.T) < TOL[dtype]
    v = A.values.clone()
    p.set_values(v)
    v.mul_(-2.0)  # in place: the kernel reads the values where they lie
    assert rel_err(p.apply(xc.mT).mT, x.double() @ (-2.0 * D).T) < TOL[dtype]
    p.set_values(A.values * 0.5)
    assert rel_err(p.apply(xc.mT).mT, x.double() @ (0.5 * D).T) < TOL[dtype]


@gpu
def test_bm_cuda_graph():
    dtype = torch.bfloat16
    D = random_dense(384, 512, 0.1, dtype, seed=4, empty_rows=3)
    A, p = _plan(D, dtype)
    bias = random_x(384, 1, dtype, 1).squeeze(1).cuda()
    x = random_x(64, 512, dtype, 8).cuda()
    p.apply(x.mT, bias=bias)  # the first call records its launch outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = p.apply(x.mT, bias=bias)
    x2 = random_x(64, 512, dtype, 9)
    x.copy_(x2.cuda())
    g.replay()
    torch.cuda.synchronize()
    ref = x2.double() @ D.T + bias.double().cpu()
    assert rel_err(y.mT, ref) < TOL[dtype]


@gpu
def test_auto_choice(monkeypatch):
    from sparsetorch_cuda import _spmm_bm

    dtype = torch.float16
    D = random_dense(512, 1024, 0.1, dtype, seed=6)
    A, p = _plan(D, dtype, kind="auto")
    x = random_x(64, 1024, dtype, 2)
    ref = x.double() @ D.T
    # the committed rule: auto runs bm exactly where BM_AUTO covers (density, k) and, with BM_AUTO_WHERE_FL,
    # where auto would otherwise run spmm_fl
    rule = _spmm_bm.BM_AUTO
    density = p.nnz / (512 * 1024)
    want = rule is not None and rule[0] <= density <= rule[1] and rule[2] <= 64 <= rule[3]
    if _spmm_bm.BM_AUTO_WHERE_FL:
        want = want and p._fl_ok() and p.fl_kind(64) == "fl"
    assert p._bm_ok(64) == want
    assert rel_err(p.apply(x.cuda().mT).mT, ref) < TOL[dtype]
    monkeypatch.setattr(_spmm_bm, "BM_AUTO", (0.05, 0.2, 16, 128))
    monkeypatch.setattr(_spmm_bm, "BM_AUTO_WHERE_FL", False)
    p._prepared.clear()
    assert p._bm_ok(64) and not p._bm_ok(8) and not p._bm_ok(256)
    assert rel_err(p.apply(x.cuda().mT).mT, ref) < TOL[dtype]
    monkeypatch.setattr(_spmm_bm, "BM_AUTO", (0.2, 1.0, 16, 128))
    assert not p._bm_ok(64)
    # only in place of spmm_fl: 4 row blocks of 128 fit spmm_ws in one wave on any GPU with clusters
    monkeypatch.setattr(_spmm_bm, "BM_AUTO", (0.05, 0.2, 16, 128))
    monkeypatch.setattr(_spmm_bm, "BM_AUTO_WHERE_FL", True)
    assert p._bm_ok(64) == (p.fl_kind(64) == "fl")
