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
                 "x12f/128", "x12a/256", "xr/256", "xr:3", "xr:1", "x12b", "x12b/1024", "x12a+6", "x12b+5", "xva+4")

def _csr16_options(plan, spec: str) -> tuple[str, str]:
    """Set a CSR16_KERNELS entry ("name[:copies][/threads][+flags]") on ``plan``; returns (name, copies)."""
    kern, _, flags = spec.partition("+")
    kern, _, threads = kern.partition("/")
    kern, _, copies = kern.partition(":")
    plan.csr16_kernel = kern
    if flags:
        plan.csr16_flags = int(flags)
    if threads:
        plan.csr16_threads = int(threads)
    if copies:
        plan.csr16_copies = int(copies)
    return kern, copies



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
    kern, copies = _csr16_options(plan, kern)
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
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("kind", ("auto", "fl", "ws", "tile", "bm", "sp"))
@pytest.mark.parametrize("k", (8, 16, 64, 130))
def test_tensor_core_products_keep_sparse_semantics_for_nonfinite_x(k, kind, dtype):
    # Inf / NaN in X[j0, b] reaches only the rows that store column j0 (session 12: the tensor-core kernels
    # multiply their tiles' structural zeros; spmm_fixup recomputes the affected columns of X from the stored
    # entries); the other columns of X keep the tensor-core product's answer; the recorded replay and a CUDA
    # graph give the same (the default since session 13, set explicitly here); mma_nonfinite = "dense" is the
    # kernels' own answer (NaN in the other rows)
    m, n, j0 = 300, 1024, 100
    D = random_dense(m, n, 0.1, torch.float64, seed=k + len(kind), empty_rows=3)
    D[::2, j0] = 0.0
    D[1::2, j0] = 0.5
    D = D.to(dtype).double()
    plan = _plan(to_format(D, CSR, dtype, torch.int32))
    plan.mma_kernel = kind
    plan.mma_nonfinite = "sparse"
    if not plan._mma_ok(k):
        pytest.skip(f"{kind} does not run k = {k} here")
    xt = _xt(k, n, dtype, k)
    bad = sorted({1, k - 1})
    xt[bad[0], j0] = float("inf")
    xt[bad[-1], j0 + 1] = float("nan")  # column j0 + 1: stored by some rows, not by others
    b = _bias(m, dtype, 4)
    bc = b.cuda()
    x = xt.cuda().T  # X^T contiguous, as a linear layer passes it
    clean = torch.where(torch.isfinite(xt), xt, torch.zeros((), dtype=dtype)).double()
    ref = D @ clean.T + b.double()[:, None]  # (m, k): the finite part
    stores = D != 0
    key = ("mma", k, x.mT.data_ptr() & 15, bc.data_ptr())
    for run in range(2):  # the recording launch, then the recorded replay
        y = plan.apply(x, bias=bc).double().cpu()
        for c in range(k):
            if c == bad[0]:
                hit = stores[:, j0]
                assert bool(torch.isinf(y[hit, c]).all()) and bool((y[hit, c] > 0).all()), (run, c)  # 0.5 * +Inf
            elif c == bad[-1]:
                hit = stores[:, j0 + 1]
                assert bool(torch.isnan(y[hit, c]).all()), (run, c)
            else:
                hit = torch.zeros(m, dtype=torch.bool)
            assert bool(torch.isfinite(y[~hit, c]).all()), (run, c, torch.nonzero(~torch.isfinite(y[~hit, c])).flatten()[:8])
            assert rel_err(y[~hit, c], ref[~hit, c]) < TOL[dtype], (run, c)
        assert type(plan._prepared.get(key)).__name__ == "PreparedSeq"  # the product and its fix-up, recorded
    out = torch.empty(k, m, dtype=dtype, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(plan.apply(x, bias=bc).mT)
    out.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(out.T.double().cpu()), torch.isnan(y))
    plan1 = _plan(to_format(D, CSR, dtype, torch.int32))
    plan1.mma_kernel = kind  # mma_nonfinite left at its default: the sparse answer
    assert torch.equal(torch.isnan(plan1.apply(x, bias=bc).double().cpu()), torch.isnan(y))
    plan2 = _plan(to_format(D, CSR, dtype, torch.int32))
    plan2.mma_kernel = kind
    plan2.mma_nonfinite = "dense"
    yd = plan2.apply(x, bias=bc).double().cpu()
    if kind != "sp":  # the dense answer: the other rows of the tile come back NaN
        assert bool(torch.isnan(yd[~stores[:, j0], bad[0]]).any())


