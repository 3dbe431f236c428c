"""The tensor-core SpMM (kernels/mma.cu) and the fused / unfused bias, on a GPU, against dense
float64 references: CSR (short and long rows per 64-column tile, empty rows, n not a multiple of
64), the generic path (COO through a CSR) and N:M 2:4, float16 and bfloat16, every cluster size,
the CSR kernels (spmm_fl and spmm_ws, chosen by the plan, and spmm_mma: ``plan.mma_kernel``), X given as a linear
layer's transposed input and as a contiguous (n, k) tensor, columns of X that fill no whole
64-column block, CUDA-graph capture, the recorded-launch replay, values written in place. Skips
without a GPU."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import COO, CSR, NM

from _cuda_helpers import TOL, gpu, nm_dense, random_dense, rel_err, to_format


HALF = (torch.float16, torch.bfloat16)


def _plan(A, variant=None):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    p = CudaSpmmPlan(A, variant=variant)
    p.set_values(A.values)
    return p


def _xt(k, n, dtype, seed):
    """X^T as a linear layer holds it: (k, n) contiguous, values representable in dtype."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, generator=g, dtype=torch.float64).to(dtype)


def _bias(m, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, generator=g, dtype=torch.float64).to(dtype)


def _ref(D, xt, b=None):
    y = D @ xt.double().T
    return y if b is None else y + b.double()[:, None]


@gpu
@pytest.mark.parametrize("kern", ("fl", "ws", "tile"))
@pytest.mark.parametrize("rows", (128, 64))
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("split", (1, 2, 3, 4, 8))
@pytest.mark.parametrize("shape", ((300, 512, 0.1), (130, 264, 0.5), (1000, 1024, 0.02), (257, 2048, 0.9), (64, 520, 0.3),
                                   (40, 8200, 0.05)),
                         ids=("sparse", "n%64", "verysparse", "dense-rows", "n520", "wide"))
def test_csr_mma_matches_dense(shape, split, dtype, rows, kern):
    m, n, dens = shape
    if kern == "tile" and split == 3:
        pytest.skip("spmm_mma has cluster sizes 1, 2, 4, 8")
    if kern != "tile" and rows == 64:
        pytest.skip("spmm_fl and spmm_ws have 128 rows per block")
    D = random_dense(m, n, dens, dtype, seed=m + n, empty_rows=5, long_rows=1)
    A = to_format(D, CSR, dtype, torch.int32)
    plan = _plan(A)
    plan.mma_kernel = kern
    plan.mma_split_override = split
    plan.mma_rows = rows
    assert plan._mma_layout() is not None
    assert plan._fl_ok() == (kern != "tile")
    if kern != "tile":
        assert plan.fl_kind(64) == kern and plan.fl_split(64) == split
    for k, seed in ((8, 1), (17, 2), (33, 6), (64, 3), (100, 4), (130, 5)):
        xt = _xt(k, n, dtype, seed).cuda()
        b = _bias(m, dtype, seed).cuda()
        Y = plan.apply(xt.mT, bias=b)  # a linear layer's call: X = x.mT, Y comes back as Yt.mT
        assert Y.shape == (m, k) and Y.dtype == dtype and Y.mT.is_contiguous()
        err = rel_err(Y, _ref(D, xt.cpu(), b.cpu()))
        assert err < TOL[dtype], (shape, split, k, err)
        Yc = plan.apply(xt.mT.contiguous())  # contiguous X: transposed inside, Y contiguous
        assert Yc.is_contiguous()
        err_c = rel_err(Yc, _ref(D, xt.cpu()))
        assert err_c < TOL[dtype], (shape, split, k, "contiguous", err_c)
        again = plan.apply(xt.mT, bias=b)  # the recorded launch, replayed
        assert torch.equal(again, Y)


@gpu
@pytest.mark.parametrize("bias", (True, False), ids=("bias", "nobias"))
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", ((4096, 4096), (333, 1024), (129, 72), (1, 64), (200, 4104)),
                         ids=("llm", "ragged-m", "n72", "one-row", "n4104"))
def test_fl_default_plan(shape, dtype, bias):
    # the default plan (spmm_fl, its own cluster size) on every k: 1 and 7 run the other kernels
    m, n = shape
    D = random_dense(m, n, 0.1, dtype, seed=m * 7 + n, empty_rows=min(3, m - 1), long_rows=1)
    plan = _plan(to_format(D, CSR, dtype, torch.int32))
    assert plan._fl_ok()
    b = _bias(m, dtype, 9).cuda() if bias else None
    for k in (1, 7, 8, 64, 65, 130):
        xt = _xt(k, n, dtype, k).cuda()
        for _ in range(2):  # the second call replays the recorded launch
            Y = plan.apply(xt.mT, bias=b)
            err = rel_err(Y, _ref(D, xt.cpu(), None if b is None else b.cpu()))
            assert err < TOL[dtype], (shape, k, err)
        if k >= 8:
            assert plan.fl_kind(k) in ("fl", "ws") and plan.fl_split(k) in (1, 2, 3, 4, 8)


