"""The checks of the spectral ops (eigsh, eigs): their inputs (``k``, ``which``, ``tol``, ``maxiter``, ``v0``; a mass
matrix ``M`` that must be symmetric positive definite) and the eigenpairs a plan returns (shapes,
finiteness, and the residual of the accuracy contract, computed here from the stored entries)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ...errors import IndefiniteMatrixError, InputError, NotSymmetricError
from ...tensor import SparseTensor
from ...tensor.sparse_tensor import vmapped
from ..properties import detect

__all__ = ["check_mass_matrix", "MASS_FIX"]

_WHICH_SH = ("LA", "SA", "LM", "SM")
_WHICH_GE = ("LM", "SM", "LR", "SR", "LI", "SI")
_POLICIES = ("raise", "warn", "ignore")


def _check_common(A, k, which, allowed, tol, maxiter, v0, op) -> None:
    n = A.format_shape[0]
    if vmapped(A.values):
        raise InputError(f"{op} under torch.func.vmap over A's values is not supported (its method choice and "
                         f"certificates read the values); give the members as a value batch instead: "
                         f"{op}(A.with_values(V), k) with V of shape (batch, {A.values.shape[-1]}) returns "
                         f"(batch, k) eigenvalues, and torch.func.grad / jacrev work on it")
    if not isinstance(k, int) or isinstance(k, bool) or not (1 <= k <= n):
        raise InputError(f"{op}: k must be an int with 1 <= k <= n={n}, got k={k!r}")
    if which not in allowed:
        raise InputError(f"{op}: which must be one of {allowed}, got {which!r}")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise InputError(f"{op}: tol must be a non-negative number (0: the method's default), got {tol!r}")
    if maxiter is not None and (not isinstance(maxiter, int) or maxiter < 1):
        raise InputError(f"{op}: maxiter must be a positive int or None, got {maxiter!r}")
    if v0 is not None:
        if not isinstance(v0, torch.Tensor) or v0.shape[-1] != n:
            raise InputError(f"{op}: v0 must be a tensor with last dimension n={n}, got "
                             f"{tuple(v0.shape) if isinstance(v0, torch.Tensor) else type(v0).__name__}")


def check_mass_matrix(M: SparseTensor, op: str) -> bool:
    """Refuse an ``M`` that is not symmetric positive definite, as far as cheap tests can tell:
    symmetry (detected), a real positive diagonal (necessary). Returns True when definiteness is
    proven (detected SPD: symmetric, positive diagonal, diagonally dominant); otherwise each plan
    certifies it with the factorization it makes (a Cholesky, or an LU with diagonal pivots whose
    signs give M's inertia) and raises :class:`IndefiniteMatrixError` when that fails."""
    tags = detect(M)
    if "nonsymmetric" in tags:
        raise NotSymmetricError(f"{op}: M is not symmetric (Hermitian): entries differ from the transpose beyond "
                                f"1e-12 relative. {MASS_FIX}")
    if "spd" in tags:
        return True
    coords, slot = M.entries()
    on = coords[0] == coords[1]
    n = M.format_shape[0]
    vals = M.values.detach()[..., slot]
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0][on], vals[..., on])
    dre = diag.real if diag.is_complex() else diag
    bad = ~(dre > 0)
    if bool(bad.any()):
        flat = torch.nonzero(bad.reshape(-1, n))[0]
        member, i = int(flat[0]), int(flat[1])
        where = f" (value-batch member {member})" if diag.dim() > 1 else ""
        raise IndefiniteMatrixError(
            f"{op}: M is not positive definite: its diagonal entry M[{i}, {i}] = "
            f"{float(dre.reshape(-1, n)[member, i]):.6g}{where} is not positive ({int(bad.sum())} of {n * max(1, diag.numel() // n)} "
            f"diagonal entries are <= 0). {MASS_FIX}")
    return False


#: What to do about an M that is not SPD (every refusal says it).
MASS_FIX = ("A generalized symmetric eigenproblem A v = w M v needs M symmetric positive definite (a mass or Gram "
            "matrix); with an indefinite M the problem's eigenvalues need not be real and ARPACK/LOBPCG return numbers "
            "that are not eigenvalues. If A is SPD and M is not, solve M v = mu A v (mu = 1/w) with A as the mass "
            "matrix; otherwise use sparsetorch.eigs on M^-1 A (a general eigenproblem)")

