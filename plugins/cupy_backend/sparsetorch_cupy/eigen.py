"""Deprecated alias of :mod:`sparsetorch_cupy.spectral` (the Lanczos plan), kept for code that
imported it from here: in sparsetorch "eigen" names only the Eigen C++ library
(``sparsetorch-eigen``). Importing it warns (:class:`DeprecationWarning`); it will be removed."""

from __future__ import annotations

import warnings

from .spectral import WHICH, LanczosPlan

__all__ = ["LanczosPlan", "WHICH"]

warnings.warn("sparsetorch_cupy.eigen is deprecated: import from sparsetorch_cupy.spectral", DeprecationWarning,
              stacklevel=2)