@gpu
@pytest.mark.parametrize("kern", CSR16_KERNELS)
def test_csr16_rows_next_to_an_infinite_value(kern):
    # a row's entries share 16-byte pieces with its neighbours' (and the last row's piece runs past the
    # values): an Inf there must reach its own row only (session 12: csr16_warp masked X, not the
    # product, and 0 * Inf gave NaN in the next row)
    dtype = torch.float16
    m, n = 96, 1024
    D = random_dense(m, n, 0.2, dtype, seed=12, empty_rows=2)
    A = to_format(D, CSR, dtype, torch.int32)
    rowptr = A.pos(1).cpu()
    bad = [r for r in range(1, m - 1) if rowptr[r + 1] > rowptr[r] and int(rowptr[r + 1]) % 8 != 0][:3]
    vals = A.values.clone()
    for r in bad:
        vals[int(rowptr[r + 1]) - 1] = float("inf")  # the row's last entry, mid-piece
    A = A.with_values(vals)
    plan = _plan(A)
    kern, copies = _csr16_options(plan, kern)
    x = _xt(1, n, dtype, 5).abs().T.contiguous().cuda() + 0.5  # positive: each bad row's sum is +Inf
    y = plan.apply(x).double().cpu()[:, 0]
    Dv = torch.zeros(m, n, dtype=torch.float64)
    Dv[torch.repeat_interleave(torch.arange(m), rowptr[1:] - rowptr[:-1]), A.crd(1).long().cpu()] = vals.double().cpu()
    ref = Dv @ x.double().cpu()[:, 0]
    assert bad and all(torch.isposinf(y[r]) for r in bad)
    good = torch.isfinite(ref)
    assert bool(torch.isfinite(y[good]).all()), torch.nonzero(~torch.isfinite(y) & good).flatten().tolist()
    assert rel_err(y[good], ref[good]) < TOL[dtype]


@gpu
@pytest.mark.parametrize("kern", ("auto", "xv", "x12", "x12f", "xva", "x12a", "xr", "x12b"))
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




# ---- session 9: programmatic dependent launch (launch.py) of the batch-1 kernels, csr16_x12b ----------

def _chain_plan(n, dtype, kern, flags, seed=11):
    D = random_dense(n, n, 0.1, dtype, seed=seed, empty_rows=3, long_rows=1) / 16  # powers of two: still exact
    plan = _plan(to_format(D, CSR, dtype, torch.int32))
    plan.csr16_kernel = kern
    plan.csr16_flags = flags
    return D, plan


def _check_chain(D, Ys, dtype, steps):
    torch.cuda.synchronize()
    for i in range(steps):
        prev = Ys[i].cpu()
        assert torch.isfinite(Ys[i + 1]).all(), f"step {i + 1} read X before the step before it wrote it (NaN)"
        assert rel_err(Ys[i + 1], D @ prev.double()) < TOL[dtype], f"step {i + 1}"


@gpu
@pytest.mark.parametrize("flags", (0, 1, 2, 4, 5, 6))
@pytest.mark.parametrize("kern", ("x12a", "xva", "x12b"))
def test_csr16_pdl_back_to_back_chain(kern, flags):
    # y_{i+1} = A y_i, launched back to back through the plan's recorded launch (programmatic dependent
    # launch on sm_90: each launch may start before the one before it has finished; flags 1 lets it start
    # at once). Every output buffer starts as NaN: a kernel that read X before its griddepcontrol.wait
    # (or a wait that did not cover the copy) would gather NaN. Then the same chain captured in a CUDA graph.
    dtype, n, steps = torch.float16, 2048, 8
    D, plan = _chain_plan(n, dtype, kern, flags)
    x0 = _xt(1, n, dtype, 12).T.contiguous().cuda()
    assert rel_err(plan.apply(x0), _ref(D, x0.T.cpu())) < TOL[dtype]  # the recording (a plain launch)
    prep = plan._prepared[("mma", 1, 0, 0)]
    from sparsetorch_cuda.launch import arch_of

    assert prep.pdl == (int(arch_of(torch.cuda.current_device())[3:]) >= 90)
    Ys = torch.full((steps + 1, n), float("nan"), dtype=dtype, device="cuda")
    Ys[0].copy_(x0[:, 0])  # a torch kernel just before the first PDL launch: it must see its write
    for i in range(steps):
        prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
    _check_chain(D, Ys, dtype, steps)
    Ys[1:].fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(steps):
            prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
    torch.cuda.synchronize()
    for seed in (13, 14):
        Ys[1:].fill_(float("nan"))
        Ys[0].copy_(_xt(1, n, dtype, seed)[0].cuda())
        g.replay()
        _check_chain(D, Ys, dtype, steps)


