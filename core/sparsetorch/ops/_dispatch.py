"""From operands to a chosen, cached plan (shared by the ops and their stateful objects)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..autograd import products
from ..autograd.fallback import Route
from ..dispatch.plan import PlanState
from ..dispatch.cache import plan_cache
from ..dispatch.lru import LRU
from ..dispatch.options import SolveOptions
from ..dispatch.records import Offer, OperandInfo, Request
from ..dispatch.select import ExplainTable, choose
from ..tensor import SparseTensor

__all__ = ["make_request", "obtain_plan", "plan_for", "route_for", "call_options", "options_key", "CALL_OPTIONS"]

# Options that change what a plan is (part of the cache key). Tolerances, iteration limits and
# callbacks are per call (CALL_OPTIONS): one plan serves them all.
_PLAN_OPTIONS = ("restart", "block_size", "dense_max")
CALL_OPTIONS = ("rtol", "atol", "maxiter", "check_every", "callback")


def make_request(op: str, operands: tuple[OperandInfo, ...], properties: frozenset[str], options: dict[str, Any],
                 measured: tuple = ()) -> Request:
    requires_grad = any(o.requires_grad for o in operands)
    return Request(op, operands, properties, dict(options), requires_grad, measured)


def options_key(offer: Offer, options: dict[str, Any]) -> tuple:
    pre = options.get("preconditioner")
    pre_key = pre if (pre is None or isinstance(pre, str)) else ("callable", id(pre))
    bo = options.get("backend_options") or {}
    return (offer.preconditioner, pre_key, tuple(sorted((k, repr(v)) for k, v in bo.items()))) + tuple(
        (k, options.get(k)) for k in _PLAN_OPTIONS
    )


#: Calls seen per (op, pattern, dtype): how many more a pattern is expected to serve when the
#: caller does not say (``repeat``). Bounded; the oldest patterns are forgotten first.
_CALLS: "LRU[Any, int]" = LRU("calls per pattern", 1024)


def expected_calls(op: str, A: SparseTensor, *, count: bool) -> int:
    """The calls this pattern is expected to serve: as many as seen so far, this one included
    (the past predicts the future: a loop that has solved 20 times on a pattern will likely
    solve 20 more), rounded down to a power of two so that remembered dispatch decisions are
    re-made only log2(calls) times. ``count``: record this call (``explain`` only peeks)."""
    key = (op, A.pattern_key, A.dtype)
    with _CALLS.lock:
        seen = (_CALLS.peek(key) or 0) + 1
        if count:
            _CALLS.put(key, seen)
    return 1 << (seen.bit_length() - 1)


def with_expected_calls(op: str, A: SparseTensor, request: Request, table: ExplainTable | None, *,
                        count: bool) -> Request | None:
    """``request`` with the ``repeat`` option filled in from the calls seen on the pattern, when
    the caller gave none and some offer has a one-time setup to spread (``None``: no change)."""
    if request.option("repeat") is not None:
        return None
    # Without a setup to spread there is nothing to count (the table is the same on every call
    # of this request: remembered decisions), and the per-call bookkeeping is skipped.
    if table is not None and not any(r.offer is not None and r.offer.setup > 0 for r in table.rows):
        return None
    repeat = expected_calls(op, A, count=count)
    if repeat <= 1:
        return None
    opts = request.options
    return replace(request, options=opts.replace(repeat=repeat) if isinstance(opts, SolveOptions)
                   else {**opts, "repeat": repeat})


def obtain_plan(op: str, A: SparseTensor, request: Request, *, cache: bool = True) -> tuple[PlanState, Offer, ExplainTable]:
    """Choose the cheapest capable backend and return its plan (from the cache when the
    pattern, dtype and options match a previous call)."""
    offer, table = choose(request)
    spread = with_expected_calls(op, A, request, table, count=True)
    if spread is not None:  # some offer has a one-time setup: price it over the expected calls
        request = spread
        offer, table = choose(request)
    return plan_for(op, A, request, offer, cache=cache), offer, table


def plan_for(op: str, A: SparseTensor, request: Request, offer: Offer, *, cache: bool = True) -> PlanState:
    """The plan of ``offer`` for ``A`` (from the plan cache when one was built for the same
    pattern, dtype, symmetry class and plan options)."""
    # Plans capture the pattern only: they get A with zero values; values arrive through
    # set_values. The factory runs lazily, at the first load, which happens inside the autograd
    # Function, where torch.func transforms hand over plain tensors that a plan may keep.
    def factory():
        # one zero broadcast to the values' shape: no nnz-sized buffer for the plan to keep
        # (2.6 GB at 320M entries, measured in the GPU suite's 64M case)
        zeros = torch.zeros((), dtype=A.dtype, device=A.device).expand(A.values.shape)
        source = A.detach().with_values(zeros)
        return offer.build(source, request)

    label = f"{offer.backend}/{offer.method}"

    def build() -> PlanState:
        return PlanState(None, factory=factory, reload_always=(op == "matmul"), label=label)

    if not cache:
        return build()
    # The symmetry class is part of the key: a plan may rely on it (the torch backend's Krylov
    # plans run adjoint solves with A itself when A = A^H), so values on the same pattern that
    # lose their symmetry get a plan of their own.
    sym = tuple(sorted(request.properties & {"spd", "hermitian", "symmetric"}))
    key = (op, offer.backend, offer.method, A.pattern_key, A.dtype, tuple(A.batch_shape), sym,
           options_key(offer, request.options))
    state, hit = plan_cache().get_or_build(key, A.pattern_key, build, (op, offer.backend, offer.method, tuple(A.shape)))
    state.reused = hit
    return state


def call_options(request: Request) -> dict[str, Any]:
    """The options of a call that may change from call to call on one plan (passed to the
    plan's solve, never stored on it)."""
    return {k: request.options.get(k) for k in CALL_OPTIONS}


def route_for(op: str, A: SparseTensor, request: Request, table: ExplainTable, offer: Offer, state: PlanState, *,
              cache: bool = True) -> Route:
    """The fallback route of a call: ``offer`` first, then the offers ranked after it (none when
    the user pinned the method)."""
    pinned = request.option("method") is not None
    rest: list[Offer] = []
    if not pinned:
        # the offers ranked after ``offer`` (a Solver that fell back starts further down the
        # table), then those before it
        offers = [r.offer for r in table.offers if r.offer is not None]
        k = offers.index(offer) if offer in offers else -1
        rest = offers[k + 1:] + offers[:max(k, 0)]
    return Route(A.detach(), state, offer, rest, lambda o: plan_for(op, A, request, o, cache=cache), pinned=pinned)


def _product_state(A: SparseTensor, X: torch.Tensor) -> PlanState:
    """The product plan for ``A @ X`` (what the autograd layer's checks and tangents use)."""
    from .matmul import matmul_request  # noqa: PLC0415 - matmul imports this module

    state, _, _ = obtain_plan("matmul", A, matmul_request(A, X, {}))
    return state


products.register(_product_state)
