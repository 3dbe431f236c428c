"""Testing helpers for sparsetorch and its backend plugins.

The conformance kit (STYLE.md rules 11 and 12; the package :mod:`.conformance`): base classes a
backend's tests subclass, naming the backend (what its BackendInfo declares is the default of
methods, devices and dtypes) and the capability flags it does not declare; every parity test
runs against dense float64 oracles, errors included. Test matrices for it (and for anyone) live in :mod:`.problems`.

``import sparsetorch`` does not import this package (it needs pytest).
"""

from . import problems
from .conformance import (
    DIRECT_METHODS, REQUIREMENT_WORDS, ConformanceBase, EigsConformance, EigshConformance, ErrorConformance,
    LogdetConformance, MatmulConformance, SolveConformance, SymmetricFamily,
)
from .problems import (
    Problem, convection_diffusion, hermitian_pd, make_problem, poisson2d, random_nonsymmetric, random_rectangular,
    symmetric_indefinite,
)

__all__ = [
    "ConformanceBase", "SolveConformance", "MatmulConformance", "ErrorConformance", "EigshConformance",
    "EigsConformance", "LogdetConformance", "SymmetricFamily", "DIRECT_METHODS", "REQUIREMENT_WORDS",
    "problems", "Problem", "make_problem", "poisson2d", "symmetric_indefinite", "convection_diffusion", "hermitian_pd",
    "random_nonsymmetric", "random_rectangular",
]
