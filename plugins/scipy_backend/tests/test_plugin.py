"""The backend's declaration, offers and declines (metadata only: no GPU needed to ask about one)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import OperandInfo, Request
from sparsetorch.format import CSR, TensorFormat
from sparsetorch.testing.problems import convection_diffusion, poisson2d

import sparsetorch_scipy.plugin as plugin


def _request(n: int = 100, *, dtype=torch.float64, device: str = "cpu", props=("spd", "symmetric"), fmt=CSR,
             nse: int | None = None, op: str = "solve", **options) -> Request:
    A = OperandInfo("sparse", (n, n), dtype, torch.device(device), format=fmt, nse=nse if nse is not None else 5 * n)
    b = OperandInfo("dense", (n, 1), dtype, torch.device(device))
    return Request(op, (A, b), frozenset(props), options)


def _by_method(answers):
    offers = {}
    declines = {}
    for a in answers:
        (offers if isinstance(a, st.Offer) else declines).setdefault(a.method, []).append(a)
    return offers, declines


# Declaration --------------------------------------------------------------------------------------
def test_backend_info(scipy_backend) -> None:
    info = scipy_backend
    assert info.name == "scipy" and info.devices == ("cpu",)
    assert info.dtypes == (torch.float32, torch.float64, torch.complex64, torch.complex128)
    assert dict(info.ops) == {"solve": ("lu", "cg", "bicgstab", "gmres", "lgmres", "gcrotmk", "minres", "tfqmr", "amg"),
                              "matmul": ("spmm",), "lstsq": ("lsqr", "lsmr"), "eigsh": ("arpack", "lobpcg"),
                              "eigs": ("arpack",), "logdet": ("lu",)}
    assert dict(info.missing) == {}  # scipy and pyamg are installed here


def test_missing_pyamg_is_reported_and_declined(monkeypatch) -> None:
    monkeypatch.setattr(plugin, "_installed", lambda module: module != "pyamg")
    info = plugin.sparsetorch_backend_info()
    assert "pyamg" in info.missing and "pip install" in info.missing["pyamg"]
    offers, declines = _by_method(plugin.sparsetorch_offers(_request()))
    assert "amg" not in offers and "pyamg" in declines["amg"][0].reason
    assert all(o.preconditioner != "amg" for o in offers["cg"])  # auto offers CG + Jacobi only
    _, declines = _by_method(plugin.sparsetorch_offers(_request(method="cg", preconditioner="amg")))
    assert "needs pyamg" in declines["cg"][0].reason


def test_import_light() -> None:
    """The hook module answers without importing SciPy (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys, sparsetorch_scipy.plugin as p; p.sparsetorch_backend_info(); "
            "from sparsetorch.backend import OperandInfo, Request; import torch; "
            "A = OperandInfo('sparse', (9, 9), torch.float64, torch.device('cpu'), nse=40); "
            "p.sparsetorch_offers(Request('solve', (A,), frozenset({'spd'}), {})); "
            "print('scipy' in sys.modules, 'pyamg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "SPARSETORCH_CALIBRATION": "defaults"})
    assert out.stdout.split() == ["False", "False"], out


# Declines -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "words"), [
    ({"device": "cuda"}, "CPU only"),
    ({"dtype": torch.float16}, "float16"),
    ({"dtype": torch.bfloat16}, "bfloat16"),
])
def test_whole_request_declines(kw, words) -> None:
    answers = plugin.sparsetorch_offers(_request(**kw))
    assert len(answers) == 1 and isinstance(answers[0], st.Decline) and answers[0].method is None
    assert words in answers[0].reason


def test_batch_level_format_declined() -> None:
    batched = TensorFormat.parse("(b, i, j) -> (b : batch, i : dense, j : compressed)")
    A = OperandInfo("sparse", (2, 5, 5), torch.float64, torch.device("cpu"), format=batched, nse=10)
    (d,) = plugin.sparsetorch_offers(Request("solve", (A,), frozenset(), {}))
    assert isinstance(d, st.Decline) and "BATCH" in d.reason


