"""Deprecated alias of :mod:`sparsetorch_scipy.spectral` (the eigenvalue plans), kept for code that
imported them from here: in sparsetorch "eigen" names only the Eigen C++ library
(``sparsetorch-eigen``). Importing it warns (:class:`DeprecationWarning`); it will be removed."""

from __future__ import annotations

import warnings

from .eigs import EigsPlan
from .spectral import EIGS_WHICH, EIGSH_WHICH, LOBPCG_MAXITER, EigshPlan

__all__ = ["EigshPlan", "EigsPlan", "EIGSH_WHICH", "EIGS_WHICH", "LOBPCG_MAXITER"]

warnings.warn("sparsetorch_scipy.eigen is deprecated: import from sparsetorch_scipy.spectral", DeprecationWarning,
              stacklevel=2)
