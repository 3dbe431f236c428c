"""Format-agnostic operations, each a one-shot function and a stateful plan/execute object."""

from ..autograd.custom_ops import csr_matmul
from .info import IterationResult, SolveInfo, Status
from .matmul import Matmul, matmul, norm, transpose
from .operator import LinearOperator
from .solve import Solver, solve
from .spgemm import spgemm
from . import methods as _methods  # noqa: F401,E402 - binds A.solve(), A.eigsh(), ... (torch-sla's spelling)

__all__ = ["csr_matmul", "IterationResult", "LinearOperator",
           "Matmul", "SolveInfo", "Solver", "Status", "matmul", "norm", "solve", "spgemm", "transpose"]
