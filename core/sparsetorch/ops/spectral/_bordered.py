"""The bordered system of an eigenvector's adjoint (``autograd/spectral.py``, docs/spectral.md):
assembled on one fixed pattern and solved through dispatch, which the autograd layer below the
ops cannot reach; ``eigsh`` hands this class to its handle."""

from __future__ import annotations

import torch

from ...errors import DegenerateEigenvalueError, NoBackendError, SingularMatrixError
from ...tensor import SparseTensor
from .._assemble import CooAssembler
from ..lstsq import lstsq
from ..solve import solve

__all__ = ["BorderedSystem"]


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

    def solve(self, avals, mvals, V, shift: float, rhs, drop_null: bool = False) -> torch.Tensor:
        """``y``; the bordered matrix is singular when ``shift`` is an eigenvalue repeated outside the
        computed ones: then :class:`DegenerateEigenvalueError`, or with ``drop_null`` the least-squares
        solution of least norm (the coupling to the missing copy dropped)."""
        n, k = self.n, self.k
        a = avals.detach()[self._slot]
        if self._M is None:
            md = torch.full((n,), -shift, dtype=a.dtype, device=a.device)
            MV = V
        else:
            m = mvals.detach()
            md = -shift * m[self._mslot]
            MV = self._M.with_values(m) @ V
        border = MV.reshape(-1)  # row-major (n, k): matches the (ar, bc) order
        lower = MV.conj().reshape(-1)
        K = self._asm.tensor(torch.cat([a, md, border, lower]))
        b = torch.cat([rhs, rhs.new_zeros(k)])
        props = "hermitian" if a.is_complex() else "symmetric"
        # K is symmetric indefinite and may have zeros on its diagonal: a direct LU where one is
        # offered (BiCGSTAB broke down on it at the first iteration), an iterative method otherwise.
        try:
            try:
                x = solve(K, b, properties=props, method="lu")
            except NoBackendError:
                x = solve(K, b, properties=props, rtol=1e-12)
        except SingularMatrixError as exc:
            if not drop_null:
                raise DegenerateEigenvalueError(
                    f"eigenvector gradient at eigenvalue {shift:.6g}: it is repeated, and its other copy is not among "
                    f"the {k} computed eigenpairs (the bordered system of its adjoint is singular), so the eigenvector "
                    f"is not unique and this loss has no gradient. Compute more eigenpairs (a larger k) so that every "
                    f"copy is among them, use a loss that depends only on the eigenspace, or pass degenerate='warn' / "
                    f"'ignore' (drops the coupling to the missing copy)") from exc
            x = lstsq(K, b)
        return x[:n]
