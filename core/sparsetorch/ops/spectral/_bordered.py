"""The bordered system of an eigenvector's adjoint (``autograd/spectral.py``, docs/spectral.md):
assembled on one fixed pattern and solved through dispatch, which the autograd layer below the
ops cannot reach; ``eigsh`` hands this class to its handle.

The bordered matrix is singular exactly when the shift is an eigenvalue with a copy outside the
computed pairs. An LU of it rarely says so: rounding leaves a pivot of order ``eps ||A||``, and a
consistent right-hand side (the loss's gradient has no component along the missing copy) came
back with an arbitrary, method-dependent component along that copy and no error (session 27's
sweep: a 4 x 4 grid Laplacian). So every solve carries a probe: a fixed pseudo-random ``u``,
solved with the same matrix, whose answer ``y_u = sum_{j not computed} v_j v_j^H M u / (w_j - s)``
bounds the nearest eigenvalue not computed, ``min_j |w_j - s| <= ||u||_M / ||y_u||_M`` (never
below it; near it unless ``u`` is almost orthogonal to that eigenvector, which a pseudo-random
``u`` is not; near the threshold one more inverse iteration sharpens it: ``BorderedSystem._gap``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import NoBackendError, SingularMatrixError
from ...tensor import SparseTensor
from .._assemble import CooAssembler
from ..lstsq import lstsq
from ..solve import solve

__all__ = ["BorderedSystem", "BorderedSolution"]

_PROBE_SEED = 0x5EED
_MAX_NULL = 8  # missing copies removed at most (a multiplicity beyond it keeps its coupling)


@dataclass(frozen=True)
class BorderedSolution:
    """What one bordered solve found. ``y``: the solution's first ``n`` entries (``None`` when the
    matrix is exactly singular and nothing was dropped); ``gap``: the probe's estimate of the
    distance from the shift to the nearest eigenvalue not computed (never below it; ``0.0`` when
    the matrix is exactly singular); ``dropped``: how many missing copies of the shift were
    projected out of ``y`` (``drop_null`` only)."""

    y: torch.Tensor | None
    gap: float
    dropped: int = 0


class BorderedSystem:
    """``[[A - s M, M V], [V^H M, 0]]`` on one fixed pattern (A's, M's or the diagonal, a dense border)."""

    def __init__(self, A: SparseTensor, M: SparseTensor | None, k: int) -> None:
        n = A.format_shape[0]
        dev = A.device
        coords, self._slot = A.entries()
        if M is None:
            mr = mc = torch.arange(n, device=dev)
            self._mslot = None
        else:
            mco, self._mslot = M.entries()
            mr, mc = mco[0], mco[1]
        ar = torch.arange(n, device=dev).repeat_interleave(k)
        bc = n + torch.arange(k, device=dev).repeat(n)
        rows = torch.cat([coords[0], mr, ar, bc])
        cols = torch.cat([coords[1], mc, bc, ar])
        self.n, self.k = n, k
        self._asm = CooAssembler(rows, cols, (n + k, n + k), A.dtype)
        self._M = M
        gen = torch.Generator().manual_seed(_PROBE_SEED)
        probe = torch.randn(n, dtype=torch.float64, generator=gen)
        if A.dtype.is_complex:
            probe = torch.complex(probe, torch.randn(n, dtype=torch.float64, generator=gen))
        self._probe = probe.to(dtype=A.dtype, device=dev)

    def solve(self, avals, mvals, V, shift: float, rhs, *, gap_tol: float = 0.0,
              drop_null: bool = False) -> BorderedSolution:
        """``y`` for the right-hand side ``rhs``, with the probe's gap estimate (module docstring).
        With ``drop_null``, a copy of ``shift`` outside the computed ones (the probe's gap at most
        ``gap_tol``, or an exactly singular matrix) has its coupling dropped: ``y`` is the solution
        with the component along each such copy removed from ``rhs`` and from ``y``."""
        n, k = self.n, self.k
        a = avals.detach()[self._slot]
        if self._M is None:
            md = torch.full((n,), -shift, dtype=a.dtype, device=a.device)
            MV = V
            Mop = None
        else:
            m = mvals.detach()
            md = -shift * m[self._mslot]
            Mop = self._M.with_values(m)
            MV = Mop @ V
        border = MV.reshape(-1)  # row-major (n, k): matches the (ar, bc) order
        lower = MV.conj().reshape(-1)
        K = self._asm.tensor(torch.cat([a, md, border, lower]))
        props = "hermitian" if a.is_complex() else "symmetric"
        mul = (lambda x: x) if Mop is None else (lambda x: Mop @ x)  # noqa: E731
        mnorm = lambda x: float(torch.sqrt((x.conj() * mul(x)).sum().real.clamp_min(0)))  # noqa: E731

        def run(cols: list[torch.Tensor]) -> torch.Tensor:
            B = torch.stack([torch.cat([c, c.new_zeros(k)]) for c in cols], -1)
            # K is symmetric indefinite and may have zeros on its diagonal: a direct LU where one is
            # offered (BiCGSTAB broke down on it at the first iteration), an iterative method otherwise.
            try:
                X = solve(K, B, properties=props, method="lu")
            except NoBackendError:
                X = solve(K, B, properties=props, rtol=1e-12)
            return X[:n]

        u = self._probe
        try:
            X = run([rhs, mul(u)])
        except SingularMatrixError:
            if not drop_null:
                return BorderedSolution(None, 0.0)
            # the least-squares solution of least norm: the coupling to the missing copies dropped
            b = torch.cat([rhs, rhs.new_zeros(k)])
            return BorderedSolution(lstsq(K, b)[:n], 0.0, 1)
        y = X[:, 0]
        Z: list[torch.Tensor] = []
        gap, z = self._gap(run, mul, mnorm, u, X[:, 1], Z, gap_tol)
        if not drop_null or gap > gap_tol:
            return BorderedSolution(y, gap)
        # Missing copies: the probe's answer is one (inverse iteration: the other eigenvectors are damped
        # by the ratio of the gaps); the probe, rid of it, finds the next. rhs and y lose their
        # components along them, in M's inner product: y is the part of the solution outside them.
        est = gap
        while est <= gap_tol and len(Z) < _MAX_NULL:
            zn = mnorm(z)
            if zn == 0.0:
                break
            Z.append(_deflate(z / zn, Z, mul) if Z else z / zn)
            v = _deflate(u, Z, mul)
            try:
                est, z = self._gap(run, mul, mnorm, v, _deflate(run([mul(v)])[:, 0], Z, mul), Z, gap_tol)
            except SingularMatrixError:  # the solve's checks gave up on this right-hand side: stop here
                break
        r = rhs
        for q in Z:
            r = r - mul(q) * (q.conj() @ r)
        try:
            y = _deflate(run([r])[:, 0], Z, mul)
        except SingularMatrixError:
            y = _deflate(lstsq(K, torch.cat([r, r.new_zeros(k)]))[:n], Z, mul)
        return BorderedSolution(y, gap, len(Z))

    def _gap(self, run, mul, mnorm, u, yu, Z, gap_tol: float) -> tuple[float, torch.Tensor]:
        """The probe's gap estimate ``||u||_M / ||y_u||_M`` and the vector it points at. A random ``u``
        has a component of about ``||u|| / sqrt(n)`` along the nearest eigenvector, so the estimate
        may exceed the gap by ``sqrt(n)``: within ``10 sqrt(n)`` of ``gap_tol`` one more inverse
        iteration (``y_u`` as the right-hand side) sharpens it; the bound holds for either. A solve
        that then reports the matrix singular gives 0."""
        gap = _ratio(mnorm(u), mnorm(yu))
        if gap_tol < gap <= gap_tol * 10 * self.n ** 0.5:
            zn = mnorm(yu)
            z0 = yu / zn
            try:
                z = _deflate(run([mul(z0)])[:, 0], Z, mul)
            except SingularMatrixError:
                return 0.0, yu
            return min(gap, _ratio(1.0, mnorm(z))), z
        return gap, yu


def _ratio(num: float, den: float) -> float:
    return float("inf") if den == 0.0 else (0.0 if den == float("inf") else num / den)


def _deflate(x: torch.Tensor, Z: list[torch.Tensor], mul) -> torch.Tensor:
    """``x`` less its components along the M-orthonormal ``Z`` (twice: Gram-Schmidt, reorthogonalised)."""
    for _ in range(2):
        for q in Z:
            x = x - q * (q.conj() @ mul(x))
    return x
