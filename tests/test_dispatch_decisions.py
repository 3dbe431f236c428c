"""Remembered dispatch decisions (select.choose): a repeated request does not ask the backends
again; anything that can change the answer (metadata, options, properties, the set of
backends, the calibration setting) is part of the key; the switch and the reset work; explain
always asks."""

from __future__ import annotations

import pytest
import torch

import sparsetorch
from sparsetorch.dispatch import reset_backends
from sparsetorch.dispatch.select import _DECISIONS, clear_decisions

from test_plugins import FakeBackend, _system


@pytest.fixture
def backends(monkeypatch):
    monkeypatch.setenv("SPARSETORCH_DISABLE_PLUGINS", "1")
    monkeypatch.delenv("SPARSETORCH_DISPATCH_CACHE", raising=False)
    b = reset_backends()
    clear_decisions()
    yield b
    monkeypatch.undo()
    reset_backends()


def test_repeated_requests_do_not_ask_again(backends) -> None:
    fast = FakeBackend("fast", seconds=1e-9)
    backends.register(fast, "fast")
    A, D, b = _system()
    # a first solve in a fresh process pays lazy imports (~90 ms), which the route records on the pattern as a
    # measured time (another request): warm up on another pattern
    sparsetorch.solve(A.to(torch.float32), b.to(torch.float32))
    for k in range(5):
        x, info = sparsetorch.solve(A.with_values(A.values * (k + 1)), b, return_info=True)
        torch.testing.assert_close(x, torch.linalg.solve(D * (k + 1), b))
        assert info.backend == "fast"
    assert len(fast.requests) == 1  # asked once, answered from memory four times


def test_the_key_holds_what_can_change_the_answer(backends) -> None:
    fast = FakeBackend("fast", seconds=1e-9)
    backends.register(fast, "fast")
    A, D, b = _system()
    sparsetorch.solve(A, b)
    from sparsetorch.ops.properties import detect

    def fresh():  # the same matrix in a new values tensor per call: calls on the same values tensor are
        return A.with_values(A.values.clone())  # counted (a factorization kept is spread over them)

    sparsetorch.solve(fresh(), b, properties=sorted(detect(A)))  # the detected properties again: same question
    assert len(fast.requests) == 1
    sparsetorch.solve(fresh(), b, properties="symmetric")  # other properties
    sparsetorch.solve(fresh(), b, rtol=1e-9)  # other options
    sparsetorch.solve(fresh(), torch.stack([b, b], 1))  # other right-hand-side shape
    assert len(fast.requests) == 4
    # another dtype is another question (the core declines float32 for "fast", which declared
    # float64 only, without asking it): not answered from the float64 decision
    _, info = sparsetorch.solve(A.to(torch.float32), b.to(torch.float32), return_info=True)
    assert info.backend == "torch"


def test_registering_a_backend_starts_afresh(backends) -> None:
    A, D, b = _system()
    _, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "torch"
    fast = FakeBackend("fast", seconds=1e-12)
    backends.register(fast, "fast")
    _, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "fast"
    backends.unregister("fast")
    _, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "torch"


def test_switch_and_clear(backends, monkeypatch) -> None:
    fast = FakeBackend("fast", seconds=1e-9)
    backends.register(fast, "fast")
    A, D, b = _system()
    # new values per call (the same pattern): calls repeated on the same values would re-ask at power-of-two
    # counts, where a factorization kept by the plan is spread over them (test_block_diagonal.py)
    k = iter(range(1, 100))
    monkeypatch.setenv("SPARSETORCH_DISPATCH_CACHE", "0")
    sparsetorch.solve(A.with_values(A.values * next(k)), b)
    sparsetorch.solve(A.with_values(A.values * next(k)), b)
    assert len(fast.requests) == 2 and not _DECISIONS
    monkeypatch.delenv("SPARSETORCH_DISPATCH_CACHE")
    sparsetorch.solve(A.with_values(A.values * next(k)), b)
    sparsetorch.solve(A.with_values(A.values * next(k)), b)
    assert len(fast.requests) == 3
    clear_decisions()
    sparsetorch.solve(A.with_values(A.values * next(k)), b)
    assert len(fast.requests) == 4


def test_explain_always_asks(backends) -> None:
    fast = FakeBackend("fast", seconds=1e-9)
    backends.register(fast, "fast")
    A, D, b = _system()
    sparsetorch.solve(A, b)
    sparsetorch.explain("solve", A, b)
    sparsetorch.explain("solve", A, b)
    assert len(fast.requests) == 3
