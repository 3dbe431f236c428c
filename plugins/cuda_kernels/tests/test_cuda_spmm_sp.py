"""The 2:4 sparse-tensor-core SpMM (kernels/spmm_sp.cu, _spmm_sp.py).

On the CPU: the per-pattern layout rebuilds A exactly when read the way the kernel reads it (records,
metadata, residual), for random patterns with groups of three and four entries, empty rows, and m / n
not multiples of the block. On a GPU (skipped without one): ``plan.mma_kernel = "sp"`` against dense
float64 references, float16 and bfloat16, every compiled configuration and cluster size, bias, k
not a multiple of 8 or 64, new values (set_values) and values written in place, contiguous X."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import CSR

from _cuda_helpers import TOL, gpu, random_dense, rel_err, to_format

HALF = (torch.float16, torch.bfloat16)


def _csr(D: torch.Tensor):
    """rowptr, col (int64) and the values (float64) of a dense matrix's nonzeros, row-major."""
    nz = D != 0
    rowptr = torch.zeros(D.shape[0] + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(nz.sum(1), 0)
    col = torch.nonzero(nz)[:, 1]
    return rowptr, col, D[nz]


def _rebuild(lay, rowptr, val, m, n):
    """A as the kernel sees it: per block and row the first two entries of each group through the
    metadata, then the residual entries."""
    from sparsetorch_cuda._spmm_sp import _as_i32  # noqa: F401 - the module imports

    S, J = lay["S"], lay["J"]
    rec = lay["rec"].to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros(S * 16, J * 32, dtype=torch.float64)
    rp = torch.zeros(S * 16, dtype=torch.int64)
    rp[:m] = rowptr[:m]
    for blk in range(S * J):
        s, j = divmod(blk, J)
        for rl in range(16):
            g, h = rl % 8, rl // 8
            occ = int(rec[blk, 2 * g + h])
            toff = (int(rec[blk, 16 + g]) >> (16 * h)) & 0xFFFF
            row = 16 * s + rl
            if row >= m:
                assert occ == 0
                continue
            for q in range(8):
                nib = (occ >> (4 * q)) & 15
                pos = int(rp[row]) + toff + bin(occ & ((1 << (4 * q)) - 1)).count("1")
                meta = (int(rec[blk, 24 + 2 * g + q // 4]) >> (4 * (q % 4) + 16 * h)) & 15
                i0, i1 = meta & 3, meta >> 2
                assert i0 < i1, (blk, rl, q, meta)
                v1 = float(val[pos]) if nib not in (0, 8) else 0.0
                v2 = float(val[pos + (0 if nib == 8 else 1)]) if (bin(nib).count("1") >= 2 or nib == 8) else 0.0
                out[row, 32 * j + 4 * q + i0] += v1
                out[row, 32 * j + 4 * q + i1] += v2
    rptr, pos, rc = lay["rptr"].to(torch.int64), lay["res_pos"].to(torch.int64), lay["res_rc"].to(torch.int64)
    for blk in range(S * J):
        s, j = divmod(blk, J)
        for e in range(int(rptr[blk]), int(rptr[blk + 1])):
            col, rl = int(rc[e]) >> 4, int(rc[e]) & 15
            assert col // 32 == j
            out[16 * s + rl, col] += float(val[int(pos[e])])
    return out[:m, :n]


@pytest.mark.parametrize("shape", ((40, 72, 0.1, 0), (33, 100, 0.4, 1), (16, 32, 0.9, 2), (50, 64, 0.02, 3), (17, 40, 1.0, 4)),
                         ids=("sparse", "groups-of-3-4", "dense-ish", "very-sparse", "full"))
def test_layout_rebuilds_A(shape):
    from sparsetorch_cuda._spmm_sp import sp_layout

    m, n, dens, seed = shape
    D = random_dense(m, n, dens, torch.float64, seed=seed, empty_rows=3)
    rowptr, col, val = _csr(D)
    lay = sp_layout(rowptr, col, m, n)
    assert lay is not None
    assert lay["S"] == -(-m // 16) and lay["J"] == -(-n // 32)
    assert lay["rec"].shape == (lay["S"] * lay["J"], 40) and lay["rec"].dtype == torch.int32
    A = _rebuild(lay, rowptr, val, m, n)
    assert torch.equal(A, D)
    if dens >= 0.4:
        assert lay["stats"]["residual"] > 0


@pytest.mark.parametrize("vp", (0, 2, 14))
@pytest.mark.parametrize("cfg", ((2, 2, 4, 2, 1), (4, 2, 4, 1, 3)))
def test_value_staging_addresses(cfg, vp):
    """The kernel's copy of a block's values into shared memory, replayed on the host: per row the
    16-byte units around its run (from the records' run starts), the rows' prefix, the delta per row,
    each unit's source found by binary search; every entry of the block's k-chunks read at
    delta + 2 p is the CSR value (values based at byte ``vp`` mod 16)."""
    from sparsetorch_cuda._spmm_sp import SP_REC, sp_layout

    R, WR, WK, CS, kpw = cfg
    m, n = 70, 200
    D = random_dense(m, n, 0.3, torch.float64, seed=11, empty_rows=4)
    rowptr, col, val = _csr(D)
    lay = sp_layout(rowptr, col, m, n)
    J, ROWS = lay["J"], 16 * R * WR
    recs = lay["rec"].to(torch.int64) & 0xFFFFFFFF
    vbytes = bytearray(vp) + b"".join(int(i).to_bytes(2, "little") for i in range(len(val))) + bytearray(32)
    vs0 = 4096  # the values' shared-memory address
    for blk in range(-(-m // ROWS)):
        for rank in range(CS):
            jlo = rank * WK * kpw
            jhi = min(J, jlo + WK * kpw)
            units, d0, start = [0] * ROWS, [0] * ROWS, [0] * ROWS
            for t in range(ROWS):
                r = blk * ROWS + t
                if r >= m or jlo >= jhi:
                    continue
                s_, rl = r >> 4, r & 15
                start[t] = int(rowptr[r])
                tlo = (int(recs[s_ * J + jlo, 16 + (rl & 7)]) >> (16 * (rl >> 3))) & 0xFFFF
                thi = ((int(recs[s_ * J + jhi, 16 + (rl & 7)]) >> (16 * (rl >> 3))) & 0xFFFF if jhi < J
                       else int(rowptr[r + 1]) - start[t])
                if thi > tlo:
                    a0, a1 = vp + 2 * (start[t] + tlo), vp + 2 * (start[t] + thi)
                    f0 = a0 & ~15
                    units[t] = (((a1 + 15) & ~15) - f0) >> 4
                    d0[t] = vp - f0
            pre = [0]
            for u in units:
                pre.append(pre[-1] + u)
            delta = [d0[t] + vs0 + 16 * pre[t] for t in range(ROWS)]
            sm = bytearray(16 * pre[-1])
            for f in range(pre[-1]):
                lo, hi = 0, ROWS
                while hi - lo > 1:
                    mid = (lo + hi) >> 1
                    lo, hi = (mid, hi) if pre[mid] <= f else (lo, mid)
                dst = vs0 + 16 * f
                src = vp + (dst - delta[lo])
                sm[16 * f:16 * f + 16] = vbytes[src:src + 16]
            for t in range(ROWS):
                r = blk * ROWS + t
                if r >= m:
                    continue
                for p in range(int(rowptr[r]), int(rowptr[r + 1])):
                    if jlo <= int(col[p]) // 32 < jhi:
                        a = delta[t] + 2 * p - vs0  # the kernel's ld.shared.u16 [delta + 2 p]
                        got = int.from_bytes(sm[a:a + 2], "little") if a >= 0 else -1
                        assert got == p, (blk, rank, t, p, got)
    assert SP_REC == 160


def test_layout_declines():
    from sparsetorch_cuda._spmm_sp import sp_layout

    rowptr = torch.tensor([0, 2])
    assert sp_layout(rowptr, torch.tensor([5, 3]), 1, 8) is None   # columns not increasing
    assert sp_layout(rowptr, torch.tensor([3, 3]), 1, 8) is None   # duplicate column
    assert sp_layout(rowptr, torch.tensor([3, 9]), 1, 8) is None   # column out of range


def test_meta_lut_is_valid():
    from sparsetorch_cuda._spmm_sp import _meta_lut

    lut = _meta_lut(torch.device("cpu")).tolist()
    for nib, code in enumerate(lut):
        i0, i1 = code & 3, code >> 2
        assert i0 < i1
        kept = [p for p in range(4) if nib >> p & 1][:2]
        assert all(p in (i0, i1) for p in kept)


def test_choose_fits_shared_memory(monkeypatch):
    from sparsetorch_cuda import _spmm_sp as sp

    monkeypatch.setattr(sp, "_cluster_ok", lambda dev: True)
    monkeypatch.setattr(sp, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(sp, "_capacity", lambda cfg, cs, smem, dev: 132 // cs * cs)
    for m, n, k in ((4096, 4096, 64), (11008, 4096, 64), (4096, 8192, 8), (100, 64, 8)):
        got = sp.sp_choose(m, n, k, 0)
        assert got is not None, (m, n, k)
        R, WR, WK, CS, kpw, smem, vcap = got
        assert smem <= sp.SP_MAX_SMEM and kpw * WK * CS >= -(-n // 32)
    assert sp.sp_choose(4096, 4096, 64, 0, (4, 2, 4, 3)) is None  # no cluster of 3
    assert sp.sp_choose(64, 65528, 64, 0) is None  # the X^T slice would not fit in shared memory


# GPU ------------------------------------------------------------------------------------------------


def _plan(A):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    p = CudaSpmmPlan(A)
    p.set_values(A.values)
    p.mma_kernel = "sp"
    return p


def _xt(k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, generator=g, dtype=torch.float64).to(dtype)


def _ref(D, xt, b=None):
    y = D @ xt.double().T
    return y if b is None else y + b.double()[:, None]


def _configs():
    from sparsetorch_cuda._spmm_sp import SP_CLUSTERS, SP_CONFIGS

    return [(*c, s) for c in SP_CONFIGS for s in SP_CLUSTERS]


@gpu
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", ((300, 512, 0.1), (130, 264, 0.5), (1000, 1024, 0.02), (257, 2048, 0.9), (64, 520, 0.3),
                                   (40, 8200, 0.05)),
                         ids=("sparse", "n%32", "verysparse", "dense-rows", "n520", "wide"))
def test_sp_matches_dense(shape, dtype):
    m, n, dens = shape
    D = random_dense(m, n, dens, dtype, seed=m + n, empty_rows=5, long_rows=1)
    A = to_format(D, CSR, dtype, torch.int32)
    plan = _plan(A)
    assert plan._sp_layout() is not None
    for cfg in _configs():
        if torch.cuda.get_device_capability()[0] < 9 and cfg[3] > 1:
            continue
        plan.sp_config_override = cfg
        if plan.sp_choice(64) is None:  # its X^T slice does not fit in shared memory
            assert not plan._sp_ok(64)
            continue
        assert plan._sp_ok(64), cfg
        for k, seed in ((8, 1), (17, 2), (64, 3), (130, 5)):
            xt = _xt(k, n, dtype, seed).cuda()
            b = _bias(m, dtype, seed).cuda()
            Y = plan.apply(xt.mT, bias=b)
            assert Y.shape == (m, k) and Y.dtype == dtype
            err = rel_err(Y, _ref(D, xt.cpu(), b.cpu()))
            assert err < TOL[dtype], (shape, cfg, k, err)
    plan.sp_config_override = None
    xt = _xt(33, n, dtype, 9).cuda()
    Yc = plan.apply(xt.mT.contiguous())  # contiguous X: transposed inside, Y contiguous
    assert Yc.is_contiguous() and rel_err(Yc, _ref(D, xt.cpu())) < TOL[dtype]


def _bias(m, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, generator=g, dtype=torch.float64).to(dtype)


@gpu
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
def test_sp_sees_new_values(dtype):
    m, n = 200, 256
    D = random_dense(m, n, 0.3, dtype, seed=7)
    A = to_format(D, CSR, dtype, torch.int32)
    plan = _plan(A)
    xt = _xt(64, n, dtype, 1).cuda()
    assert rel_err(plan.apply(xt.mT), _ref(D, xt.cpu())) < TOL[dtype]
    v2 = (A.values * 2).contiguous()
    plan.set_values(v2)
    assert rel_err(plan.apply(xt.mT), _ref(2 * D, xt.cpu())) < TOL[dtype]
    v2.mul_(-0.5)  # in place: the kernel reads the values where they lie
    assert rel_err(plan.apply(xt.mT), _ref(-D, xt.cpu())) < TOL[dtype]


@gpu
def test_sp_is_deterministic():
    m, n = 513, 1024
    D = random_dense(m, n, 0.1, torch.float16, seed=3)
    plan = _plan(to_format(D, CSR, torch.float16, torch.int32))
    xt = _xt(64, n, torch.float16, 2).cuda()
    Y0 = plan.apply(xt.mT)
    for _ in range(3):
        assert torch.equal(plan.apply(xt.mT), Y0)
