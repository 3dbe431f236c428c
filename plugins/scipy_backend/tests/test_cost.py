"""The cost model: the sparsity-dimension estimate, and what auto-dispatch picks for Poisson
problems of the crossover benchmark (requests are metadata: no large matrix is built)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import rates
from sparsetorch.backend import OperandInfo, Request
from sparsetorch.format import CSR

import sparsetorch_scipy.plugin as plugin
from sparsetorch_scipy import cost


def _poisson_request(m: int, dim: int, **options) -> Request:
    n = m**dim
    nse = n * (2 * dim + 1) - 2 * dim * m ** (dim - 1)  # interior stencil minus the boundary
    A = OperandInfo("sparse", (n, n), torch.float64, torch.device("cpu"), format=CSR.replace(index_dtype=torch.int32), nse=nse)
    b = OperandInfo("dense", (n, 1), torch.float64, torch.device("cpu"))
    return Request("solve", (A, b), frozenset({"spd", "symmetric"}), {"rtol": 1e-6, **options})


def _best(request: Request) -> tuple[str, str | None]:
    offers = [a for a in plugin.sparsetorch_offers(request) if isinstance(a, st.Offer)]
    best = min(offers, key=lambda o: o.seconds)
    return best.method, best.preconditioner


def test_dimension_estimate() -> None:
    assert cost.dimension(_poisson_request(64, 2)) == pytest.approx(2.0, abs=0.05)
    assert cost.dimension(_poisson_request(24, 3)) == pytest.approx(2.9, abs=0.1)
    assert cost.dimension(_poisson_request(24, 3, backend_options={"dimension": 2})) == 2.0


# The fastest SciPy option measured at rtol 1e-6 (benchmarks/results/crossover_cpu.json, README).
@pytest.mark.parametrize(("m", "dim", "expected"), [
    (64, 2, ("cg", "jacobi")),
    (128, 2, ("cg", "jacobi")),
    (256, 2, ("cg", "amg")),
    (512, 2, ("cg", "amg")),
    (1024, 2, ("cg", "amg")),
    (16, 3, ("cg", "jacobi")),
    (32, 3, ("cg", "jacobi")),
    (48, 3, ("cg", "jacobi")),
])
def test_auto_pick_matches_the_measured_fastest(m, dim, expected, monkeypatch) -> None:
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    assert _best(_poisson_request(m, dim)) == expected


def test_lu_wins_when_factors_are_reused_for_many_right_hand_sides(monkeypatch) -> None:
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    req = _poisson_request(128, 2)
    A, _ = req.operands
    many = Request("solve", (A, OperandInfo("dense", (A.n, 64), torch.float64, A.device)), req.properties, req.options)
    assert _best(many) == ("lu", None)


def test_lu_estimate_grows_much_faster_in_3d() -> None:
    r = rates("cpu")
    two = cost.lu_estimate(r, _poisson_request(64, 2))  # n = 4096
    three = cost.lu_estimate(r, _poisson_request(16, 3))  # n = 4096
    assert three.fill > 3 * two.fill and three.flops > 10 * two.flops


@pytest.mark.parametrize("k, ratio", [(1, 1.0), (8, cost.MULTI_COLUMN_FACTOR), (64, cost.MULTI_COLUMN_FACTOR)])
def test_multi_column_products_are_charged_more_than_torch(k, ratio, monkeypatch) -> None:
    """One column: SciPy's product is priced like torch's (it was 0.6-0.7x the time, and wins the
    tie on memory); several columns: MULTI_COLUMN_FACTOR more (measured 1.06-2.81x, median 1.36),
    so multi-column products (a sparse layer's batch) go to torch."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")
    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(400)  # large enough that the fixed per-call costs do not matter
    X = torch.ones(A.shape[0], k, dtype=torch.float64)
    rows = {r.backend: r for r in st.explain("matmul", A, X).rows if r.seconds is not None}
    assert rows["scipy"].seconds / rows["torch"].seconds == pytest.approx(ratio, rel=0.05)
    assert st.explain("matmul", A, X).chosen.backend == ("scipy" if k == 1 else "torch")
