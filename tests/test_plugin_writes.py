"""A plan that writes into A's index buffers and then fails is named, and the fallback does not run on the
corrupted pattern (session 27's plugin sweep: the next method read the zeroed buffers and hung in compiled
code, or blamed the caller's matrix). Plans must not modify their inputs (docs/backend-authors.md)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch
from sparsetorch.dispatch.records import BackendInfo, Offer

from test_plugins import backends  # noqa: F401 - the fixture


class _WritingPlan:
    backend, method, preconditioner = "writer", "lu", None

    def __init__(self, A) -> None:
        self.A = A

    def set_values(self, values: torch.Tensor) -> None:
        self.A.crd(1).zero_()  # a bug: the caller's column indices (large matrices share them with plans)
        raise RuntimeError("the factorization failed")

    def solve(self, B, *, adjoint=False, options=None):  # pragma: no cover - never reached
        raise AssertionError


class _Writer:
    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name="writer", version="0", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"solve": ("lu",)}, priority=100)

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer("writer", "lu", 1e-12, 0, lambda A, req: _WritingPlan(A), notes="test double")]


def test_a_plan_that_writes_the_index_buffers_and_fails_is_named(backends):  # noqa: F811
    backends.register(_Writer(), "writer")
    n = 50_000  # above the size where plans get the caller's index buffers rather than copies
    main = torch.full((n,), 4.0, dtype=torch.float64)
    off = torch.full((n - 1,), -1.0, dtype=torch.float64)
    r = torch.cat([torch.arange(n), torch.arange(n - 1), torch.arange(1, n)])
    c = torch.cat([torch.arange(n), torch.arange(1, n), torch.arange(n - 1)])
    A = sparsetorch.SparseTensor.from_coo(torch.cat([main, off, off]), r, c, shape=(n, n)).convert("CSR")
    before = A.crd(1).clone()
    b = torch.ones(n, dtype=torch.float64)
    try:
        sparsetorch.solve(A, b)
    except sparsetorch.BackendError as exc:
        if torch.equal(A.crd(1), before):
            pytest.skip("the plan got a copy of the index buffers: the caller's A is intact, nothing to name")
        assert "index buffers are no longer valid" in str(exc) and "writer/lu" in str(exc)
    else:
        # a plan given copies: the caller's pattern is intact and the fallback answered
        assert torch.equal(A.crd(1), before)