def _inf_norm(T: SparseTensor) -> torch.Tensor:
    """max_i sum_j |T_ij| per value-batch member (>= the spectral norm of a Hermitian T)."""
    coords, slot = T.entries()
    vals = T.values.detach().index_select(-1, slot).abs()
    n = T.format_shape[0]
    return vals.new_zeros(*vals.shape[:-1], n).index_add(-1, coords[0], vals).amax(-1)


def _product(T: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``T @ X`` for every member of T's value batch (X with the same batch in front)."""
    # index_select, not advanced indexing: torch opens a parallel region for the latter even on small
    # inputs, which stalls on a busy machine (10-30 ms per call measured under load, session 22)
    coords, slot = T.entries()
    vals = T.values.detach().index_select(-1, slot)
    rows, cols = coords[0], coords[1]
    contrib = vals.unsqueeze(-1) * X.index_select(-2, cols)
    out = X.new_zeros(*contrib.shape[:-2], X.shape[-2], X.shape[-1])
    return out.index_add(-2, rows, contrib)


def _check_outputs(w, V, batch, n, k) -> str | None:
    """What is wrong with a plan's eigenpairs (None: shape, dtype and finiteness are right)."""
    want_w = (*batch, k)
    want_V = (*batch, n, k)
    if not isinstance(w, torch.Tensor) or not isinstance(V, torch.Tensor):
        return f"returned {type(w).__name__}/{type(V).__name__}, not tensors"
    if tuple(w.shape) != want_w or tuple(V.shape) != want_V:
        return f"returned w {tuple(w.shape)} and V {tuple(V.shape)}; expected {want_w} and {want_V}"
    if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(V).all()):
        return "returned NaN or Inf in the eigenpairs"
    return None