@pytest.mark.parametrize(("props", "kw", "method", "words"), [
    (("nonsymmetric",), {}, "cg", "symmetric positive definite"),
    (("nonsymmetric",), {}, "minres", "symmetric (Hermitian)"),
    (("nonsymmetric",), {}, "amg", "symmetric positive definite"),
    (("spd", "symmetric"), {"method": "cholesky"}, "cholesky", "no sparse Cholesky"),
    (("spd", "symmetric"), {}, "tfqmr", "only when asked for"),
    (("spd", "symmetric"), {"method": "cg", "preconditioner": "ilu"}, "cg", "not symmetric"),
    (("spd", "symmetric"), {"preconditioner": "jacobi"}, "lu", "direct method"),
    (("spd", "symmetric"), {"preconditioner": "jacobi", "method": "amg"}, "amg", "multigrid solver itself"),
    (("symmetric",), {"method": "minres", "preconditioner": "amg"}, "minres", "symmetric positive definite preconditioner"),
])
def test_method_declines_with_reason(props, kw, method, words) -> None:
    _, declines = _by_method(plugin.sparsetorch_offers(_request(props=props, **kw)))
    assert method in declines, declines
    assert any(words in d.reason for d in declines[method]), [d.reason for d in declines[method]]


def test_ruge_stuben_is_real_only() -> None:
    req = _request(dtype=torch.complex128, method="amg", backend_options={"amg": "ruge_stuben"})
    _, declines = _by_method(plugin.sparsetorch_offers(req))
    assert "real only" in declines["amg"][0].reason
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(method="amg", backend_options={"amg": "ruge_stuben"})))
    assert offers["amg"]


def test_unknown_preconditioner_declines_everything() -> None:
    (d,) = plugin.sparsetorch_offers(_request(preconditioner="block_jacobi"))
    assert isinstance(d, st.Decline) and d.method is None and "block_jacobi" in d.reason


def test_cg_pinned_on_symmetric_is_offered_like_the_torch_backend() -> None:
    offers, _ = _by_method(plugin.sparsetorch_offers(_request(props=("symmetric",), method="cg")))
    assert [o.preconditioner for o in offers["cg"]] == [None]


def test_auto_offers_cg_with_jacobi_and_amg() -> None:
    offers, _ = _by_method(plugin.sparsetorch_offers(_request()))
    assert sorted(o.preconditioner for o in offers["cg"]) == ["amg", "jacobi"]
    assert {"lu", "cg", "bicgstab", "gmres", "lgmres", "gcrotmk", "minres", "amg"} <= set(offers)


def test_float16_through_the_core_declines_and_torch_takes_float32(scipy_backend) -> None:
    A = poisson2d(4, 3, dtype=torch.float16)
    table = st.explain("solve", A, torch.ones(12, dtype=torch.float16))
    rows = [r for r in table.declines if r.backend == "scipy"]
    assert rows and "float16" in rows[0].reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA tensors")
def test_cuda_tensors_declined(scipy_backend) -> None:  # pragma: no cover - no GPU in CI
    A = poisson2d(4, 3, device="cuda")
    table = st.explain("solve", A, torch.ones(12, dtype=torch.float64, device="cuda"))
    assert all(r.offer is None for r in table if r.backend == "scipy")


def test_explain_lists_the_scipy_offers(scipy_backend) -> None:
    A = convection_diffusion(6)
    table = st.explain("solve", A, torch.ones(36, dtype=torch.float64))
    ours = {(r.method, r.offer.preconditioner if r.offer else None) for r in table.offers if r.backend == "scipy"}
    assert ("lu", None) in ours and ("bicgstab", "jacobi") in ours and ("gmres", "jacobi") in ours
    assert "SuperLU (COLAMD" in str(table)