@gpu
@pytest.mark.parametrize("kern", ("fl", "ws", "tile"))
def test_values_written_in_place_are_seen(kern):
    # the kernels read the values where they lie: an in-place update with the same storage (what an
    # optimizer step does) is seen by the recorded launch
    dtype = torch.float16
    D = random_dense(256, 512, 0.1, dtype, seed=5)
    A = to_format(D, CSR, dtype, torch.int32)
    plan = _plan(A)
    plan.mma_kernel = kern
    v = A.values.clone()
    plan.set_values(v)
    xt = _xt(64, 512, dtype, 1).cuda()
    y1 = plan.apply(xt.mT)
    v.mul_(2)
    plan.set_values(v)
    y2 = plan.apply(xt.mT)
    assert rel_err(y2, 2 * _ref(D, xt.cpu())) < TOL[dtype]
    assert rel_err(y1, _ref(D, xt.cpu())) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
def test_default_split_and_generic_path(dtype):
    D = random_dense(4096 // 8, 1024, 0.1, dtype, seed=3)
    A = to_format(D, COO, dtype, torch.int64)
    plan = _plan(A)
    assert plan.kind == "generic" and plan.mma_split(64) in (1, 2, 4, 8)
    xt = _xt(64, 1024, dtype, 7).cuda()
    assert rel_err(plan.apply(xt.mT), _ref(D, xt.cpu())) < TOL[dtype]
    plan.use_mma = False  # the CUDA-core kernels on the same call agree
    assert rel_err(plan.apply(xt.mT), _ref(D, xt.cpu())) < TOL[dtype]


@gpu
@pytest.mark.parametrize("rows", (128, 64))
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("split", (1, 2, 4, 8))
@pytest.mark.parametrize("shape", ((256, 512), (130, 264), (33, 2048)))
def test_nm24_mma_matches_dense(shape, split, dtype, rows):
    m, n = shape
    D = nm_dense(m, n, 2, 4, dtype, seed=n)
    A = to_format(D, NM(2, 4), dtype, torch.int32)
    plan = _plan(A)
    plan.mma_split_override = split
    plan.mma_rows = rows
    assert plan.kind == "nm" and plan._mma_layout() is not None
    for k in (8, 64, 70):
        xt = _xt(k, n, dtype, k).cuda()
        b = _bias(m, dtype, k).cuda()
        err = rel_err(plan.apply(xt.mT, bias=b), _ref(D, xt.cpu(), b.cpu()))
        assert err < TOL[dtype], (shape, split, k, err)


@gpu
def test_mma_not_taken_where_it_does_not_apply():
    D = random_dense(100, 245, 0.1, torch.float16, seed=1)  # n % 8 != 0
    plan = _plan(to_format(D, CSR, torch.float16, torch.int32))
    assert not plan._mma_ok(64)
    xt = _xt(64, 245, torch.float16, 2).cuda()
    assert rel_err(plan.apply(xt.mT), _ref(D, xt.cpu())) < TOL[torch.float16]
    D32 = random_dense(100, 256, 0.1, torch.float32, seed=1)
    assert not _plan(to_format(D32, CSR, torch.float32, torch.int32))._mma_ok(64)  # float32: CUDA-core kernels


@gpu
@pytest.mark.parametrize("fmt", ("CSR", "NM(2,4)"))
@pytest.mark.parametrize("dtype", (torch.float16, torch.float32), ids=("float16", "float32"))
@pytest.mark.parametrize("k", (1, 3, 64))
def test_bias_on_every_path(fmt, dtype, k):
    m, n = 200, 256
    D = nm_dense(m, n, 2, 4, dtype, seed=2) if fmt != "CSR" else random_dense(m, n, 0.1, dtype, seed=2)
    plan = _plan(to_format(D, CSR if fmt == "CSR" else NM(2, 4), dtype, torch.int32))
    b = _bias(m, dtype, 3).cuda()
    X = _xt(k, n, dtype, 4).T.contiguous().cuda()
    for _ in range(2):  # the second call replays what the first recorded
        err = rel_err(plan.apply(X, bias=b), _ref(D, X.T.cpu(), b.cpu()))
        assert err < TOL[dtype], (fmt, dtype, k, err)
    with pytest.raises(Exception, match="bias"):
        plan.apply(X, bias=b[:-1])


@gpu
def test_mma_cuda_graph_capture():
    dtype = torch.float16
    D = random_dense(512, 1024, 0.1, dtype, seed=4)
    plan = _plan(to_format(D, CSR, dtype, torch.int32))
    xt = _xt(64, 1024, dtype, 5).cuda()
    b = _bias(512, dtype, 6).cuda()
    plan.apply(xt.mT, bias=b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.apply(xt.mT, bias=b)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = plan.apply(xt.mT, bias=b)
    new = _xt(64, 1024, dtype, 8)
    xt.copy_(new.cuda())
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y, _ref(D, new, b.cpu())) < TOL[dtype]


CSR16_KERNELS = ("warp", "xs1", "xs2", "xs4", "auto", "xv", "xvf", "x12", "x12f", "xva", "x12a", "xr", "xv/256", "x12/512",
                 "x12f/128", "x12a/256", "xr/256", "xr:3", "xr:1")


@gpu
@pytest.mark.parametrize("kern", CSR16_KERNELS)
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", ((300, 512, 0.1), (129, 4096, 0.5), (1000, 1024, 0.04), (64, 520, 0.3), (70, 12000, 0.01),
                                   (517, 4096, 0.1), (40, 136, 0.9)))
