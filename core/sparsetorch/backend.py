"""The one public namespace for backend authors.

A backend plugin imports from here and from the public API (``sparsetorch``,
``sparsetorch.format``, ``sparsetorch.testing``) only; every name below is part of the plugin
contract and keeps its meaning across minor versions. Modules under ``sparsetorch.dispatch``,
``sparsetorch.ops``, ``sparsetorch.tensor``, ``sparsetorch.autograd`` and ``sparsetorch.backends``
are the core's own and may change without notice (``tests/test_plugin_imports.py`` fails when an
in-tree plugin imports one). A plugin states the oldest core it runs on in its pyproject
``dependencies`` (``sparsetorch>=0.1``); docs/backend-authors.md walks through all of it.

What is here, by use:

- declaring a backend: :data:`hookimpl`, :class:`BackendInfo`, and the op and method names
  (:data:`OPS`, :data:`METHODS`, :data:`DIRECT_METHODS`);
- answering a request: :class:`Request` (op, operands, properties, options) and its
  :class:`OperandInfo` records, :class:`Measured` (what earlier calls on the pattern measured),
  :class:`Offer`, :class:`Decline`;
- what a call asked for: :class:`SolveOptions` (``request.options`` of a solve),
  :class:`MatmulOptions`, :class:`SpectralOptions` (eigsh, eigs), :class:`LstsqOptions`,
  :class:`LogdetOptions` (the other ops' records; :func:`defaults` lists a record's defaults) and
  :class:`CallOptions` (the per-call part, the ``options`` argument of ``plan.solve``), all
  read-only mappings of their fields; :data:`DEFAULT_RESTART`, :data:`DEFAULT_CHECK_EVERY` (the
  shared defaults of fields left None);
- what a plan is: the typed protocols :class:`Plan`, :class:`SolvePlan`, :class:`MatmulPlan`,
  :class:`LstsqPlan`, :class:`EigshPlan`, :class:`EigsPlan`, :class:`LogdetPlan`,
  :class:`SolveListPlan` and the optional capabilities :class:`InverseEntries`,
  :class:`SampledProduct`, :class:`CheapReload`, :class:`Bindable`;
- cost models: :func:`rates` / :class:`Rates` (this machine's measured bandwidth, flop and launch
  rates), :func:`calibrate` (measure them again, e.g. in a benchmark), :func:`sparsity_dimension`,
  :func:`fill_dimension` (the dimension a direct solver's fill tables are read at, up to
  :data:`FILL_DIMENSION_MAX` for graphs that grow like expanders), :func:`lu_fill_flops` (a sparse
  LU's factor entries and work from the shared tables :data:`LU_FILL` / :data:`LU_FLOPS`),
  :func:`loglog_interp`, and the byte counts :func:`itemsize`, :func:`index_size`,
  :func:`batch_size`;
- declines every backend makes the same way, with the reasons users already know:
  :func:`cuda_matrix_decline`, :func:`cpu_matrix_decline`, :func:`dtype_name`,
  :func:`conversion_note` (the note of an offer that converts A's format), :func:`hermitian`,
  :func:`spd_ok` (the rule for methods that need SPD);
- plans that iterate: :class:`IterationResult`, :class:`Status`, :class:`Outcome` /
  :func:`combine` (one result from per-system outcomes), :func:`trivial_system` (NaN/Inf and
  ``b == 0`` answered before iterating), :func:`maxiter_reason`, :func:`true_residual_solve` with
  :class:`Run` (restart an inner Krylov solver until the true residual meets the tolerance), and
  :func:`to_real` / :func:`from_real` / :func:`realified_matvec` (a Hermitian system as a real
  symmetric one of twice the size, for real-only MINRES);
- accuracy: :func:`default_rtol`, :func:`unit_roundoff`, :func:`backward_error_bound`;
- gradients computed outside autograd (a backward pass of solves under ``no_grad``): :func:`first_order_only`
  makes differentiating them again raise a clear error instead of reading them as constants, and
  :func:`first_order_in` does so only along the inputs they held constant;
- moving data into the plan's layout: :func:`conversion` / :class:`Conversion`;
- the errors a plan raises: :class:`SingularMatrixError`, :class:`IndefiniteMatrixError`,
  :class:`NotConvergedError`, :class:`InputError`, :class:`BackendError`; :data:`MASS_FIX`, the
  advice every refusal of a non-SPD mass matrix ``M`` (generalized ``eigsh``) ends with;
- tests and benchmarks that register a plugin in-process (a source checkout without its entry
  point): :func:`get_backends` (the process's backend manager: ``.register(module, name)``,
  ``.names``) and :func:`reset_backends` (back to the entry points), :func:`plan_cache` (the
  cached plans, ``.entries()`` and ``.clear()``).
"""