def _ascending(w: torch.Tensor, V: torch.Tensor) -> str | None:
    """Put eigsh's pairs in ascending order of ``w`` per member, in place (the plan contract says
    ascending, docs/backend-authors.md; a plugin returned them descending and the caller got them
    so): ``w`` sorted, ``V``'s columns moved with their values. O(k log k) to test and sort, plus one
    copy of V where the order was wrong. Returns why it could not (the tensors cannot be written in
    place: an inference tensor, overlapping memory), else None."""
    if w.shape[-1] < 2 or bool((w[..., 1:] >= w[..., :-1]).all()):
        return None
    order = torch.sort(w, dim=-1, stable=True).indices
    try:
        with torch.no_grad():
            V.copy_(V.gather(-1, order.unsqueeze(-2).expand(V.shape)))
            w.copy_(w.gather(-1, order))
    except RuntimeError as exc:
        return (f"returned eigenvalues not in ascending order (the plan contract) in tensors the core cannot reorder "
                f"in place ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return None


def _verify_pairs(A: SparseTensor, M: SparseTensor | None, w: torch.Tensor, V: torch.Tensor, rtol: float | None):
    """(ok, worst relative residual, why): ``||A v - w M v|| <= rtol (||A|| ||v|| + |w| ||M|| ||v||)``,
    norms the inf-norm per member; ``rtol=None`` (an explicit tol) checks finiteness only. eigsh's
    pairs (real ``w``; eigs' are complex and keep their order) are first put in ascending order, in
    place (:func:`_ascending`)."""
    if not w.is_complex():
        why = _ascending(w, V)
        if why is not None:
            return False, float("nan"), why
    AV = _product(A, V)
    MV = V if M is None else _product(M, V)
    R = AV - MV * w.to(V.dtype).unsqueeze(-2)
    vn = torch.linalg.vector_norm(V, dim=-2)
    an = _inf_norm(A).unsqueeze(-1)
    mn = torch.ones_like(an) if M is None else _inf_norm(M).unsqueeze(-1)
    scale = (an * vn + w.abs() * mn * vn).clamp_min(torch.finfo(vn.dtype).tiny)
    rel = torch.linalg.vector_norm(R, dim=-2) / scale
    worst = float(rel.max()) if rel.numel() else 0.0
    if rtol is None or worst <= rtol:
        return True, worst, ""
    return False, worst, (f"returned pairs with relative residual {worst:.3g} > {rtol:g} (the accuracy contract "
                          f"||A v - w M v|| <= {rtol:g} (||A|| + |w| ||M||) ||v||)")


def magnitude_scale(A: SparseTensor | None) -> float:
    """A power of four (exact, and its square root too) that brings A's largest stored magnitude
    near 1 when it lies outside the range where squared norms are safe (a quarter of the exponent
    range either way), else 1. eigsh / eigs of a finite float64 matrix with entries >= 1e170 failed
    (ARPACK's and the checks' residual norms overflowed; session 21's sweep)."""
    if A is None or A.values.numel() == 0:
        return 1.0
    from ...autograd._route_checks import _pow2_scale  # noqa: PLC0415 - one helper of the solve's scaling

    vmax = float(A.values.detach().abs().amax())
    s = _pow2_scale(vmax, A.dtype)
    if s == 1.0:
        return 1.0
    e = round(math.log2(s))
    return math.ldexp(1.0, e - (e % 2))


def empty_batch(A: SparseTensor, k: int, eigs: bool, return_info: bool) -> tuple | None:
    """The answer for a value batch of no members (``A.values`` of shape ``(..., 0, ..., slots)``): ``w`` of shape
    ``(*batch, k)`` and ``V`` ``(*batch, n, k)``, empty, with gradients linked to A's values (eigsh / eigs raised a
    backend's internal error on it, where solve / logdet / norm answer an empty batch; session 26's sweep); None
    for a batch with members."""
    batch = tuple(A.batch_shape)
    if not batch or math.prod(batch) != 0:
        return None
    from ...dispatch.results import Status  # noqa: PLC0415
    from ..info import SolveInfo  # noqa: PLC0415

    n = A.format_shape[0]
    real = A.values.real.dtype if A.dtype.is_complex else A.dtype
    wdtype = (torch.complex128 if real == torch.float64 else torch.complex64) if eigs else real
    vdtype = wdtype if eigs else A.dtype
    w = A.values.new_zeros(*batch, k, dtype=wdtype)
    V = A.values.new_zeros(*batch, n, k, dtype=vdtype)
    if A.values.requires_grad and torch.is_grad_enabled():  # (empty) gradients flow back to the values
        z = A.values.sum() * 0
        w = w + (z.real if z.is_complex() and not w.is_complex() else z).to(w.dtype)
        V = V + z.to(V.dtype)
    if not return_info:
        return w, V
    return w, V, SolveInfo(backend="none", method="none", iterations=0, residual=0.0, converged=True,
                           status=Status.DIRECT, reason="a batch of no members: nothing to solve")


# The wanted end ----------------------------------------------------------------------------------------------------
#: :func:`wrong_end`'s slack: this many times the tolerance the pairs were accepted at, in the problem's scale
#: ``||A|| + |w| ||M||`` (the worst pair's backward error is at most the tolerance times that scale)
WRONG_END_SLACK = 10.0
#: a value-batch member's index
_Member = tuple[int, ...]
#: how :func:`wrong_end`'s refusals begin
WRONG_END = "returned eigenvalues that are not the"


def _distinct(T: SparseTensor) -> tuple[Any, ...]:
    """Pattern data of :func:`wrong_end`: ``(slot, inv, nu, rows, cols, tslot, found, on, diag_rows)``: the value slot of
    each stored entry, the index of its coordinate among the ``nu`` distinct ones (``inv``; None where the
    coordinates are distinct), the distinct coordinates' rows and columns, the slot (``inv`` None) or the
    distinct index of each one's transposed entry (``tslot``, valid where ``found``; ``found`` None: everywhere),
    the positions of the diagonal ones and their rows. A pattern without duplicates reads the map that property detection
    keeps in the pattern's cache (detection has mostly built it already: nothing more is kept); one with
    duplicates (a nonunique format) is coalesced on each call."""
    from ..properties import _symmetry_map  # noqa: PLC0415 - detection's pattern data, shared

    smap = _symmetry_map(T)
    coords, slot = T.entries()
    if smap is not None:
        smap.resolve()
        return (slot, None, int(slot.numel()), coords[0], coords[1], smap.tslot, smap.found, smap.on_idx,
                smap.diag_rows)
    n = T.format_shape[0]
    lin = coords[0].to(torch.int64) * n + coords[1].to(torch.int64)
    uniq, inv = torch.unique(lin, sorted=True, return_inverse=True)
    rows, cols = uniq // n, uniq % n
    tlin = cols * n + rows
    tpos = torch.searchsorted(uniq, tlin).clamp_max(max(uniq.numel() - 1, 0))
    found = uniq.index_select(0, tpos) == tlin
    on = (rows == cols).nonzero().squeeze(-1)
    return slot, inv, int(uniq.numel()), rows, cols, tpos, found, on, rows.index_select(0, on)


class _Sums:
    """What :func:`wrong_end` reads of one matrix (float64, per value-batch member): the distinct entries
    (duplicates summed), the real diagonal, the inf-norm, the largest row sum of the skew-Hermitian part's
    magnitudes (a bound on its 2-norm: the part is skew-Hermitian, so its 1- and inf-norms agree) and the sum of
    the entries' real parts (``1^T T 1``)."""

    def __init__(self, T: SparseTensor) -> None:
        n = T.format_shape[0]
        slot, inv, nu, rows, cols, tslot, found, on, diag_rows = _distinct(T)
        self.rows, self.cols, self.on, self.diag_rows, self.nnz = rows, cols, on, diag_rows, nu
        values = T.values.detach()
        values = values.to(torch.complex128 if values.is_complex() else torch.float64)
        if inv is None:
            cv = values.index_select(-1, slot)
            tv = values.index_select(-1, tslot)
        else:
            cv = values.new_zeros(*values.shape[:-1], nu).index_add(-1, inv, values.index_select(-1, slot))
            tv = cv.index_select(-1, tslot)
        if tv.is_complex():
            tv = tv.conj()
        if found is not None:
            tv = torch.where(found, tv, torch.zeros_like(tv))
        re = cv.real if cv.is_complex() else cv
        self.cv = cv
        self.diag = re.new_zeros(*re.shape[:-1], n).index_add(-1, diag_rows, re.index_select(-1, on))
        # the inf-norm and the skew part's: one scatter of both
        both = torch.stack([cv.abs(), (cv - tv).abs()])
        sums = both.new_zeros(*both.shape[:-1], n).index_add(-1, rows, both).amax(-1)
        self.inf, self.skew = sums[0], 0.5 * sums[1]
        self.total = re.sum(-1)


def wrong_end(A: SparseTensor, M: SparseTensor | None, w: torch.Tensor, which: str, sigma: float | None,
              tau: float) -> str | None:
    """Why eigsh's eigenvalues ``w`` (ascending, per member) are provably not the ``k`` wanted ones of the
    pencil ``(A, M)`` (None: nothing proves it). Cheap necessary conditions, O(nnz):

    - every Rayleigh quotient ``x^H A x / x^H M x`` lies in ``[w_min, w_max]`` of the whole spectrum, and its
      magnitude is at most the spectral radius: with ``x = e_i`` (``A_ii / M_ii``) and ``x = 1`` (the all-ones
      vector) this bounds the largest returned from below ("LA"), the smallest from above ("SA"), the largest
      magnitude from below ("LM");
    - for ``M = None``, the sum of the j largest eigenvalues is at least the sum of the j largest diagonal
      entries (Schur / Ky Fan), the j smallest at most the j smallest, and the j largest magnitudes at least
      the j largest ``|A_ii|`` (Fan: the diagonal's magnitudes are weakly majorized by the singular values),
      for each ``j <= k``;
    - for ``M = None``, the eigenvalue nearest ``s`` ("SM": ``s = 0``; ``sigma`` with "LM": ``s = sigma``) is at
      most ``||(A - s I) x|| / ||x||`` away from it, for ``x = e_j`` (A's columns) and ``x = 1``.

    A correct answer is taken to be the wanted pairs of a nearby pencil ``(A + E, M + F)`` with ``||E|| <= t
    ||A||`` and ``||F|| <= t ||M||``, ``t`` the tolerance the pairs were accepted at (``tau``: the accuracy
    contract, or an explicit tol, or the measured residual, whichever is largest; at least a backward-stable
    dense method's error). Each bound then holds up to ``(||E|| + |w| ||F||) ||x||^2`` (the ``x^H E x`` terms), so it
    is tested with the slack ``WRONG_END_SLACK * tau * (||A|| + max|w| ||M||) ||x||^2`` (norms: inf-norms, which
    bound the 2-norms of Hermitian matrices), plus the skew-Hermitian part of A counted twice (a matrix
    declared symmetric (``properties=``) whose asymmetry a backend resolves its own way: ``x^H A x`` reads its
    Hermitian part), plus float64 rounding of the sums. A generalized "SM", and ``sigma`` with another
    ``which`` or with M, are not checked. ``k = n`` (every eigenvalue) is never refused."""
    n = A.format_shape[0]
    k = w.shape[-1]
    if k >= n or (sigma is not None and (which != "LM" or M is not None)) or (which == "SM" and M is not None):
        return None
    a = _Sums(A)
    if a.nnz == 0:
        return None
    f64 = torch.float64
    eps = float(torch.finfo(f64).eps)
    wd = w.detach().to(f64)
    wmax = wd.abs().amax(-1)
    batch = tuple(wd.shape[:-1])
    rel = WRONG_END_SLACK * tau + 8 * eps
    m = None if M is None else _Sums(M)
    if m is None:
        scale = a.inf + wmax
        eta = rel * scale + 2 * a.skew
        mtotal: torch.Tensor | float = float(n)
    else:  # (M's batch is A's or empty: broadcasting)
        scale = a.inf + wmax * m.inf
        eta = rel * scale + 2 * (a.skew + wmax * m.skew)
        mtotal = m.total
    # per unit of ||x||^2 = n for x = 1, with the float64 rounding of its sums of nnz terms (sum |T_ij| <= n ||T||)
    eta_one = eta + 2 * (a.nnz + n) * eps * scale
    tests: list[tuple[torch.Tensor, Callable[[_Member], str]]] = []  # (excess per member, what it proves there)
    quotient = "x^H A x / x^H M x" if m is not None else "x^H A x / x^H x"
    if sigma is None and which in ("LA", "SA", "LM"):
        sa, lm = which == "SA", which == "LM"
        name = {"LA": "largest", "SA": "smallest", "LM": "largest magnitude"}[which]
        end = wd[..., -1] if which == "LA" else wd[..., 0] if sa else wmax
        beyond = "above" if sa else "below"
        bound = "at most" if sa else "at least"
        mag = " in magnitude" if lm else ""
        d = a.diag.abs() if lm else a.diag
        if m is None:
            # Schur / Ky Fan on the diagonal, j = 1..k (j = 1: the Rayleigh quotients of the e_i)
            j = torch.arange(1, k + 1, dtype=f64, device=wd.device)
            ds = d.topk(k, -1, largest=not sa).values.cumsum(-1)
            ws = wd.cumsum(-1) if sa else (wd.abs().sort(-1, descending=True).values if lm else wd.flip(-1)).cumsum(-1)
            gs = ws - ds if sa else ds - ws
            ex = gs - j * eta.unsqueeze(-1)

            def kyfan(b: _Member) -> str:
                jb = int(ex[b].argmax())
                if jb == 0:
                    i = int((d[b] if not sa else -d[b]).argmax())
                    return (f"the {name} returned, {float(end[b]):.6g}, is {beyond} {'|A[i, i]|' if lm else 'A[i, i]'} = "
                            f"{float(d[b][i]):.6g} for i = {i} (the Rayleigh quotient {quotient} of x = e_i, which the "
                            f"{name} eigenvalue is {bound}{mag})")
                if lm:
                    return (f"the {jb + 1} largest magnitudes returned sum to {float(ws[b][jb]):.6g}, below the sum "
                            f"of the {jb + 1} largest |A[i, i]|, {float(ds[b][jb]):.6g} (Fan: the j largest eigenvalue "
                            f"magnitudes sum to at least that)")
                return (f"the {jb + 1} {name} returned sum to {float(ws[b][jb]):.6g}, {beyond} the sum of the {jb + 1} "
                        f"{name} diagonal entries of A, {float(ds[b][jb]):.6g} (Schur / Ky Fan: the j {name} "
                        f"eigenvalues sum to {bound} that)")

            tests.append((ex.amax(-1), kyfan))
        else:
            mdiag = m.diag
            g = end.unsqueeze(-1) * mdiag - d if sa else d - end.unsqueeze(-1) * mdiag

            def ratio(b: _Member) -> str:
                gb = g[b]
                i = int(gb.argmax())
                q = float(d[b][i] / mdiag.expand(*batch, n)[b][i])
                bar = "|" if lm else ""
                return (f"the {name} returned, {float(end[b]):.6g}, is {beyond} {bar}A[i, i]{bar} / M[i, i] = {q:.6g} for "
                        f"i = {i} (the Rayleigh quotient {quotient} of x = e_i, which the {name} eigenvalue is "
                        f"{bound}{mag})")

            tests.append((g.amax(-1) - eta, ratio))
        tot = a.total.abs() if lm else a.total
        q1 = end * mtotal - tot if sa else tot - end * mtotal

        def ones(b: _Member) -> str:
            mt = float(mtotal) if isinstance(mtotal, float) else float(mtotal.expand(batch)[b])
            bar = "|" if lm else ""
            return (f"the {name} returned, {float(end[b]):.6g}, is {beyond} the Rayleigh quotient {quotient} of the "
                    f"all-ones vector x, {bar}sum(A){bar} / {'sum(M)' if m is not None else 'n'} = "
                    f"{float(tot[b]) / mt:.6g} (which the {name} eigenvalue is {bound}{mag})")

        tests.append((q1 / n - eta_one, ones))
    else:  # "SM" (s = 0) or sigma with "LM" (the nearest to s), M = None
        s = 0.0 if sigma is None else float(sigma)
        near = (wd - s).abs().amin(-1)
        cvs = a.cv
        # lines without a stored diagonal entry (A - s I holds -s there)
        bare = torch.ones(n, dtype=f64, device=wd.device).index_fill(0, a.diag_rows, 0.0)
        if s != 0.0:
            on = torch.zeros(a.nnz, dtype=f64, device=wd.device).index_fill(0, a.on, 1.0)
            cvs = cvs - s * on.to(cvs.dtype)
        sq = cvs.abs().square()
        col = (sq.new_zeros(*sq.shape[:-1], n).index_add(-1, a.cols, sq) + bare * (s * s)).sqrt()
        rs = cvs.new_zeros(*cvs.shape[:-1], n).index_add(-1, a.rows, cvs) - (bare * s).to(cvs.dtype)
        one_norm = torch.linalg.vector_norm(rs, dim=-1) / math.sqrt(n)
        rnd = 8 * eps * (a.inf + abs(s) + wmax) * (n + 1)
        target = "0" if sigma is None else f"sigma = {s:.6g}"
        shifted = "A" if sigma is None else "A - sigma I"
        sx = "A x" if sigma is None else "(A - sigma I) x"
        why = f"some eigenvalue is within ||{sx}|| / ||x|| of {'0' if sigma is None else 'sigma'} for every x"

        def column(b: _Member) -> str:
            i = int(col[b].argmin())
            return (f"the returned eigenvalue nearest {target} is {float(near[b]):.6g} from it, farther than the norm "
                    f"of column {i} of {shifted}, {float(col[b][i]):.6g} ({why})")

        def row_sums(b: _Member) -> str:
            return (f"the returned eigenvalue nearest {target} is {float(near[b]):.6g} from it, farther than "
                    f"||{shifted.replace('A - sigma I', '(A - sigma I)')} 1|| / sqrt(n) = {float(one_norm[b]):.6g} "
                    f"(1: the all-ones vector; {why})")

        tests.append((near - col.amin(-1) - eta - rnd, column))
        tests.append((near - one_norm - eta - rnd, row_sums))
    bad = torch.stack([t[0].expand(batch) for t in tests]) > 0
    if not bool(bad.any()):
        return None
    for (_, say), hit in zip(tests, bad):
        if bool(hit.any()):
            flat = int(torch.nonzero(hit.reshape(-1))[0]) if batch else 0
            idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), batch)) if batch else ()
            where = f" (value-batch member {flat})" if batch else ""
            return (f"{WRONG_END} wanted ones (k={k}, which={which!r}{'' if sigma is None else f', sigma={sigma!r}'})"
                    f"{where}: {say(idx)}, beyond the slack {float(eta[idx]):.3g} (tolerance {tau:.3g})")
    return None  # pragma: no cover - a hit is found above