def test_csr16_one_column(shape, dtype, kern):
    # long rows, one right-hand side: the uint16-column kernels, bias fused: csr16_warp (X gathered
    # through the read-only cache), csr16_xs<R> (X in shared memory, R rows per warp) and the
    # session-8 csr16_xv* / csr16_x12* (a lane per pair of 8-entry chunks; "/T": T threads per block)
    m, n, dens = shape
    D = random_dense(m, n, dens, dtype, seed=n, empty_rows=3)
    plan = _plan(to_format(D, CSR, dtype, torch.int32))
    kern, _, threads = kern.partition("/")
    kern, _, copies = kern.partition(":")
    plan.csr16_kernel = kern
    if threads:
        plan.csr16_threads = int(threads)
    if copies:
        plan.csr16_copies = int(copies)
    assert plan.use_csr16
    # the 12-bit columns take n <= 4096; 8 copies of X (xr's default) n <= 8128
    runs = kern != "warp" and not (kern.startswith("x12") and n > 4096) and not (kern == "xr" and n > 8128 and copies in ("", "8"))
    assert plan._mma_ok(1) == runs
    x = _xt(1, n, dtype, 1).T.contiguous().cuda()
    b = _bias(m, dtype, 2).cuda()
    for _ in range(2):
        assert rel_err(plan.apply(x, bias=b), _ref(D, x.T.cpu(), b.cpu())) < TOL[dtype]
        assert rel_err(plan.apply(x), _ref(D, x.T.cpu())) < TOL[dtype]
    key = ("mma", 1, 0, b.data_ptr()) if runs else (1, 0, b.data_ptr())
    assert plan._prepared.get(key) is not None  # one launch with the bias: recorded
    xo = _xt(1, n + 8, dtype, 3).cuda()[0, 1:n + 1]  # X at an odd address: copied to an aligned one first
    assert rel_err(plan.apply(xo[:, None], bias=b), _ref(D, xo[None].cpu(), b.cpu())) < TOL[dtype]


@gpu
@pytest.mark.parametrize("kern", ("auto", "xv", "x12", "x12f", "xva", "x12a", "xr"))
def test_csr16_xv_values_in_place_and_graph(kern):
    # the values are read where they lie (an in-place update is seen by the recorded launch), and the
    # launch is captured by a CUDA graph
    dtype = torch.float16
    D = random_dense(300, 1024, 0.2, dtype, seed=9, empty_rows=2)
    A = to_format(D, CSR, dtype, torch.int32)
    plan = _plan(A)
    plan.csr16_kernel = kern
    v = A.values.clone()
    plan.set_values(v)
    x = _xt(1, 1024, dtype, 4).T.contiguous().cuda()
    b = _bias(300, dtype, 5).cuda()
    y1 = plan.apply(x, bias=b)
    assert rel_err(y1, _ref(D, x.T.cpu(), b.cpu())) < TOL[dtype]
    v.mul_(2)
    plan.set_values(v)
    y2 = plan.apply(x)
    assert rel_err(y2, 2 * _ref(D, x.T.cpu())) < TOL[dtype]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y3 = plan.apply(x, bias=b)
    new = _xt(1, 1024, dtype, 6).T.contiguous()
    x.copy_(new.cuda())
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y3, _ref(D * 2, new.T, b.cpu())) < TOL[dtype]


