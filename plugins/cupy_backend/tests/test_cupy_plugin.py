"""The backend's declaration, offers and declines: metadata only, so these run on any machine
(no GPU, no CuPy). Where an answer depends on CuPy being installed, CuPy's presence is set."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import METHODS, OperandInfo, Request
from sparsetorch.format import BSR, COO, CSC, CSR, DIA
from sparsetorch.testing.problems import poisson2d

import sparsetorch_cupy.plugin as plugin
from sparsetorch_cupy import cost


def _request(n: int = 100, *, dtype=torch.float64, device: str = "cuda", props=("spd", "symmetric"), fmt=CSR,
             nse: int | None = None, op: str = "solve", rhs: int | None = 1, **options) -> Request:
    A = OperandInfo("sparse", (n, n), dtype, torch.device(device), format=fmt, nse=nse if nse is not None else 5 * n)
    ops = (A,) if rhs is None else (A, OperandInfo("dense", (n, rhs), dtype, torch.device(device)))
    return Request(op, ops, frozenset(props), options)


def _by_method(answers):
    offers, declines = {}, {}
    for a in answers:
        (offers if isinstance(a, st.Offer) else declines).setdefault(a.method, []).append(a)
    return offers, declines


@pytest.fixture
def with_cupy(monkeypatch):
    """Answer as if CuPy were installed (the offers never import it)."""
    monkeypatch.setattr(plugin, "_cupy_distribution", lambda: "cupy-cuda13x 14.2.0")


@pytest.fixture
def without_cupy(monkeypatch):
    monkeypatch.setattr(plugin, "_cupy_distribution", lambda: None)


# Declaration ----------------------------------------------------------------------------------------
def test_backend_info(cupy_backend) -> None:
    info = cupy_backend
    assert info.name == "cupy" and info.devices == ("cuda",)
    assert info.dtypes == (torch.float32, torch.float64, torch.complex64, torch.complex128)
    ops = dict(info.ops)
    assert ops["matmul"] == ("spmm",) and ops["eigsh"] == ("lanczos",) and ops["lstsq"] == ("lsmr",)
    assert set(ops["solve"]) >= {"cg", "gmres", "minres", "qr"}
    assert ("cgs" in ops["solve"]) == ("cgs" in METHODS)


def test_missing_cupy_is_reported_with_install_command(without_cupy) -> None:
    info = plugin.sparsetorch_backend_info()
    assert "cupy" in info.missing and "cupy-cuda12x" in info.missing["cupy"] and "cupy-cuda13x" in info.missing["cupy"]
    answers = plugin.sparsetorch_offers(_request())
    assert len(answers) == 1 and isinstance(answers[0], st.Decline)
    assert "pip install" in answers[0].reason and answers[0].method is None


def test_import_light() -> None:
    """The hook module answers without importing CuPy (checked in a fresh interpreter)."""
    code = ("import sys, sparsetorch_cupy.plugin as p; p.sparsetorch_backend_info(); "
            "from sparsetorch.backend import OperandInfo, Request; import torch; "
            "A = OperandInfo('sparse', (9, 9), torch.float64, torch.device('cuda'), nse=40); "
            "p.sparsetorch_offers(Request('solve', (A,), frozenset({'spd'}), {})); "
            "p.sparsetorch_offers(Request('matmul', (A,), frozenset(), {})); "
            "print('cupy' in sys.modules, 'cupyx' in sys.modules)")
    import os

    env = dict(os.environ, SPARSETORCH_CALIBRATION="defaults")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"], proc.stdout + proc.stderr


def test_offers_without_a_format(with_cupy) -> None:
    """OperandInfo.format may be None (metadata from elsewhere): costed as a conversion, no crash."""
    A = OperandInfo("sparse", (50, 50), torch.float64, torch.device("cuda"), nse=200)
    for op in ("matmul", "solve"):
        answers = plugin.sparsetorch_offers(Request(op, (A,), frozenset({"spd"}), {}))
        offers = [a for a in answers if isinstance(a, st.Offer)]
        assert offers and all("converts" in o.notes for o in offers)


# Declines ---------------------------------------------------------------------------------------------
def test_cpu_operands_declined_with_the_fix(with_cupy) -> None:
    (d,) = plugin.sparsetorch_offers(_request(device="cpu"))
    assert isinstance(d, st.Decline) and "CUDA" in d.reason and "cpu" in d.reason
    if torch.cuda.is_available():  # the fix: move the operands (never done by the backend)
        assert ".cuda()" in d.reason
    else:  # nothing to move them to
        assert "no CUDA device" in d.reason


def test_cpu_operands_declined_through_dispatch(cupy_backend) -> None:
    A = poisson2d(4, 3)
    b = torch.ones(12, dtype=torch.float64)
    table = st.explain("solve", A, b)
    rows = [r for r in table.rows if r.backend == "cupy"]
    assert rows and not any(r.chosen for r in rows) and all(r.reason for r in rows)
    with pytest.raises(st.NoBackendError, match="cupy"):
        st.solve(A, b, backend="cupy")
    with pytest.raises(st.NoBackendError, match="cupy"):
        st.matmul(A, b, backend="cupy")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unsupported_dtype(with_cupy, dtype) -> None:
    (d,) = plugin.sparsetorch_offers(_request(dtype=dtype))
    assert str(dtype).replace("torch.", "") in d.reason and "float64" in d.reason


def test_batch_level_format_declined(with_cupy) -> None:
    from sparsetorch.format import TensorFormat, named

    batched = getattr(named, "BATCHED_CSR", None)
    if batched is None:
        pytest.skip("no named batched-pattern format in this core")
    A = OperandInfo("sparse", (2, 10, 10), torch.float64, torch.device("cuda"), format=batched, nse=30)
    (d,) = plugin.sparsetorch_offers(Request("matmul", (A,), frozenset(), {}))
    assert "BATCH" in d.reason and isinstance(batched, TensorFormat)


def test_structural_requirements(with_cupy) -> None:
    offers, declines = _by_method(plugin.sparsetorch_offers(_request(props=("nonsymmetric",))))
    assert "cg" not in offers and "symmetric positive definite" in declines["cg"][0].reason
    assert "minres" not in offers and "symmetric" in declines["minres"][0].reason
    assert "gmres" in offers
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(props=("symmetric",), method="cg")))
    assert "cg" in offers  # pinned on a symmetric A: the user vouches, CG checks curvature itself


def test_auto_offers_use_jacobi(with_cupy) -> None:
    offers, _ = _by_method(plugin.sparsetorch_offers(_request()))
    assert {"cg", "gmres", "minres"} <= set(offers)
    assert all(o.preconditioner == "jacobi" for ms in offers.values() for o in ms)
    pinned, _ = _by_method(plugin.sparsetorch_offers(_request(method="cg")))
    assert pinned["cg"][0].preconditioner is None


def test_ilu_declined_for_symmetric_methods(with_cupy) -> None:
    offers, declines = _by_method(plugin.sparsetorch_offers(_request(preconditioner="ilu")))
    assert "gmres" in offers and offers["gmres"][0].preconditioner == "ilu"
    for m in ("cg", "minres"):
        assert m not in offers and "ILU(0) is not symmetric" in declines[m][0].reason


def test_unknown_preconditioner_declined(with_cupy) -> None:
    (d,) = plugin.sparsetorch_offers(_request(preconditioner="amg"))
    assert "'amg'" in d.reason and "jacobi" in d.reason


def test_qr_only_when_asked(with_cupy) -> None:
    offers, declines = _by_method(plugin.sparsetorch_offers(_request()))
    assert "qr" not in offers and "method='qr'" in declines["qr"][0].reason and "2.9 s" in declines["qr"][0].reason
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(method="qr")))
    assert "qr" in offers
    _, declines = _by_method(plugin.sparsetorch_offers(_request(method="qr", preconditioner="jacobi")))
    assert "direct method" in declines["qr"][0].reason


@pytest.mark.parametrize("method", ["lu", "cholesky", "bicgstab", "amg", "lgmres"])
def test_methods_cupyx_lacks_are_declined_when_pinned(with_cupy, method) -> None:
    _, declines = _by_method(plugin.sparsetorch_offers(_request(method=method)))
    assert method in declines and declines[method][0].reason


def test_rectangular_solve_declined(with_cupy) -> None:
    A = OperandInfo("sparse", (10, 12), torch.float64, torch.device("cuda"), format=CSR, nse=30)
    (d,) = plugin.sparsetorch_offers(Request("solve", (A,), frozenset(), {}))
    assert "square" in d.reason and "10x12" in d.reason


def test_eigsh_answers(with_cupy) -> None:
    (o,) = plugin.sparsetorch_offers(_request(op="eigsh", rhs=None, k=4))
    assert isinstance(o, st.Offer) and o.method == "lanczos"
    (d,) = plugin.sparsetorch_offers(_request(op="eigsh", rhs=None, sigma=0.5))
    assert "sigma" in d.reason
    (d,) = plugin.sparsetorch_offers(_request(op="eigsh", rhs=None, which="SM"))
    assert "'SM'" in d.reason
    (d,) = plugin.sparsetorch_offers(_request(op="eigsh", rhs=None, props=("nonsymmetric",)))
    assert "symmetric" in d.reason
    M = OperandInfo("sparse", (100, 100), torch.float64, torch.device("cuda"), format=CSR, nse=100)
    A = OperandInfo("sparse", (100, 100), torch.float64, torch.device("cuda"), format=CSR, nse=500)
    (d,) = plugin.sparsetorch_offers(Request("eigsh", (A, M), frozenset({"symmetric"}), {}))
    assert "mass matrix" in d.reason


def test_undeclared_op_gets_no_answer(with_cupy) -> None:
    assert plugin.sparsetorch_offers(_request(op="logdet", rhs=None)) == []


# Costs -------------------------------------------------------------------------------------------------
def test_spmm_cost_grows_with_work_and_charges_conversion(with_cupy) -> None:
    small = plugin.sparsetorch_offers(_request(op="matmul", n=10_000, nse=50_000))[0]
    big = plugin.sparsetorch_offers(_request(op="matmul", n=1_000_000, nse=5_000_000))[0]
    assert big.seconds > 3 * small.seconds
    native = plugin.sparsetorch_offers(_request(op="matmul", n=1_000_000, nse=5_000_000, fmt=CSC))[0]
    assert native.seconds == pytest.approx(big.seconds, rel=0.01) and "converts" not in native.notes
    for fmt in (COO, DIA, BSR(2, 2)):  # COO too: cuSPARSE's CSR kernel beat its COO kernel (measured)
        conv = plugin.sparsetorch_offers(_request(op="matmul", n=1_000_000, nse=5_000_000, fmt=fmt))[0]
        assert conv.seconds > big.seconds and "converts" in conv.notes


def test_krylov_estimates(with_cupy) -> None:
    from sparsetorch.backend import rates

    r = rates("cuda")
    loose = cost.krylov_cost(r, _request(n=1_000_000, nse=5_000_000, rtol=1e-3), "cg", None)
    tight = cost.krylov_cost(r, _request(n=1_000_000, nse=5_000_000, rtol=1e-10), "cg", None)
    assert tight[2] > 2 * loose[2] and tight[0] > loose[0]
    capped = cost.krylov_cost(r, _request(n=1_000_000, nse=5_000_000, maxiter=7), "cg", None)
    assert capped[2] == 7
    # the iteration estimate on 2-D Poisson 1000^2 at rtol 1e-6 (measured: 1,650 iterations)
    assert 1400 < cost.iterations("cg", 1_000_000, 1e-6, None) < 2000
    gm = cost.krylov_cost(r, _request(n=10_000, nse=50_000, maxiter=3, restart=5), "gmres", None, restart=5)
    assert gm[2] == 15  # maxiter counts restart cycles
