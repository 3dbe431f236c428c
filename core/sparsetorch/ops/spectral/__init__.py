"""``eigsh`` (symmetric / Hermitian, generalized too) and ``eigs`` (general), through dispatch,
with adjoint gradients (Hellmann-Feynman for eigenvalues, a projected bordered solve for
eigenvectors; left/right eigenvectors for ``eigs``). docs/spectral.md has the contract and the math.

Layout: ``_eigsh.py`` and ``_eigs.py`` (the ops and their requests), ``_attempts.py`` (the fallback
driver: offers tried in the explain table's order until one returns pairs that pass the checks),
``_checks.py`` (input checks, the mass-matrix refusal, the residual check of the accuracy
contract), ``_bordered.py`` (the bordered system of the eigenvector adjoint). The adjoint rules
are in ``autograd/spectral.py``.
"""

from __future__ import annotations

from ._checks import MASS_FIX, check_mass_matrix
from ._eigs import eigs, eigs_request
from ._eigsh import eigsh, eigsh_request

__all__ = ["eigsh", "eigs", "eigsh_request", "eigs_request", "check_mass_matrix", "MASS_FIX"]
