"""Small, well-conditioned test matrices for the conformance kit (and for anyone's tests).

Every generator builds its matrix densely in float64 (complex128 for complex dtypes), keeps the
nonzeros in the requested format, and returns a :class:`~sparsetorch.SparseTensor`. Sizes are
meant to stay small (``n <= 200``): these are for checking answers against dense oracles, not
for timing.

================================  ===========================================================
generator                         matrix
================================  ===========================================================
:func:`poisson2d`                 5-point Laplacian on an ``nx x ny`` grid: SPD, detected as
                                  ``spd`` (diagonally dominant)
:func:`symmetric_indefinite`      the Laplacian shifted into the middle of its spectrum:
                                  symmetric, indefinite, eigenvalues kept away from zero
:func:`convection_diffusion`      central-difference convection-diffusion: non-symmetric,
                                  diagonally dominant
:func:`hermitian_pd`              complex Hermitian positive definite (Laplacian plus an
                                  imaginary antisymmetric coupling), detected as ``spd``
:func:`random_nonsymmetric`       random pattern, strictly diagonally dominant
================================  ===========================================================

:func:`make_problem` picks one by the structure a method needs (``"spd"``, ``"symmetric"`` or
``"general"``) and returns a :class:`Problem` (the matrix, its float64 dense oracle, right-hand
side factories).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..format import CSR, TensorFormat
from ..tensor import SparseTensor

__all__ = [
    "Problem", "make_problem", "poisson2d", "symmetric_indefinite", "convection_diffusion", "hermitian_pd",
    "random_nonsymmetric", "random_rectangular", "oracle_dtype", "KINDS",
]

#: Structures a problem can have (what a method may require of its matrix).
KINDS = ("spd", "symmetric", "general")


def oracle_dtype(dtype: torch.dtype) -> torch.dtype:
    """The double-precision dtype dense oracles run in: float64, or complex128 for complex dtypes."""
    return torch.complex128 if dtype.is_complex else torch.float64


def _finish(dense: torch.Tensor, format: TensorFormat | str, dtype: torch.dtype, device) -> SparseTensor:
    return SparseTensor.from_dense(dense.to(dtype=dtype, device=device), format)


def _lap1d(m: int, lower: float = -1.0, upper: float = -1.0) -> torch.Tensor:
    d = torch.diag(torch.full((m,), 2.0, dtype=torch.float64))
    if m > 1:
        d += torch.diag(torch.full((m - 1,), lower, dtype=torch.float64), -1)
        d += torch.diag(torch.full((m - 1,), upper, dtype=torch.float64), 1)
    return d


def _grid(nx: int, ny: int, cx: float = 0.0, cy: float = 0.0) -> torch.Tensor:
    """``I (x) Tx + Ty (x) I`` with central convection ``c`` in each direction (c = 0: Laplacian)."""
    tx = _lap1d(nx, -1.0 - cx, -1.0 + cx)
    ty = _lap1d(ny, -1.0 - cy, -1.0 + cy)
    return torch.kron(torch.eye(ny, dtype=torch.float64), tx) + torch.kron(ty, torch.eye(nx, dtype=torch.float64))


def _dense_poisson(nx: int, ny: int | None) -> torch.Tensor:
    return _grid(nx, nx if ny is None else ny)


def poisson2d(nx: int, ny: int | None = None, *, format: TensorFormat | str = CSR, dtype: torch.dtype = torch.float64,
              device: torch.device | str = "cpu") -> SparseTensor:
    """The 5-point Laplacian on an ``nx x ny`` grid (``n = nx * ny``), Dirichlet boundary: SPD.

    For a complex ``dtype`` the same real matrix is stored with complex values (Hermitian PD).
    Built from its stencil triplets (never densely), so benchmark sizes (1000², 8000²) work.
    """
    ny = nx if ny is None else ny
    i = torch.arange(nx * ny, device=device)
    x, y = i % nx, i // nx
    rows, cols, vals = [i], [i], [torch.full((nx * ny,), 4.0, dtype=torch.float64, device=device)]
    for ok, step in ((x > 0, -1), (x < nx - 1, 1), (y > 0, -nx), (y < ny - 1, nx)):
        r = i[ok]
        rows.append(r)
        cols.append(r + step)
        vals.append(torch.full((r.numel(),), -1.0, dtype=torch.float64, device=device))
    A = SparseTensor.from_coo(torch.cat(vals).to(dtype), torch.cat(rows), torch.cat(cols), shape=(nx * ny, nx * ny), format=CSR)
    fmt = TensorFormat.parse(format) if isinstance(format, str) else format
    return A if fmt == CSR else A.convert(fmt)


def _middle_shift(dense: torch.Tensor) -> float:
    """A shift in the largest gap of the middle half of the spectrum (Hermitian ``dense``)."""
    ev = torch.linalg.eigvalsh(dense)
    n = ev.numel()
    lo, hi = max(1, n // 4), max(2, (3 * n) // 4)
    gaps = ev[lo:hi] - ev[lo - 1 : hi - 1]
    k = int(torch.argmax(gaps)) + lo
    return float((ev[k] + ev[k - 1]) / 2)


def symmetric_indefinite(nx: int, ny: int | None = None, *, format: TensorFormat | str = CSR,
                         dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> SparseTensor:
    """``L - s I`` for the grid Laplacian ``L`` and a shift ``s`` in the middle of its spectrum:
    symmetric (Hermitian for complex dtypes, with an imaginary coupling), indefinite, and
    nonsingular with a modest condition number (``s`` sits in the widest gap)."""
    base = _dense_poisson(nx, ny) if not dtype.is_complex else _dense_hermitian(nx, ny, diag_extra=0.0)
    shift = _middle_shift(base)
    dense = base - shift * torch.eye(base.shape[0], dtype=base.dtype)
    return _finish(dense, format, dtype, device)


def convection_diffusion(nx: int, ny: int | None = None, *, convection: float = 0.4, format: TensorFormat | str = CSR,
                         dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> SparseTensor:
    """Central-difference convection-diffusion on an ``nx x ny`` grid: non-symmetric, and
    diagonally dominant for ``|convection| < 1`` (so well conditioned). A complex ``dtype`` adds
    an imaginary part to the convection (non-Hermitian)."""
    ny = nx if ny is None else ny
    dense = _grid(nx, ny, convection, convection / 2)
    if dtype.is_complex:
        skew = _grid(nx, ny, 0.3, 0.0) - _grid(nx, ny)  # antisymmetric, on the off-diagonals
        dense = dense.to(torch.complex128) + 0.5j * skew.abs()
    return _finish(dense, format, dtype, device)


def _dense_hermitian(nx: int, ny: int | None, *, coupling: float = 0.5, diag_extra: float | None = None) -> torch.Tensor:
    ny = nx if ny is None else ny
    lap = _grid(nx, ny)
    skew = _grid(nx, ny, 1.0, 1.0) - lap  # real antisymmetric: +-1 on the grid couplings
    dense = lap.to(torch.complex128) + 1j * coupling * skew
    if diag_extra is None:
        # Make every row strictly dominant: |-1 + i c| = sqrt(1 + c^2) per neighbour (<= 4 of them).
        diag_extra = 4 * (math.sqrt(1 + coupling**2) - 1) + 0.25
    return dense + diag_extra * torch.eye(lap.shape[0], dtype=torch.complex128)


def hermitian_pd(nx: int, ny: int | None = None, *, format: TensorFormat | str = CSR, dtype: torch.dtype = torch.complex128,
                 device: torch.device | str = "cpu") -> SparseTensor:
    """A complex Hermitian positive definite matrix on the grid pattern: the Laplacian plus an
    imaginary antisymmetric coupling, with the diagonal raised so that rows are strictly
    dominant (detected as ``spd``). ``dtype`` must be complex."""
    if not dtype.is_complex:
        raise ValueError(f"hermitian_pd needs a complex dtype, got {dtype}; use poisson2d for a real SPD matrix")
    return _finish(_dense_hermitian(nx, ny), format, dtype, device)


def random_nonsymmetric(n: int, *, density: float = 0.2, seed: int = 0, format: TensorFormat | str = CSR,
                        dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> SparseTensor:
    """A random sparse ``n x n`` matrix (about ``density`` of the off-diagonal entries set) made
    strictly diagonally dominant by its diagonal: well conditioned, non-symmetric pattern and
    values. Complex dtypes get complex entries."""
    g = torch.Generator().manual_seed(seed)
    wdtype = oracle_dtype(dtype)
    off = torch.randn(n, n, generator=g, dtype=wdtype) * (torch.rand(n, n, generator=g, dtype=torch.float64) < density)
    off.fill_diagonal_(0)
    rowsum = off.abs().sum(-1)
    dense = off + torch.diag((1.5 * rowsum + 1.0).to(wdtype))
    return _finish(dense, format, dtype, device)


def random_rectangular(m: int, n: int, *, density: float = 0.3, seed: int = 0, format: TensorFormat | str = CSR,
                       dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> SparseTensor:
    """A random sparse ``m x n`` matrix (for products), with at least one entry per row."""
    g = torch.Generator().manual_seed(seed)
    wdtype = oracle_dtype(dtype)
    vals = torch.randn(m, n, generator=g, dtype=wdtype)
    mask = torch.rand(m, n, generator=g, dtype=torch.float64) < density
    mask[torch.arange(m), torch.arange(m) % n] = True
    return _finish(vals * mask, format, dtype, device)


@dataclass(frozen=True)
class Problem:
    """A test system: the matrix, its structure and a seeded source of right-hand sides.

    ``dense`` is the float64 (complex128) dense form of the *stored* values, so the oracle sees
    exactly the matrix the backend sees (float32 rounding included).
    """

    name: str
    kind: str
    A: SparseTensor
    seed: int = 0

    @property
    def n(self) -> int:
        return int(self.A.format_shape[0])

    @property
    def dense(self) -> torch.Tensor:
        return self.A.detach().to_dense().to(oracle_dtype(self.A.dtype))

    def rhs(self, *columns: int, batch: Sequence[int] | None = None, seed: int | None = None,
            dtype: torch.dtype | None = None) -> torch.Tensor:
        """A random right-hand side ``(*batch, n)`` (or ``(*batch, n, k)`` with ``rhs(k)``) in A's
        dtype (or ``dtype``) and device; ``batch`` defaults to A's value batch."""
        g = torch.Generator().manual_seed(self.seed + 1000 if seed is None else seed)
        batch = tuple(self.A.batch_shape) if batch is None else tuple(batch)
        want = dtype or self.A.dtype
        shape = (*batch, self.n, *columns)
        b = torch.randn(shape, generator=g, dtype=oracle_dtype(want))
        return b.to(dtype=want, device=self.A.device)

    def value_batch(self, size: int = 3) -> SparseTensor:
        """``A`` with ``size`` value sets on its pattern: member ``k`` is ``(1 + k/4) A`` with, for
        the SPD and general kinds, ``k/2`` added to the diagonal (the structure is kept)."""
        coords, slot = self.A.entries()
        diag = torch.zeros(self.A.values.shape[-1], dtype=torch.bool, device=self.A.device)
        diag[slot[coords[0] == coords[1]]] = True
        members = []
        for k in range(size):
            v = self.A.values.detach() * (1 + k / 4)
            if self.kind != "symmetric":
                v = v + (k / 2) * diag.to(v.dtype)
            members.append(v)
        return self.A.with_values(torch.stack(members))

    def solution(self, b: torch.Tensor, A: SparseTensor | None = None) -> torch.Tensor:
        """The dense double-precision oracle ``torch.linalg.solve(A, b)`` (``b`` as ``solve`` takes it)."""
        A = self.A if A is None else A
        dense = A.detach().to_dense().to(oracle_dtype(A.dtype))
        bd = b.detach().to(dense.dtype)
        nb = len(A.batch_shape)
        if bd.dim() == nb + 1:
            return torch.linalg.solve(dense, bd.unsqueeze(-1)).squeeze(-1)
        return torch.linalg.solve(dense, bd)