@gpu
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("kern", ("auto", "x12a", "x12b"))
def test_csr16_pdl_plan_chain_with_bias(kern, dtype):
    # the same chain through plan.apply (a recording call first, then the PDL replays), the bias fused and
    # written in place between calls, then captured in a graph with a torch op between two launches
    D, plan = _chain_plan(4096, dtype, kern, 5, seed=21)
    b = (_bias(4096, dtype, 22) / 16).cuda()
    b0 = b.cpu()
    x = _xt(1, 4096, dtype, 23).T.contiguous().cuda()
    y1 = plan.apply(x, bias=b)  # the recording (a plain launch)
    y2 = plan.apply(y1, bias=b)  # a PDL replay right behind it
    b.mul_(-1)  # a torch kernel writing the bias, then a PDL launch reading it
    y3 = plan.apply(y2, bias=b)
    y4 = plan.apply(y3)  # no bias: a second recording, then its replay
    y5 = plan.apply(y4)
    torch.cuda.synchronize()
    assert rel_err(y1, _ref(D, x.T.cpu(), b0)) < TOL[dtype]
    assert rel_err(y2, _ref(D, y1.T.cpu(), b0)) < TOL[dtype]
    assert rel_err(y3, _ref(D, y2.T.cpu(), -b0)) < TOL[dtype]
    assert rel_err(y4, _ref(D, y3.T.cpu())) < TOL[dtype]
    assert rel_err(y5, _ref(D, y4.T.cpu())) < TOL[dtype]
    x = _xt(1, 4096, dtype, 24).T.contiguous().cuda()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y1 = plan.apply(x, bias=b)
        y2 = plan.apply(y1)
        y1h = y1 * 0.5  # a torch kernel between
        y3 = plan.apply(y1h, bias=b)
    for seed in (25, 26):
        x.copy_(_xt(1, 4096, dtype, seed).T.contiguous().cuda())
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(y1, _ref(D, x.T.cpu(), b.cpu())) < TOL[dtype]
        assert rel_err(y2, _ref(D, y1.T.cpu())) < TOL[dtype]
        assert rel_err(y3, _ref(D, y1h.T.cpu(), b.cpu())) < TOL[dtype]


@gpu
def test_csr16_pdl_off():
    # plan.csr16_pdl = False: the recorded launch is a plain one even where another plan opted the kernel in
    dtype = torch.float16
    D, plan = _chain_plan(1024, dtype, "x12a", 0)
    D2, other = _chain_plan(1024, dtype, "x12a", 0, seed=12)
    x = _xt(1, 1024, dtype, 3).T.contiguous().cuda()
    other.apply(x)
    plan.csr16_pdl = False
    for _ in range(2):
        assert rel_err(plan.apply(x), _ref(D, x.T.cpu())) < TOL[dtype]
    assert not plan._prepared[("mma", 1, 0, 0)].pdl


def test_rot_assign_is_a_per_pair_rotation():
    # csr16_x12b's order (no GPU needed): emulating the kernel's gathers with the rotated columns and
    # values rotated as xv_rotate does gives A x; pairs shared by two rows keep rotation 0; the choice
    # does not add bank conflicts
    from sparsetorch_cuda._mma import rot_assign

    for m, n, dens in ((200, 1024, 0.1), (40, 300, 0.6), (30, 64, 0.05), (5, 4096, 0.3)):
        D = random_dense(m, n, dens, torch.float64, seed=m, empty_rows=2, long_rows=1)
        mask = D != 0
        rp = torch.zeros(m + 1, dtype=torch.int64)
        rp[1:] = torch.cumsum(mask.sum(1), 0)
        col = mask.nonzero()[:, 1]
        vals = D[mask]
        cols, rot, st = rot_assign(rp.to(torch.int32), col.to(torch.int32))
        nnz, P = col.numel(), cols.shape[0]
        assert P == -(-nnz // 16) + 1 and rot.dtype == torch.uint8 and int(rot.max()) < 16
        assert st["conflict_steps_per_row"] <= st["conflict_steps_per_row_no_rotation"]
        vpad = torch.zeros(P * 16, dtype=torch.float64)
        vpad[:nnz] = vals
        x = torch.randn(n, dtype=torch.float64)
        y = torch.zeros(m, dtype=torch.float64)
        r64 = rot.to(torch.int64)
        for r in range(m):
            s, e = int(rp[r]), int(rp[r + 1])
            for p in range(s >> 4, (e + 15) >> 4):
                whole = 16 * p >= s and 16 * p + 16 <= e
                assert whole or int(r64[p]) == 0
                t = torch.arange(16)
                j = 16 * p + ((t + int(r64[p])) & 15)
                keep = torch.ones(16, dtype=torch.bool) if whole else (16 * p + t >= s) & (16 * p + t < e)
                y[r] += (vpad[j] * x[cols[p]] * keep).sum()
        assert torch.allclose(y, D @ x, atol=1e-10)
