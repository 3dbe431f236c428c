"""Preconditioners applied rank by rank (no communication): Jacobi and block Jacobi.

``block_jacobi``: the rank's diagonal block ``A[owned, owned]`` solved by ``sparsetorch.Solver``,
i.e. by whatever backend dispatch picks on that rank (SciPy/Eigen LU or Cholesky on the CPU,
cuDSS on a GPU...); ``local_options`` go to the Solver. Local AMG (PyAMG through the SciPy
plugin): ``{"method": "amg", "maxiter": 2, "rtol": 1e-300, "on_nonconvergence": "ignore"}`` is a
fixed number of V-cycles, a fixed symmetric operator that CG can use; ``{"method": "amg",
"rtol": 1e-2}`` is an inexact solve that changes from one application to the next: use GMRES,
which is flexible here (it keeps the preconditioned vectors), not CG. The factorization is
made once per set of values and cached on the DSparseTensor; the transposed block (adjoint solves
of a nonsymmetric matrix) is a second Solver, made when first needed.
"""

from __future__ import annotations

from typing import Callable

import torch

import sparsetorch as st

__all__ = ["make_preconditioner", "PRECONDITIONERS"]

PRECONDITIONERS = ("block_jacobi", "jacobi", None)


def _values_key(A, values: torch.Tensor) -> tuple:
    return (values.data_ptr(), values._version, tuple(values.shape))


def make_preconditioner(A, values: torch.Tensor, kind, *, transpose: bool, local_options: dict | None):
    """A local ``r -> M^-1 r`` (1-D local vectors) for one matrix's ``values``, or None."""
    if kind is None or kind == "none":
        return None
    if callable(kind):
        return kind
    cache = A.pattern.cache
    key = (kind, transpose, _values_key(A, values), tuple(sorted((local_options or {}).items())))
    hit = cache.get("precond")
    if hit is not None and hit[0] == key:
        return hit[1]
    if kind == "jacobi":
        d = A.with_values(values).diagonal()
        if bool((d == 0).any()):
            row = int(torch.nonzero(d == 0)[0])
            raise st.SingularMatrixError(f"jacobi preconditioner: the diagonal entry of local row {row} (global "
                                         f"{int(A.owned_rows()[row])}) is zero on rank {A.comm.rank}; use "
                                         f"preconditioner='block_jacobi' or None", row=row)
        inv = 1.0 / d
        fn: Callable = lambda r: (inv if r.dim() == 1 else inv[:, None]) * r  # noqa: E731  (a vector or a block)
    elif kind == "block_jacobi":
        block = A.local_block(values.detach())
        if transpose:
            rows, cols = block.entries()[0]
            block = st.SparseTensor.from_coo(block.coordinates()[1], cols, rows, shape=block.shape, format=st.format.CSR)
        if A.n_local == 0:
            fn = lambda r: r  # noqa: E731
        else:
            solver = st.Solver(block, **(local_options or {}))
            solver.factorize()

            def fn(r: torch.Tensor, solver=solver) -> torch.Tensor:
                return solver.solve(r)

            fn.solver = solver  # the rank's local sparsetorch.Solver (what dispatch chose: solver.explain())
    else:
        raise st.InputError(f"unknown preconditioner {kind!r}; choose 'block_jacobi', 'jacobi', None or a callable")
    cache["precond"] = (key, fn)
    return fn
