"""Dense fallback for small systems: LU (or Cholesky for SPD) of ``A.to_dense()``.

Cheaper than any iterative method below a few thousand unknowns, exact to rounding, and it
solves adjoint systems from the same factors (``lu_solve(adjoint=True)``).
"""

from __future__ import annotations

import torch

from ...errors import IndefiniteMatrixError, NotSymmetricError, SingularMatrixError
from ...dispatch.results import IterationResult, Status
from ...tensor import SparseTensor

__all__ = ["DenseLUPlan", "DenseLstsqPlan"]


class DenseLUPlan:
    backend = "torch"
    preconditioner = None

    def __init__(self, A: SparseTensor, *, cholesky: bool = False) -> None:
        self.method = "cholesky" if cholesky else "lu"
        self._A = A
        self._cholesky = cholesky
        self._factors = None

    def set_values(self, values: torch.Tensor) -> None:
        dense = self._A.with_values(values.detach()).to_dense()
        if self._cholesky:
            _check_hermitian(dense)
            L, info = torch.linalg.cholesky_ex(dense)
            bad = _first_bad(info)
            if bad is not None:
                raise IndefiniteMatrixError(
                    f"Cholesky failed at row {bad}: the matrix is not positive definite; "
                    f"use method='lu' (or 'minres' if it is symmetric indefinite)"
                )
            self._factors = (L,)
        else:
            LU, piv, info = torch.linalg.lu_factor_ex(dense)
            # Singular means an exactly zero (or non-finite) pivot. A pivot that is merely small
            # relative to max |A| is what a badly scaled but nonsingular matrix gives (rows in
            # different units): its answer is judged by the core's residual and backward-error
            # check, which refines it or falls back, not by the pivot's size.
            diag = LU.diagonal(dim1=-2, dim2=-1)
            bad = (diag == 0) | ~torch.isfinite(diag)
            if bool(bad.any()) or _first_bad(info) is not None:
                row = int(torch.nonzero(bad.reshape(-1, bad.shape[-1]).any(0))[0, 0]) if bool(bad.any()) else _first_bad(info)
                raise SingularMatrixError(
                    f"the matrix is singular: LU (partial pivoting) met a zero pivot at column {row}; check the system "
                    f"(boundary conditions, a zero row or column) or use a least-squares method",
                    row=row,
                )
            self._factors = (LU, piv)

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, IterationResult]:
        if self._cholesky:
            (L,) = self._factors
            X = torch.cholesky_solve(B, L)  # A is Hermitian: A^H = A
        else:
            LU, piv = self._factors
            X = torch.linalg.lu_solve(LU, piv, B, adjoint=adjoint)
        return X, IterationResult(0, float("nan"), True, Status.DIRECT, "dense factorization")


#: the relative difference between an entry and its conjugate transpose's below which a matrix given to a
#: Cholesky counts as Hermitian (assembly rounding; the refinement answers the rest)
HERMITIAN_RTOL = 1e-4


def _check_hermitian(dense: torch.Tensor) -> None:
    """Raise :class:`NotSymmetricError` where ``dense`` is not Hermitian beyond assembly rounding: Cholesky
    reads one triangle and factors another matrix without an error (a complex symmetric A tagged ``spd``
    came out as "singular to working precision" from the residual check). O(n^2) beside the O(n^3)
    factorization. A pair passes within ``max(sqrt(eps), 1e-4)`` of the larger entry (or 100 eps max|A|): a
    matrix assembled in single precision and solved in double differs from its transpose by ~1e-7, and the
    Cholesky of its lower triangle plus the core's refinement answers it (a sqrt(eps) bound refused it)."""
    if dense.numel() == 0:
        return
    t = dense.mH
    eps = torch.finfo(dense.real.dtype if dense.is_complex() else dense.dtype).eps
    a2, t2 = dense.abs().square(), t.abs().square()
    bound = max(eps, HERMITIAN_RTOL ** 2) * torch.maximum(a2, t2) + (100 * eps) ** 2 * a2.amax(dim=(-2, -1), keepdim=True)
    bad = (dense - t).abs().square() > bound
    if not bool(bad.any()):
        return
    where = torch.nonzero(bad)[0].tolist()
    i, j = where[-2], where[-1]
    member = f" (member {tuple(where[:-2])} of the value batch)" if len(where) > 2 else ""
    sym = dense.is_complex() and bool(((dense - dense.mT).abs().square() <= bound).all())
    what = ("a complex symmetric matrix (A == A^T), not Hermitian (A == A^H)" if sym
            else "not symmetric (Hermitian)")
    raise NotSymmetricError(
        f"Cholesky needs a Hermitian positive definite matrix; A is {what}: A[{i}, {j}] = {dense[(*where[:-2], i, j)].item()} "
        f"but conj(A[{j}, {i}]) = {t[(*where[:-2], i, j)].item()}{member}. Use method='lu' (check the properties= tag: "
        f"'spd' says A == A^H)")


def _first_bad(info: torch.Tensor) -> int | None:
    if bool((info != 0).any()):
        return int(info[info != 0].reshape(-1)[0]) - 1
    return None


