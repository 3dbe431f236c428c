"""Per-system outcomes of iterative solves, combined into one IterationResult (the worst case):
the core's shared helpers (:mod:`sparsetorch.dispatch.helpers`)."""

from sparsetorch.dispatch.helpers import Outcome, combine

__all__ = ["Outcome", "combine"]
