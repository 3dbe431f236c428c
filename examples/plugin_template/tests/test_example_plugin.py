"""Tests of the example backend: its declaration, its offers and declines, and its plan's numbers.

Run from a source checkout (``pythonpath`` in pyproject.toml finds the package) or after
``pip install -e .``::

    pytest                      # in examples/plugin_template/

When the package is installed, the backend is loaded through its entry point; otherwise the
fixtures (``conformance_backend`` for the kit, ``example_backend`` below) register the module
in-process under the same name, and reset the backends afterwards.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch
from sparsetorch.backend import get_backends, reset_backends
from sparsetorch.backend import OperandInfo, Request
from sparsetorch.format import COO, CSC, CSR
from sparsetorch.testing import ErrorConformance, SolveConformance
from sparsetorch_example import plugin
from sparsetorch_example.plan import DenseLUPlan


# The conformance kit: the shared parity suite every backend runs (values, batches, gradients,
# plans, the plan cache, errors), against dense float64 oracles. The capability flags say what
# this backend does; the kit skips the rest with the flag's name as the reason.
class ExampleBackend:
    backend = "example"
    methods = ("lu",)
    devices = ("cpu",)
    dtypes = (torch.float64,)
    formats = (CSR, CSC, COO)
    supports_complex = False
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True

    @pytest.fixture(autouse=True)
    def conformance_backend(self):
        """The kit's hook for loading the backend: register it when not installed."""
        backends = get_backends()
        if self.backend not in backends.names:
            backends.register(plugin, self.backend)
        yield
        reset_backends()

    @pytest.fixture(autouse=True)
    def _known_core_issues(self, request):
        """Expected failures (non-strict: a fix shows as XPASS) of kit tests that fail because of
        open issues in the core, not in this backend. Delete entries as the core fixes land."""
        params = getattr(request.node, "callspec", None)
        params = params.params if params is not None else {}
        for test, only, reason in KNOWN_CORE_ISSUES:
            if request.node.originalname == test and all(params.get(k) == v for k, v in only.items()):
                request.applymarker(pytest.mark.xfail(reason=f"core issue: {reason}", strict=False))


#: (kit test, parameters it applies to, reason): kit tests this backend is expected to fail,
#: marked xfail (non-strict). Empty: the template passes the whole kit.
KNOWN_CORE_ISSUES: list[tuple[str, dict, str]] = []


class TestExampleSolve(ExampleBackend, SolveConformance):
    pass


class TestExampleErrors(ExampleBackend, ErrorConformance):
    pass


# Backend-specific tests ---------------------------------------------------------------------------
@pytest.fixture
def example_backend():
    """The loaded "example" backend (entry point if installed, else registered here)."""
    backends = get_backends()
    if "example" not in backends.names:
        backends.register(plugin, "example")
    broken = [b for b in backends.broken if b.name == "example"]
    assert not broken, broken
    yield backends.info("example")
    reset_backends()  # leave the process-wide state as we found it


def _matrix(n: int = 30, *, batch: tuple[int, ...] = (), seed: int = 0, dtype=torch.float64):
    """A nonsymmetric, well-conditioned sparse matrix (tridiagonal plus a few far entries)."""
    g = torch.Generator().manual_seed(seed)
    D = torch.diag(torch.full((n,), 4.0))
    D += torch.diag(torch.full((n - 1,), -1.0), 1) + torch.diag(torch.full((n - 1,), -1.5), -1)
    D[0, n - 1] = 0.5
    D[n - 1, 0] = -0.25
    mask = D != 0
    if batch:
        D = D.expand(*batch, n, n) * (1 + 0.1 * torch.rand(*batch, n, n, generator=g))
    D = (D * mask).to(dtype)
    return sparsetorch.SparseTensor.from_dense(D), D


def _request(n: int = 30, *, dtype=torch.float64, device: str = "cpu", **options) -> Request:
    A = OperandInfo("sparse", (n, n), dtype, torch.device(device), nse=3 * n)
    b = OperandInfo("dense", (n, 1), dtype, torch.device(device))
    return Request("solve", (A, b), frozenset({"nonsymmetric"}), options)


# Declaration --------------------------------------------------------------------------------------
def test_backend_info_declares_cpu_float64_lu(example_backend) -> None:
    info = example_backend
    assert info.name == "example"
    assert info.devices == ("cpu",)
    assert info.dtypes == (torch.float64,)
    assert dict(info.ops) == {"solve": ("lu",)}
    assert dict(info.missing) == {}  # SciPy is a dependency of the distribution


# Offers and declines ------------------------------------------------------------------------------
def test_offer_has_a_positive_cost_that_grows_with_n() -> None:
    small, large = plugin.sparsetorch_offers(_request(30)), plugin.sparsetorch_offers(_request(600))
    assert [type(o).__name__ for o in small + large] == ["Offer", "Offer"]
    assert 0 < small[0].seconds < large[0].seconds
    assert small[0].bytes == 30 * 30 * 8 + 4 * 30 + 90 * 8