def make_problem(kind: str, size: int | tuple[int, int] = (5, 4), *, format: TensorFormat | str = CSR,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu", variant: str | None = None,
                 seed: int = 0) -> Problem:
    """A problem of structure ``kind`` (``"spd"``, ``"symmetric"`` (indefinite) or ``"general"``)
    on a grid of ``size`` points (``(nx, ny)``, or ``n`` for a 1-D grid).

    ``variant="random"`` gives :func:`random_nonsymmetric` for the general kind (``n = nx * ny``).
    Complex dtypes give Hermitian matrices for ``spd``/``symmetric`` and non-Hermitian ones for
    ``general``.
    """
    nx, ny = (size, 1) if isinstance(size, int) else size
    kw = dict(format=format, dtype=dtype, device=device)
    if kind == "spd":
        A = hermitian_pd(nx, ny, **kw) if dtype.is_complex else poisson2d(nx, ny, **kw)
        name = "hermitian_pd" if dtype.is_complex else "poisson2d"
    elif kind == "symmetric":
        A, name = symmetric_indefinite(nx, ny, **kw), "symmetric_indefinite"
    elif kind == "general":
        if variant == "random":
            A, name = random_nonsymmetric(nx * ny, seed=seed, **kw), "random_nonsymmetric"
        else:
            A, name = convection_diffusion(nx, ny, **kw), "convection_diffusion"
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return Problem(f"{name}{nx}x{ny}", kind, A, seed)
