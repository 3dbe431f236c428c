"""Format-agnostic operations, each a one-shot function and a stateful plan/execute object."""

from .info import IterationResult, SolveInfo, Status
from .matmul import Matmul, matmul, norm, transpose
from .solve import Solver, solve

__all__ = ["IterationResult", "Matmul", "SolveInfo", "Solver", "Status", "matmul", "norm", "solve", "transpose"]
