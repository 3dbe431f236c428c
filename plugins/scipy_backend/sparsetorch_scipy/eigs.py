"""``EigsPlan``: eigenvalues of a general square A through ARPACK (``scipy.sparse.linalg.eigs``),
ordered by ``which``; shift-invert for ``sigma``. The shared pieces (the member matrices, the
operation counter and its deadline, shift-invert operators, Rayleigh-Ritz, residuals) live in
:mod:`.spectral`, with ``EigshPlan``."""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import InputError, IterationResult, SingularMatrixError, SparseTensor, Status

from ._convert import Handoff
from .spectral import EIGS_WHICH, OutOfBudget, _counting, _deadline, _member_matrices, _residual, _v0, _where

__all__ = ["EigsPlan"]

class EigsPlan:
    """A few eigenpairs of a general square sparse matrix with ARPACK, left vectors on request."""

    method = "arpack"
    preconditioner = None

    def __init__(self, A: SparseTensor, options: Mapping[str, Any], *, backend: str = "scipy") -> None:
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/arpack needs a square matrix, got {m}x{n}")
        self.backend, self.n = backend, int(n)
        self._h = Handoff(A)
        self._mats: list[Any] | None = None

    def set_values(self, values: torch.Tensor) -> None:
        self._mats = None
        self._mats = _member_matrices(self._h, values)

    def eigs(self, k: int, *, which: str = "LM", sigma: complex | None = None, tol: float = 0.0,
             maxiter: int | None = None, v0: torch.Tensor | None = None, left: bool = False,
             budget: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, IterationResult]:
        from scipy.sparse.linalg import ArpackNoConvergence, eigs

        if self._mats is None:
            raise RuntimeError(f"{self.backend}/arpack: eigs() before set_values()")
        if which not in EIGS_WHICH:
            raise InputError(f"{self.backend}/arpack: which={which!r}; use one of {EIGS_WHICH}")
        ws, Vs, Us, its, worst, failed = [], [], [], 0, 0.0, []
        cdtype = np.result_type(self._mats[0].dtype, np.complex64)
        deadline = _deadline(budget)
        for i, A in enumerate(self._mats):
            count = [0]
            x0 = _v0(v0, i, self.n, A.dtype)
            # ARPACK's real mode reads LI/SI as |Im|: run those on the complex matrix (signed imaginary parts).
            # A complex sigma on a real A likewise: the real mode's operator Re[(A - sigma I)^-1] treats sigma and
            # conj(sigma) alike, and returned an eigenvalue near conj(sigma) (distance 1.01) in place of the third
            # nearest one (0.109; session 20's sweep)
            complex_shift = sigma is not None and complex(sigma).imag != 0
            Aw = A.astype(cdtype) if ((which in ("LI", "SI") or complex_shift) and not np.iscomplexobj(A.data)) else A
            if x0 is not None:
                x0 = x0.astype(Aw.dtype)
            try:
                if sigma is not None or which == "SM":
                    # shift-invert (SciPy factors A - sigma I; complex sigma on real A included); SM without
                    # sigma: at 0, where regular-mode ARPACK converges slowly or not at all
                    shift = 0.0 if sigma is None else sigma
                    try:
                        w, V = eigs(Aw.tocsc(), k=k, sigma=shift, which="LM" if sigma is None else which, tol=tol,
                                    maxiter=maxiter, v0=x0)
                    except RuntimeError as exc:
                        if sigma is not None or "singular" not in str(exc).lower():
                            raise
                        w, V = eigs(_counting(Aw, count, deadline), k=k, which=which, tol=tol, maxiter=maxiter, v0=x0)
                else:
                    w, V = eigs(_counting(Aw, count, deadline), k=k, which=which, tol=tol, maxiter=maxiter, v0=x0)
                    # an eigenvalue beyond the answer's end in V's orthogonal complement (ARPACK's regular mode skips
                    # some where magnitudes crowd: a random sparse n = 1000, LM, missed the pair at |w| = 2.4511
                    # between 2.4655 and 2.4352 returned; SciPy's eigs alike, 2 of 3 runs): run again with a wider
                    # basis and another start, up to MISSED_RETRIES times; still missing, the attempt fails
                    ncv = None
                    for retry in range(MISSED_RETRIES + 1):
                        beyond = _beyond(Aw, np.asarray(w), np.asarray(V), which, _v0(None, 7 + retry, self.n, Aw.dtype))
                        if beyond is None:
                            break
                        if retry == MISSED_RETRIES:
                            failed.append(f"ARPACK's {k} eigenvalues{_where(i)} miss one beyond them, {beyond:.6g} "
                                          f"(found in the orthogonal complement of the returned vectors), after "
                                          f"{MISSED_RETRIES} wider runs")
                            break
                        ncv = min(self.n, max(2 * (ncv or max(2 * k + 1, 20)), 4 * k + 1))
                        w, V = eigs(_counting(Aw, count, deadline), k=k, which=which, tol=tol, maxiter=maxiter,
                                    v0=_v0(None, 100 + retry, self.n, Aw.dtype), ncv=ncv)
            except OutOfBudget:
                w = np.full(k, np.nan, dtype=cdtype)
                V = np.full((self.n, k), np.nan, dtype=cdtype)
                failed.append(f"ARPACK stopped{_where(i)} when its budget of {budget:.3g} s (the estimate of the direct "
                              f"method it delays) was spent")
            except ArpackNoConvergence as exc:
                got = exc.eigenvalues.shape[0]
                w = np.concatenate([exc.eigenvalues, np.full(k - got, np.nan)]).astype(cdtype)
                V = np.concatenate([exc.eigenvectors, np.full((self.n, k - got), np.nan)], axis=1).astype(cdtype)
                failed.append(f"ARPACK did not converge{_where(i)}: {got} of {k} eigenvalues after maxiter="
                              f"{maxiter if maxiter is not None else '10 n'}; raise maxiter or tol, or pass sigma")
            except RuntimeError as exc:
                if "singular" not in str(exc).lower():
                    raise
                raise SingularMatrixError(f"{self.backend}/arpack: A - sigma I is exactly singular for sigma={sigma!r}; "
                                          f"move sigma slightly") from exc
            w, V = np.asarray(w, dtype=cdtype), np.asarray(V, dtype=cdtype)
            key = w if sigma is None else 1.0 / (w - sigma)
            order = _order(key, which)
            w, V = w[order], V[:, order]
            with np.errstate(invalid="ignore"):  # columns of NaN (not converged) stay NaN
                V = V / np.where(np.linalg.norm(V, axis=0) == 0, 1.0, np.linalg.norm(V, axis=0))
                worst = max(worst, _residual(A, None, w, V))
            its = max(its, count[0])
            ws.append(w)
            Vs.append(V)
            if left:
                Us.append(self._left(A, w, i))
        batch = tuple(self._h.batch_shape)
        w_t = torch.from_numpy(np.stack(ws)).reshape(*batch, k)
        V_t = torch.from_numpy(np.stack(Vs)).reshape(*batch, self.n, k)
        U_t = torch.from_numpy(np.stack(Us)).reshape(*batch, self.n, k) if left else None
        if failed:
            res = IterationResult(its, worst, False, Status.MAX_ITERATIONS, failed[0])
        else:
            res = IterationResult(its, worst, True, Status.CONVERGED, f"scipy arpack: {k} eigenpairs, {its} operator applications")
        return w_t, V_t, U_t, res

    def _left(self, A: Any, w: np.ndarray, member: int) -> np.ndarray:
        """Left eigenvectors: A^H u = conj(w) u, by inverse iteration with a shifted LU per eigenvalue."""
        import scipy.sparse as sp
        from scipy.sparse.linalg import splu

        n = self.n
        cdtype = w.dtype
        AH = A.conj().T.astype(cdtype).tocsc()
        eye = sp.eye_array(n, dtype=cdtype, format="csc")
        rng = np.random.default_rng(1234 + member)
        U = np.empty((n, w.shape[0]), dtype=cdtype)
        for j, wj in enumerate(w):
            if not np.isfinite(wj):
                U[:, j] = np.nan
                continue
            shift = np.conj(wj)
            lu = None
            for nudge in (0.0, 1e-10, 1e-8, 1e-6):
                s = shift + nudge * max(abs(shift), 1.0)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        lu = splu((AH - s * eye).tocsc())
                    break
                except RuntimeError:
                    continue
            if lu is None:
                raise SingularMatrixError(f"{self.backend}/arpack: A^H - conj(w) I stayed exactly singular for w={wj!r} "
                                          f"after nudging the shift; no left eigenvector")
            u = rng.standard_normal(n) + 1j * rng.standard_normal(n)
            for _ in range(2):
                with np.errstate(all="ignore"):
                    u = lu.solve(u.astype(cdtype))
                nrm = np.linalg.norm(u)
                if not np.isfinite(nrm) or nrm == 0:
                    break
                u = u / nrm
            U[:, j] = u
        return U

    def __repr__(self) -> str:
        return f"EigsPlan(arpack, n={self.n})"


