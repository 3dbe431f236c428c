"""Deprecated alias of :mod:`sparsetorch.ops.spectral`, kept for code that imported the eigenvalue
ops from here ("eigen" now names only the Eigen C++ library of ``plugins/eigen_backend``).

Importing it warns (:class:`DeprecationWarning`); it will be removed. Use ``sparsetorch.eigsh`` /
``sparsetorch.eigs``; a backend plugin that needs :data:`MASS_FIX` imports it from
``sparsetorch.ops.spectral`` until ``sparsetorch.backend`` re-exports it.
"""

from __future__ import annotations

import warnings

from .spectral import MASS_FIX, check_mass_matrix, eigs, eigs_request, eigsh, eigsh_request

__all__ = ["eigsh", "eigs", "eigsh_request", "eigs_request", "check_mass_matrix", "MASS_FIX"]

warnings.warn("sparsetorch.ops.eigen is deprecated: import from sparsetorch.ops.spectral (or use sparsetorch.eigsh / "
              "sparsetorch.eigs)", DeprecationWarning, stacklevel=2)
