"""One-time setup spread over the calls a pattern serves (Offer.setup, the ``repeat`` option,
the calls seen on a pattern): a loop of one-shot solves moves to the method whose setup pays
off, at a predictable call; a Solver prices its setup over its expected reuse."""

from __future__ import annotations

import pytest
import torch

import sparsetorch
from sparsetorch.dispatch import Offer
from sparsetorch.dispatch.select import clear_decisions
from sparsetorch.errors import InputError
from sparsetorch.dispatch import plan as dispatch_plan

from test_plugins import FakeBackend, _system, backends  # noqa: F401 - backends is a fixture

U = 1e-8  # the unit of the fakes' costs


class SetupBackend(FakeBackend):
    """One offer with a one-time part of its cost."""

    def __init__(self, name: str, *, seconds: float, setup: float, method: str = "lu") -> None:
        super().__init__(name, seconds=seconds, method=method)
        self.setup = setup

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        self.requests.append(request)
        return [Offer(self.name, self.method, self.seconds, 0, self.build, notes="test double", setup=self.setup)]


@pytest.fixture
def fakes(backends, monkeypatch):  # noqa: F811 - the fixture imported above
    """The built-in backends plus two fakes: direct costs 1 unit on a first call, 0.95 of it
    analysis; iterative 0.2 every call (units of 10 ns: below anything the built-in torch backend
    estimates, so the two fakes compete)."""
    monkeypatch.delenv("SPARSETORCH_DISPATCH_CACHE", raising=False)
    clear_decisions()
    dispatch_plan._CALLS.clear()
    backends.register(SetupBackend("direct", seconds=1.0 * U, setup=0.95 * U, method="lu"), "direct")
    backends.register(FakeBackend("iterative", seconds=0.2 * U, method="cg"), "iterative")
    yield backends
    dispatch_plan._CALLS.clear()


def test_offer_setup_must_lie_within_its_seconds() -> None:
    with pytest.raises(ValueError, match="setup"):
        Offer("x", "lu", 1.0, 0, lambda A, r: None, setup=1.5)
    with pytest.raises(ValueError, match="setup"):
        Offer("x", "lu", 1.0, 0, lambda A, r: None, setup=-0.1)


def test_repeat_spreads_the_setup(fakes) -> None:
    A, D, b = _system()
    one = sparsetorch.explain("solve", A, b, repeat=1)
    assert one.chosen.backend == "iterative"
    ten = sparsetorch.explain("solve", A, b, repeat=10)
    assert ten.chosen.backend == "direct"
    row = [r for r in ten.rows if r.backend == "direct"][0]
    assert row.seconds == pytest.approx((0.05 + 0.095) * U)
    assert "spread over 10 calls" in row.reason
    x, info = sparsetorch.solve(A, b, repeat=10, return_info=True)
    assert info.backend == "direct"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_a_loop_of_one_shot_solves_switches_when_the_setup_pays_off(fakes) -> None:
    """Calls seen so far, rounded down to a power of two, are the expected calls: 0.05 + 0.95/k
    beats 0.2 from k = 8 on (k = 4 gives 0.29). explain, asked before each call, agrees."""
    A, D, b = _system()
    used, told = [], []
    for k in range(1, 13):
        Ak = A.with_values(A.values * k)
        told.append(sparsetorch.explain("solve", Ak, b).chosen.backend)
        x, info = sparsetorch.solve(Ak, b, return_info=True)
        used.append(info.backend)
        torch.testing.assert_close(x, torch.linalg.solve(D * k, b))
    assert used == ["iterative"] * 7 + ["direct"] * 5
    assert told == used


def test_solver_expects_reuse(fakes) -> None:
    A, D, b = _system()
    s = sparsetorch.Solver(A)
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(D, b))
    assert s.explain().chosen.backend == "direct"  # priced over SOLVER_REPEAT = 10 solves
    s1 = sparsetorch.Solver(A, repeat=1)
    s1.solve(b)
    assert s1.explain().chosen.backend == "iterative"


def test_bad_repeat_is_rejected(fakes) -> None:
    A, _, b = _system()
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(InputError, match="repeat"):
            sparsetorch.solve(A, b, repeat=bad)