#: wider ARPACK runs after an answer found to miss an eigenvalue beyond its end (:func:`_beyond`)
MISSED_RETRIES = 2
#: how far beyond the answer's end (relative to its magnitude) a found eigenvalue must lie to count as missed
BEYOND_MARGIN = 1e-6


def _beyond(A: Any, w: np.ndarray, V: np.ndarray, which: str, x0: np.ndarray | None) -> complex | None:
    """An eigenvalue of A beyond the end of the answer ``w`` in ``which``'s order, or None. With ``Q`` an orthonormal
    basis of ``span(V)`` (an invariant subspace), A is block triangular in ``[Q, Q_perp]``, so the eigenvalues of
    ``Q_perp^H A Q_perp`` are A's others: ARPACK (one eigenvalue, the same ``which``) on ``P A P + c Q Q^H``, ``P = I -
    Q Q^H`` and ``c`` the answer's end value (so the directions of Q sit at the end, not beyond it). A found value
    beyond the end by :data:`BEYOND_MARGIN` (relative) is a missed eigenvalue. None also where the check cannot run
    (ARPACK not converging on it, too small a complement)."""
    from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigs  # noqa: PLC0415

    n, k = V.shape
    if n - k < 3 or not np.all(np.isfinite(w)) or not np.all(np.isfinite(V)):
        return None
    rank = _RANK[which]  # smaller: wanted sooner
    end = w[np.argmax(rank(w))]
    Q, _ = np.linalg.qr(V)
    dtype = np.result_type(A.dtype, Q.dtype)

    def mv(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=dtype).reshape(-1)
        c = Q.conj().T @ x
        y = A @ (x - Q @ c)
        return y - Q @ (Q.conj().T @ y) + end * (Q @ c)

    op = LinearOperator((n, n), matvec=mv, dtype=dtype)
    try:
        theta = eigs(op, k=1, which=which, tol=0.0, v0=None if x0 is None else x0.astype(dtype),
                     return_eigenvectors=False, ncv=min(n, 20))
    except (ArpackNoConvergence, ArpackError):
        return None
    t = complex(theta[0])
    scale = max(abs(end), float(np.abs(w).max()), np.finfo(np.float64).tiny)
    if rank(np.array([t]))[0] < rank(np.array([end]))[0] - BEYOND_MARGIN * scale:
        return t
    return None


#: each ``which``'s sort key of eigenvalues (smaller: wanted sooner), shared by :func:`_order` and :func:`_beyond`
_RANK = {"LM": lambda z: -np.abs(z), "SM": np.abs, "LR": lambda z: -np.real(z), "SR": np.real,
         "LI": lambda z: -np.imag(z), "SI": np.imag}


def _order(key: np.ndarray, which: str) -> np.ndarray:
    """The torch backend's order: by ``which``'s key, stable."""
    k = _RANK[which](key)
    k = np.where(np.isnan(k), np.inf, k)
    return np.argsort(k, kind="stable")