class DenseLstsqPlan:
    """Least squares on the dense matrix by a thin SVD (torch.linalg.svd, CPU or GPU).

    The answer is the minimum-norm least-squares solution ``X = A^+ B``, or with ``damp`` the regularized one
    ``V diag(s / (s^2 + damp^2)) U^H B``; the adjoint problem (``A^H X = B``) reads the same factors. Backward
    stable, any shape and rank, value batches; the SVD is paid once per set of values (twice where the scaled
    one is rank deficient, or for ``damp``). The numerical rank drops singular values below ``max(m, n) eps
    s_max`` (NumPy's ``lstsq`` rule) of the matrix factored: of A with unit-norm columns (rows) where that has
    full rank, so that a column 1e-20 the size of the others is a column, not rounding (NumPy drops it).

    A of full column rank (m >= n) is factored with its columns scaled to unit norm (powers of two), one of
    full row rank (m < n) with its rows: the answer is the same (unique, or the minimum-norm one of a
    consistent system) and, as a Householder QR's, backward stable column by column, so that a column 1e-6
    the size of another keeps its digits (an SVD of A itself is stable only in ``||A||``: columns scaled
    1e-6..1e6 came back 100 % off in the small ones). Where the scaled matrix is rank deficient, and for
    ``damp``, the SVD of A itself answers (the minimum-norm solution is not invariant under scaling).

    The hand-over when a Krylov method does not converge and no sparse QR is installed (impcol_a, cond 1.4e8:
    SciPy's LSQR stopped at its iteration limit and the core + SciPy install had nothing else)."""

    backend = "torch"
    method = "dense"
    preconditioner = None

    def __init__(self, A: SparseTensor) -> None:
        self._A = A
        self.m, self.n = A.format_shape
        self._dense = None
        self._scaled = None  # (U, S, Vh, kept, row scale, column scale) or None: use the plain SVD
        self._plain = None

    def set_values(self, values: torch.Tensor) -> None:
        dense = self._A.with_values(values.detach()).to_dense()
        self._dense, self._plain, self._scaled = dense, None, None
        full = min(self.m, self.n)
        if not full:
            return
        tall = self.m >= self.n
        norms = torch.linalg.vector_norm(dense, dim=-2 if tall else -1)
        ok = norms > 0
        scale = torch.where(ok, torch.exp2(-torch.round(torch.log2(torch.where(ok, norms, torch.ones_like(norms))))),
                            torch.ones_like(norms)).to(dense.dtype)
        svd = self._svd(dense * scale.unsqueeze(-2) if tall else dense * scale.unsqueeze(-1))
        if bool(svd[3].all()):  # full rank once scaled: the same solution, column- (row-) wise stable
            ones = torch.ones(*scale.shape[:-1], self.m if tall else self.n, dtype=dense.dtype, device=dense.device)
            self._scaled = svd + ((ones, scale) if tall else (scale, ones))
        else:  # rank deficient: the minimum-norm solution, from the SVD of A itself
            self._plain = self._svd(dense)

    def _svd(self, dense: torch.Tensor) -> tuple:
        U, S, Vh = torch.linalg.svd(dense, full_matrices=False)
        eps = torch.finfo(S.dtype).eps
        return U, S, Vh, S > S[..., :1] * (max(self.m, self.n) * eps)

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options=None) -> tuple[torch.Tensor, IterationResult]:
        if self._dense is None:
            raise RuntimeError("torch/dense: lstsq() before set_values()")
        damp = float((options or {}).get("damp") or 0.0)
        B = B.to(self._dense.dtype)
        if not min(self.m, self.n):
            rows = self.m if adjoint else self.n
            return B.new_zeros(*B.shape[:-2], rows, B.shape[-1]), IterationResult(0, float("nan"), True, Status.DIRECT,
                                                                                  "empty matrix")
        if self._scaled is not None and not damp:
            U, S, Vh, kept, dr, dc = self._scaled
            how = "columns" if self.m >= self.n else "rows"
        else:
            if self._plain is None:
                self._plain = self._svd(self._dense)
            U, S, Vh, kept = self._plain
            dr = dc = None
            how = None
        if damp:
            inv = S / (S * S + damp * damp)
        else:
            inv = torch.where(kept, 1.0 / torch.where(kept, S, torch.ones_like(S)), torch.zeros_like(S))
        inv = inv.to(U.dtype).unsqueeze(-1)
        # A = Dr^-1 (U S V^H) Dc^-1: A's solution Dc (Dr A Dc)^+ Dr B, A^H's Dr (Dr A Dc)^+H Dc B (full rank)
        left, right = (dc, dr) if not adjoint else (dr, dc)
        if right is not None:
            B = B * right.unsqueeze(-1)
        X = U @ (inv * (Vh @ B)) if adjoint else Vh.mH @ (inv * (U.mH @ B))
        if left is not None:
            X = X * left.unsqueeze(-1)
        rank = int(kept.sum(-1).min())
        note = (f"dense SVD least squares (numerical rank {rank} of min(m, n) = {min(self.m, self.n)}"
                + (f", factored with unit-norm {how}" if how else "") + (f", damp {damp:g})" if damp else ")"))
        return X, IterationResult(0, float("nan"), True, Status.DIRECT, note)
