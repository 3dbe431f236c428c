"""Operands on another device (a GPU), run on the host: offered only when the user allows
transfers, with the copies costed (``plugin.py``).

:class:`TransferPlan` wraps any of this backend's plans. Pattern work copies A's index buffers
to the host once (in the factory, cached with the plan); each ``set_values`` copies the values;
each call copies its dense operands (B, X, M, v0) to the host and the results back to A's device.
Everything else (factorizations, AMG hierarchies, adjoint solves for the backward pass) is the
host plan's, unchanged, so gradients are the same as for CPU operands.

Cost of the copies (added to the host plan's estimate): ``bytes / link_bandwidth + copies x
latency`` with ``link_bandwidth`` 10 GB/s (PCIe 4 x16 with pageable host memory; pinned memory
reaches ~25 GB/s) and 15 us per copy, overridable with ``backend_options`` ``link_bandwidth``
(bytes/s). Counted per call: A's values (they may be new), B in and X out; the index buffers
once per pattern (counted in every estimate: a request does not say whether a plan is cached).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sparsetorch import Request, SparseTensor

__all__ = ["TransferPlan", "transfer_seconds", "LINK_BANDWIDTH", "COPY_LATENCY", "allowed"]

LINK_BANDWIDTH = 10e9
COPY_LATENCY = 15e-6


def allowed(request: Request) -> bool:
    """Whether the user allows host/device copies: the core option ``allow_transfer`` (proposed)
    or, until the core has it, ``backend_options={"allow_transfer": True}``."""
    bo = request.option("backend_options") or {}
    return bool(request.option("allow_transfer") or bo.get("allow_transfer"))


def transfer_seconds(request: Request) -> tuple[float, float]:
    """(seconds, bytes) of the copies one call makes (see the module docstring)."""
    A = request.A
    vsize = torch.empty((), dtype=A.dtype).element_size()
    isize = 4 if getattr(A.format, "index_dtype", None) == torch.int32 else 8
    batch = max(1, int(torch.Size(A.batch_shape).numel())) if A.batch_shape else 1
    nse = A.nse or 0
    n = A.shape[-1]
    pattern = (nse + n + 1) * isize
    values = batch * nse * vsize
    dense = sum(2 * int(torch.Size(o.shape).numel()) * vsize for o in request.operands[1:] if o.kind == "dense")
    if not dense:  # Solver.plan() asks without B: one vector in and out
        dense = 2 * n * vsize * batch
    nbytes = float(pattern + values + dense)
    bo = request.option("backend_options") or {}
    bandwidth = float(bo.get("link_bandwidth") or LINK_BANDWIDTH)
    copies = 2 + 2 + len(request.operands)
    return nbytes / bandwidth + copies * COPY_LATENCY, nbytes


def _host(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to("cpu")


class TransferPlan:
    """A host plan for operands on ``device``: inputs copied to the host, results copied back."""

    def __init__(self, build: Callable[[SparseTensor, Request], Any], A: SparseTensor, request: Request) -> None:
        self.device = A.device
        self._inner = build(A.cpu(), request)  # the pattern's index buffers: once per plan

    # what the core reads ------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._inner.backend

    @property
    def method(self) -> str:
        return self._inner.method

    @property
    def preconditioner(self) -> Any:
        return getattr(self._inner, "preconditioner", None)

    def __getattr__(self, name: str) -> Any:  # counters and the like (factorizations, amg_reuse, ...)
        if name.startswith("_") or name == "inverse_entries":  # not wrapped: its results would stay on the host
            raise AttributeError(name)
        return getattr(self._inner, name)

    # the plan protocols ---------------------------------------------------------------------------
    def _back(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(self.device)

    def set_values(self, values: torch.Tensor) -> None:
        self._inner.set_values(_host(values))

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options: Any = None):
        X, res = self._inner.solve(_host(B), adjoint=adjoint, options=options)
        return self._back(X), res

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        return self._back(self._inner.apply(_host(X), adjoint=adjoint))

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options: Any = None):
        X, res = self._inner.lstsq(_host(B), adjoint=adjoint, options=options)
        return self._back(X), res

    def slogdet(self):
        sign, logabs = self._inner.slogdet()
        return self._back(sign), self._back(logabs)

    def eigsh(self, k: int, *, M: SparseTensor | None = None, v0: torch.Tensor | None = None, **kw: Any):
        w, V, res = self._inner.eigsh(k, M=None if M is None else M.cpu(), v0=_host(v0), **kw)
        return self._back(w), self._back(V), res

    def eigs(self, k: int, *, v0: torch.Tensor | None = None, **kw: Any):
        w, V, U, res = self._inner.eigs(k, v0=_host(v0), **kw)
        return self._back(w), self._back(V), self._back(U), res

    def __repr__(self) -> str:
        return f"TransferPlan({self._inner!r}, results on {self.device})"
