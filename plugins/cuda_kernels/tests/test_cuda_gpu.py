"""The cuda backend's kernels on a GPU, against dense float64 references.

Every format with a kernel of its own (CSR vector and load balanced, DIA, ELL, DELTA(b)) and the
generic path (COO, BSR through a CSR made from the pattern), in float16, bfloat16, float32 and
float64 with int32 and int64 indices, for one and several right-hand sides; the adjoint product;
the SDDMM of the backward; value batches; dispatch and autograd through ``st.matmul``; CUDA-graph
capture; and the on-disk module cache reused by a second process. Skips without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import BSR, COO, CSR, DELTA, DIA, ELL, NM

from sparsetorch_cuda.layout import NM_VARIANTS

from _cuda_helpers import TOL, banded_dense, gpu, nm_dense, random_dense, rel_err, to_format, make_plan as _plan, random_x as _x

pytestmark = gpu

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX = (torch.int32, torch.int64)
FORMATS = {"CSR": CSR, "DIA": DIA, "ELL": ELL, "DELTA(4)": DELTA(4), "DELTA(2)": DELTA(2), "DELTA(8)": DELTA(8),
           "DELTA(16)": DELTA(16), "COO": COO, "BSR(2,2)": BSR(2, 2), "BSR(3,2)": BSR(3, 2), "NM(2,4)": NM(2, 4),
           "NM(1,4)": NM(1, 4)}


@pytest.fixture(autouse=True)
def _poisoned_allocator():
    """Fill the caching allocator's free blocks with NaN before each test: an output element a
    kernel fails to write then shows up as NaN (rel_err is inf) instead of a lucky zero."""
    free, _ = torch.cuda.mem_get_info()
    junk = torch.full((min(free // 8, 64 << 20) // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del junk
    yield


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("index_dtype", INDEX, ids=["i32", "i64"])
@pytest.mark.parametrize("fmt", list(FORMATS), ids=list(FORMATS))
def test_spmm_matches_dense(fmt, dtype, index_dtype):
    if fmt == "DIA":
        D = banded_dense(301, 245, (-17, -1, 0, 1, 3, 60), dtype, seed=4)
    elif fmt.startswith("NM"):
        nn, mm = FORMATS[fmt].levels[2].type.parameter, FORMATS[fmt].levels[1].expr.c
        D = nm_dense(301, 245, nn, mm, dtype, seed=len(fmt))
    else:
        D = random_dense(301, 245, 0.05, dtype, seed=len(fmt), empty_rows=7)
    A = to_format(D, FORMATS[fmt], dtype, index_dtype)
    plan = _plan(A)
    assert plan.kind == {"COO": "generic"}.get(fmt, fmt.split("(")[0].lower())
    for k, seed in ((1, 1), (3, 2), (40, 3)):
        X = _x(245, k, dtype, seed)
        Y = plan.apply(X.cuda())
        assert Y.shape == (301, k) and Y.dtype == dtype
        err = rel_err(Y, D @ X.double())
        assert err < TOL[dtype], (fmt, dtype, index_dtype, k, err)
        Xa = _x(301, k, dtype, seed + 10)
        assert plan._dense_route(k) == (k == 40)  # k = 40: A^T X by the dense route (plan.DENSE_ROUTE)
        err_a = rel_err(plan.apply(Xa.cuda(), adjoint=True), D.T @ Xa.double())
        assert err_a < TOL[dtype], ("adjoint", fmt, dtype, k, err_a)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_balanced_csr_on_skewed_rows(dtype):
    # a few dense rows among short ones: the vector kernel's worst case
    D = random_dense(2000, 3000, 0.002, dtype, seed=5, long_rows=3, empty_rows=11)
    A = to_format(D, CSR, dtype, torch.int32)
    for variant in ("vector", "balanced"):
        plan = _plan(A, variant)
        assert plan.variant == variant
        for k in (1, 2):
            X = _x(3000, k, dtype, 7 + k)
            err = rel_err(plan.apply(X.cuda()), D @ X.double())
            assert err < TOL[dtype], (variant, k, err)
    from sparsetorch_cuda.cost import csr_variant

    assert _plan(A).variant == csr_variant(2000, int(A.nse), 3000) == "vector"  # 3000 < SKEW_MIN_ROW
    assert csr_variant(1000, 10_000, 50_000) == "balanced"


@pytest.mark.parametrize("variant", ("lanes", "groups", "packed", "packed2"))
@pytest.mark.parametrize("bits", (1, 2, 4, 8, 16))
def test_delta_long_rows_and_packing(bits, variant):
    # rows of thousands of entries (many 32-lane iterations, carries between them) and gaps
    # that overflow b bits (the format inserts explicit zeros)
    D = random_dense(64, 9000, 0.3, torch.float16, seed=bits)
    A = to_format(D, DELTA(bits), torch.float16, torch.int32)
    plan = _plan(A, variant)
    assert plan.kind == "delta" and plan.bits == bits and plan.variant == variant
    nse = int(A.nse)
    assert plan.words.numel() == -(-(-(-nse // 8) * 8 * bits) // 32) + 4  # b bits per gap, whole groups, 4 spare words
    for k in (1, 3):  # X of 18 KB (in shared memory) and 54 KB (read from global memory)
        X = _x(9000, k, torch.float16, 3 + k)
        assert rel_err(plan.apply(X.cuda()), D @ X.double()) < TOL[torch.float16], k


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("variant", ("stream", "streamcs", "stream4", "stream16", "vector", "balanced", "sell", "sell-sorted"))
@pytest.mark.parametrize("shape", ((1000, 700, 0.006), (77, 5000, 0.02), (300, 300, 0.9)), ids=("short", "medium", "long"))
def test_csr_variants(shape, variant, dtype, monkeypatch):
    # every CSR kernel on short, medium (100 per row) and long (270 per row, several chunks of
    # the stream kernel) rows, int32 and int64 indices; SELL-C-sigma without and with sorting
    import sparsetorch_cuda.plan as plan_mod

    if variant == "sell-sorted":
        monkeypatch.setattr(plan_mod, "SELL_SIGMA", 64)
        variant = "sell"
    m, n, dens = shape
    D = random_dense(m, n, dens, dtype, seed=m, empty_rows=5)
    for idx in (torch.int32, torch.int64):
        A = to_format(D, CSR, dtype, idx)
        plan = _plan(A, variant)
        for k in (1, 3):
            X = _x(n, k, dtype, k)
            err = rel_err(plan.apply(X.cuda()), D @ X.double())
            assert err < TOL[dtype], (variant, idx, k, err)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("variant", ("p1", "p1cs", "p1pf", "p1na", "p2", "p4", "rows1", "rows2", "classic"))
def test_dia_variants(variant, dtype):
    # 11 diagonals (a batch of 8 and a partial one; the "p" variants fall back to shared memory)
    # and 5 or 7 (offsets as kernel parameters), off-matrix slots, m > n and m < n
    cases = [((-40, -17, -3, -1, 0, 1, 2, 5, 9, 33, 120), m, n) for m, n in ((700, 530), (530, 700), (1, 300))]
    cases += [((-3, 0, 1, 7, 40), m, n) for m, n in ((1500, 1400), (1400, 1500), (3, 2), (1504, 1400), (1504, 1507))]
    cases += [((-64, -8, -1, 0, 1, 8, 64), 1504, 1504)]
    for offs, m, n in cases:
        D = banded_dense(m, n, offs, dtype, seed=m)
        A = to_format(D, DIA, dtype, torch.int64)
        plan = _plan(A, variant)
        assert plan.variant == variant
        for k in (1, 2):
            X = _x(n, k, dtype, k)
            err = rel_err(plan.apply(X.cuda()), D @ X.double())
            assert err < TOL[dtype], (variant, m, n, k, err)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("variant", NM_VARIANTS)
@pytest.mark.parametrize("shape", ((130, 256), (64, 8192), (5, 48), (33, 100), (7, 16), (3, 1040)))
def test_nm24_kernels(shape, variant, dtype):
    # n % 16 == 0 takes the vectorized 2:4 kernel (k = 1; rows shared by 1..4 warps, rows that
    # fill no whole block), others the general one; both against dense
    m, n = shape
    D = nm_dense(m, n, 2, 4, dtype, seed=n)
    A = to_format(D, NM(2, 4), dtype, torch.int32)
    plan = _plan(A, variant)
    assert plan.kind == "nm" and plan.pos_bits == 2 and plan.variant == variant
    assert plan.words.numel() == -(-int(A.values.shape[-1]) // 16) + 4  # 2 bits per slot
    for k in (1, 2):
        X = _x(n, k, dtype, k)
        err = rel_err(plan.apply(X.cuda()), D @ X.double())
        assert err < TOL[dtype], (shape, k, err)
    X = _x(n + 1, 1, dtype, 9).cuda()[1:]  # a misaligned X (storage offset 1) takes the general kernel
    assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]


@pytest.mark.parametrize("k", [5, 40], ids=["k5", "k40"])  # k = 40: the dense route (plan.DENSE_ROUTE_MIN_K)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("fmt", ["CSR", "DIA", "ELL", "DELTA(4)", "COO", "NM(2,4)", "BSR(2,2)"])
def test_sddmm_matches_dense(fmt, dtype, k):
    from sparsetorch_cuda.plan import DENSE_ROUTE_MIN_K

    m, n = 150, 120
    if fmt == "DIA":
        D = banded_dense(m, n, (-5, 0, 2, 30), dtype, seed=11)
    elif fmt == "NM(2,4)":
        D = nm_dense(m, n, 2, 4, dtype, seed=11)
    else:
        D = random_dense(m, n, 0.08, dtype, seed=11, empty_rows=3)
    A = to_format(D, FORMATS[fmt], dtype, torch.int64)
    plan = _plan(A)
    assert plan._dense_route(k) == (k >= DENSE_ROUTE_MIN_K)
    P, Q = _x(m, k, dtype, 1), _x(n, k, dtype, 2)
    out = plan.sddmm(P.cuda(), Q.cuda())
    assert out.shape == A.values.shape
    # a batch of two (P, Q) pairs: each member's own products
    P2, Q2 = torch.stack([P, -2 * P]), torch.stack([Q, Q])
    out2 = plan.sddmm(P2.cuda(), Q2.cuda())
    assert out2.shape == (2, *A.values.shape) and torch.equal(out2[0], out)
    assert rel_err(out2[1], -2 * out.double().cpu()) < TOL[dtype] * 2
    # reference: (P Q^T)[i, j] at every stored slot; padding slots (off the matrix) zero
    G = P.double() @ Q.double().T
    coords, slot = A.entries()
    ref = torch.zeros(A.values.shape[-1], dtype=torch.float64)
    ref[slot.cpu()] = G[coords[0].cpu(), coords[1].cpu()]
    assert rel_err(out, ref) < TOL[dtype] * 2, (fmt, dtype)


@pytest.mark.parametrize("fmt", ["CSR", "DIA", "ELL", "DELTA(4)", "COO", "NM(2,4)", "BSR(2,2)"])
def test_repeated_calls_replay_the_recorded_launch(fmt):
    """The common call (X (n, k) contiguous, no adjoint) records its one launch on the first run
    and replays it with the next X and Y pointers: fresh X every call, a misaligned X (its own
    recording), new values (recorded again), other k, a CUDA graph of replays; all against dense."""
    dtype = torch.float16 if fmt.startswith("NM") else torch.float32
    m, n = 304, 256
    if fmt == "DIA":
        D = banded_dense(m, n, (-9, -1, 0, 1, 8), dtype, seed=21)
    elif fmt == "NM(2,4)":
        D = nm_dense(m, n, 2, 4, dtype, seed=21)
    else:
        D = random_dense(m, n, 0.06, dtype, seed=21, empty_rows=4)
    A = to_format(D, FORMATS[fmt], dtype, torch.int32)
    plan = _plan(A)
    for i in range(4):
        X = _x(n, 1, dtype, 30 + i).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (fmt, i)
    assert plan._prepared.get((1, 0)) is not None, plan._prepared  # one launch, recorded
    for i in range(3):
        Xo = _x(n + 1, 1, dtype, 40 + i).cuda()[1:]  # storage offset: X's address is not 16-byte aligned
        assert rel_err(plan.apply(Xo), D @ Xo.double().cpu()) < TOL[dtype], (fmt, "offset", i)
    for k in (3, 3, 17, 17):
        X = _x(n, k, dtype, k).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (fmt, k)
    plan.set_values(A.values * -2)
    assert not plan._prepared
    for i in range(2):
        X = _x(n, 1, dtype, 50 + i).cuda()
        assert rel_err(plan.apply(X), (-2 * D) @ X.double().cpu()) < 2 * TOL[dtype], (fmt, "new values", i)
    x = _x(n, 1, dtype, 60).cuda()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.apply(x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y = plan.apply(x)
    x.copy_(_x(n, 1, dtype, 61).cuda())
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y, (-2 * D) @ _x(n, 1, dtype, 61).double()) < 2 * TOL[dtype], (fmt, "graph")


def test_value_batch_and_new_values():
    D = random_dense(90, 70, 0.1, torch.float32, seed=3)
    A = to_format(D, CSR, torch.float32, torch.int32)
    Ab = A.with_values(torch.stack([A.values, 2 * A.values + 1]))
    plan = _plan(Ab)
    X = _x(70, 2, torch.float32, 4)
    Xb = torch.stack([X, 3 * X]).cuda()
    Db = Ab.to_dense().double().cpu()
    assert rel_err(plan.apply(Xb), Db @ torch.stack([X, 3 * X]).double()) < TOL[torch.float32]
    plan.set_values(A.values * -1.5)  # new values on the same pattern
    assert rel_err(plan.apply(X.cuda()), (-1.5 * D) @ X.double()) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_dispatch_and_gradients_through_st_matmul(cuda_backend, dtype):
    D = random_dense(60, 50, 0.15, dtype, seed=9)
    A = to_format(D, CSR, dtype, torch.int32)
    x = _x(50, 2, dtype, 1).cuda()
    table = st.explain("matmul", A, x, backend="cuda")
    assert table.chosen is not None and table.chosen.backend == "cuda"
    y = st.matmul(A, x, backend="cuda")
    assert rel_err(y, D @ x.double().cpu()) < TOL[dtype]
    if dtype in (torch.float32, torch.float64):
        v = A.values.detach().clone().requires_grad_()
        xg = x.detach().clone().requires_grad_()
        st.matmul(A.with_values(v), xg, backend="cuda").pow(2).sum().backward()
        Dd = A.to_dense().detach().double().requires_grad_()
        xd = x.detach().double().requires_grad_()
        (Dd @ xd).pow(2).sum().backward()
        coords, slot = A.entries()
        ref_v = torch.zeros(A.values.shape[-1], dtype=torch.float64, device="cuda")
        ref_v[slot] = Dd.grad[coords[0], coords[1]]
        assert rel_err(v.grad, ref_v) < 1e3 * TOL[dtype]
        assert rel_err(xg.grad, xd.grad) < 1e3 * TOL[dtype]
        # the plan's SDDMM gives the same value gradient as the backward pass
        plan = _plan(A)
        dY = 2 * (D.cuda() @ x.double()).to(dtype)
        assert rel_err(plan.sddmm(dY, x), v.grad) < 1e3 * TOL[dtype]


def test_gradcheck_float64(cuda_backend):
    D = random_dense(12, 9, 0.4, torch.float64, seed=2)
    A = to_format(D, DELTA(4), torch.float64, torch.int64)
    v = A.values.detach().clone().requires_grad_()
    X = _x(9, 2, torch.float64, 3).cuda().requires_grad_()
    assert torch.autograd.gradcheck(lambda values, x: st.matmul(A.with_values(values), x, backend="cuda", cache=False), (v, X))


def test_cuda_graph_capture():
    D = random_dense(500, 500, 0.02, torch.float32, seed=4)
    A = to_format(D, CSR, torch.float32, torch.int32)
    plan = _plan(A)
    x = _x(500, 1, torch.float32, 5).cuda()
    plan.apply(x)  # loads the module outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.apply(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = plan.apply(x)
    x.copy_(_x(500, 1, torch.float32, 6).cuda())
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y, D @ _x(500, 1, torch.float32, 6).double()) < TOL[torch.float32]


def test_launch_on_a_side_stream_orders_with_torch():
    D = random_dense(4000, 4000, 0.01, torch.float64, seed=8)
    A = to_format(D, CSR, torch.float64, torch.int32)
    plan = _plan(A)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(4000, 1, dtype=torch.float64, device="cuda") * 2  # written on s
        y = plan.apply(x)  # must run after the fill, on s
        z = y * 1.0
    s.synchronize()
    assert rel_err(z, D @ torch.full((4000, 1), 2.0, dtype=torch.float64)) < 1e-12


def test_invalid_patterns_are_refused_before_launch():
    from sparsetorch_cuda.plan import CudaSpmmPlan

    D = random_dense(10, 10, 0.3, torch.float32, seed=1)
    A = to_format(D, CSR, torch.float32, torch.int32)
    bad_col = A.crd(1).clone()
    bad_col[0] = 10
    B = st.SparseTensor(CSR, (10, 10), [None, A.pos(1)], [None, bad_col], A.values, check=False)
    with pytest.raises(st.InputError, match=r"column indices must lie in \[0, 10\)"):
        CudaSpmmPlan(B)
    # row pointers: the core's constructor already refuses most broken ones, so the plan's own
    # check is exercised directly
    from sparsetorch_cuda.plan import _check_rowptr

    ptr = A.pos(1)
    _check_rowptr(ptr, 10, int(A.nse), "ok")  # the valid one passes
    dec = ptr.clone()
    dec[3] = int(dec[4]) + 1  # row 3 now ends before it starts
    for bad, words in ((dec, "decrease"), (ptr[:-1], "m \\+ 1"), (ptr + 1, "from 0 to nnz")):
        with pytest.raises(st.InputError, match=words):
            _check_rowptr(bad, 10, int(A.nse), "plan")


def test_second_process_compiles_nothing(tmp_path):
    """The on-disk cache: a fresh process with the same cache directory loads every module it
    needs from disk (NVRTC is not called)."""
    code = textwrap.dedent("""
        import json, torch, sparsetorch as st
        from sparsetorch.format import CSR, DELTA
        from sparsetorch_cuda import compile as c
        from sparsetorch_cuda.plan import CudaSpmmPlan
        D = torch.eye(64, dtype=torch.float16) * 3
        for fmt in (CSR, DELTA(4)):
            A = st.SparseTensor.from_dense(D).convert(fmt).cuda()
            p = CudaSpmmPlan(A); p.set_values(A.values)
            y = p.apply(torch.ones(64, 1, dtype=torch.float16, device="cuda"))
            assert float(y.float().sum()) == 192.0
        print(json.dumps(c.STATS))
    """)
    env = dict(os.environ, SPARSETORCH_CUDA_CACHE=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    import json

    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first["compiled"] >= 1 and second["compiled"] == 0 and second["disk"] >= 1, (first, second)
    assert any(p.suffix == ".cubin" for p in tmp_path.iterdir())


# Matmul.execute's direct path (plan.bind: one recorded launch per call, no autograd Function) ----
@pytest.mark.parametrize("fmt", ["CSR", "DIA", "ELL", "DELTA(4)", "COO", "BSR(2,2)"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("k", (None, 1, 5), ids=["vector", "k1", "k5"])
def test_matmul_execute_direct_path(fmt, dtype, k):
    """Formats read where they lie take the bound launch (COO too: stored in row-major order, its
    values are the CSR's values, no gather); results equal dense on repeated calls, after in-place
    writes to b and to A's values (seen: the kernel reads them where they lie), after
    reset_operands_unchecked(b=) with a fresh b, and inside a CUDA graph."""
    m, n = 200, 170
    if fmt == "DIA":
        D = banded_dense(m, n, (-7, -1, 0, 1, 5), dtype, seed=31)
    else:
        D = random_dense(m, n, 0.07, dtype, seed=31, empty_rows=3)
    A = to_format(D, FORMATS[fmt], dtype, torch.int32)
    b = (_x(n, 1, dtype, 70)[:, 0] if k is None else _x(n, k, dtype, 70)).cuda()
    mm = st.Matmul(A, b, backend="cuda")
    mm.plan()
    y0 = mm.execute()
    bound = mm._direct is not None
    assert bound, (fmt, mm._direct)
    ref = lambda bb, DD=D: DD.double() @ bb.double().cpu()  # noqa: E731
    tol = TOL[dtype]
    assert y0.shape == ((m,) if k is None else (m, k)) and y0.dtype == dtype
    assert rel_err(y0, ref(b)) < tol
    y1 = mm.execute()
    assert y1.data_ptr() != y0.data_ptr() and torch.equal(y0, y1)  # a new output per call
    b.mul_(-3)  # in place: the same address
    assert rel_err(mm.execute(), ref(b)) < tol
    with torch.no_grad():
        A.values.mul_(0.5)  # A's values in place: read where they lie (or re-gathered: COO)
    assert rel_err(mm.execute(), ref(b, 0.5 * D)) < tol
    b2 = (_x(n, 1, dtype, 71)[:, 0] if k is None else _x(n, k, dtype, 71)).cuda()
    mm.reset_operands_unchecked(b=b2)
    assert rel_err(mm.execute(), ref(b2, 0.5 * D)) < tol
    assert (mm._direct is not None) == bound  # a b of the same layout keeps the bound launch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mm.execute()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = mm.execute()
    b2.copy_(b)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(yg, ref(b, 0.5 * D)) < tol


def test_matmul_execute_direct_path_declines():
    """The bound launch is skipped (the Function path runs, with its autograd) when a gradient
    is recorded, for a misaligned or non-contiguous b, and re-bound after A's index buffers are
    written in place (re-validated: an invalid write raises instead of being read)."""
    dtype = torch.float64
    D = random_dense(120, 90, 0.1, dtype, seed=41)
    D[0] = 0
    D[0, 3], D[0, 7] = 1.0, 2.0  # row 0: columns 3 and 7 (entry 1 of the CSR is column 7)
    A = to_format(D, CSR, dtype, torch.int32)
    b = _x(90, 1, dtype, 42)[:, 0].cuda()
    mm = st.Matmul(A, b, backend="cuda")
    y = mm.execute()
    assert mm._direct is not None
    assert rel_err(y, D @ b.double().cpu()) < TOL[dtype]
    # a gradient being recorded: the Function path
    v = A.values.detach().clone().requires_grad_(True)
    Ag = A.with_values(v)
    mg = st.Matmul(Ag, b, backend="cuda")
    yg = mg.execute()
    assert yg.requires_grad
    yg.sum().backward()
    assert v.grad is not None and rel_err(v.grad, v.grad) == 0
    with torch.no_grad():  # no gradient recorded: the bound launch
        yn = mg.execute()
    assert not yn.requires_grad and mg._direct is not None and torch.allclose(yn, yg.detach())
    # b laid out anew (misaligned view): declined per call, results still right
    bo = _x(91, 1, dtype, 43)[:, 0].cuda()[1:]
    mm.reset_operands_unchecked(b=bo)
    assert rel_err(mm.execute(), D @ bo.double().cpu()) < TOL[dtype]
    # c overwritten with beta = 0: the output is c itself
    c = torch.full((120,), float("nan"), dtype=dtype, device="cuda")
    mc = st.Matmul(A, b, c, beta=0, backend="cuda")
    out = mc.execute()
    assert out is c and mc._direct is not None and mc._direct.into_c
    assert rel_err(c, D @ b.double().cpu()) < TOL[dtype]
    # c accumulated (beta = 1): the general path
    c2 = torch.ones(120, dtype=dtype, device="cuda")
    m2 = st.Matmul(A, b, c2, backend="cuda")
    assert rel_err(m2.execute(), D @ b.double().cpu() + 1) < TOL[dtype] and m2._direct is None
    # A's columns written in place: re-validated and re-planned
    col = A.crd(1)
    assert col[:2].tolist() == [3, 7]
    with torch.no_grad():
        col[1] = 50  # still sorted and in range: a valid new pattern
    D2 = D.clone()
    D2[0, 7], D2[0, 50] = 0.0, 2.0
    assert rel_err(mm.execute(), D2 @ bo.double().cpu()) < TOL[dtype]
    with torch.no_grad():
        col[1] = 10_000  # out of range: raises, never read by a kernel
    with pytest.raises(st.ValidationError):
        mm.execute()


@pytest.mark.parametrize("fmt", ["CSR", "DIA"])
def test_matmul_execute_direct_path_ctypes_launch(fmt, monkeypatch):
    """The bound launch through ctypes (launch.BOUND_LAUNCH = "ctypes"): same results, on a side
    stream too (the arguments are remade for each stream) and inside a CUDA graph."""
    import sparsetorch_cuda.launch as launch_mod

    monkeypatch.setattr(launch_mod, "BOUND_LAUNCH", "ctypes")
    # a kernel opted in to programmatic dependent launch (the DIA defaults since session 11) is launched
    # through cuLaunchKernelEx whatever BOUND_LAUNCH says: PDL off here, so the ctypes launch is the one tested
    monkeypatch.setattr(launch_mod, "PDL", False)
    dtype = torch.float64
    m, n = 150, 150
    D = banded_dense(m, n, (-4, 0, 1, 9), dtype, seed=51) if fmt == "DIA" else random_dense(m, n, 0.08, dtype, seed=51)
    A = to_format(D, FORMATS[fmt], dtype, torch.int32)
    b = _x(n, 1, dtype, 52)[:, 0].cuda()
    mm = st.Matmul(A, b, backend="cuda")
    for _ in range(3):
        assert rel_err(mm.execute(), D @ b.double().cpu()) < TOL[dtype]
    assert mm._direct is not None and mm._direct.bound._ct is not None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ys = mm.execute()
        ys2 = mm.execute()
    torch.cuda.current_stream().wait_stream(s)
    assert rel_err(ys, D @ b.double().cpu()) < TOL[dtype] and torch.equal(ys, ys2)
    with torch.cuda.stream(s):
        mm.execute()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = mm.execute()
    b.mul_(2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(yg, D @ b.double().cpu()) < TOL[dtype]
