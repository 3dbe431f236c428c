"""The plugin's hook implementations: the distributed backend describes itself to the registry.

The core's one-process ops (``sparsetorch.solve`` on a SparseTensor) are not this backend's to
answer: it declares no single-process op, so dispatch never asks it, and ``sparsetorch info``
lists it with what it provides. Distributed operands go through this package's own entry points
(``sparsetorch_distributed.solve`` / ``eigsh`` / ``nonlinear_solve`` / ``DSparseTensor @ x``), which dispatch the
*local* work (the block-Jacobi block solves) through ``sparsetorch.Solver`` on each rank.
"""

from __future__ import annotations

import torch

import sparsetorch
from sparsetorch.backend import BackendInfo, Decline, Offer, Request

from . import __version__

NAME = "distributed"


@sparsetorch.hookimpl
def sparsetorch_backend_info() -> BackendInfo:
    try:
        import torch.distributed as dist

        missing = {} if dist.is_available() else {"torch.distributed": "this torch build has no torch.distributed"}
    except ImportError:  # pragma: no cover
        missing = {"torch.distributed": "not importable"}
    return BackendInfo(
        name=NAME,
        version=__version__,
        description=("distributed: row-partitioned DSparseTensor over torch.distributed (gloo/NCCL); CG, BiCGStab, "
                     "GMRES, MINRES with block-Jacobi (multi-column blocks), block-Lanczos eigsh, Newton-Krylov "
                     "nonlinear_solve, adjoint gradients; call sparsetorch_distributed.solve/eigsh/nonlinear_solve"),
        devices=("cpu", "cuda"),
        dtypes=(torch.float32, torch.float64),
        ops={},
        missing=missing,
        options=(),  # reads no backend_options (local solves take theirs through local_options)
    )


@sparsetorch.hookimpl
def sparsetorch_offers(request: Request) -> list[Offer | Decline]:
    return []  # declares no single-process op (see the module docstring)