@pytest.mark.parametrize(
    ("request_kw", "method", "words"),
    [
        ({"dtype": torch.float32}, None, "float64 only"),
        ({"dtype": torch.complex128}, None, "float64 only"),
        ({"device": "cuda"}, None, "CPU only"),
        ({"n": plugin.MAX_N + 1}, "lu", f"only up to {plugin.MAX_N} unknowns"),
        ({"dense_max": 10}, "lu", "pass dense_max=30"),
        ({"preconditioner": "jacobi"}, "lu", "direct method"),
    ],
)
def test_declines_with_a_reason(request_kw, method, words) -> None:
    # A Request is plain data: no CUDA device is needed to ask about one.
    answers = plugin.sparsetorch_offers(_request(**request_kw))
    assert len(answers) == 1 and isinstance(answers[0], sparsetorch.Decline), answers
    assert answers[0].method == method
    assert words in answers[0].reason


def test_a_pinned_method_it_lacks_is_declined_and_lu_still_answered() -> None:
    decline, lu = plugin.sparsetorch_offers(_request(method="cg"))
    assert isinstance(decline, sparsetorch.Decline) and decline.method == "cg"
    assert "only method 'lu'" in decline.reason
    assert isinstance(lu, sparsetorch.Offer) and lu.method == "lu"  # the dispatcher filters it


def test_float32_decline_shows_in_explain(example_backend) -> None:
    A, D = _matrix(dtype=torch.float32)
    table = sparsetorch.explain("solve", A, torch.ones(30))
    row = next(r for r in table.declines if r.backend == "example")
    assert "float32" in row.reason and "float64" in row.reason
    assert table.chosen.backend == "torch"


def test_chosen_when_its_offer_is_the_cheapest_allowed(example_backend) -> None:
    # Its in-place factorization needs half the memory of the torch backend's dense LU: under a
    # budget between the two it is the cheapest offer left.
    A, D = _matrix(50)
    b = torch.ones(50, dtype=torch.float64)
    ours = next(r for r in sparsetorch.explain("solve", A, b) if r.backend == "example")
    torch_lu = next(r for r in sparsetorch.explain("solve", A, b) if r.backend == "torch" and r.method == "lu")
    assert ours.bytes < torch_lu.bytes
    x, info = sparsetorch.solve(A, b, max_bytes=ours.bytes, return_info=True)
    assert (info.backend, info.method) == ("example", "lu")
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


# The plan ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("k", [1, 4])
def test_plan_solves_and_adjoint_solves(batch, k) -> None:
    A, D = _matrix(25, batch=batch)
    B = torch.randn(*batch, 25, k, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    plan = DenseLUPlan(A)
    plan.set_values(A.values)
    X, res = plan.solve(B)
    Xa, _ = plan.solve(B, adjoint=True)
    assert res.converged and res.status is sparsetorch.Status.DIRECT
    torch.testing.assert_close(X, torch.linalg.solve(D, B))
    torch.testing.assert_close(Xa, torch.linalg.solve(D.mT, B))


def test_set_values_refactors_on_the_same_pattern() -> None:
    A, D = _matrix(20)
    plan = DenseLUPlan(A)
    b = torch.ones(20, 1, dtype=torch.float64)
    plan.set_values(A.values)
    plan.set_values(2 * A.values)  # numeric phase only; the pattern work from __init__ is kept
    torch.testing.assert_close(plan.solve(b)[0], torch.linalg.solve(2 * D, b))


def test_solver_object_reuses_the_plan_for_new_values(example_backend) -> None:
    A, D = _matrix(20)
    b = torch.ones(20, dtype=torch.float64)
    s = sparsetorch.Solver(A, backend="example")
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(D, b))
    assert (s.backend, s.method) == ("example", "lu")
    s.update_values(3 * A.values)
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(3 * D, b))


def test_gradients_through_the_adjoint_solve(example_backend) -> None:
    A, D = _matrix(8)
    values = A.values.clone().requires_grad_(True)
    b = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def f(v, rhs):
        # cache=False: gradcheck perturbs ``v`` through ``.data``, which leaves its version counter
        # unchanged, so a cached plan could not tell that the values moved.
        return sparsetorch.solve(A.with_values(v), rhs, backend="example", cache=False)

    assert torch.autograd.gradcheck(f, (values, b))


def test_singular_matrix_is_a_clear_error() -> None:
    A, D = _matrix(10)
    D2 = D.clone()
    D2[4] = 0.0  # a zero row
    S = sparsetorch.SparseTensor.from_dense(D2 + 0.0 * (D != 0), mask=D != 0)
    plan = DenseLUPlan(S)
    with pytest.raises(sparsetorch.SingularMatrixError, match="singular to working precision"):
        plan.set_values(S.values)


def test_solve_before_set_values_says_so() -> None:
    A, _ = _matrix(5)
    with pytest.raises(RuntimeError, match="before set_values"):
        DenseLUPlan(A).solve(torch.ones(5, 1, dtype=torch.float64))
