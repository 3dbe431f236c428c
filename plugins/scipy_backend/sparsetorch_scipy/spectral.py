"""Ops ``"eigsh"`` (methods ``"arpack"``, ``"lobpcg"``) and ``"eigs"`` (``"arpack"``) on SciPy.

``EigshPlan`` (symmetric / Hermitian A, generalized ``A v = w M v`` with M Hermitian positive
definite):

- ``arpack``: ``scipy.sparse.linalg.eigsh``. With ``sigma`` it runs in shift-invert mode on our
  own SuperLU factorization of ``A - sigma M`` (counted, and a singular shift raises
  :class:`SingularMatrixError` naming sigma); ``which="SM"`` without sigma, and ``"SA"`` on a
  matrix known to be SPD, use shift-invert at 0 (ARPACK's regular mode converges slowly at the
  small end of the spectrum; falls back to regular mode when A is singular). ``"SA"`` on a
  symmetric matrix not known to be SPD first factors A with diagonal pivots (SuperLU's
  symmetric mode, no off-diagonal pivoting): the pivots' signs are A's inertia (Sylvester), so
  all positive proves A SPD and the same factors run shift-invert at 0 (494_bus: 126,604
  regular-mode products before, a few dozen solves now); otherwise regular mode.
- ``M`` must be Hermitian positive definite: the same diagonal-pivot LU of M (the
  factorization regular mode needs for ``M^-1`` anyway) certifies it, and a non-positive pivot
  raises :class:`IndefiniteMatrixError` naming the count of negative eigenvalues (ARPACK with
  an indefinite M returns numbers that are not eigenvalues).
- ``budget`` (seconds, from the core's fallback): the products/solves stop when it is spent and
  the result says so (``converged=False``), so the next offer can take over.
- ``lobpcg``: ``scipy.sparse.linalg.lobpcg`` for ``which`` "LA"/"SA" (no sigma), started from
  ``v0`` and seeded random vectors; ``backend_options={"lobpcg_preconditioner": "amg"}`` (PyAMG
  V-cycle) or ``"jacobi"`` speeds up the smallest eigenvalues of SPD matrices. ``tol`` is
  relative, as ARPACK's: residual norms <= tol ||A||_inf (tol=0: 1e-12; never below
  32 sqrt(n) eps: LOBPCG stopped short of 4 sqrt(n) eps in the conformance kit). SciPy's LOBPCG warns instead of failing when it
  stops short; that warning becomes ``converged=False``.

Both return ``w`` ascending and ``V`` with ``V^H M V = I`` (renormalised), and report the largest
relative eigen-residual ``||A v - w M v|| / (|w| ||M v|| + ||A v||)``.

``EigsPlan`` (general square A): ``scipy.sparse.linalg.eigs``, eigenvalues ordered by ``which``
as the torch backend orders them. Left eigenvectors (``left=True``): for each eigenvalue ``w``,
inverse iteration on ``A^H - conj(w) I`` with its own SuperLU factorization (two solves from a
seeded random start): this finds the left vector *of that eigenvalue* whatever the order ARPACK
returns things in, where matching the eigenvalues of a second ``eigs(A^H)`` run by distance can
pair the wrong vectors inside clusters. A shift that is exactly singular is nudged by
``1e-10 |w|``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Mapping

import numpy as np
import torch

from sparsetorch import IndefiniteMatrixError, InputError, IterationResult, SingularMatrixError, SparseTensor, Status

from ._convert import Handoff

__all__ = ["EigshPlan", "EigsPlan", "EIGSH_WHICH", "EIGS_WHICH"]  # noqa: F822 - EigsPlan: module __getattr__

EIGSH_WHICH = ("LA", "SA", "LM", "SM")
EIGS_WHICH = ("LM", "SM", "LR", "SR", "LI", "SI")
#: LOBPCG iterations when maxiter is not given (SciPy's default, 20, stops short on Poisson).
LOBPCG_MAXITER = 500


def _member_matrices(h: Handoff, values: torch.Tensor) -> list[Any]:
    return [h.matrix(d) for d in h.values(values)]


class OutOfBudget(Exception):
    """Raised from inside an operator when the call's time budget is spent."""


def _deadline(budget: float | None) -> float | None:
    return None if budget is None else time.perf_counter() + float(budget)


def _tick(counter: list, deadline: float | None) -> None:
    counter[0] += 1
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfBudget


def _counting(mat: Any, counter: list[int], deadline: float | None = None) -> Any:
    from scipy.sparse.linalg import LinearOperator

    def mv(x: np.ndarray) -> np.ndarray:
        _tick(counter, deadline)
        return mat @ x

    return LinearOperator(mat.shape, matvec=mv, rmatvec=lambda x: mat.conj().T @ x, dtype=mat.dtype)


