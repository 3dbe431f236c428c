"""The cuda backend without a GPU: its declaration, offers and declines (a Request is plain
data, so CUDA requests can be asked about anywhere), the cost model, and the cost model
against the committed H200 measurements."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import Decline, Offer, OperandInfo, Rates, Request
from sparsetorch.format import BSR, COO, CSR, DELTA, DIA, ELL, NM, batched

import sparsetorch_cuda.plugin as plugin
from sparsetorch_cuda import cost


def _request(m=1000, n=1000, nse=7000, *, dtype=torch.float16, device="cuda", fmt=CSR, k=1, batch=(), **options):
    A = OperandInfo("sparse", (*batch, m, n), dtype, torch.device(device), format=fmt, nse=nse, batch_shape=batch)
    X = OperandInfo("dense", (*batch, n, k), dtype, torch.device(device))
    return Request("matmul", (A, X), frozenset(), options)


def _only(answers):
    assert len(answers) == 1, answers
    return answers[0]


def test_backend_info_declares_half_types_and_matmul(cuda_backend):
    info = cuda_backend
    assert info.name == "cuda" and info.devices == ("cuda",)
    assert set(info.dtypes) == {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    assert dict(info.ops) == {"matmul": ("spmm",), "solve": ("cg", "bicgstab")}


def test_cpu_tensors_are_declined_in_explain(cuda_backend):
    A = st.SparseTensor.from_dense(torch.eye(5, dtype=torch.float32))
    table = st.explain("matmul", A, torch.ones(5))
    row = next(r for r in table.declines if r.backend == "cuda")
    assert "cuda" in row.reason.lower()
    assert table.chosen is not None and table.chosen.backend != "cuda"


def test_cpu_request_is_declined_by_the_hook():
    got = _only(plugin.sparsetorch_offers(_request(device="cpu")))
    assert isinstance(got, Decline) and ("CUDA" in got.reason or "cuda" in got.reason)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device decline")
def test_no_device_is_declined_with_the_reason():
    got = _only(plugin.sparsetorch_offers(_request(device="cpu")))
    assert "no CUDA device" in got.reason


@pytest.mark.parametrize(("kw", "words"), [
    ({"dtype": torch.complex64}, "complex64"),
    ({"fmt": batched(CSR), "batch": (2,)}, "BATCH levels"),
    ({"method": "cg"}, "only method 'spmm'"),
])
def test_declines_with_a_reason(monkeypatch, kw, words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a request for a GPU, asked on any machine
    got = _only(plugin.sparsetorch_offers(_request(**kw)))
    assert isinstance(got, Decline) and words in got.reason, got


def test_missing_bindings_decline_carries_the_install_command(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(plugin, "_bindings_missing", lambda: "cuda.bindings is not installed: pip install cuda-bindings nvidia-cuda-nvrtc")
    got = _only(plugin.sparsetorch_offers(_request()))
    assert isinstance(got, Decline) and "pip install cuda-bindings nvidia-cuda-nvrtc" in got.reason


def test_other_ops_are_not_answered():
    req = _request()
    assert plugin.sparsetorch_offers(Request("eigsh", req.operands, frozenset(), {})) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", [CSR, DIA, ELL, DELTA(4), COO, NM(2, 4), BSR(2, 2)])
def test_offers_on_cuda_with_a_cost_that_grows_with_size(monkeypatch, fmt, dtype):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    small = _only(plugin.sparsetorch_offers(_request(10_000, 10_000, 70_000, dtype=dtype, fmt=fmt)))
    large = _only(plugin.sparsetorch_offers(_request(1_000_000, 1_000_000, 7_000_000, dtype=dtype, fmt=fmt)))
    assert isinstance(small, Offer) and small.method == "spmm" and small.backend == "cuda"
    assert 0 < small.seconds < large.seconds and small.bytes < large.bytes
    if fmt == COO:
        assert large.setup > 0 and "made from the pattern" in large.notes  # the CSR is built once
    else:
        assert large.setup == 0


def test_traffic_counts_bits_for_delta_and_no_indices_for_dia():
    m = n = 8192
    nnz = m * n // 2
    csr = cost.traffic("csr", m=m, n=n, nnz=nnz, k=1, vs=2, isz=4)
    delta = cost.traffic("delta", m=m, n=n, nnz=nnz, k=1, vs=2, isz=4, bits=4)
    assert delta == pytest.approx(nnz * 2.5 + (m + 1) * 4 + (m + n) * 2)
    assert delta < 0.45 * csr + (m + n) * 2
    dia = cost.traffic("dia", m=m, n=n, nnz=7 * m, k=1, vs=8, isz=8, slots=7 * m)
    assert dia == 7 * m * 8 + (m + n) * 8
    assert cost.traffic("csr", m=m, n=n, nnz=nnz, k=4, vs=2, isz=4) == pytest.approx(4 * (nnz * 6 + (m + 1) * 4) + 4 * (m + n) * 2)
    # N:M 2:4: values + 2 bits per slot (n / 2 slots per row); BSR: one index per block
    nm = cost.traffic("nm", m=m, n=n, nnz=nnz, k=1, vs=2, isz=4, slots=nnz, bits=2)
    assert nm == pytest.approx(nnz * 2.25 + (m + n) * 2) and nm < 0.6 * (m * n * 2)
    bsr = cost.traffic("bsr", m=m, n=n, nnz=nnz, k=1, vs=8, isz=4, slots=nnz, block=16)
    assert bsr == pytest.approx(nnz * 8 + nnz / 16 * 4 + (m + 1) * 4 + (m + n) * 8)


def test_csr_variant_rule():
    assert cost.csr_variant(1000, 7000, 7) == "streamcs"  # short rows: 32 rows per warp
    assert cost.csr_variant(1000, 7000, 300) == "vector"  # one row too long for the stream kernel
    assert cost.csr_variant(1000, 40_000, 60) == "vector"  # mean 40
    assert cost.csr_variant(1000, 7000, 100_000) == "balanced"
    assert cost.csr_variant(10, 100_000, 10_000) == "vector"  # long rows everywhere: no skew


def test_cost_model_against_the_committed_h200_measurements():
    """Each measured row of cost_h200.json, predicted from its byte count, the measured copy
    bandwidth of that run and the fitted efficiencies, lands within 2x of its measured time;
    and the efficiencies are the medians of the rows (the fit is what the file says)."""
    data = cost.measurements()
    assert data, f"{cost.MEASUREMENTS.name} is missing or unreadable"
    rows = data["rows"]
    assert len(rows) >= 10
    assert "H200" in data["machine"]["gpu"]
    bw = data["copy_bandwidth_bytes_per_s"]
    for r in rows:
        pred = cost.predict(r["family"], r["bytes"], bw, host=0.0)
        assert 0.5 < pred / r["kernel_s"] < 2.0, (r, pred)
    import statistics

    for fam, eff in data["efficiency"].items():
        effs = [r["bytes"] / (r["kernel_s"] * bw) for r in rows if r["family"] == fam]
        assert effs and eff == pytest.approx(statistics.median(effs), rel=1e-6), fam
        # the copy bandwidth is a read + write figure; a kernel that mostly reads (ELL, X reused
        # through L2) can pass it a little, never by much
        assert 0.05 < eff <= 1.2
    assert 1e-6 < data["host_s"] < 1e-4
    # host time in launch units of the same run, priced at the machine's launch unit
    assert data["host_launches"] == pytest.approx(data["host_s"] / data["launch_unit_s"], rel=1e-6)
    assert 0.2 < data["host_launches"] < 10
    rates = Rates("cuda", **{k: data["rates"][k] for k in ("bandwidth", "flops", "launch", "measured")})
    assert cost.host_seconds(rates) == pytest.approx(data["host_launches"] * rates.launch)
    assert cost.bandwidth_scale(rates) == pytest.approx(bw / rates.bandwidth)


def _choice_request(c: dict) -> Request:
    fmt = {"CSR": CSR, "DIA": DIA}[c["format"].split()[0]]
    if fmt == CSR:
        fmt = fmt.replace(index_dtype=getattr(torch, c["index"]))
    dtype = getattr(torch, c["dtype"])
    A = OperandInfo("sparse", (c["m"], c["n"]), dtype, torch.device("cuda"), format=fmt, nse=c["nse"])
    X = OperandInfo("dense", (c["n"], c["k"]), dtype, torch.device("cuda"))
    return Request("matmul", (A, X), frozenset(), {})


def test_auto_choice_against_the_committed_h200_measurements():
    """Every matrix of the fitting run's ``choices`` (the 114^3 stencil, CSR int32 / int64 / DIA,
    float64 / float32): this model's estimate at that run's rates is the lowest of all backends'
    estimates of that run wherever Matmul.execute pinned to cuda measured fastest (back to back),
    is not the lowest where another backend measured more than 10 % faster, and lies within 2x
    of the measured time."""
    data = cost.measurements()
    choices = data["choices"]
    assert len(choices) >= 4
    rates = Rates("cuda", **{k: data["rates"][k] for k in ("bandwidth", "flops", "launch", "measured")})
    for c in choices:
        ours = cost.spmm_cost(rates, _choice_request(c))[0]
        others = {b: s for b, s in c["estimates"].items() if b != "cuda"}
        measured = c["measured_thr_s"]
        fastest = min(measured, key=measured.get)
        if fastest == "cuda":
            assert ours < min(others.values()), (c["case"], c["format"], ours, others, measured)
        elif measured[fastest] < 0.9 * measured["cuda"]:
            assert ours > min(others.values()), (c["case"], c["format"], ours, others, measured)
        assert 0.5 < ours / measured["cuda"] < 2.0, (c["case"], c["format"], ours, measured)


@pytest.mark.parametrize("sigma", [1, 4, 64])
def test_sell_layout_reproduces_the_product(sigma):
    """The SELL-C-sigma layout the plan builds (on the CPU here), read the way the kernel reads it
    (slot (r, t) of slice s at slice_ptr[s] + t * 32 + r, row perm[q]), gives A @ x."""
    from sparsetorch_cuda.plan import sell_layout

    g = torch.Generator().manual_seed(sigma)
    m, n = 101, 57
    D = (torch.rand(m, n, generator=g) < torch.rand(m, 1, generator=g) * 0.5) * torch.randn(m, n, generator=g, dtype=torch.float64)
    D[7] = 0  # an empty row
    A = st.SparseTensor.from_dense(D, mask=D != 0).convert(CSR, index_dtype=torch.int32)
    lay = sell_layout(A.pos(1), A.crd(1), sigma=sigma)
    assert (lay["perm"] is None) == (sigma == 1)
    vals = torch.cat([A.values, A.values.new_zeros(1)])[lay["src"]]
    x = torch.randn(n, generator=g, dtype=torch.float64)
    y = torch.full((m,), float("nan"), dtype=torch.float64)
    ptr = lay["slice_ptr"]
    for q in range(m):
        s, r = divmod(q, 32)
        w = int(ptr[s + 1] - ptr[s]) // 32
        slots = int(ptr[s]) + torch.arange(w) * 32 + r
        row = int(lay["perm"][q]) if lay["perm"] is not None else q
        y[row] = (vals[slots] * x[lay["col"][slots].long()]).sum()
    assert torch.allclose(y, D @ x)
    # padding: every slot is either a stored entry (each exactly once) or value 0 / column 0
    used = lay["src"] < int(A.nse)
    assert int(used.sum()) == int(A.nse) and torch.unique(lay["src"][used]).numel() == int(A.nse)
    assert bool((lay["col"][~used] == 0).all())
    if sigma > 1:  # sorted by length inside each window
        lengths = (A.pos(1)[1:] - A.pos(1)[:-1])[lay["perm"].long()]
        for w0 in range(0, m, sigma):
            seg = lengths[w0:w0 + sigma]
            assert bool((seg[:-1] >= seg[1:]).all())


def test_mma_cost_model_against_the_committed_h200_measurements():
    """The tensor-core SpMM's model: the committed coefficients are the least-squares fit of the
    committed rows (cuda_kernels_h200_s5.json, the plan's own cluster size), every row predicted
    within 1.5x, and the rule of when it applies follows the plan's."""
    data = cost.measurements()["mma"]
    rows = data["rows"]
    assert len(rows) >= 8 and {r["kind"] for r in rows} == {"csr", "nm"}
    fit = cost.fit_mma(rows)
    for name, value in data["coefficients"].items():
        assert fit[name] == pytest.approx(value, rel=1e-6, abs=1e-18), name
    for r in rows:
        pred = cost.mma_seconds(r["kind"], r["m"], r["n"], r["nnz"], r["k"])
        assert 1 / 1.5 < pred / r["kernel_s"] < 1.5, (r, pred)
    h = torch.float16
    assert cost.mma_applies("csr", h, 4096, 4096, 1 << 20, 64) and cost.mma_applies("nm", torch.bfloat16, 4096, 4096, 1 << 23, 8, (2, 4))
    assert not cost.mma_applies("csr", h, 4096, 4096, 1 << 20, 4)          # fewer than 8 columns
    assert not cost.mma_applies("csr", torch.float32, 4096, 4096, 1 << 20, 64)
    assert not cost.mma_applies("csr", h, 4096, 4100, 1 << 20, 64)         # n % 8
    assert not cost.mma_applies("nm", h, 4096, 4096, 1 << 20, 64, (1, 4))
    assert "csr16" in cost.measurements()["efficiency"]


def test_half_precision_layer_offers_price_the_new_kernels(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    A = OperandInfo("sparse", (4096, 4096), torch.float16, torch.device("cuda"), format=CSR, nse=4096 * 410)
    for k in (1, 64):
        X = OperandInfo("dense", (4096, k), torch.float16, torch.device("cuda"))
        offer = _only(plugin.sparsetorch_offers(Request("matmul", (A, X), frozenset(), {})))
        if k == 64:  # the tensor-core model, not 64 passes of bytes
            assert offer.seconds == pytest.approx(cost.mma_seconds("csr", 4096, 4096, 4096 * 410, 64)
                                                  + cost.host_seconds(), rel=0.5)
        assert offer.seconds < 1e-4


class _StandInBound:
    """What ``CudaSpmmPlan.bind`` returns, on the CPU: ``bound(X, Y)`` writes ``A X`` into Y
    (from the values it was bound to, read at call time), or declines (False) a non-contiguous X."""

    def __init__(self, A, values):
        self.A, self.values, self.calls = A, values, 0

    def __call__(self, X, Y):
        if not X.is_contiguous():
            return False
        self.calls += 1
        Y.copy_((self.A.with_values(self.values).to_dense() @ X).reshape(Y.shape))
        return True


class _StandInPlan:
    """A product plan with ``bind`` around the torch backend's plan (how Matmul's direct path is
    exercised without a GPU)."""

    def __init__(self, inner, A):
        self.inner, self.A, self.bound = inner, A, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def bind(self, values, X):
        self.bound = _StandInBound(self.A, values)
        return self.bound


def _with_stand_in(mm):
    mm.plan()
    plan = _StandInPlan(mm._state.plan, mm.a)
    mm._state.plan = plan
    return plan


def test_matmul_direct_path_core_side():
    """Matmul.execute takes a plan's bound launch for the common call (no Function, output made
    per call, or c itself with beta = 0) and the Function path otherwise: a gradient recorded,
    alpha != 1, c accumulated; A's index buffers written in place re-plan (and re-bind)."""
    torch.manual_seed(0)
    D = torch.randn(30, 20, dtype=torch.float64) * (torch.rand(30, 20) < 0.3)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    b = torch.randn(20, dtype=torch.float64)
    mm = st.Matmul(A, b, backend="torch")
    plan = _with_stand_in(mm)
    y = mm.execute()
    assert plan.bound is not None and plan.bound.calls == 1 and mm._direct is not None
    assert y.shape == (30,) and torch.allclose(y, D @ b)
    y2 = mm.execute()
    assert plan.bound.calls == 2 and y2.data_ptr() != y.data_ptr()
    b.mul_(2)
    assert torch.allclose(mm.execute(), D @ b)
    b2 = torch.randn(20, dtype=torch.float64)
    mm.reset_operands_unchecked(b=b2)
    assert torch.allclose(mm.execute(), D @ b2) and plan.bound.calls == 4
    # a gradient recorded: the Function path (the bound launch is not called)
    v = A.values.clone().requires_grad_(True)
    mg = st.Matmul(A.with_values(v), b, backend="torch")
    pg = _with_stand_in(mg)
    yg = mg.execute()
    assert yg.requires_grad and (pg.bound is None or pg.bound.calls == 0)
    with torch.no_grad():
        assert not mg.execute().requires_grad and pg.bound.calls == 1
    # c with beta = 0: written in place and returned; beta = 1 or alpha != 1: no bind
    c = torch.full((30,), float("nan"), dtype=torch.float64)
    mc = st.Matmul(A, b, c, beta=0, backend="torch")
    pc = _with_stand_in(mc)
    assert mc.execute() is c and torch.allclose(c, D @ b) and pc.bound.calls == 1
    for kw in ({"alpha": 2.0}, {"c": torch.ones(30, dtype=torch.float64)}):
        mo = st.Matmul(A, b, backend="torch", **kw)
        po = _with_stand_in(mo)
        ref = 2 * D @ b if "alpha" in kw else D @ b + 1
        assert torch.allclose(mo.execute(), ref) and po.bound is None and mo._direct is None
    # c sharing memory with b: no bind
    bb = torch.randn(30, dtype=torch.float64)
    Dsq = torch.randn(30, 30, dtype=torch.float64) * (torch.rand(30, 30) < 0.3)
    As = st.SparseTensor.from_dense(Dsq).convert(CSR)
    ref = Dsq @ bb
    ms = st.Matmul(As, bb, bb, beta=0, backend="torch")
    ps = _with_stand_in(ms)
    assert torch.allclose(ms.execute(), ref) and ps.bound is None
    # A's index buffers written in place (still valid): plan again, then bind again
    col = A.crd(1)
    old = mm._state
    with torch.no_grad():
        col.add_(0)  # a write (the version counter moves), same numbers
    assert torch.allclose(mm.execute(), D @ b2)
    assert mm._state is not old  # planned again (the torch plan: no bind, the Function path)
    assert torch.allclose(mm.execute(), D @ b2)


def test_kernel_objects_are_one_per_signature(monkeypatch):
    """launch.kernel hands out one Kernel object per (source, name, types, device): per-kernel state
    lives on it (the shared-memory opt-in, keyed by the object's identity; PDL; the argument block).
    Session 10's last commit lost the cache (the decorator moved to resident_blocks), so a
    bfloat16 kernel could reuse the id of a freed float16 one of the same name and skip its
    shared-memory opt-in: its launches of more than 48 KB failed on the H200 (session 11)."""
    import sparsetorch_cuda.launch as launch

    made = []

    class Fake:
        def __init__(self, *a):
            made.append(a)

    monkeypatch.setattr(launch, "Kernel", Fake)
    monkeypatch.setattr(launch, "arch_of", lambda i: "sm_90")
    launch.kernel.cache_clear()
    try:
        a = launch.kernel("mma", "spmm_fl_s2", torch.float16, torch.int32, 0, 12)
        b = launch.kernel("mma", "spmm_fl_s2", torch.float16, torch.int32, 0, 12)
        c = launch.kernel("mma", "spmm_fl_s2", torch.bfloat16, torch.int32, 0, 12)
        assert a is b and c is not a and len(made) == 2
    finally:
        launch.kernel.cache_clear()


def test_modules_load_their_kernels_through_launch_kernel(monkeypatch):
    """krylov.py, _spmm_cc.py, _spmm_wd.py and _spmm_pb.py take their kernels from launch.kernel (compile.py's
    caches; one library per (source, value type, index type, arch)): the source, the types and the argument
    count each asks for. No GPU: the library loader and the architecture are stand-ins."""
    import sparsetorch_cuda.launch as launch
    from sparsetorch_cuda import _spmm_cc, _spmm_pb, _spmm_wd, krylov

    loaded = []

    class FakeDriver:
        def cuLibraryGetKernel(self, lib, name):
            return 0, 7

        def CUfunction(self, k):
            return ("fn", k)

    monkeypatch.setattr(launch, "_driver", lambda: FakeDriver())
    monkeypatch.setattr(launch, "_ok", lambda cu, err, what: None)
    monkeypatch.setattr(launch, "arch_of", lambda i: "sm_90")
    monkeypatch.setattr(launch, "_library", lambda *key: loaded.append(key) or "lib")
    launch.kernel.cache_clear()
    try:
        k = krylov._kernel("cg_init", torch.float64, torch.int64, 0)
        assert loaded[-1] == ("krylov", "float64", "int64", "sm_90") and k._nargs == krylov._NARGS["cg_init"]
        k = _spmm_cc._kernel(_spmm_cc.kernel_names()[0], torch.bfloat16, 0)
        assert loaded[-1] == ("spmm_cc", "bfloat16", "int32", "sm_90") and k._nargs == _spmm_cc._NARGS
        k = _spmm_wd._kernel(_spmm_wd.kernel_names()[0], torch.float16, 0)
        assert loaded[-1] == ("spmm_wd", "float16", "int32", "sm_90") and k._nargs == _spmm_wd._NARGS
        k = _spmm_pb._kernel(_spmm_pb.kernel_names()[0], torch.float16, 0, 5)
        assert loaded[-1] == ("spmm_pb", "float16", "int32", "sm_90") and k._nargs == 5
        assert krylov._kernel("cg_init", torch.float64, torch.int64, 0) is krylov._kernel("cg_init", torch.float64,
                                                                                          torch.int64, 0)
        assert len(loaded) == 4  # one Kernel per signature (launch.kernel's cache)
    finally:
        launch.kernel.cache_clear()


def test_kernels_of_generated_modules_bind_like_launch_kernel(monkeypatch):
    """codegen.py loads the libraries of generated sources itself and takes kernels from them through
    launch.Kernel._bind: the same fields as launch.Kernel (name, function, an argument block of 8-byte
    slots and its address array, a lock). A fake driver stands in for the GPU."""
    import numpy as np

    import sparsetorch_cuda.launch as launch
    from sparsetorch_cuda import codegen

    class FakeDriver:
        class CUresult(int):
            pass

        def cuLibraryGetKernel(self, lib, name):
            return 0, 1000 + len(name)

        def CUfunction(self, k):
            return ("fn", k)

    monkeypatch.setattr(launch, "_driver", lambda: FakeDriver())
    monkeypatch.setattr(launch, "_ok", lambda cu, err, what: None)
    for cls in (codegen._gen_kernel_class(),):
        k = cls("lib", "gen_rows_x", 5)
        assert k.name == "gen_rows_x" and k._fn == ("fn", 1010) and k._nargs == 5
        assert k._args.dtype == np.uint64 and k._args.shape == (5,)
        assert list(k._ptrs) == [k._args.ctypes.data + 8 * i for i in range(5)]
        assert k._addr == k._ptrs.ctypes.data and k.pdl is False
        k._lock.acquire()
        k._lock.release()


def test_prepare_records_a_product_and_its_fixup_only(monkeypatch):
    """plan._prepare (no GPU: fake kernels and driver): one recorded launch gives a Prepared; the tensor-core
    product followed by ``spmm_fixup`` gives a PreparedSeq that writes X and Y into both argument blocks and
    launches them in order; any other pair of launches, or a launch without X, is not recorded."""
    import sparsetorch_cuda.launch as launch
    from sparsetorch_cuda.plan import CudaSpmmPlan

    launched = []

    class FakeCu:
        def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, addr, extra):
            launched.append((fn, gx, bx))
            return (0,)

    class K:
        def __init__(self, name):
            self.name, self._fn, self._cu, self.pdl = name, "fn_" + name, FakeCu(), False

    monkeypatch.setattr(launch, "raw_stream", lambda dev: 7)
    monkeypatch.setattr(launch, "_stream", lambda raw: raw)
    plan = CudaSpmmPlan.__new__(CudaSpmmPlan)
    plan.dev_index = 0
    xp, yp, other = 0x7F0000001000, 0x7F0000002000, 0x7F0000003000
    prod = (K("spmm_ws_s2"), (32, 1), 512, (4096, 4096, 64, other, xp, 0, yp, 0), 0)
    fix = (K("spmm_fixup"), (64, 1), 256, (4096, 4096, other, other, other, xp, 0, yp), 0)
    one = plan._prepare([prod], xp, yp)
    assert type(one) is launch.Prepared
    seq = plan._prepare([prod, fix], xp, yp)
    assert type(seq) is launch.PreparedSeq and seq.pdl is False
    seq(0x5000, 0x6000)
    assert [c[0] for c in launched] == ["fn_spmm_ws_s2", "fn_spmm_fixup"]
    for part in seq._parts:
        assert int(part._args[part._xi]) == 0x5000 and int(part._args[part._yi]) == 0x6000
    assert plan._prepare([prod, (K("add_bias"), (1, 1), 256, (1, 2, xp, yp), 0)], xp, yp) is None
    assert plan._prepare([prod, prod, fix], xp, yp) is None
    assert plan._prepare([(K("spmm_fixup"), (1, 1), 256, (1, 2, other, yp), 0)], xp, yp) is None
