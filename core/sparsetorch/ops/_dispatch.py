"""From operands to a chosen, cached plan (shared by the ops and their stateful objects)."""

from __future__ import annotations

from typing import Any

import torch

from ..autograd.handles import PlanState
from ..dispatch.cache import plan_cache
from ..dispatch.records import Offer, OperandInfo, Request
from ..dispatch.select import ExplainTable, choose, rank
from ..tensor import SparseTensor

__all__ = ["make_request", "obtain_plan", "explain_request", "options_key"]

# Options that change what a plan is (part of the cache key); the rest only steer selection.
_PLAN_OPTIONS = ("rtol", "atol", "maxiter", "restart", "block_size", "check_every", "dense_max")


def make_request(op: str, operands: tuple[OperandInfo, ...], properties: frozenset[str], options: dict[str, Any]) -> Request:
    requires_grad = any(o.requires_grad for o in operands)
    return Request(op, operands, properties, dict(options), requires_grad)


def options_key(offer: Offer, options: dict[str, Any]) -> tuple:
    pre = options.get("preconditioner")
    pre_key = pre if (pre is None or isinstance(pre, str)) else ("callable", id(pre))
    return (offer.preconditioner, pre_key) + tuple((k, options.get(k)) for k in _PLAN_OPTIONS)


def obtain_plan(op: str, A: SparseTensor, request: Request, *, cache: bool = True) -> tuple[PlanState, Offer, ExplainTable]:
    """Choose the cheapest capable backend and return its plan (from the cache when the
    pattern, dtype and options match a previous call)."""
    offer, table = choose(request)
    source = A.detach()

    def build() -> PlanState:
        return PlanState(offer.build(source, request))

    if not cache:
        return build(), offer, table
    key = (op, offer.backend, offer.method, A.pattern_key, A.dtype, tuple(A.batch_shape), options_key(offer, request.options))
    state, hit = plan_cache().get_or_build(key, A.pattern_key, build, (op, offer.backend, offer.method, tuple(A.shape)))
    state.reused = hit
    return state, offer, table


def explain_request(request: Request) -> ExplainTable:
    return rank(request)


def device_of(*tensors: torch.Tensor) -> torch.device:
    return tensors[0].device
