"""sparsetorch: sparse tensors in any storage format, and sparse linear algebra, for PyTorch.

``import sparsetorch`` loads torch and the core only; optional packages (SciPy, CuPy, PyAMG)
and backend plugins are imported when an operation first needs them.
"""

from . import format, nn
from ._markers import hookimpl
from ._version import __version__
from .dispatch import BackendInfo, Decline, Offer, OperandInfo, Request, plan_cache
from .dispatch.lru import cache_info, clear_caches
from .dispatch.select import get_backends as registry
from .errors import (
    BackendError, ConversionError, DegenerateEigenvalueError, FallbackWarning, FormatError, FormatParseError, IndefiniteMatrixError, InputError,
    InteropError, NoBackendError, NotConvergedError, NotConvergedWarning, NotSymmetricError, SingularMatrixError,
    SparseTorchError, SparseTorchWarning, ValidationError,
)
from .format import Dimension, LevelFormat, LevelProperty, TensorFormat
from .ops import IterationResult, LinearOperator, Matmul, SolveInfo, Solver, Status, matmul, norm, solve, spgemm, transpose
from .ops.operator import register_krylov as _register_krylov
from .ops.spectral import eigs, eigsh
from .ops.explain import explain
from .ops.logdet import det, logdet, slogdet
from .ops.lstsq import Lstsq, lstsq
from .ops.structure import is_hermitian, is_positive_definite, is_symmetric
from .ops.svd import cond, svds
from .ops.nonlinear import Anderson, Newton, NonlinearSolveInfo, Picard, nonlinear_solve
from .tensor import PatternKey, SparseTensor, SparseTensorList, Tensor, from_package

__all__ = [
    "__version__", "format", "hookimpl", "nn",
    # errors and warnings
    "BackendError", "ConversionError", "DegenerateEigenvalueError", "FallbackWarning", "FormatError", "FormatParseError", "IndefiniteMatrixError",
    "InputError", "InteropError", "NoBackendError", "NotConvergedError", "NotConvergedWarning", "NotSymmetricError",
    "SingularMatrixError", "SparseTorchError", "SparseTorchWarning", "ValidationError",
    # formats and tensors
    "Dimension", "LevelFormat", "LevelProperty", "TensorFormat",
    "PatternKey", "SparseTensor", "SparseTensorList", "Tensor", "from_package",
    # operations
    "IterationResult", "LinearOperator",
    "Matmul", "SolveInfo", "Solver", "Status", "cond", "det", "eigs", "eigsh", "explain", "logdet", "Lstsq", "lstsq", "matmul",
    "NonlinearSolveInfo", "nonlinear_solve", "norm", "slogdet", "solve", "spgemm", "svds", "transpose",
    "is_hermitian", "is_positive_definite", "is_symmetric",
    # nonlinear methods (option records for nonlinear_solve(method=...))
    "Newton", "Anderson", "Picard",
    # dispatch
    "BackendInfo", "Decline", "Offer", "OperandInfo", "Request", "plan_cache", "registry",
    # caches
    "cache_info", "clear_caches",
]


def _torch_krylov() -> dict:
    """The torch backend's Krylov solvers, for ``solve`` on a matrix-free A (the ops layer may not
    import a backend: ops/operator.py); imported on first use, not with the package."""
    from .backends.torch_native.krylov import bicgstab, cg, gmres, minres

    return {"cg": cg, "minres": minres, "gmres": gmres, "bicgstab": bicgstab}


_register_krylov(_torch_krylov)