def diagonal_pivot_lu(S: Any) -> tuple[Any, int] | None:
    """An LU of the Hermitian ``S`` with diagonal pivots only (SuperLU's symmetric mode,
    ``diag_pivot_thresh=0``) and the number of non-positive pivots (= S's eigenvalues <= 0, by
    Sylvester's law of inertia, as in an LDL^T); None when a zero diagonal forced an off-diagonal
    pivot or the factorization failed (S is then not positive definite either)."""
    from scipy.sparse.linalg import splu

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lu = splu(S.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                      options={"SymmetricMode": True})
    except RuntimeError:
        return None
    if not np.array_equal(lu.perm_r, lu.perm_c):
        return None
    d = np.asarray(lu.U.diagonal())
    re = d.real
    bad = int(np.count_nonzero(~(re > 0)))
    if np.iscomplexobj(d):
        # a Hermitian S's pivots are real; their imaginary parts are rounding, of the order of u ||S||: judged
        # against the larger of the pivot and S's largest entry (relative to the pivot alone, a tiny pivot of a
        # shift next to an eigenvalue, 7e-7 with 1e-13 of rounding, counted as non-positive and rejected a
        # correct ARPACK answer as missing a copy; session 26's sweep)
        scale = float(abs(S).max()) if S.nnz else 0.0
        bad += int(np.count_nonzero(~(re <= 0) & (np.abs(d.imag) > 1e-8 * np.maximum(np.abs(re), scale))))
    return lu, bad


def _count_at_least(A: Any, sigma: float, above: bool, M: Any | None = None) -> int | None:
    """How many eigenvalues of the Hermitian ``A`` (of the pencil ``(A, M)``, M positive definite) are >=
    ``sigma`` (``above``) or <= ``sigma``: the non-positive pivots of ``sigma M - A`` (``A - sigma M``) factored
    with diagonal pivots (Sylvester's law of inertia); None where that factorization needed an off-diagonal
    pivot or failed."""
    import scipy.sparse as sp

    # counted in double precision whatever A's dtype: a complex64 factorization's rounding (imaginary parts of the
    # pivots near 1e-7 of A) counted 17 eigenvalues where there are 4 (session 32's sweep)
    wide = np.complex128 if np.issubdtype(A.dtype, np.complexfloating) else np.float64
    A = A.astype(wide, copy=False)
    I = sp.identity(A.shape[0], dtype=wide, format="csc") if M is None else M.astype(wide, copy=False)
    S = (sigma * I - A) if above else (A - sigma * I)
    got = diagonal_pivot_lu(sp.csc_matrix(S))
    return None if got is None else got[1]


def _has_empty_lines(A: Any) -> bool:
    """Whether a row of A stores nothing (an isolated node: its eigenvector ``e_i`` is out of reach of a Krylov
    space grown from A's products, whatever M is)."""
    import scipy.sparse as sp

    return bool((np.diff(sp.csr_matrix(A).indptr) == 0).any())


#: which="SA" on a matrix whose SPD probe failed with at most k pivots not positive, or with every pivot not positive at
#: rounding level (a graph Laplacian of more than k components): the probe of A + delta I, delta = PSD_SHIFT ||A||_inf,
#: and shift-invert at -delta where it passes (a positive semidefinite A); 0: off
PSD_SHIFT = 1e-3


def _rounding_pivots(lu: Any, norm: float, dtype: Any) -> bool:
    """Whether every pivot of ``lu`` that is not positive is at rounding level (``1e3 u ||A||_inf``): the mark of a
    singular positive semidefinite matrix rather than an indefinite one (20 components of a Laplacian, k = 6: the
    probe of A + delta I was skipped for having more than k such pivots, and eigsh took 3.7 s against SciPy's
    LOBPCG's 0.05; session 32's sweep)."""
    d = np.real(np.asarray(lu.U.diagonal()))
    bad = d[~(d > 0)]
    return bool(bad.size) and bool(np.all(np.abs(bad) <= 1e3 * np.finfo(dtype).eps * norm))

#: up to this order every ARPACK answer is checked by an inertia count (a factorization of this size costs
#: milliseconds); above it only answers holding a repeated value or a matrix with an empty row are. An answer can
#: miss copies without holding two: k = 2 on three identical blocks returned one copy of the top eigenvalue and the
#: next one (error 6.7e-2; session 24's review)
VERIFY_ALL_MAX = 20_000


#: the inertia count is skipped, where no repeated value or empty row asks for it, when its factorization is predicted
#: to cost more than INERTIA_MIN_SECONDS and INERTIA_RATIO times what ARPACK's answer took (:func:`_factor_seconds`);
#: the Rayleigh-Ritz count of :func:`_complement_count` answers instead
INERTIA_MIN_SECONDS = 0.05
INERTIA_RATIO = 4.0
#: seconds per flop of the envelope model (:func:`_factor_seconds`), set from factorizations on 2 cores (SuperLU,
#: diagonal pivots), where it over-predicts: 2-D Poisson 141^2 0.04 s predicted / 0.037 s measured, 3-D Poisson 20^3
#: 0.09 / 0.09, 27^3 0.74 / 0.55, random sparse SPD n = 1000 0.03 / 0.023, n = 2000 0.26 / 0.12, n = 5000 4.1 / 1.3
#: (where ARPACK's own answer took 0.03 s)
INERTIA_SECONDS_PER_FLOP = 2e-10


