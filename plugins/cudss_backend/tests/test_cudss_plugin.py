"""The backend's declaration, offers, declines, cost model and library lookup: metadata only, so
these run on any machine (no GPU, no cuDSS). Where an answer depends on libcudss being found,
its presence is set."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import rates
from sparsetorch.backend import OperandInfo, Request
from sparsetorch.format import CSR
from sparsetorch.testing.problems import poisson2d

import sparsetorch_cudss.plugin as plugin
from sparsetorch_cudss import _lib, cost
from sparsetorch_cudss.plan import _settings


def _request(n: int = 10_000, *, dtype=torch.float64, device: str = "cuda", props=("spd", "symmetric"), fmt=CSR,
             nse: int | None = None, rhs: int | None = 1, requires_grad: bool = False, batch=(), **options) -> Request:
    A = OperandInfo("sparse", (*batch, n, n), dtype, torch.device(device), format=fmt,
                    nse=nse if nse is not None else 5 * n, batch_shape=tuple(batch), requires_grad=requires_grad)
    ops = (A,) if rhs is None else (A, OperandInfo("dense", (*batch, n, rhs), dtype, torch.device(device)))
    return Request("solve", ops, frozenset(props), options, requires_grad)


def _by_method(answers):
    offers, declines = {}, {}
    for a in answers:
        (offers if isinstance(a, st.Offer) else declines).setdefault(a.method, []).append(a)
    return offers, declines


@pytest.fixture
def with_cudss(monkeypatch):
    """Answer as if libcudss were found (the offers never load it) and the GPU had 80 GiB free."""
    monkeypatch.setattr(plugin, "_missing", lambda: None)
    monkeypatch.setattr(cost, "free_device_bytes", lambda device: 80 * 2**30)
    plugin._live.clear()


@pytest.fixture
def without_cudss(monkeypatch):
    monkeypatch.setattr(plugin, "_missing", lambda: "cuDSS library not found (looked in nowhere): pip install "
                                                    "'sparsetorch-cudss[cu13]' or 'sparsetorch-cudss[cu12]'")


# Declaration ----------------------------------------------------------------------------------------
def test_backend_info(cudss_backend) -> None:
    info = cudss_backend
    assert info.name == "cudss" and info.devices == ("cuda",)
    assert dict(info.ops) == {"solve": ("lu", "cholesky", "ldlt"), "solve_list": ("lu", "cholesky", "ldlt")}
    assert info.dtypes == (torch.float32, torch.float64, torch.complex64, torch.complex128)


def test_missing_library_is_reported_with_install_command(without_cudss) -> None:
    info = plugin.sparsetorch_backend_info()
    assert "cudss" in info.missing and "pip install" in info.missing["cudss"]
    (d,) = plugin.sparsetorch_offers(_request())
    assert isinstance(d, st.Decline) and d.method is None
    assert "cuDSS library not found" in d.reason and "sparsetorch-cudss[cu13]" in d.reason


# Declines --------------------------------------------------------------------------------------------
def test_cpu_operands_are_declined_with_the_reason(with_cudss) -> None:
    (d,) = plugin.sparsetorch_offers(_request(device="cpu"))
    assert isinstance(d, st.Decline)
    if torch.cuda.is_available():
        assert "CUDA tensors only" in d.reason and ".cuda()" in d.reason
    else:
        assert "no CUDA device" in d.reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unsupported_dtype(with_cudss, dtype) -> None:
    (d,) = plugin.sparsetorch_offers(_request(dtype=dtype))
    assert isinstance(d, st.Decline) and "float64" in d.reason and str(dtype).replace("torch.", "") in d.reason


def test_non_square_and_mixed_devices(with_cudss) -> None:
    A = OperandInfo("sparse", (10, 12), torch.float64, torch.device("cuda"), format=CSR, nse=30)
    (d,) = plugin.sparsetorch_offers(Request("solve", (A,), frozenset(), {}))
    assert isinstance(d, st.Decline) and "10x12" in d.reason
    A = OperandInfo("sparse", (10, 10), torch.float64, torch.device("cuda"), format=CSR, nse=30)
    b = OperandInfo("dense", (10, 1), torch.float64, torch.device("cpu"))
    (d,) = plugin.sparsetorch_offers(Request("solve", (A, b), frozenset(), {}))
    assert isinstance(d, st.Decline) and "different devices" in d.reason


def test_batch_levels_declined(with_cudss) -> None:
    fmt = st.TensorFormat.parse("(b, i, j) -> (b : batch, i : dense, j : compressed)")
    A = OperandInfo("sparse", (3, 10, 10), torch.float64, torch.device("cuda"), format=fmt, nse=30)
    (d,) = plugin.sparsetorch_offers(Request("solve", (A,), frozenset(), {}))
    assert isinstance(d, st.Decline) and "BATCH" in d.reason and "SparseTensorList" in d.reason


def test_iterative_methods_and_preconditioners_are_declined(with_cudss) -> None:
    answers = plugin.sparsetorch_offers(_request(method="cg"))
    assert all(isinstance(a, st.Decline) for a in answers)
    (d,) = [a for a in answers if a.method == "cg"]
    assert "direct solver" in d.reason
    assert {a.method for a in answers} == {"cg", "lu", "cholesky", "ldlt"}
    (d,) = plugin.sparsetorch_offers(_request(preconditioner="jacobi"))
    assert isinstance(d, st.Decline) and "preconditioner" in d.reason


def test_other_ops_are_not_answered(with_cudss) -> None:
    req = _request()
    assert plugin.sparsetorch_offers(Request("matmul", req.operands, frozenset(), {})) == []


# Offers and the cost model -----------------------------------------------------------------------------
def test_spd_gets_all_three_and_cholesky_is_cheapest(with_cudss) -> None:
    offers, declines = _by_method(plugin.sparsetorch_offers(_request()))
    assert set(offers) == {"lu", "cholesky", "ldlt"} and not declines
    assert offers["cholesky"][0].seconds < offers["ldlt"][0].seconds <= offers["lu"][0].seconds * 1.01
    assert offers["cholesky"][0].bytes < offers["lu"][0].bytes
    assert "analysis" in offers["lu"][0].notes and "refactorization" in offers["lu"][0].notes


def test_general_matrix_gets_lu_only_with_reasons(with_cudss) -> None:
    offers, declines = _by_method(plugin.sparsetorch_offers(_request(props=())))
    assert set(offers) == {"lu"}
    assert "positive definite" in declines["cholesky"][0].reason and "symmetric" in declines["ldlt"][0].reason


def test_pinned_cholesky_on_symmetric_is_offered(with_cudss) -> None:
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(props=("symmetric",), method="cholesky")))
    assert "cholesky" in offers
    _, declines = _by_method(plugin.sparsetorch_offers(_request(props=("symmetric",))))
    assert "cholesky" in declines  # not offered on a symmetric matrix unless asked for


def test_gradient_adds_one_solve(with_cudss) -> None:
    plain = _by_method(plugin.sparsetorch_offers(_request()))[0]["cholesky"][0].seconds
    grad = _by_method(plugin.sparsetorch_offers(_request(requires_grad=True)))[0]["cholesky"][0].seconds
    est = cost.estimate(rates("cuda"), _request(), "cholesky")
    assert grad == pytest.approx(plain + est.solve)


def test_first_call_pays_the_analysis_reuse_does_not(with_cudss) -> None:
    req = _request(n=1_000_000)
    first = _by_method(plugin.sparsetorch_offers(req))[0]["lu"][0]
    # priced with the threading layer where it ships beside the library (session 28's H100: the pip wheel's
    # libcudss_mtlayer_gomp made the offer 1.8 s against the single-threaded estimate's 6.2 s)
    est = cost.estimate(rates("cuda"), req, "lu", threaded=plugin._threaded())
    assert first.seconds == pytest.approx(est.first_call)
    plain = cost.estimate(rates("cuda"), req, "lu")
    assert plain.analysis == pytest.approx(6.1, rel=0.05)  # the measured anchor (H200, 1M 2-D, single-threaded)

    class Alive:
        pass

    keep = Alive()
    plugin._live[plugin._signature(req, "lu")] = keep
    again = _by_method(plugin.sparsetorch_offers(req))[0]["lu"][0]
    assert again.seconds == pytest.approx(est.reuse_call) and "plan alive" in again.notes
    del keep


def test_costs_grow_with_size_and_dimension(with_cudss) -> None:
    r = rates("cuda")
    small, big = (cost.estimate(r, _request(n=n), "cholesky") for n in (10_000, 1_000_000))
    assert big.factor > 10 * small.factor and big.fill > 50 * small.fill
    two_d = cost.estimate(r, _request(n=1_000_000, nse=5_000_000), "cholesky")
    three_d = cost.estimate(r, _request(n=1_000_000, nse=7_000_000), "cholesky")
    assert three_d.fill > 3 * two_d.fill and three_d.factor > 10 * two_d.factor
    batched = cost.estimate(r, _request(n=10_000, batch=(8,), rhs=1), "cholesky")
    assert batched.device_bytes > 7 * small.device_bytes


def test_factors_too_large_for_the_gpu_go_hybrid_or_decline(with_cudss, monkeypatch) -> None:
    monkeypatch.setattr(cost, "free_device_bytes", lambda device: 64 * 2**20)  # 64 MiB free
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(n=1_000_000)))
    assert "hybrid memory mode" in offers["cholesky"][0].notes and "exceed free GPU memory" in offers["cholesky"][0].notes
    offers, declines = _by_method(plugin.sparsetorch_offers(_request(n=1_000_000, backend_options={"hybrid_memory": False})))
    assert not offers and "hybrid_memory=False" in declines["cholesky"][0].reason
    assert "use an iterative method" in declines["lu"][0].reason


def test_cpu_dispatch_is_unchanged(cudss_backend) -> None:
    A = poisson2d(6)
    b = torch.ones(36, dtype=torch.float64)
    x, info = st.solve(A, b, return_info=True)
    assert info.backend != "cudss"
    torch.testing.assert_close(st.matmul(A, x), b)
    rows = [r for r in st.explain("solve", A, b).rows if r.backend == "cudss"]
    assert rows and all(r.offer is None and r.reason for r in rows)


# backend_options validation (plan.py runs on CPU for this) ------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"reordering": "metis"}, "reordering"), ({"pivot_type": "rook"}, "pivot_type"),
    ({"pivot_threshold": -1.0}, "pivot_threshold"), ({"ir_steps": 1.5}, "ir_steps"),
    ({"hybrid_memory": "yes"}, "hybrid_memory"),
])
def test_bad_backend_options(bad, match) -> None:
    with pytest.raises(st.InputError, match=match):
        _settings({"backend_options": bad}, "cudss")


def test_good_backend_options() -> None:
    s = _settings({"backend_options": {"reordering": "amd", "ir_steps": 2, "hybrid_memory": True}}, "cudss")
    assert s["reordering"] == "amd" and s["ir_steps"] == 2 and s["hybrid_memory"] is True


# Finding and loading the library ------------------------------------------------------------------------
@pytest.fixture
def fresh_lookup(monkeypatch):
    _lib.find_library.cache_clear()
    _lib.load.cache_clear()
    yield monkeypatch
    _lib.find_library.cache_clear()
    _lib.load.cache_clear()


def _fake_wheel(tmp_path, sub: str, soname: str):
    d = tmp_path / "nvidia" / sub / "lib"
    d.mkdir(parents=True)
    (d / soname).write_bytes(b"not a library")
    return d / soname


def test_finds_the_wheel_layouts(fresh_lookup, tmp_path) -> None:
    fresh_lookup.delenv(_lib.ENV, raising=False)
    lib = _fake_wheel(tmp_path, "cu13", "libcudss.so.1")
    fresh_lookup.setattr(sys, "path", [str(tmp_path)] + [p for p in sys.path if "site-packages" not in p])
    path, how = _lib.find_library()
    assert path == str(lib) and how == "wheel"


def test_finds_the_old_wheel_layout_and_soname(fresh_lookup, tmp_path) -> None:
    fresh_lookup.delenv(_lib.ENV, raising=False)
    lib = _fake_wheel(tmp_path, "cudss", "libcudss.so.0")
    fresh_lookup.setattr(sys, "path", [str(tmp_path)])
    assert _lib.find_library()[0] == str(lib)


def test_environment_variable_wins_and_is_checked(fresh_lookup, tmp_path) -> None:
    lib = _fake_wheel(tmp_path, "cu12", "libcudss.so.0")
    fresh_lookup.setenv(_lib.ENV, str(lib.parent))
    assert _lib.find_library() == (str(lib), _lib.ENV)
    _lib.find_library.cache_clear()
    fresh_lookup.setenv(_lib.ENV, str(tmp_path / "nothing.so"))
    path, how = _lib.find_library()
    assert path is None and "names no libcudss" in how


def test_not_found_names_where_it_looked(fresh_lookup, tmp_path) -> None:
    fresh_lookup.delenv(_lib.ENV, raising=False)
    fresh_lookup.setenv("LD_LIBRARY_PATH", str(tmp_path))
    fresh_lookup.setattr(sys, "path", [str(tmp_path)])
    fresh_lookup.setattr(os.path, "isdir", lambda p, _isdir=os.path.isdir: _isdir(p) and not p.startswith("/usr"))
    path, how = _lib.find_library()
    assert path is None and "looked in" in how
    with pytest.raises(_lib.LibraryNotFound, match=r"cuDSS library not found.*pip install"):
        _lib.load()


def test_a_broken_library_file_is_a_clear_error(fresh_lookup, tmp_path) -> None:
    lib = _fake_wheel(tmp_path, "cu13", "libcudss.so.1")
    fresh_lookup.setenv(_lib.ENV, str(lib))
    with pytest.raises(_lib.LibraryNotFound, match=r"could not be loaded"):
        _lib.load()


def test_status_codes_become_named_errors() -> None:
    e = _lib.CudssError("cudssExecute", 2)
    assert "CUDSS_STATUS_ALLOC_FAILED" in str(e) and "hybrid_memory" in str(e)
    assert "INVALID_VALUE" in str(_lib.CudssError("cudssConfigSet", 3))


def test_model_reproduces_the_h200_measurements() -> None:
    """The fitted model against the committed H200 run (cuDSS 0.8, Cholesky, float64 Poisson):
    analysis, refactorization + solve, factor entries and peak device memory within 35 %."""
    import json
    from pathlib import Path

    from sparsetorch.backend import Rates

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "cudss_h200_cudss08.json"
    if not path.exists():
        pytest.skip("benchmark results not in this checkout")
    h200 = Rates("cuda", bandwidth=4.0e12, flops=cost.REFERENCE_FLOPS, launch=8e-6)
    cases = json.loads(path.read_text())["cases"]
    assert set(cases) == {"2d-1000", "2d-2000", "3d-100"}
    for case, entry in cases.items():
        ours = entry["sparsetorch_cholesky"]
        req = _request(n=entry["n"], nse=entry["nse"])
        est = cost.estimate(h200, req, "cholesky")
        assert est.analysis == pytest.approx(ours["analysis_host_s"], rel=0.35), case
        assert est.reuse_call == pytest.approx(ours["repeat_s"], rel=0.35), case
        assert est.fill == pytest.approx(ours["factor_nnz"], rel=0.35), case
        peak = ours["memory_estimates"][1]  # cuDSS's own peak device memory estimate after the analysis
        assert est.device_bytes == pytest.approx(peak, rel=0.35), case


# Non-uniform batches (op "solve_list") ------------------------------------------------------------------
def _list_request(sizes, *, device="cuda", props=("spd", "symmetric"), requires_grad=False, **options) -> Request:
    n_max = max(s[0] for s in sizes)
    A = OperandInfo("sparse_list", (len(sizes), n_max, n_max), torch.float64, torch.device(device), None,
                    sum(s[1] for s in sizes), (), requires_grad)
    B = OperandInfo("dense", (len(sizes), n_max, 1), torch.float64, torch.device(device))
    return Request("solve_list", (A, B), frozenset(props), {**options, "list_sizes": tuple(sizes)}, requires_grad)


def test_list_offers_sum_the_members(with_cudss) -> None:
    sizes = [(10_000, 50_000, 1), (40_000, 200_000, 1), (2_500, 12_500, 2)]
    offers, declines = _by_method(plugin.sparsetorch_offers(_list_request(sizes)))
    assert set(offers) == {"lu", "cholesky", "ldlt"} and "batch API" in offers["cholesky"][0].notes
    r = rates("cuda")
    singles = [cost.estimate(r, plugin._member_request(_list_request(sizes), *s), "cholesky", threaded=plugin._threaded())
               for s in sizes]
    assert offers["cholesky"][0].seconds <= sum(e.first_call for e in singles)
    assert offers["cholesky"][0].seconds > max(e.first_call for e in singles)
    offers, declines = _by_method(plugin.sparsetorch_offers(_list_request(sizes, props=())))
    assert set(offers) == {"lu"} and "positive definite" in declines["cholesky"][0].reason


def test_list_declines(with_cudss, monkeypatch) -> None:
    (d,) = plugin.sparsetorch_offers(_list_request([(100, 500, 1)], device="cpu"))
    assert isinstance(d, st.Decline) and ("CUDA" in d.reason)
    monkeypatch.setattr(cost, "free_device_bytes", lambda device: 2**20)
    answers = plugin.sparsetorch_offers(_list_request([(1_000_000, 5_000_000, 1)] * 2))
    assert all(isinstance(a, st.Decline) for a in answers) and "one by one" in answers[0].reason


def test_list_on_cpu_is_solved_member_by_member(cudss_backend) -> None:
    """No backend takes a CPU list whole: the per-member path, same answers as single solves."""
    As = st.SparseTensorList([poisson2d(4), poisson2d(5)])
    Bs = [torch.ones(16, dtype=torch.float64), torch.ones(25, dtype=torch.float64)]
    Xs = st.solve(As, Bs)
    for A, B, X in zip(As, Bs, Xs):
        torch.testing.assert_close(X, torch.linalg.solve(A.to_dense(), B))


def test_threaded_analysis_matches_its_measurement() -> None:
    """With cuDSS's OpenMP layer (the committed H200 run with it): the analysis estimate."""
    import json
    from pathlib import Path

    from sparsetorch.backend import Rates

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "cudss_h200_threads.json"
    if not path.exists():
        pytest.skip("benchmark results not in this checkout")
    entry = json.loads(path.read_text())["cases"]["2d-1000"]
    ours, single = entry["sparsetorch_cholesky"], entry["sparsetorch_cholesky_1thread"]
    assert ours["threading_layer"] and single["threading_layer"] is None
    h200 = Rates("cuda", bandwidth=4.0e12, flops=cost.REFERENCE_FLOPS, launch=8e-6)
    req = _request(n=entry["n"], nse=entry["nse"])
    assert cost.estimate(h200, req, "cholesky", threaded=True).analysis == pytest.approx(ours["analysis_host_s"], rel=0.35)
    assert cost.estimate(h200, req, "cholesky").analysis == pytest.approx(single["analysis_host_s"], rel=0.35)
