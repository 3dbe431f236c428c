"""The strip-compacted tensor-core SpMM (kernels/spmm_cc.cu, _spmm_cc.py).

On the CPU: the per-pattern layout, read the way the kernel reads it (step ranges per strip and K-slice,
slice-local features, B fragments in mma.m16n8k16 lane order), rebuilds A exactly for ragged shapes,
empty rows and a dense row; repeated entries are declined; the gathered features of a half-step mostly
have distinct residues mod 8 (the module's NVRTC build and kernel names: tests/test_compile_host.py). On a GPU (skipped without one):
:class:`CcSpmm` against dense float64 references, float16 and bfloat16, every cluster size and B format,
bias and none, k = 1 .. 130, m not a multiple of 8, n not a multiple of 64, new values, every
output written, CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch

from _cuda_helpers import GPU_MISSING, TOL, gpu, random_dense, rel_err

HALF = (torch.float16, torch.bfloat16)


def _csr(D: torch.Tensor):
    nz = D != 0
    rowptr = torch.zeros(D.shape[0] + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(nz.sum(1), 0)
    col = torch.nonzero(nz)[:, 1]
    return rowptr, col, D[nz]


def _rebuild(lay, packed: torch.Tensor, m: int, n: int, C: int, KS: int) -> torch.Tensor:
    """A (m x n, float64) from the layout, read as the kernel reads it (independently of _spmm_cc.py)."""
    S = lay["steps"]
    sptr = lay["sptr"].to(torch.int64)
    cols = (lay["cols"].to(torch.int64) & 0xFFFF)[: 16 * S]
    B = packed[: S * 128].to(torch.float64).view(S, 32, 4)
    W = torch.zeros(S, 8, 16, dtype=torch.float64)
    for lane in range(32):
        g, t4 = lane // 4, lane % 4
        for h, j in enumerate((2 * t4, 2 * t4 + 1, 2 * t4 + 8, 2 * t4 + 9)):
            W[:, g, j] = B[:, lane, h]
    G = sptr.numel() - 1
    grp = torch.repeat_interleave(torch.arange(G), sptr[1:] - sptr[:-1])
    strip, q = grp // C, grp % C
    feat = q[:, None] * KS + cols.view(S, 16)  # S x 16
    out = torch.zeros(-(-m // 8) * 8, n + KS + 16, dtype=torch.float64)
    for r in range(8):
        rows = (strip * 8 + r)[:, None].expand(S, 16)
        vals = W[:, r, :]
        nz = vals != 0
        assert bool((feat[nz] < n).all()), "a nonzero B half points past column n - 1"
        assert int(torch.unique(rows[nz] * (n + KS + 16) + feat[nz]).numel()) == int(nz.sum()), "an entry twice"
        out.index_put_((rows[nz], feat[nz]), vals[nz], accumulate=True)
    return out[:m, :n]


CASES = [(300, 512, 0.1, 5, 1, 1), (129, 136, 0.3, 3, 0, 2), (72, 200, 0.9, 0, 2, 4), (41, 64, 0.02, 10, 0, 1),
         (13, 1000, 0.1, 2, 1, 8), (8, 17, 0.5, 0, 1, 2)]


@pytest.mark.parametrize("case", CASES)
def test_layout_rebuilds_A(case):
    from sparsetorch_cuda._spmm_cc import CC_PF, cc_choose, cc_layout, pack_values

    m, n, density, empty, full, C = case
    D = random_dense(m, n, density, torch.float16, seed=m + n, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    C, KS = cc_choose(n, C)
    assert KS % 16 == 0 and C * KS >= n
    lay = cc_layout(rowptr, col, m, n, C, KS)
    assert lay is not None
    assert lay["sptr"].numel() == -(-m // 8) * C + 1 and int(lay["sptr"][-1]) == lay["steps"]
    assert lay["cols"].numel() == 16 * (lay["steps"] + CC_PF) and int((lay["cols"].to(torch.int64) & 0xFFFF).max()) < KS
    packed = pack_values(lay, val.to(torch.float16))
    assert packed.numel() == 128 * (lay["steps"] + CC_PF)
    assert not bool(packed[128 * lay["steps"]:].any()), "the spare steps are not zero"
    assert torch.equal(_rebuild(lay, packed, m, n, C, KS), D)


def _unz(lay, words: torch.Tensor) -> torch.Tensor:
    """The dense-packed B halves (steps x 128) from the "z" format, decoded as a kernel lane decodes it."""
    S = lay["steps"]
    recs = lay["recs"].to(torch.int64) & 0xFFFFFFFF
    w = words.view(torch.int16).to(torch.int64) & 0xFFFF
    w = w[0::2] | (w[1::2] << 16) if w.numel() else w  # 4-byte words
    out = torch.zeros(S, 64, dtype=torch.int64)
    for st in range(S):
        lo, hi, base = int(recs[st, 0]), int(recs[st, 1]), int(recs[st, 2])
        code = lo | (hi << 32)
        for lane in range(32):
            below = bin(code & ((1 << (2 * lane)) - 1)).count("1")
            bits = (code >> (2 * lane)) & 3
            if bits & 1:
                out[st, 2 * lane] = int(w[base + below])
            if bits & 2:
                out[st, 2 * lane + 1] = int(w[base + below + (bits & 1)])
    halves = torch.stack([out & 0xFFFF, out >> 16], 2).reshape(S, 128)
    return torch.where(halves >= 2**15, halves - 2**16, halves).to(torch.int16).view(torch.float16)


@pytest.mark.parametrize("case", CASES[:4])
def test_compressed_format_decodes_to_the_dense_one(case):
    from sparsetorch_cuda._spmm_cc import cc_choose, cc_layout, pack_values

    m, n, density, empty, full, C = case
    D = random_dense(m, n, density, torch.float16, seed=m + n + 1, empty_rows=empty, long_rows=full)
    rowptr, col, val = _csr(D)
    C, KS = cc_choose(n, C)
    lay = cc_layout(rowptr, col, m, n, C, KS)
    dense = pack_values(lay, val.to(torch.float16), "dense")
    z = pack_values(lay, val.to(torch.float16), "z")
    assert z.numel() == 2 * lay["stats"]["words_z"] + 4
    S = lay["steps"]
    assert torch.equal(_unz(lay, z).view(-1), dense[: 128 * S].view(-1))
    assert not bool((lay["recs"][S:, :2] != 0).any()), "the spare records hold registers"


def test_layout_declines_repeated_entries():
    from sparsetorch_cuda._spmm_cc import cc_layout

    rowptr = torch.tensor([0, 2, 3])
    col = torch.tensor([1, 1, 0])
    assert cc_layout(rowptr, col, 2, 4, 1, 16) is None


def test_half_steps_gather_distinct_residues():
    """At 10 % density on 4096 columns, the (rank, residue) order leaves almost no two gathered features of a
    half-step in the same bank group (mean of the largest residue count per half-step, 1 = conflict-free)."""
    from sparsetorch_cuda._spmm_cc import cc_choose, cc_layout

    m, n = 256, 4096
    D = random_dense(m, n, 0.1, torch.float16, seed=7)
    rowptr, col, _ = _csr(D)
    C, KS = cc_choose(n)
    lay = cc_layout(rowptr, col, m, n, C, KS)
    st = lay["stats"]
    assert st["mean_conflict"] < 1.3, st
    # the union of 8 rows at 10 %: about 1 - 0.9^8 = 57 % of the columns
    assert 0.5 < st["union"] / (m // 8 * n) < 0.64, st


def test_choose():
    from sparsetorch_cuda._spmm_cc import CC_KS_TARGET, cc_choose

    assert cc_choose(64) == (1, 64)
    assert cc_choose(4096) == (8, 512)
    assert cc_choose(4096, 4) == (4, 1024)
    assert cc_choose(1000)[0] == 2 and cc_choose(1000)[1] >= 500
    assert cc_choose(10 ** 6) is None
    assert cc_choose(CC_KS_TARGET + 1)[0] == 2


def test_auto_rule():
    from sparsetorch_cuda._spmm_cc import cc_auto

    m = n = 4096
    assert cc_auto(m, n, m * n // 10, 64) and cc_auto(m, n, m * n // 2, 16)
    assert not cc_auto(m, n, m * n // 10, 1) and not cc_auto(m, n, m * n // 10, 128)
    assert cc_auto(11008, 4096, 11008 * 4096 // 10, 128, fl_kind="fl")
    assert not cc_auto(m, n, m * n // 100, 64) and not cc_auto(m, n, m * n // 10, 64, rule=None)
    assert not cc_auto(64, 10 ** 6, 10 ** 6, 64)  # the X slice does not fit


# GPU ------------------------------------------------------------------------------------------------
GPU_CASES = [(300, 512, 0.1, 5, 1), (129, 136, 0.3, 3, 0), (72, 200, 0.9, 0, 2), (41, 64, 0.02, 10, 0),
             (13, 1000, 0.1, 2, 1), (1000, 4096, 0.1, 3, 1)]


def _op(D, dtype, **kw):
    from sparsetorch_cuda._spmm_cc import CcSpmm

    rowptr, col, val = _csr(D)
    return CcSpmm(rowptr.cuda().to(torch.int32), col.cuda().to(torch.int32), val.to(dtype).cuda(), D.shape, **kw)


@gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("case", GPU_CASES)
def test_matches_dense(case, dtype):
    m, n, density, empty, full = case
    D = random_dense(m, n, density, dtype, seed=m * 7 + n, empty_rows=empty, long_rows=full)
    op = _op(D, dtype)
    g = torch.Generator().manual_seed(m + n)
    bias = torch.randn(m, generator=g, dtype=torch.float64).to(dtype)
    for k in (1, 5, 16, 17, 64, 65, 130):
        x = torch.randn(k, n, generator=g, dtype=torch.float64).to(dtype)
        out = torch.full((k, m), float("nan"), dtype=dtype, device="cuda")
        y = op(x.cuda(), bias.cuda(), out=out)
        ref = x.double() @ D.T + bias.double()
        assert rel_err(y, ref) < TOL[dtype], (k, rel_err(y, ref))
        y0 = op(x.cuda())
        ref0 = x.double() @ D.T
        if float(ref0.norm()) > 0:
            assert rel_err(y0, ref0) < TOL[dtype], (k, rel_err(y0, ref0))


@gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("clusters", [1, 2, 4, 8])
@pytest.mark.parametrize("fmt", ["dense", "z"])
@pytest.mark.parametrize("ncl", [None, 1, 3])
@pytest.mark.parametrize("once", [False, True])
def test_every_launch_shape(clusters, fmt, ncl, once, dtype):
    if clusters > 1 and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    if once and fmt != "dense":
        pytest.skip("the one-reduction builds read dense B only")
    m, n = 777, 1100
    D = random_dense(m, n, 0.1, dtype, seed=clusters * 10 + len(fmt), empty_rows=4, long_rows=1)
    op = _op(D, dtype, clusters=clusters, fmt=fmt, ncl=ncl, once=once)
    assert op.C == clusters
    name = op._launch_args(64)[0].name
    # one partial-sum buffer (32 KB) a round beside the X slice (KS x 128 bytes): 98 strips in 7 rounds (ncl = 1)
    # never fit, 3 rounds (ncl = 3) only beside a slice of C > 1; otherwise the per-round build runs
    fits = ncl is None or (ncl == 3 and clusters > 1)
    assert name.endswith("_o") == (once and fits), name
    g = torch.Generator().manual_seed(clusters)
    bias = torch.randn(m, generator=g, dtype=torch.float64).to(dtype)
    for k in (3, 16, 64, 100):
        x = torch.randn(k, n, generator=g, dtype=torch.float64).to(dtype)
        y = op(x.cuda(), bias.cuda(), out=torch.full((k, m), float("nan"), dtype=dtype, device="cuda"))
        assert rel_err(y, x.double() @ D.T + bias.double()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", HALF)
def test_new_values_and_graph(dtype):
    m, n = 515, 4096
    D = random_dense(m, n, 0.1, dtype, seed=3)
    op = _op(D, dtype)
    rowptr, col, val = _csr(D)
    D2 = D.clone()
    D2[D != 0] = (torch.rand(int(val.numel()), dtype=torch.float64) + 0.5).to(dtype).double()
    op.set_values(D2[D != 0].to(dtype).cuda())
    x = torch.randn(64, n, dtype=torch.float64).to(dtype).cuda()
    b = torch.randn(m, dtype=torch.float64).to(dtype).cuda()
    out = torch.full((64, m), float("nan"), dtype=dtype, device="cuda")
    op(x, b, out=out)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, b, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, x.double().cpu() @ D2.T + b.double().cpu()) < TOL[dtype]


def test_gpu_marker_reason():
    assert GPU_MISSING is None or "CUDA" in GPU_MISSING or "cuda" in GPU_MISSING


def test_mixin_declines_off_its_ground():
    from sparsetorch_cuda._spmm_cc import CcMixin

    class Plan(CcMixin):
        mma_kernel, dtype, kind, _values, shape, nnz = "auto", torch.float16, "csr", torch.zeros(3), (4, 4), 3

    p = Plan()
    assert not p._cc_ok(64)  # "auto" with CC_AUTO None
    p.mma_kernel, p.dtype = "cc", torch.float32
    assert not p._cc_ok(64)  # not half precision
    p.dtype, p._values = torch.float16, torch.zeros(2, 3)
    assert not p._cc_ok(64)  # a batch of value sets