def _factor_seconds(A: Any) -> float:
    """The predicted time of the inertia count's factorization of a shift of the Hermitian ``A``: the flops of a
    factorization without pivoting in reverse Cuthill-McKee order, sum of b_i^2 over rows with b_i the row's span
    left of the diagonal (its envelope: the entries of such a factorization are at most twice its sum plus n), times
    :data:`INERTIA_SECONDS_PER_FLOP`. The factorization itself orders by minimum degree, rarely worse. O(nnz)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    C = sp.csr_matrix(A)
    n = C.shape[0]
    p = reverse_cuthill_mckee(C, symmetric_mode=True)
    rank = np.empty(n, dtype=np.int64)
    rank[p] = np.arange(n)
    rows = rank[np.repeat(np.arange(n), np.diff(C.indptr))]
    first = np.arange(n)  # by position in the order; the diagonal bounds each row's span from the right
    np.minimum.at(first, rows, rank[C.indices])
    span = (np.arange(n) - first).astype(np.float64)
    return float(np.dot(span, span)) * INERTIA_SECONDS_PER_FLOP


#: Lanczos steps of :func:`_complement_count` (fewer where the complement is smaller)
COMPLEMENT_STEPS = 48


def _orthonormal(X: np.ndarray) -> np.ndarray:
    """An orthonormal basis of X's columns (n x few): Cholesky QR twice (two small Gram matrices; numpy's
    Householder QR took 30 ms on 5000 x 6 here), Householder where a Gram matrix is not numerically definite."""
    Q = X
    for _ in range(2):
        try:
            R = np.linalg.cholesky(Q.conj().T @ Q).conj().T
        except np.linalg.LinAlgError:
            return np.linalg.qr(X)[0]
        Q = np.linalg.solve(R.T, Q.T).T  # Q R^-1
    return Q


def _complement_count(A: Any, V: np.ndarray, which: str, t: float, seed: int = 0) -> int:
    """A lower bound on how many eigenvalues of the Hermitian ``A`` lie in the region of ``which`` beyond ``t`` (LA:
    ``>= t``, SA: ``<= t``, LM: ``|w| >= t``), proven by Rayleigh-Ritz: for any orthonormal S, the eigenvalues of
    ``S^H A S`` interlace A's (Cauchy), so as many of them as lie in the region, A has at least there. S spans the
    returned vectors ``V`` and the extreme Ritz vectors of a Lanczos run on A restricted to V's orthogonal complement
    (full reorthogonalization, seeded random start): a copy ARPACK missed lies in that complement, at its extreme, where
    Lanczos finds it first. A count above the returned one proves a miss; a count equal to it proves nothing (unlike
    the inertia count), which is why this stands in for that count only where its factorization is costly."""
    n, k = V.shape
    Q = _orthonormal(V)
    m = min(COMPLEMENT_STEPS, n - k)
    if m < 1:
        return 0
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    if np.iscomplexobj(A.data) or np.iscomplexobj(V):
        x = x + 1j * rng.standard_normal(n)
    x = x.astype(np.result_type(A.dtype, V.dtype, np.float64))
    W = np.zeros((n, m), dtype=x.dtype)
    alpha, beta = np.zeros(m), np.zeros(m)
    used = 0
    for j in range(m):
        for _ in range(2):  # twice is enough (Kahan, Parlett)
            x = x - Q @ (Q.conj().T @ x)
            x = x - W[:, :j] @ (W[:, :j].conj().T @ x)
        nx = float(np.linalg.norm(x))
        if j > 0 and nx <= 1e-12 * max(float(np.abs(alpha[:j]).max()), float(beta[:j].max()), 1e-300):
            break  # an invariant subspace of the complement: its Ritz values are exact
        if nx == 0.0:
            break
        if j > 0:
            beta[j - 1] = nx
        W[:, j] = x / nx
        y = A @ W[:, j]
        alpha[j] = float(np.real(np.vdot(W[:, j], y)))
        x = y - alpha[j] * W[:, j] - (beta[j - 1] * W[:, j - 1] if j > 0 else 0.0)
        used = j + 1
    if used == 0:
        return 0
    T = np.diag(alpha[:used]) + np.diag(beta[:used - 1], 1) + np.diag(beta[:used - 1], -1)
    theta, s = np.linalg.eigh(T)
    # the Ritz vectors that could add to the count: the extreme ones at the region's end(s), as many as V holds
    pick = {"LA": np.argsort(-theta), "SA": np.argsort(theta), "LM": np.argsort(-np.abs(theta))}[which][:max(k, 1)]
    S = _orthonormal(np.concatenate([Q, W[:, :used] @ s[:, pick]], axis=1))
    H = S.conj().T @ (A @ S)
    mu = np.linalg.eigvalsh(0.5 * (H + H.conj().T))
    if which == "LA":
        return int(np.count_nonzero(mu >= t))
    if which == "SA":
        return int(np.count_nonzero(mu <= t))
    return int(np.count_nonzero(np.abs(mu) >= t))


def _missed_copies(A: Any, w: np.ndarray, which: str, sigma: float | None = None, M: Any | None = None,
                   empty: bool = False, V: np.ndarray | None = None, seconds: float = 0.0) -> str | None:
    """Why ARPACK's answer misses copies of a repeated eigenvalue, or None. A Krylov method finds one
    eigenvector per eigenvalue in exact arithmetic and the others only through rounding: on 8 identical graph
    blocks it returned 5 of a cluster's 8 copies and the next cluster's value in place of the rest, every pair
    passing the residual check (session 22's sweep); with shift-invert or a mass matrix M alike (9 components:
    5 of 9 zeros; isolated nodes with M: none of 8; session 24's sweep). Up to :data:`VERIFY_ALL_MAX` unknowns,
    and where the answer holds a repeated value (to 1e-8 of its largest) or A has an empty row (``empty``), the
    count of the pencil's eigenvalues in the
    region the answer covers (inertia counts of ``A - s M``: diagonal-pivot factorizations) must equal the count
    returned there. ``which`` / ``sigma`` are what ARPACK was asked: with ``sigma``, ``LM`` the nearest to it,
    ``LA`` / ``SA`` the nearest above / below it.

    With the returned vectors ``V`` (regular mode: no ``sigma``, no ``M``), a Rayleigh-Ritz count over V and the extreme
    Ritz vectors of V's complement (:func:`_complement_count`, O(48 products)) runs first: a count above the returned
    one proves a miss without a factorization. Then the inertia count runs as above, except on an answer without a
    repeated value, of a matrix without an empty row, whose factorization is predicted costly against ARPACK's own
    time ``seconds`` (:data:`INERTIA_RATIO`): there the Rayleigh-Ritz count is the check (random sparse SPD, n = 5000:
    the factorization took 1.3 s, ARPACK 0.03 s), and above :data:`VERIFY_ALL_MAX` unknowns, where nothing was
    checked, it is now."""
    w = np.sort(np.real(w[np.isfinite(w)]))
    if w.size < 1 or which not in ("LA", "SA", "LM"):
        return None
    scale = max(float(np.abs(w).max()), abs(float(sigma)) if sigma is not None else 0.0) or 1.0
    repeated = w.size > 1 and bool(np.any(np.diff(w) <= 1e-8 * scale))
    regular = sigma is None and M is None and V is not None and V.shape[1] == w.size and bool(np.isfinite(V).all())
    inertia = repeated or empty or (A.shape[0] <= VERIFY_ALL_MAX and (
        not regular or _factor_seconds(A) <= max(INERTIA_MIN_SECONDS, INERTIA_RATIO * seconds)))
    if not (inertia or regular):
        return None
    # the region is drawn just inside the outermost value returned: eigenvalues tied with it (a cluster the k-th
    # value cuts through) may be left out by a correct answer; one strictly inside may not (an outward margin
    # rejected correct answers: 1e6 I + L with sigma = 1e6, any k of [1, 1, 1, 3, 3, 3] about sigma = 2)
    # (relative to the larger of the values and ||A||_inf, at least 64 u of A's dtype: eigenvalues at rounding level,
    # -7.7e-15 for a Laplacian's zero, or a float32 value tied with the boundary, were counted inside a region drawn
    # at 1e-8 of the values alone, and rejected correct answers; session 32's sweep)
    norm = float(abs(A).sum(axis=1).max()) if A.shape[0] and A.nnz else 0.0
    if M is not None and M.nnz:
        norm /= max(float(abs(M).sum(axis=1).max()), 1e-300)
    delta = max(1e-8, 64 * float(np.finfo(A.dtype).eps)) * max(scale, norm)

    def below(s: float) -> int | None:
        return _count_at_least(A, s, False, M)

    where: str
    if regular:
        t = {"LA": float(w[0]) + delta, "SA": float(w[-1]) - delta}.get(which, float(np.abs(w).min()) + delta)
        inside = {"LA": w >= t, "SA": w <= t}.get(which, np.abs(w) >= t)
        want, got = int(np.count_nonzero(inside)), _complement_count(A, V, which, t)
        if got > want:
            side = {"LA": f"at or above {t:.6g}", "SA": f"at or below {t:.6g}"}.get(which, f"beyond +-{t:.6g}")
            return (f"ARPACK returned {want} eigenvalues {side} but A has at least {got} there (Rayleigh-Ritz over the "
                    f"returned vectors and the extreme ones of their orthogonal complement): copies of a repeated "
                    f"eigenvalue were missed (a Krylov method finds them only through rounding); a block method "
                    f"(LOBPCG) or the dense method finds them")
        if not inertia:
            return None
    if sigma is None:
        if which == "LA":
            t = float(w[0]) + delta
            want, got, where = int(np.count_nonzero(w >= t)), _count_at_least(A, t, True, M), f"at or above {t:.6g}"
        elif which == "SA":
            t = float(w[-1]) - delta
            want, got, where = int(np.count_nonzero(w <= t)), below(t), f"at or below {t:.6g}"
        else:
            t = float(np.abs(w).min()) + delta
            up, down = _count_at_least(A, t, True, M), below(-t)
            want = int(np.count_nonzero(np.abs(w) >= t))
            got = None if up is None or down is None else up + down
            where = f"beyond +-{t:.6g}"
    else:
        s0 = float(sigma)
        if which == "LM":
            d = float(np.abs(w - s0).max()) - delta
            if d <= 0:
                return None
            lo, hi = below(s0 - d), below(s0 + d)
            want, where = int(np.count_nonzero(np.abs(w - s0) < d)), f"within {d:.6g} of sigma={s0:.6g}"
        elif which == "LA":
            u = float(w[-1]) - delta
            hi, lo = below(u), below(s0)
            want, where = int(np.count_nonzero((w > s0) & (w <= u))), f"between sigma={s0:.6g} and {u:.6g}"
        else:
            l0 = float(w[0]) + delta
            hi, lo = below(s0), below(l0)
            want, where = int(np.count_nonzero((w < s0) & (w > l0))), f"between {l0:.6g} and sigma={s0:.6g}"
        got = None if lo is None or hi is None else hi - lo
    if got is None or got <= want:
        return None
    pencil = "A" if M is None else "the pencil (A, M)"
    return (f"ARPACK returned {want} eigenvalues {where} but {pencil} has {got} there (an inertia count): copies of "
            f"a repeated eigenvalue were missed (a Krylov method finds them only through rounding, and an isolated "
            f"node's not at all); a block method (LOBPCG) or the dense method finds them")


def _op_from_lu(lu: Any, n: int, dtype: Any, counter: list[int], deadline: float | None) -> Any:
    from scipy.sparse.linalg import LinearOperator

    def mv(x: np.ndarray) -> np.ndarray:
        _tick(counter, deadline)
        return lu.solve(np.asarray(x, dtype=dtype))

    return LinearOperator((n, n), matvec=mv, dtype=dtype)


def certify_mass(M: Any, backend: str, method: str, member: int) -> Any:
    """The diagonal-pivot LU of M when M is Hermitian positive definite; else
    :class:`IndefiniteMatrixError` with what was found and what to do."""
    from sparsetorch.backend import MASS_FIX

    got = diagonal_pivot_lu(M)
    if got is None or got[1] > 0:
        what = ("a zero pivot forced off-diagonal pivoting" if got is None
                else f"{got[1]} of its {M.shape[0]} pivots (as many eigenvalues) are <= 0")
        raise IndefiniteMatrixError(f"{backend}/{method}: M is not positive definite{_where(member)}: an LU of M with "
                                    f"diagonal pivots (an LDL^T, whose pivot signs are M's inertia) found {what}. "
                                    f"{MASS_FIX}")
    return got[0]


def _shift_invert(A: Any, sigma: complex | float, M: Any | None, counter: list[int], backend: str,
                  deadline: float | None = None) -> Any:
    """``(A - sigma M)^-1`` as a LinearOperator on one SuperLU factorization."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator, splu

    n = A.shape[0]
    B = M if M is not None else sp.eye_array(n, dtype=A.dtype, format="csc")
    dtype = np.result_type(A.dtype, np.asarray(sigma).dtype)
    S = (A.astype(dtype) - sigma * B.astype(dtype)).tocsc()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lu = splu(S)
    except RuntimeError as exc:
        raise SingularMatrixError(f"{backend}/arpack: A - sigma M is exactly singular for sigma={sigma!r} (sigma is an "
                                  f"eigenvalue, or A and M share a null vector); move sigma slightly") from exc

    def mv(x: np.ndarray) -> np.ndarray:
        _tick(counter, deadline)
        return lu.solve(np.asarray(x, dtype=dtype))

    return LinearOperator((n, n), matvec=mv, dtype=dtype)


def _sm_near_zero(A: Any, M: Any | None, k: int, kw: dict, count: list[int], backend: str,
                  deadline: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``which="SM"`` of a singular A (no sigma): shift-invert at a tiny ``delta`` beside 0 instead of
    ARPACK's regular mode, which on an indefinite matrix with a many-fold null space ran 54 s and did
    not converge (n = 2500, 50-fold 0; session 21). ``delta = sqrt(u) ||A||_1`` (tried at -1.7 delta too,
    should delta be an eigenvalue) and two more eigenvalues than asked; the k of least magnitude among
    those nearest delta are the k of least magnitude of A when the k-th is within ``R - |delta|`` of 0
    (R: the distance from delta to the farthest one found; every eigenvalue not found lies at least R
    from delta). None when that cannot be shown or no shift factors: the caller runs regular mode."""
    from scipy.sparse.linalg import eigsh

    n = A.shape[0]
    if n < 4:
        return None
    scale = float(abs(A).sum(axis=0).max())
    if not np.isfinite(scale) or scale == 0:
        return None
    delta0 = float(np.sqrt(np.finfo(A.dtype).eps)) * scale
    for delta in (delta0, -1.7 * delta0):
        try:
            op = _shift_invert(A, delta, M, count, backend, deadline)
        except SingularMatrixError:
            continue
        ke = min(n - 1, k + 2)
        args = dict(kw, k=ke)
        w, V = eigsh(A, M=M, sigma=delta, which="LM", OPinv=op, **args)
        w = np.real(w)
        order = np.argsort(np.abs(w), kind="stable")[:k]
        reach = float(np.abs(w - delta).max()) - abs(delta)
        # within rounding of the reach: a many-fold 0 puts every eigenvalue found at |delta| from delta, and
        # the comparison of two numbers within an ulp of each other decided by chance (ARPACK's start vector
        # depends on the process's earlier calls: CI failed where a local run passed; session 22)
        if float(np.abs(w[order]).max()) > reach + 64.0 * float(np.finfo(A.dtype).eps) * scale:
            return None
        return w[order], V[:, order]
    return None


def _rayleigh_ritz(A: Any, M: Any | None, w: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``V`` made exactly M-orthonormal and rotated to Ritz vectors of its span (k x k work):
    inside a cluster of (nearly) equal eigenvalues a solver's vectors need not be orthogonal.
    Columns with NaN (not converged) are left as they are."""
    ok = np.isfinite(w) & np.isfinite(V).all(axis=0)
    if not ok.any():
        return w, V
    Vk = V[:, ok]
    MV = Vk if M is None else M @ Vk
    G = Vk.conj().T @ MV
    G = (G + G.conj().T) / 2
    try:
        L = np.linalg.cholesky(G)
    except np.linalg.LinAlgError:  # dependent vectors: keep the solver's, normalised
        norms = np.sqrt(np.abs(np.diag(G)))
        norms[norms == 0] = 1.0
        V = V.copy()
        V[:, ok] = Vk / norms
        return w, V
    Q = np.linalg.solve(L, Vk.conj().T).conj().T  # V L^-H: M-orthonormal
    H = Q.conj().T @ (A @ Q)
    theta, Y = np.linalg.eigh((H + H.conj().T) / 2)
    w, V = w.copy(), V.copy()
    w[ok], V[:, ok] = theta, Q @ Y
    return w, V


def _residual(A: Any, M: Any | None, w: np.ndarray, V: np.ndarray) -> float:
    if V.shape[1] == 0:
        return 0.0
    AV = A @ V
    MV = V if M is None else M @ V
    num = np.linalg.norm(AV - MV * w, axis=0)
    den = np.abs(w) * np.linalg.norm(MV, axis=0) + np.linalg.norm(AV, axis=0)
    den[den == 0] = 1.0
    return float(np.max(num / den))


def _v0(v0: torch.Tensor | None, member: int, n: int, dtype: Any) -> np.ndarray:
    """ARPACK's start vector: the caller's ``v0``, else a random vector seeded by (n, member).

    Left to ARPACK, the start is drawn from a generator whose state is the process's: the same
    call then gives other eigenvectors (signs, bases of repeated eigenvalues), other iteration
    counts and, on borderline problems, other certificates depending on what ran before it.
    """
    if v0 is None:
        rng = np.random.default_rng((n, member, 0x5EED))
        x = rng.standard_normal(n)
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal(n)
        return np.ascontiguousarray(x, dtype=dtype)
    arr = v0.detach().cpu().numpy().reshape(-1, n)
    return np.ascontiguousarray(arr[member if arr.shape[0] > 1 else 0], dtype=dtype)


class EigshPlan:
    """A few eigenpairs of a Hermitian sparse matrix (optionally generalized) with SciPy."""

    preconditioner = None

    def __init__(self, A: SparseTensor, method: str, options: Mapping[str, Any], properties: frozenset[str] = frozenset(),
                 *, backend: str = "scipy") -> None:
        if method not in ("arpack", "lobpcg"):
            raise InputError(f"{backend}: eigsh method {method!r} is not 'arpack' or 'lobpcg'")
        m, n = A.format_shape
        if m != n:
            raise InputError(f"{backend}/{method} needs a square matrix, got {m}x{n}")
        self.backend, self.method, self.n = backend, method, int(n)
        self.spd = "spd" in properties
        self._h = Handoff(A)
        bo = options.get("backend_options") or {}
        self._pre = bo.get("lobpcg_preconditioner")
        if self._pre not in (None, "jacobi", "amg"):
            raise InputError(f"backend_options lobpcg_preconditioner={self._pre!r} must be None, 'jacobi' or 'amg'")
        self._mats: list[Any] | None = None
        self._M_handoff: Handoff | None = None

    def set_values(self, values: torch.Tensor) -> None:
        self._mats = None
        self._mats = _member_matrices(self._h, values)

    def _m_matrices(self, M: SparseTensor | None) -> list[Any] | None:
        if M is None:
            return None
        if self._M_handoff is None or self._M_handoff._source.pattern_key != M.pattern_key:
            self._M_handoff = Handoff(M)
        return _member_matrices(self._M_handoff, M.values)

    def eigsh(self, k: int, *, which: str = "LA", sigma: float | None = None, M: SparseTensor | None = None,
              tol: float = 0.0, maxiter: int | None = None, v0: torch.Tensor | None = None,
              budget: float | None = None) -> tuple[torch.Tensor, torch.Tensor, IterationResult]:
        if self._mats is None:
            raise RuntimeError(f"{self.backend}/{self.method}: eigsh() before set_values()")
        if which not in EIGSH_WHICH:
            raise InputError(f"{self.backend}/{self.method}: which={which!r}; use one of {EIGSH_WHICH}")
        Ms = self._m_matrices(M)
        ws, Vs, its, worst, failed = [], [], 0, 0.0, []
        deadline = _deadline(budget)
        Mlus: dict[int, Any] = {}
        if Ms is not None:
            for j, Mj in enumerate(Ms):
                Mlus[j] = certify_mass(Mj, self.backend, self.method, j)
        for i, A in enumerate(self._mats):
            j = i if (Ms is not None and len(Ms) > 1) else 0
            Mi = None if Ms is None else Ms[j]
            x0 = _v0(v0, i, self.n, A.dtype)
            run = self._arpack if self.method == "arpack" else self._lobpcg
            try:
                w, V, count, ok, why = run(A, Mi, k, which, sigma, tol, maxiter, x0, i, deadline, Mlus.get(j))
            except OutOfBudget:
                w = np.full(k, np.nan)
                V = np.full((self.n, k), np.nan, dtype=A.dtype)
                count, ok = 0, False
                why = (f"{self.method} stopped{_where(i)} when its budget of {budget:.3g} s (the estimate of the "
                       f"direct method it delays) was spent")
            w, V = _rayleigh_ritz(A, Mi, w, V.astype(A.dtype, copy=False))
            order = np.argsort(np.where(np.isnan(w), np.inf, w), kind="stable")
            w, V = w[order], V[:, order]
            worst = max(worst, _residual(A, Mi, w, V))
            its = max(its, count)
            if not ok:
                failed.append(why)
            ws.append(w)
            Vs.append(V)
        real = np.finfo(self._mats[0].dtype).dtype
        batch = tuple(self._h.batch_shape)
        w_t = torch.from_numpy(np.stack(ws).astype(real)).reshape(*batch, k)
        V_t = torch.from_numpy(np.stack(Vs).astype(self._mats[0].dtype)).reshape(*batch, self.n, k)
        if failed:
            res = IterationResult(its, worst, False, Status.MAX_ITERATIONS, failed[0])
        else:
            res = IterationResult(its, worst, True, Status.CONVERGED,
                                  f"scipy {self.method}: {k} eigenpairs, {its} operator applications")
        return w_t, V_t, res

    def _arpack(self, A, M, k, which, sigma, tol, maxiter, x0, member, deadline=None, Mlu=None):
        from scipy.sparse.linalg import ArpackNoConvergence, eigsh

        count = [0]
        if A.nnz == 0 or not np.any(A.data):
            # the zero matrix: every eigenvalue is 0 (for any M), any k independent vectors are
            # eigenvectors (made M-orthonormal by the Rayleigh-Ritz step after); ARPACK itself stops
            # at its first product ("starting vector is zero")
            V = np.zeros((A.shape[0], k), dtype=A.dtype)
            V[np.arange(k), np.arange(k)] = 1
            return np.zeros(k), V, 0, True, ""
        kw: dict[str, Any] = dict(k=k, tol=tol, maxiter=maxiter, v0=x0)
        shift = sigma
        arpack_which = which
        op = None
        if sigma is None and which == "SA" and not self.spd and A.shape[0] > 1 and bool((A.diagonal().real > 0).all()):
            # SPD by its pivots? then shift-invert at 0 with these factors (ARPACK's regular mode
            # took 126,604 products on 494_bus, SPD with condition 2.4e6)
            got = diagonal_pivot_lu(A)
            norm = float(abs(A).sum(axis=1).max())
            # pivots at rounding level: singular (a positive semidefinite A's zero eigenvalues can come out as tiny
            # positive pivots), where shift-invert at 0 divides by them (residual 0.0776 on a 30-component Laplacian)
            tiny = got is not None and float(np.abs(got[0].U.diagonal()).min()) <= 1e3 * np.finfo(A.dtype).eps * norm
            if got is not None and got[1] == 0 and not tiny:
                shift, arpack_which = 0.0, "LM"
                op = _op_from_lu(got[0], A.shape[0], A.dtype, count, deadline)
            elif PSD_SHIFT > 0 and (got is None or got[1] <= k or _rounding_pivots(got[0], norm, A.dtype)):
                # singular, or a few pivots not positive: maybe positive semidefinite (a graph Laplacian of 30
                # components, eigenvalue 0 thirty times: regular mode's ARPACK missed copies and LOBPCG took 14 s,
                # where SciPy's shift-invert below 0 took 0.18 s; session 31's sweep). A + delta I with positive
                # pivots proves every eigenvalue above -delta: shift-invert at -delta finds the smallest
                delta = PSD_SHIFT * norm
                import scipy.sparse as sp  # noqa: PLC0415

                I = sp.identity(A.shape[0], dtype=A.dtype, format="csc") if M is None else M  # the pencil's A + delta M
                shifted = diagonal_pivot_lu(sp.csc_matrix(A + delta * I))
                if shifted is not None and shifted[1] == 0:
                    shift, arpack_which = -delta, "LM"
                    op = _op_from_lu(shifted[0], A.shape[0], A.dtype, count, deadline)
        if sigma is None and (which == "SM" or (which == "SA" and self.spd)):
            shift, arpack_which = 0.0, "LM"  # shift-invert at 0: the small end converges fast
        try:
            if shift is not None and op is None:
                try:
                    op = _shift_invert(A, shift, M, count, self.backend, deadline)
                except SingularMatrixError:
                    if sigma is not None:
                        raise
                    op, shift, arpack_which = None, None, which  # A singular: regular mode
                    if which == "SM":
                        got = _sm_near_zero(A, M, k, kw, count, self.backend, deadline)
                        if got is not None:
                            return got[0], got[1], count[0], True, ""
            started = time.perf_counter()
            if shift is not None:
                w, V = eigsh(A, M=M, sigma=shift, which=arpack_which, OPinv=op, **kw)
                took = time.perf_counter() - started
            else:
                Minv = None
                if M is not None:
                    Minv = _op_from_lu(Mlu, M.shape[0], M.dtype, [0], None) if Mlu is not None else \
                        _shift_invert(M, 0.0, None, [0], self.backend)
                w, V = eigsh(_counting(A, count, deadline), M=M, Minv=Minv, which=which, **kw)
            took = time.perf_counter() - started
            if not np.iscomplexobj(np.asarray(shift if shift is not None else 0.0)):
                missed = _missed_copies(A, np.real(w), arpack_which if shift is not None else which,
                                        None if shift is None else float(shift), M, _has_empty_lines(A), V, took)
                if missed is not None:
                    return np.real(w), V, count[0], False, missed
            return np.real(w), V, count[0], True, ""
        except ArpackNoConvergence as exc:
            w, V = np.real(exc.eigenvalues), exc.eigenvectors
            pad = k - w.shape[0]
            if pad > 0:
                w = np.concatenate([w, np.full(pad, np.nan)])
                V = np.concatenate([V, np.full((V.shape[0], pad), np.nan, dtype=V.dtype)], axis=1)
            return w, V, count[0], False, (f"ARPACK did not converge{_where(member)}: {exc.eigenvalues.shape[0]} of {k} "
                                           f"eigenvalues after maxiter={maxiter if maxiter is not None else '10 n'}; raise "
                                           f"maxiter or tol, or pass sigma near the wanted eigenvalues")

    def _lobpcg(self, A, M, k, which, sigma, tol, maxiter, x0, member, deadline=None, Mlu=None):
        from scipy.sparse.linalg import lobpcg

        if sigma is not None or which not in ("LA", "SA"):
            raise InputError(f"{self.backend}/lobpcg finds the largest or smallest eigenvalues (which 'LA'/'SA', no sigma); "
                             f"got which={which!r}, sigma={sigma!r}: use method='arpack'")
        n = self.n
        rng = np.random.default_rng(member)
        X = rng.standard_normal((n, k))
        if np.iscomplexobj(A.data):
            X = X + 1j * rng.standard_normal((n, k))
        X = X.astype(A.dtype)
        if x0 is not None:
            X[:, 0] = x0
        count = [0]
        pre = self._preconditioner(A)
        limit = maxiter if maxiter is not None else LOBPCG_MAXITER
        # LOBPCG's tolerance is absolute (residual norms); ours relative, as ARPACK's: scale by ||A||_inf,
        # and keep it above what rounding allows (LOBPCG missed 4 sqrt(n) eps ||A|| in tests)
        eps = float(np.finfo(np.finfo(A.dtype).dtype).eps)
        scale = float(abs(A).sum(axis=1).max()) if A.nnz else 1.0
        rel = max(tol if tol > 0 else 1e-12, 32.0 * np.sqrt(n) * eps)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            w, V = lobpcg(_counting(A, count, deadline), X, B=M, M=pre, tol=rel * scale, maxiter=limit,
                          largest=(which == "LA"))
        short = [str(c.message) for c in caught if "tolerance" in str(c.message) or "not reach" in str(c.message)]
        if short:
            return np.real(w), V, count[0], False, (f"LOBPCG stopped short{_where(member)} after maxiter={limit}: "
                                                    f"{short[0][:200]}; raise maxiter, loosen tol, add "
                                                    f"backend_options lobpcg_preconditioner='amg', or use method='arpack'")
        return np.real(w), V, count[0], True, ""

    def _preconditioner(self, A: Any) -> Any:
        if self._pre is None:
            return None
        from scipy.sparse.linalg import LinearOperator

        if self._pre == "jacobi":
            inv = 1.0 / A.diagonal()
            return LinearOperator(A.shape, matvec=lambda x: inv * x.reshape(-1) if x.ndim == 1 else inv[:, None] * x,
                                  matmat=lambda X: inv[:, None] * X, dtype=A.dtype)
        from .amg import build_hierarchy

        ml = build_hierarchy(A.tocsr(), "smoothed_aggregation", True)
        return ml.aspreconditioner()

    def __repr__(self) -> str:
        return f"EigshPlan({self.method}, n={self.n})"


def _where(member: int) -> str:
    return f" (value-batch member {member})" if member else ""


def __getattr__(name: str) -> Any:
    # EigsPlan lives in .eigs (which imports this module's helpers): re-exported on first use
    if name == "EigsPlan":
        from .eigs import EigsPlan

        return EigsPlan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
