"""Backend discovery (pluggy), cost-based selection, explain, the plan cache and calibration."""

from .calibrate import Rates, calibrate, rates
from .hookspecs import hookspec
from .select import Backends, BrokenBackend, get_backends, reset_backends
from .plan import PlanCache, plan_cache
from .records import BackendInfo, Decline, Offer, OperandInfo, Request
from .select import ExplainTable, Row, choose, clear_decisions, rank

__all__ = [
    "BackendInfo", "Backends", "BrokenBackend", "Decline", "ExplainTable", "Offer", "OperandInfo", "PlanCache",
    "Rates", "Request", "Row", "calibrate", "choose", "clear_decisions", "get_backends", "hookspec", "plan_cache",
    "rank", "rates",
    "reset_backends",
]
