"""Per-system outcomes of iterative solves, combined into one IterationResult (the worst case):
the core's shared helpers (:mod:`sparsetorch.backend`)."""

from sparsetorch.backend import Outcome, combine

__all__ = ["Outcome", "combine"]
