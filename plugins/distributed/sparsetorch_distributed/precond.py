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
    from .pattern import version_of
    from .tensor import op_epoch

    version = version_of(values)
    if version == -1 and values.is_inference():
        # values made in inference mode keep no version counter (reading it raised; session 29's sweep): a write
        # into them would go unseen, so their factorization lasts one op call (the solve that made it)
        return (values.data_ptr(), "inference", op_epoch(), tuple(values.shape))
    return (values.data_ptr(), version, tuple(values.shape))


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
        if isinstance(hit[1], BaseException):
            raise hit[1]  # the same values failed before: no second factorization
        return hit[1]
    try:
        fn = _make(A, values, kind, transpose=transpose, local_options=local_options)
    except st.SingularMatrixError as exc:
        cache["precond"] = (key, exc)
        raise
    cache["precond"] = (key, fn)
    return fn


#: what the message of a preconditioner's SingularMatrixError says when A itself is singular (a zero row): the
#: solve raises it instead of running without the preconditioner (the agreed error reaches the other ranks as
#: its class and text)
A_SINGULAR = "A itself is singular"


def _zero_rows(A, values: torch.Tensor) -> None:
    """Raise when one of this rank's rows of A stores only zeros (A is singular, whatever the preconditioner)."""
    if not A.n_local:
        return
    sums = torch.zeros(A.n_local, dtype=values.abs().dtype, device=values.device).index_add_(
        0, A.pattern.slot_rows().to(values.device), values.detach().abs())
    zero = sums == 0
    if bool(zero.any()):
        row = int(torch.nonzero(zero)[0, 0])
        raise st.SingularMatrixError(
            f"{A_SINGULAR}: row {int(A.owned_rows()[row])} (local row {row} on rank {A.comm.rank}; {int(zero.sum())} "
            f"such rows there) has no nonzero entry; check the assembly (a missing equation or boundary condition)",
            row=row)


def _make(A, values: torch.Tensor, kind, *, transpose: bool, local_options: dict | None):
    if not transpose:
        _zero_rows(A, values)
    if kind == "jacobi":
        # (the values are this rank's own and already checked by the solve's agreement)
        d = type(A)(A.pattern, values).diagonal()
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
            try:
                coo = block.entries()[0]
                empty = (torch.bincount(coo[0].to(torch.int64), minlength=A.n_local) == 0) | \
                    (torch.bincount(coo[1].to(torch.int64), minlength=A.n_local) == 0)
                if bool(empty.any()):
                    # a row whose entries all lie in other ranks' columns: the block is singular, the local
                    # solver would find out only when first applied (inside the Krylov loop)
                    row = int(torch.nonzero(empty)[0, 0])
                    raise st.SingularMatrixError(f"local row or column {row} of the block has no entry "
                                                 f"({int(empty.sum())} such)", row=row)
                solver.factorize()
            except st.SingularMatrixError as exc:
                row = getattr(exc, "row", None)
                where = "" if row is None or not 0 <= row < A.n_local else \
                    f" (at its local row {row}, global row {int(A.owned_rows()[row])})"
                raise st.SingularMatrixError(
                    f"block_jacobi preconditioner: rank {A.comm.rank}'s diagonal block A[owned, owned] "
                    f"({A.n_local} x {A.n_local}) is singular{where}; A itself need not be (a row whose entries all lie "
                    f"in other ranks' columns, or a block of an indefinite matrix): pass preconditioner=None or "
                    f"'jacobi', or partition the rows otherwise (partition='metis' / 'spectral'). Local solver: {exc}",
                    row=row) from exc

            def fn(r: torch.Tensor, solver=solver) -> torch.Tensor:
                return solver.solve(r)

            fn.solver = solver  # the rank's local sparsetorch.Solver (what dispatch chose: solver.explain())
    else:
        raise st.InputError(f"unknown preconditioner {kind!r}; choose 'block_jacobi', 'jacobi', None or a callable")
    return fn