from __future__ import annotations

from ._markers import hookimpl
from .autograd._first_order import first_order_in, first_order_only
from .dispatch.accuracy import backward_error_bound, default_rtol, unit_roundoff
from .dispatch.plan import plan_cache
from .dispatch.calibrate import Rates, calibrate, rates
from .dispatch.helpers import (
    COLAMD_FILL, COLAMD_FLOPS, FILL_DIMENSION_MAX, LU_FILL, LU_FLOPS, Outcome, combine, cuda_matrix_decline, fill_dimension, loglog_interp,
    lu_fill_flops, sparsity_dimension, SYMMETRIC_MODE_WEAK_MAX, weak_diagonal_fraction,
)
from .dispatch.kit import (
    Run, batch_size, conversion_note, cpu_matrix_decline, dtype_name, from_real, hermitian, index_size, itemsize,
    maxiter_reason, realified_matvec, spd_ok, to_real, trivial_system, true_residual_solve,
)
from .dispatch.select import get_backends, reset_backends
from .dispatch.hookspecs import CONVERSION_KERNELS
from .dispatch.options import (DEFAULT_CHECK_EVERY, DEFAULT_RESTART, CallOptions, LogdetOptions, LstsqOptions,
                               MatmulOptions, SolveOptions, SpectralOptions, defaults)
from .dispatch.plans import (
    Bindable, CheapReload, EigsPlan, EigshPlan, InverseEntries, LogdetPlan, LstsqPlan, MatmulPlan, Plan, SampledProduct, SolveListPlan,
    SolvePlan, supports,
)
from .dispatch.records import (
    DIRECT_METHODS, METHODS, OPS, BackendInfo, Decline, Measured, Offer, OperandInfo, Request, preconditioner_name,
)
from .dispatch.results import IterationResult, Status
from .errors import BackendError, IndefiniteMatrixError, InputError, NotConvergedError, SingularMatrixError
from .ops.spectral import MASS_FIX
from .tensor.construct import Conversion, conversion
from .backends.torch_native.cost import iterations as cg_iterations
from .backends.torch_native.krylov._graph import BlockGraph, usable as graph_usable

__all__ = [
    "hookimpl", "BackendInfo", "OPS", "METHODS", "DIRECT_METHODS",
    "Request", "OperandInfo", "Measured", "Offer", "Decline",
    "SolveOptions", "CallOptions", "MatmulOptions", "SpectralOptions", "LstsqOptions", "LogdetOptions", "defaults",
    "DEFAULT_RESTART", "DEFAULT_CHECK_EVERY",
    "Plan", "SolvePlan", "MatmulPlan", "LstsqPlan", "EigshPlan", "EigsPlan", "LogdetPlan", "SolveListPlan",
    "InverseEntries", "SampledProduct", "CheapReload", "Bindable", "supports",
    "preconditioner_name",
    "Rates", "rates", "calibrate", "sparsity_dimension", "fill_dimension", "FILL_DIMENSION_MAX", "lu_fill_flops", "LU_FILL",
    "weak_diagonal_fraction", "SYMMETRIC_MODE_WEAK_MAX",
    "LU_FLOPS", "COLAMD_FILL", "COLAMD_FLOPS", "loglog_interp", "itemsize", "index_size", "batch_size",
    "cuda_matrix_decline", "cpu_matrix_decline", "dtype_name", "conversion_note", "hermitian", "spd_ok",
    "IterationResult", "Status", "Outcome", "combine", "trivial_system", "maxiter_reason", "Run",
    "true_residual_solve", "to_real", "from_real", "realified_matvec",
    "default_rtol", "unit_roundoff", "backward_error_bound", "first_order_only", "first_order_in",
    "Conversion", "conversion",
    "BackendError", "IndefiniteMatrixError", "InputError", "NotConvergedError", "SingularMatrixError", "MASS_FIX",
    "get_backends", "reset_backends", "plan_cache", "CONVERSION_KERNELS",
    "cg_iterations", "BlockGraph", "graph_usable",
]
