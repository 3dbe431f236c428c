"""Deprecated alias of :mod:`sparsetorch_distributed.spectral` (distributed ``eigsh``), kept for
code that imported it from here: in sparsetorch "eigen" names only the Eigen C++ library
(``sparsetorch-eigen``). Importing it warns (:class:`DeprecationWarning`); it will be removed.
``sparsetorch_distributed.eigsh`` is the public spelling."""

from __future__ import annotations

import warnings

from .spectral import DEigshInfo, eigsh

__all__ = ["eigsh", "DEigshInfo"]

warnings.warn("sparsetorch_distributed.eigen is deprecated: import from sparsetorch_distributed.spectral (or use "
              "sparsetorch_distributed.eigsh)", DeprecationWarning, stacklevel=2)
