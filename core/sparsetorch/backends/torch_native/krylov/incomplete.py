"""Preconditioners from A's own pattern: ``ilu0``, ``ic0``, ``ssor`` (triangular solves) and ``polynomial``
(Chebyshev, products only). Every one runs on A's device (CPU: torch's MKL sparse triangular solve; CUDA:
cuSPARSE's), in A's dtype, for a value batch member by member.

- :func:`ilu0` -- ILU(0): ``A ~ L U`` with L unit lower and U upper triangular on A's own pattern (no fill),
  computed exactly (not by fixed-point sweeps): rows are grouped into dependency levels (row i needs the rows k of
  its strictly-lower entries), and inside a level the IKJ updates run by the rank of the lower entry, one
  vectorized step per (level, rank) group (2-D Poisson 700^2: 1,399 levels, 2,795 groups). The symbolic part
  (:class:`IncompletePattern`: levels, groups, the update triplets ``(i, k, j)``) is per pattern; the numeric part
  per value set.
- :func:`ic0` -- IC(0) of a Hermitian A: ``A ~ C C^H``, ``C = L D^{1/2}`` from the ILU(0) above (``U = D L^H`` for
  Hermitian A). A pivot that is not positive (IC(0) of an SPD matrix that is not an M-matrix can break down) is
  met with Manteuffel's shift: the factorization of ``A + alpha diag(A)`` (alpha = 1e-3, doubled up to 1), named
  in the preconditioner's ``shift``.
- :func:`ssor` -- ``M = omega / (2 - omega) (D / omega + L) D^-1 (D / omega + U)`` (``L`` / ``U`` A's strict
  triangles; Hermitian positive definite for Hermitian positive definite A and ``0 < omega < 2``); omega = 1:
  symmetric Gauss-Seidel.
- :func:`polynomial` -- ``M^-1 = p(D^-1 A) D^-1``, ``p`` the Chebyshev polynomial of ``degree`` on
  ``[b / ratio, b]`` with ``b`` the Gershgorin bound of ``D^-1 A`` (an upper bound of its real spectrum, so for
  Hermitian positive definite A the preconditioner is positive definite: ``1 - lambda p(lambda)`` is below 1 in
  magnitude on ``(0, b]``). Products only: for GPUs, no triangular solve.

The factor-based ones need every diagonal entry of A stored and nonzero (a pivot of ILU(0) / IC(0) may still
vanish: :class:`~sparsetorch.errors.SingularMatrixError` names the row).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ....errors import InputError, SingularMatrixError
from ....tensor.interop.torch_io import compressed_tensor

__all__ = ["IncompletePattern", "TriangularPreconditioner", "Chebyshev", "ilu0", "ic0", "ssor", "polynomial"]

#: Manteuffel shifts tried by :func:`ic0` after a pivot that is not positive (alpha times A's diagonal)
IC0_SHIFTS = (0.0, 1e-3, 4e-3, 1.6e-2, 6.4e-2, 0.256, 1.0)


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + l)`` for each pair (vectorized)."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lens) - lens
    return np.repeat(starts - offsets, lens) + np.arange(total, dtype=np.int64)


class IncompletePattern:
    """A's pattern as the incomplete factorizations read it (CPU work once per pattern, index tensors on A's device):
    the distinct coordinates sorted by row then column, with every diagonal position added; ``inv`` maps each
    stored entry to its distinct position (duplicates summed); the (level, rank) groups of the strictly-lower
    entries and the triplets ``(r, p, q)`` of ILU(0)'s IKJ updates ``a_r -= a_p a_q`` (``p = (i, k)`` lower,
    ``q = (k, j)`` with ``j > k``, ``r = (i, j)`` stored)."""

    def __init__(self, rows: Tensor, cols: Tensor, n: int, device: torch.device) -> None:
        r = rows.detach().to("cpu", torch.int64).numpy()
        c = cols.detach().to("cpu", torch.int64).numpy()
        if r.size and (r.min() < 0 or c.min() < 0 or r.max() >= n or c.max() >= n):
            raise InputError(f"incomplete factorization: coordinates outside the {n} x {n} matrix")
        diag = np.arange(n, dtype=np.int64)
        key = np.concatenate([r * n + c, diag * n + diag])
        uniq, inv = np.unique(key, return_inverse=True)
        self.n, self.nnz = n, int(uniq.size)
        urow, ucol = uniq // n, uniq % n
        crow = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(urow, minlength=n), out=crow[1:])
        diag_pos = np.searchsorted(uniq, diag * n + diag)
        lower = ucol < urow
        upper = ucol > urow
        lo = np.nonzero(lower)[0]
        lo_row, lo_col = urow[lo], ucol[lo]
        rank = lo - crow[lo_row]
        # dependency levels: a wavefront over the rows whose lower entries' rows are all placed
        remaining = (diag_pos - crow[:-1]).astype(np.int64)
        by_k = np.argsort(lo_col, kind="stable")
        dep_rows = lo_row[by_k]
        kptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(lo_col, minlength=n), out=kptr[1:])
        level = np.full(n, -1, dtype=np.int64)
        frontier = np.nonzero(remaining == 0)[0]
        depth = 0
        while frontier.size:
            level[frontier] = depth
            dep = dep_rows[_ranges(kptr[frontier], kptr[frontier + 1] - kptr[frontier])]
            if dep.size:
                rows_hit, hits = np.unique(dep, return_counts=True)  # O(|dep|) per level, not O(n)
                remaining[rows_hit] -= hits
                frontier = rows_hit[remaining[rows_hit] == 0]
            else:
                frontier = dep
            depth += 1
        self.levels = depth
        # groups of lower entries by (level of the row, rank in the row)
        gkey = level[lo_row] * (int(rank.max()) + 1 if rank.size else 1) + rank
        order = np.argsort(gkey, kind="stable")
        lo_sorted, gsorted = lo[order], gkey[order]
        bounds = np.flatnonzero(np.diff(gsorted)) + 1
        gstart = np.concatenate([[0], bounds, [lo.size]]) if lo.size else np.zeros(1, dtype=np.int64)
        # update triplets: p = (i, k) lower, q over the strictly upper part of row k, r = (i, j) if stored
        pk = ucol[lo_sorted]
        ustart = diag_pos[pk] + 1
        ulen = crow[pk + 1] - ustart
        q = _ranges(ustart, ulen)
        p_of = np.repeat(np.arange(lo_sorted.size, dtype=np.int64), ulen)  # index into lo_sorted
        want = urow[lo_sorted][p_of] * n + ucol[q]
        pos = np.searchsorted(uniq, want)
        pos_c = np.minimum(pos, max(uniq.size - 1, 0))
        found = uniq[pos_c] == want if uniq.size else np.zeros(0, dtype=bool)
        t_p, t_q, t_r = p_of[found], q[found], pos_c[found]
        # triplets follow their p's group (p_of is sorted, so searchsorted gives each group's slice)
        tstart = np.searchsorted(t_p, gstart)
        self.groups = [(int(gstart[g]), int(gstart[g + 1]), int(tstart[g]), int(tstart[g + 1]))
                       for g in range(gstart.size - 1)]

        def dev(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

        self.inv = dev(inv[: r.size])
        self.row, self.col = dev(urow), dev(ucol)
        self.crow, self.diag_pos = dev(crow), dev(diag_pos)
        self.lower_pos = dev(lo_sorted)
        self.lower_kdiag = dev(diag_pos[pk])
        self.t_r, self.t_p, self.t_q = dev(t_r), dev(lo_sorted[t_p]), dev(t_q)
        self.is_lower, self.is_upper = dev(lower).bool(), dev(upper).bool()
        self.device = device
        self._split: dict[str, tuple[Tensor, Tensor, Tensor]] = {}

    def gather(self, values: Tensor) -> Tensor:
        """The distinct entries' values (duplicates summed, added diagonal positions zero) of one member."""
        out = values.new_zeros(self.nnz)
        return out.index_add(0, self.inv, values)

    def triangle(self, which: str, conj_transpose: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """``(crow, col, positions)`` of a CSR holding one triangle of the pattern with the diagonal ("LD" lower,
        "UD" upper); with ``conj_transpose`` the triangle's transpose (its values are then the conjugates of
        ``positions``)."""
        name = which + ("^H" if conj_transpose else "")
        if name not in self._split:
            keep = ~self.is_upper if which == "LD" else ~self.is_lower
            pos = torch.nonzero(keep).squeeze(-1)
            r, c = self.row[pos], self.col[pos]
            if conj_transpose:
                r, c = c, r
                order = torch.argsort(r * self.n + c)
                r, c, pos = r[order], c[order], pos[order]
            crow = torch.zeros(self.n + 1, dtype=torch.int64, device=self.device)
            crow[1:] = torch.cumsum(torch.bincount(r, minlength=self.n), 0)
            self._split[name] = (crow, c.contiguous(), pos)
        return self._split[name]


def _factor(pattern: IncompletePattern, v: Tensor) -> Tensor:
    """ILU(0) in place on the distinct values ``v`` (unit-lower multipliers below the diagonal, U on and above)."""
    lp, kd, tr, tp, tq = pattern.lower_pos, pattern.lower_kdiag, pattern.t_r, pattern.t_p, pattern.t_q
    for a, b, ta, tb in pattern.groups:
        P = lp[a:b]
        v[P] = v[P] / v[kd[a:b]]
        if tb > ta:
            r = tr[ta:tb]
            v.index_add_(0, r, -(v[tp[ta:tb]] * v[tq[ta:tb]]))
    return v


def _bad_pivot(pattern: IncompletePattern, v: Tensor, positive: bool) -> int | None:
    d = v[pattern.diag_pos]
    bad = ~torch.isfinite(d) | (d == 0)
    if positive:
        bad = bad | ~(d.real > 0) | (d.imag.abs() > 1e-8 * d.abs() if d.is_complex() else torch.zeros_like(bad))
    if bool(bad.any()):
        return int(torch.nonzero(bad)[0])
    return None


def _csr(crow: Tensor, col: Tensor, values: Tensor, n: int) -> Tensor:
    return compressed_tensor("csr", crow, col, values, (n, n))


class TriangularPreconditioner:
    """``M^-1 X`` by triangular solves with CSR factors: ``steps`` is a list of ``(csr, upper, unit, scale)``
    applied in order (``scale``: an ``(n, 1)`` factor multiplied in after that solve, or None), then ``post`` (a
    number) multiplies the result. One factor set per value-batch member."""

    def __init__(self, name: str, members: list[list[tuple[Tensor, bool, bool, Tensor | None]]], n: int,
                 post: float = 1.0, shift: float = 0.0) -> None:
        self.name, self.members, self.n, self.post, self.shift = name, members, n, post, shift
        self._cast: dict[torch.dtype, list[list[tuple[Tensor, bool, bool, Tensor | None]]]] = {}

    def _steps(self, dtype: torch.dtype) -> list[list[tuple[Tensor, bool, bool, Tensor | None]]]:
        have = self.members[0][0][0].dtype
        if dtype == have:
            return self.members
        if dtype not in self._cast:  # real factors for complex right-hand sides: cast once
            self._cast[dtype] = [[(m.to(dtype), up, unit, None if s is None else s.to(dtype)) for m, up, unit, s in steps]
                                 for steps in self.members]
        return self._cast[dtype]

    def __call__(self, X: Tensor) -> Tensor:
        if X.ndim < 2 or X.shape[-2] != self.n:
            raise InputError(f"{self.name} preconditioner was built for n = {self.n} but applied to shape "
                             f"{tuple(X.shape)}: it takes (*batch, n, k) tensors of the system it was built for")
        members = self._steps(X.dtype)
        flat = X.reshape(-1, self.n, X.shape[-1])
        outs = []
        for b in range(flat.shape[0]):
            y = flat[b]
            for mat, upper, unit, scale in members[b if len(members) > 1 else 0]:
                y = torch.triangular_solve(y, mat, upper=upper, unitriangular=unit).solution
                if scale is not None:
                    y = y * scale
            outs.append(y)
        out = torch.stack(outs).reshape(X.shape)
        return out * self.post if self.post != 1.0 else out

    def __repr__(self) -> str:
        extra = f", shift={self.shift:g}" if self.shift else ""
        return f"{type(self).__name__}({self.name}, n={self.n}, members={len(self.members)}{extra})"


def _members(values: Tensor) -> list[Tensor]:
    return list(values.reshape(-1, values.shape[-1]).unbind(0)) if values.dim() > 1 else [values]


def _require_diagonal(pattern: IncompletePattern, v: Tensor, name: str, member: int) -> None:
    d = v[pattern.diag_pos]
    zero = torch.nonzero(d == 0)
    if zero.numel():
        row = int(zero[0])
        where = f" (value-batch member {member})" if member else ""
        raise SingularMatrixError(f"{name}: A[{row}, {row}] is zero or not stored{where}; {name} divides by the "
                                  f"diagonal: use preconditioner='ilu' (scipy plugin) or None", row=row)


def ilu0(pattern: IncompletePattern, values: Tensor) -> tuple[TriangularPreconditioner, TriangularPreconditioner]:
    """ILU(0) of A (``values``: ``(nse,)`` or ``(*batch, nse)``): the preconditioner and its adjoint ``M^-H``."""
    n = pattern.n
    fwd, adj = [], []
    for i, vals in enumerate(_members(values)):
        v = _factor(pattern, pattern.gather(vals))
        row = _bad_pivot(pattern, v, positive=False)
        if row is not None:
            raise SingularMatrixError(f"ilu0: pivot {row} of ILU(0) is zero or not finite"
                                      + (f" (value-batch member {i})" if i else "")
                                      + "; use preconditioner='ilu' (scipy plugin, with fill), 'jacobi' or a direct "
                                        "method", row=row)
        # L's unit diagonal stored explicitly: torch's unitriangular CSR solve took 13-18x the time of a plain one
        unit = v.clone()
        unit[pattern.diag_pos] = 1
        crow, col, pos = pattern.triangle("LD")
        L = _csr(crow, col, unit[pos], n)
        crow, col, pos = pattern.triangle("UD")
        U = _csr(crow, col, v[pos], n)
        fwd.append([(L, False, False, None), (U, True, False, None)])
        vc, uc = (v.conj(), unit.conj()) if v.is_complex() else (v, unit)
        crow, col, pos = pattern.triangle("UD", True)
        Uh = _csr(crow, col, vc[pos], n)
        crow, col, pos = pattern.triangle("LD", True)
        Lh = _csr(crow, col, uc[pos], n)
        adj.append([(Uh, False, False, None), (Lh, True, False, None)])
    return TriangularPreconditioner("ilu0", fwd, n), TriangularPreconditioner("ilu0 (adjoint)", adj, n)


def ic0(pattern: IncompletePattern, values: Tensor) -> TriangularPreconditioner:
    """IC(0) of a Hermitian positive definite A: ``M = C C^H`` (Hermitian, so its own adjoint); Manteuffel's shift
    after a pivot that is not positive (:data:`IC0_SHIFTS`)."""
    n = pattern.n
    members, used = [], 0.0
    for i, vals in enumerate(_members(values)):
        base = pattern.gather(vals)
        _require_diagonal(pattern, base, "ic0", i)
        d0 = base[pattern.diag_pos]
        if bool((d0.real <= 0).any()):
            row = int(torch.nonzero(d0.real <= 0)[0])
            raise InputError(f"ic0: A[{row}, {row}] = {complex(d0[row]) if d0.is_complex() else float(d0[row]):.6g} "
                             f"is not positive: IC(0) is for Hermitian positive definite matrices; use "
                             f"preconditioner='ilu0' with gmres / bicgstab")
        for alpha in IC0_SHIFTS:
            v = base.clone()
            if alpha:
                v[pattern.diag_pos] = d0 * (1 + alpha)
            v = _factor(pattern, v)
            if _bad_pivot(pattern, v, positive=True) is None:
                used = max(used, alpha)
                break
        else:
            row = _bad_pivot(pattern, v, positive=True)
            raise SingularMatrixError(f"ic0: IC(0) broke down at pivot {row} even with A's diagonal scaled by "
                                      f"{1 + IC0_SHIFTS[-1]:g}: A is not positive definite (or far from an "
                                      f"M-matrix); use preconditioner='jacobi' or a direct method", row=row)
        d = v[pattern.diag_pos].real
        root = d.sqrt().to(v.dtype)
        # C = L D^1/2: the multipliers below the diagonal times sqrt(d_k) of their column, sqrt(d_i) on it
        crow, col, pos = pattern.triangle("LD")
        cv = torch.where(pattern.is_lower[pos], v[pos] * root[pattern.col[pos]], root[pattern.row[pos]])
        C = _csr(crow, col, cv, n)
        crow, col, pos = pattern.triangle("LD", True)
        cvh = torch.where(pattern.is_lower[pos], v[pos] * root[pattern.col[pos]], root[pattern.row[pos]])
        Ch = _csr(crow, col, torch.conj_physical(cvh) if cvh.is_complex() else cvh, n)  # in memory: a CSR kernel reads storage
        members.append([(C, False, False, None), (Ch, True, False, None)])
    return TriangularPreconditioner("ic0", members, n, shift=used)


def ssor(pattern: IncompletePattern, values: Tensor, omega: float = 1.0
         ) -> tuple[TriangularPreconditioner, TriangularPreconditioner]:
    """SSOR with relaxation ``omega`` in (0, 2): the preconditioner and its adjoint."""
    if not 0.0 < omega < 2.0:
        raise InputError(f"ssor: omega={omega!r} must lie in (0, 2) (1: symmetric Gauss-Seidel); pass "
                         f"backend_options={{'ssor_omega': 1.0}}")
    n = pattern.n
    fwd, adj = [], []
    for i, vals in enumerate(_members(values)):
        v = pattern.gather(vals)
        _require_diagonal(pattern, v, "ssor", i)
        d = v[pattern.diag_pos]
        w = v.clone()
        w[pattern.diag_pos] = d / omega  # D / omega + the strict triangles
        scale = d.unsqueeze(-1)
        lower, upper = pattern.triangle("LD"), pattern.triangle("UD")
        Lo = _csr(lower[0], lower[1], w[lower[2]], n)
        Up = _csr(upper[0], upper[1], w[upper[2]], n)
        fwd.append([(Lo, False, False, scale), (Up, True, False, None)])
        wc = w.conj() if w.is_complex() else w
        lo_h, up_h = pattern.triangle("UD", True), pattern.triangle("LD", True)
        adj.append([(_csr(lo_h[0], lo_h[1], wc[lo_h[2]], n), False, False, scale.conj() if scale.is_complex() else scale),
                    (_csr(up_h[0], up_h[1], wc[up_h[2]], n), True, False, None)])
    post = (2.0 - omega) / omega
    return (TriangularPreconditioner("ssor", fwd, n, post=post),
            TriangularPreconditioner("ssor (adjoint)", adj, n, post=post))


class Chebyshev:
    """``M^-1 X = p(D^-1 A) D^-1 X``: ``degree`` steps of Chebyshev's iteration for ``A Y = X`` from ``Y = 0`` with
    Jacobi scaling, on the interval ``[lo, hi]`` (a fixed polynomial in A: a linear operator)."""

    name = "polynomial"

    def __init__(self, product: Callable[[Tensor], Tensor], inverse_diagonal: Tensor, lo: float, hi: float,
                 degree: int) -> None:
        self.product, self.inv = product, inverse_diagonal.unsqueeze(-1)
        self.lo, self.hi, self.degree = lo, hi, degree

    def __call__(self, X: Tensor) -> Tensor:
        theta, delta = 0.5 * (self.hi + self.lo), 0.5 * (self.hi - self.lo)
        sigma = theta / delta
        rho = 1.0 / sigma
        inv = self.inv.to(X.dtype) if X.dtype != self.inv.dtype else self.inv
        R = X
        D = (inv * R) / theta
        Y = D
        for _ in range(self.degree - 1):
            R = R - self.product(D)
            rho_next = 1.0 / (2.0 * sigma - rho)
            D = (rho_next * rho) * D + (2.0 * rho_next / delta) * (inv * R)
            Y = Y + D
            rho = rho_next
        return Y

    def __repr__(self) -> str:
        return f"Chebyshev(degree={self.degree}, interval=[{self.lo:.3g}, {self.hi:.3g}])"


#: the highest Chebyshev degree taken (session 32's sweep: degree 10^6 ran for minutes, and CG's iterations stopped
#: falling past ~100)
POLY_DEGREE_MAX = 1000


def polynomial(pattern: IncompletePattern, values: Tensor, product: Callable[[Tensor], Tensor],
               adjoint_product: Callable[[Tensor], Tensor], degree: int = 4, ratio: float = 30.0
               ) -> tuple[Chebyshev, Chebyshev]:
    """The Chebyshev preconditioner and its adjoint. ``values`` unbatched or batched alike: the interval is the widest
    member's, its diagonal per member."""
    if isinstance(degree, bool) or not isinstance(degree, numbers.Real) or int(degree) != degree \
            or not 1 <= degree <= POLY_DEGREE_MAX:
        raise InputError(f"polynomial: degree={degree!r} must be an integer in [1, {POLY_DEGREE_MAX}] (backend_options "
                         f"'poly_degree'; each application costs degree products, and past ~100 the iterations saved "
                         f"stop paying for them)")
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not (ratio > 1.0 and math.isfinite(ratio)):
        raise InputError(f"polynomial: ratio={ratio!r} must be a finite number above 1 (backend_options 'poly_ratio': "
                         f"the Gershgorin bound over the interval's lower end)")
    flat = values.reshape(-1, values.shape[-1])
    v = torch.stack([pattern.gather(m) for m in flat.unbind(0)])
    d = v[:, pattern.diag_pos]
    zero = torch.nonzero(d == 0)
    if zero.numel():
        member, row = (int(t) for t in zero[0])
        raise SingularMatrixError(f"polynomial: A[{row}, {row}] is zero or not stored"
                                  + (f" (value-batch member {member})" if member else "")
                                  + "; the Chebyshev preconditioner scales by the diagonal", row=row)
    rows = v.abs().new_zeros(v.shape[0], pattern.n).index_add(1, pattern.row, v.abs())
    hi = float((rows / d.abs()).amax())  # Gershgorin: every eigenvalue of D^-1 A lies within this of 0
    if not math.isfinite(hi) or hi <= 0:
        raise InputError(f"polynomial: the Gershgorin bound of D^-1 A is {hi!r}; check A's values")
    inv = (1.0 / d).reshape(*values.shape[:-1], pattern.n)
    return (Chebyshev(product, inv, hi / ratio, hi, int(degree)),
            Chebyshev(adjoint_product, inv.conj() if inv.is_complex() else inv, hi / ratio, hi, int(degree)))
