"""The one public namespace for backend authors.

A backend plugin imports from here and from the public API (``sparsetorch``,
``sparsetorch.format``, ``sparsetorch.testing``) only; every name below is part of the plugin
contract and keeps its meaning across minor versions. Modules under ``sparsetorch.dispatch``,
``sparsetorch.ops``, ``sparsetorch.tensor`` and ``sparsetorch.autograd`` are the core's own and may
change without notice.

What is here, by use:

- declaring a backend: :data:`hookimpl`, :class:`BackendInfo`, and the op and method names
  (:data:`OPS`, :data:`METHODS`, :data:`DIRECT_METHODS`);
- answering a request: :class:`Request`, :class:`OperandInfo`, :class:`Measured`,
  :class:`Offer`, :class:`Decline`;
- cost models: :func:`rates` / :class:`Rates` (this machine's measured bandwidth and flop rates),
  :func:`sparsity_dimension`, :func:`loglog_interp`;
- shared declines: :func:`cuda_matrix_decline`;
- plans that iterate: :class:`IterationResult`, :class:`Status`, :class:`Outcome`, :func:`combine`;
- accuracy: :func:`default_rtol`, :func:`unit_roundoff`;
- moving data into the plan's layout: :func:`conversion` / :class:`Conversion`;
- the errors a plan raises: :class:`SingularMatrixError`, :class:`IndefiniteMatrixError`,
  :class:`NotConvergedError`, :class:`InputError`, :class:`BackendError`.
"""

from __future__ import annotations

from ._markers import hookimpl
from .dispatch.calibrate import Rates, rates
from .dispatch.helpers import Outcome, combine, cuda_matrix_decline, loglog_interp, sparsity_dimension
from .dispatch.records import (
    DIRECT_METHODS, METHODS, OPS, BackendInfo, Decline, Measured, Offer, OperandInfo, Request,
)
from .errors import BackendError, IndefiniteMatrixError, InputError, NotConvergedError, SingularMatrixError
from .ops.accuracy import default_rtol, unit_roundoff
from .ops.info import IterationResult, Status
from .tensor.construct import Conversion, conversion

__all__ = [
    "hookimpl", "BackendInfo", "OPS", "METHODS", "DIRECT_METHODS",
    "Request", "OperandInfo", "Measured", "Offer", "Decline",
    "Rates", "rates", "sparsity_dimension", "loglog_interp", "cuda_matrix_decline",
    "IterationResult", "Status", "Outcome", "combine",
    "default_rtol", "unit_roundoff",
    "Conversion", "conversion",
    "BackendError", "IndefiniteMatrixError", "InputError", "NotConvergedError", "SingularMatrixError",
]
