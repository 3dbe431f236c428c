"""Pure-PyTorch Krylov solvers for the built-in torch backend.

Every solver has the signature ``x, info = solver(matvec, b, *, x0=None, rtol=1e-6, atol=0.0,
maxiter=None, M=None, check_every=8, callback=None)`` (``gmres`` adds ``restart=30``) and works
on ``(*batch, n, k)`` tensors in which every (batch, column) pair is an independent system. They
stay on the device between convergence checks, never raise on non-convergence, and return an
:class:`~sparsetorch.IterationResult` whose status says how they stopped.

- :func:`cg` -- Hermitian positive definite A (reports INDEFINITE otherwise).
- :func:`minres` -- Hermitian A, definite or not.
- :func:`gmres` -- any square A, restarted, right-preconditioned.
- :func:`bicgstab` -- any square A, short recurrences (two matvecs per iteration).
- preconditioners: :func:`identity`, :func:`jacobi`, :func:`block_jacobi`.
"""

from .bicgstab import bicgstab
from .cg import cg
from .gmres import gmres
from .minres import minres
from .precond import BlockJacobi, Identity, Jacobi, block_jacobi, identity, jacobi

__all__ = [
    "cg", "minres", "gmres", "bicgstab",
    "identity", "jacobi", "block_jacobi", "Identity", "Jacobi", "BlockJacobi",
]
