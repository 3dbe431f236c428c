"""sparsetorch over torch.distributed: row-partitioned sparse matrices and differentiable solves.

::

    import sparsetorch_distributed as sd
    comm = sd.init()                                   # gloo on CPU, NCCL on GPU (torchrun env)
    A = sd.DSparseTensor.from_local_rows(rows, cols, vals, (N, N))   # this rank's rows only
    x = sd.solve(A, b_local)                           # distributed Krylov, adjoint gradients
    loss = sd.dot(w_local, x, comm); loss.backward()   # on every rank

See ``docs/distributed.md`` for the model (ownership, halos, the autograd contract, failures).
"""

from __future__ import annotations

from .comm import Comm, free_port, init
from .errors import CommTimeoutError, DistributedError, MismatchError
from .spectral import DEigshInfo, eigsh
from .exchange import ExchangePlan, halo_exchange
from .nonlinear import DNonlinearInfo, nonlinear_solve
from .ops import dot, global_sum, matmul, norm
from .partition import contiguous_offsets, edge_cut, graph_parts, rcb_parts, spectral_parts
from .solve import DSolveInfo, is_symmetric, solve
from .tensor import DSparseTensor, DSparseTensorList, pattern_cache_clear

__version__ = "0.1.0"

__all__ = [
    "Comm", "init", "free_port",
    "DistributedError", "MismatchError", "CommTimeoutError",
    "DSparseTensor", "DSparseTensorList", "pattern_cache_clear",
    "ExchangePlan", "halo_exchange",
    "matmul", "dot", "norm", "global_sum",
    "solve", "DSolveInfo", "is_symmetric", "eigsh", "DEigshInfo",
    "nonlinear_solve", "DNonlinearInfo",
    "contiguous_offsets", "rcb_parts", "spectral_parts", "graph_parts", "edge_cut",
    "__version__",
]
