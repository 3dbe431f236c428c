"""Generated matrix families that look like what users bring, for collection tests and benchmarks.

:mod:`.problems` holds small, well-conditioned matrices for checking answers against dense
oracles. This module is the other end: sparse matrices built the way applications build them,
with the awkward properties real ones have (strong convection, indefiniteness, bad scaling,
tiny singular values, complex values, exact singularity), at sizes from a few hundred to a few
thousand unknowns by default. Every generator takes its size parameters and a ``seed`` (same
arguments, same matrix, bit for bit) and returns a :class:`Generated`: the matrix as a SciPy
CSR matrix (float64 or complex128), a short unique ``name``, a one-line ``description``, the
family and its parameters, and whether the matrix is singular (where the right answer of a
solve is :class:`~sparsetorch.SingularMatrixError`). ``Generated.tensor()`` gives it as a
:class:`~sparsetorch.SparseTensor`.

=====================================  ======================================================
generator                              matrix
=====================================  ======================================================
:func:`convection_diffusion`           2-D ``-Δu + w·∇u`` on the unit square (5-point, upwind
                                       or central convection), global Péclet number ``|w|``
:func:`random_conditioned`             random sparse non-symmetric ``Q1 diag(s) Q2`` with
                                       ``Q1``, ``Q2`` products of random Givens rotations: its
                                       2-norm condition number is ``cond`` (to rounding)
:func:`helmholtz`                      ``-Δ - k² I`` on a grid (symmetric indefinite), ``k²``
                                       moved to the middle of the gap between the two nearest
                                       Laplacian eigenvalues (known in closed form)
:func:`graph_laplacian`                weighted Laplacian of a random geometric or power-law
                                       (preferential attachment) graph plus a small shift
:func:`expander`                       signed adjacency of a random graph (Gset-like): no small
                                       separators, a dense-like LU
:func:`badly_scaled`                   ``D1 A D2`` for a well-conditioned ``A`` and random
                                       diagonal ``D`` spread log-uniformly over 1e-8..1e8
:func:`near_singular`                  smallest singular value ``sigma_min`` (1e-10 by default,
                                       largest 1): nonsingular to working precision
:func:`complex_symmetric`              ``-Δ - (k² + iα) I``: complex symmetric (``A = Aᵀ``), not
                                       Hermitian (a damped Helmholtz operator)
:func:`complex_hermitian`              grid Laplacian with an imaginary antisymmetric coupling,
                                       shifted to be Hermitian indefinite or positive definite
:func:`poisson`                        5-point (2-D) or 7-point (3-D) Laplacian: SPD
:func:`singular`                       exactly singular: an empty row, two rows whose entries
                                       share one column (structural), or a duplicated row
                                       (numerical: elimination meets an exact zero pivot)
=====================================  ======================================================

:func:`collection` returns one list with every family at a few parameter settings (the set the
collection benchmark and test use); :data:`FAMILIES` maps family names to generators.

Needs NumPy and SciPy (imported here, not by ``import sparsetorch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

__all__ = [
    "Generated", "convection_diffusion", "random_conditioned", "helmholtz", "graph_laplacian", "badly_scaled",
    "near_singular", "complex_symmetric", "complex_hermitian", "poisson", "singular", "expander", "block_diagonal", "collection",
    "FAMILIES",
]


@dataclass(frozen=True)
class Generated:
    """One generated matrix: SciPy CSR (canonical: sorted indices, no duplicates) plus its record."""

    name: str
    description: str
    matrix: sp.csr_matrix
    family: str
    params: dict[str, Any] = field(default_factory=dict)
    #: True where the matrix is singular (exactly, in floating point): a solve should raise
    #: SingularMatrixError.
    singular: bool = False

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)

    def tensor(self, dtype=None, format=None):
        """The matrix as a :class:`~sparsetorch.SparseTensor` (CSR unless ``format`` says
        otherwise), in ``dtype`` (a torch dtype; default float64 / complex128)."""
        from ..tensor import SparseTensor

        T = SparseTensor.from_package(self.matrix.copy())
        if dtype is not None and dtype != T.dtype:
            T = T.to(dtype)
        if format is not None:
            T = T.convert(format)
        return T


def _canonical(A: sp.spmatrix) -> sp.csr_matrix:
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    A.sort_indices()
    A.eliminate_zeros()
    return A


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _lap1d(m: int) -> sp.csr_matrix:
    return sp.diags([-np.ones(m - 1), 2.0 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1], format="csr")


def _laplacian(m: int, dim: int = 2) -> sp.csr_matrix:
    """The ``dim``-dimensional grid Laplacian (Dirichlet) with ``m`` points a side, times h²."""
    T, I = _lap1d(m), sp.identity(m, format="csr")
    if dim == 1:
        return T
    if dim == 2:
        return (sp.kron(I, T) + sp.kron(T, I)).tocsr()
    if dim == 3:
        I2 = sp.identity(m * m, format="csr")
        return (sp.kron(I2, T) + sp.kron(I, sp.kron(T, I)) + sp.kron(T, I2)).tocsr()
    raise ValueError(f"dim must be 1, 2 or 3, got {dim!r}")


def _laplacian_eigenvalues(m: int, dim: int) -> np.ndarray:
    """Every eigenvalue of :func:`_laplacian` (closed form), sorted."""
    e = 4.0 * np.sin(np.pi * np.arange(1, m + 1) / (2 * (m + 1))) ** 2
    out = e
    for _ in range(dim - 1):
        out = np.add.outer(out, e).ravel()
    return np.sort(out)


def _gap_midpoint(eigs: np.ndarray, target: float) -> tuple[float, float]:
    """The midpoint of the gap between the eigenvalues around ``target``, and half that gap."""
    k = int(np.clip(np.searchsorted(eigs, target), 1, eigs.size - 1))
    lo, hi = eigs[k - 1], eigs[k]
    if hi - lo < 1e-9 * max(1.0, abs(hi)):  # a repeated eigenvalue: widen to the next distinct one
        distinct = np.unique(np.round(eigs, 12))
        k = int(np.clip(np.searchsorted(distinct, target), 1, distinct.size - 1))
        lo, hi = distinct[k - 1], distinct[k]
    return float((lo + hi) / 2), float((hi - lo) / 2)


# --------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------

def convection_diffusion(m: int = 30, peclet: float = 10.0, *, scheme: str = "upwind", seed: int = 0) -> Generated:
    """``-Δu + w·∇u = f`` on the unit square, ``m x m`` interior points (``n = m²``), Dirichlet.

    ``w = peclet * (cos θ, sin θ)`` with the angle θ drawn from ``seed`` in (15°, 75°), so the
    global Péclet number (``|w| L / ν`` with ``L = ν = 1``) is ``peclet``; the grid Péclet
    number is ``peclet * h / 2`` with ``h = 1 / (m + 1)``. ``scheme="upwind"``: first-order
    upwind convection (an M-matrix, diagonally dominant at every Péclet number, but far from
    symmetric at high Péclet). ``scheme="central"``: central differences (not diagonally
    dominant once the grid Péclet number exceeds 1). Scaled by ``h²``.
    """
    if scheme not in ("upwind", "central"):
        raise ValueError(f"scheme must be 'upwind' or 'central', got {scheme!r}")
    theta = math.radians(float(_rng(seed).uniform(15.0, 75.0)))
    h = 1.0 / (m + 1)
    wx, wy = peclet * math.cos(theta), peclet * math.sin(theta)
    I = sp.identity(m, format="csr")
    lap = _laplacian(m, 2)
    # first-derivative stencils (times h², i.e. h * w times a difference)
    if scheme == "central":
        D = sp.diags([-np.ones(m - 1), np.ones(m - 1)], [-1, 1], format="csr") * 0.5  # (u[i+1] - u[i-1]) / 2
        Dx = Dy = D
    else:
        back = sp.diags([-np.ones(m - 1), np.ones(m)], [-1, 0], format="csr")  # u[i] - u[i-1]  (w > 0)
        Dx = Dy = back
    conv = h * (wx * sp.kron(I, Dx) + wy * sp.kron(Dy, I))
    A = _canonical(lap + conv)
    name = f"convdiff_{scheme}_pe{peclet:g}_n{m * m}"
    desc = (f"2-D convection-diffusion, {scheme} convection, Peclet {peclet:g} (grid Peclet {peclet * h / 2:.3g}), "
            f"{m}x{m} grid")
    return Generated(name, desc, A, "convection_diffusion",
                     {"m": m, "peclet": peclet, "scheme": scheme, "seed": seed})


def _givens_layers(n: int, layers: int, rng: np.random.Generator) -> sp.csr_matrix:
    """A product of ``layers`` random orthogonal matrices, each a set of n/2 Givens rotations
    on a random pairing of the indices (so at most ``2**layers`` entries per row)."""
    Q = sp.identity(n, format="csr")
    for _ in range(layers):
        perm = rng.permutation(n)
        a, b = perm[: n // 2], perm[n // 2: 2 * (n // 2)]
        t = rng.uniform(0.0, 2.0 * np.pi, size=a.size)
        c, s = np.cos(t), np.sin(t)
        rows = np.concatenate([a, a, b, b])
        cols = np.concatenate([a, b, a, b])
        vals = np.concatenate([c, -s, s, c])
        if n % 2:  # the unpaired index keeps a sign flip
            rows, cols = np.append(rows, perm[-1]), np.append(cols, perm[-1])
            vals = np.append(vals, rng.choice([-1.0, 1.0]))
        G = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
        Q = (G @ Q).tocsr()
    return Q


def random_conditioned(n: int = 500, cond: float = 1e3, *, layers: int = 2, seed: int = 0) -> Generated:
    """A random sparse non-symmetric ``n x n`` matrix with 2-norm condition number ``cond``.

    ``A = Q1 diag(s) Q2``: ``Q1`` and ``Q2`` are independent products of ``layers`` layers of
    random Givens rotations (orthogonal, at most ``2**layers`` entries per row), and ``s``
    spreads log-uniformly from 1 down to ``1 / cond`` in a random order. So the singular values
    are exactly ``s`` up to rounding, and ``A`` has at most ``4**layers`` entries per row.
    """
    rng = _rng(seed)
    s = np.logspace(0.0, -math.log10(cond), n) if cond > 1 else np.ones(n)
    s = s[rng.permutation(n)]
    Q1 = _givens_layers(n, layers, rng)
    Q2 = _givens_layers(n, layers, rng)
    A = _canonical(Q1 @ sp.diags(s) @ Q2)
    return Generated(f"randcond_{cond:.0e}_n{n}".replace("+", ""),
                     f"random sparse non-symmetric Q1 diag(s) Q2, condition number {cond:.0e}, n={n}",
                     A, "random_conditioned", {"n": n, "cond": cond, "layers": layers, "seed": seed})


def helmholtz(m: int = 30, k: float = 20.0, *, dim: int = 2, seed: int = 0) -> Generated:
    """``-Δ - k² I`` on an ``m``-point-a-side grid in ``dim`` dimensions (times h²): symmetric
    indefinite. ``(k h)²`` is moved to the middle of the gap between the two Laplacian
    eigenvalues around it (known in closed form) so the matrix is safely nonsingular; ``seed``
    jitters ``k`` by up to 5 % before that (a different matrix, same character)."""
    h = 1.0 / (m + 1)
    kk = k * (1.0 + 0.05 * float(_rng(seed).uniform(-1.0, 1.0)))
    eigs = _laplacian_eigenvalues(m, dim)
    shift, half_gap = _gap_midpoint(eigs, (kk * h) ** 2)
    A = _canonical(_laplacian(m, dim) - shift * sp.identity(m**dim, format="csr"))
    below = int(np.sum(eigs < shift))
    return Generated(f"helmholtz{dim}d_k{k:g}_n{m**dim}",
                     f"{dim}-D Helmholtz -Lap - k^2 I, k~{kk:.3g}: {below} negative eigenvalues of {m**dim}, "
                     f"distance to the spectrum {half_gap:.2e} (spectrum width {eigs[-1]:.3g})",
                     A, "helmholtz", {"m": m, "k": k, "dim": dim, "seed": seed, "shift": shift})


def _geometric_edges(n: int, rng: np.random.Generator, degree: float) -> tuple[np.ndarray, np.ndarray]:
    from scipy.spatial import cKDTree

    pts = rng.random((n, 2))
    r = math.sqrt(degree / (math.pi * n))
    pairs = cKDTree(pts).query_pairs(r, output_type="ndarray")
    return pairs[:, 0], pairs[:, 1]


def _powerlaw_edges(n: int, rng: np.random.Generator, m_edges: int) -> tuple[np.ndarray, np.ndarray]:
    """Preferential attachment (Barabási–Albert): each new node links to ``m_edges`` existing
    nodes chosen with probability proportional to their degree."""
    src, dst = [], []
    targets = list(range(m_edges))
    repeated: list[int] = []
    for v in range(m_edges, n):
        chosen = set(targets)
        src.extend([v] * len(chosen))
        dst.extend(chosen)
        repeated.extend(chosen)
        repeated.extend([v] * len(chosen))
        picks: set[int] = set()
        while len(picks) < m_edges:
            picks.add(repeated[int(rng.integers(len(repeated)))])
        targets = list(picks)
    return np.asarray(src), np.asarray(dst)


def graph_laplacian(n: int = 1000, *, graph: str = "geometric", shift: float = 1e-3, seed: int = 0) -> Generated:
    """``L + shift * mean_degree * I`` for the weighted Laplacian ``L = D - W`` of a random graph
    (weights uniform in (0.5, 1.5)): symmetric positive definite, with the smallest eigenvalues
    near ``shift`` (relative) because the graph Laplacian's own smallest one is 0 (one per
    connected component; a geometric graph may have several).

    ``graph="geometric"``: ``n`` random points in the unit square joined within a radius giving
    about 8 neighbours each. ``graph="powerlaw"``: preferential attachment, 3 edges per new
    node (a heavy-tailed degree distribution: a few hubs of high degree).
    """
    rng = _rng(seed)
    if graph == "geometric":
        i, j = _geometric_edges(n, rng, 8.0)
    elif graph == "powerlaw":
        i, j = _powerlaw_edges(n, rng, 3)
    else:
        raise ValueError(f"graph must be 'geometric' or 'powerlaw', got {graph!r}")
    w = rng.uniform(0.5, 1.5, size=i.size)
    W = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([i, j]), np.concatenate([j, i]))), shape=(n, n))
    deg = np.asarray(W.sum(axis=1)).ravel()
    mean_deg = float(deg.mean()) if deg.size else 1.0
    A = _canonical(sp.diags(deg + shift * mean_deg) - W)
    ncomp = sp.csgraph.connected_components(W, directed=False)[0]
    return Generated(f"graphlap_{graph}_n{n}",
                     f"Laplacian of a random {graph} graph ({i.size} edges, {ncomp} components) + {shift:g} x mean "
                     f"degree, n={n}", A, "graph_laplacian", {"n": n, "graph": graph, "shift": shift, "seed": seed})


def expander(n: int = 1000, *, degree: int = 12, seed: int = 0) -> Generated:
    """A random ``degree``-regular-like graph's signed adjacency matrix: symmetric, zero
    diagonal (indefinite), edge weights +-1 at random, the kind of Gset's G51 (a random graph
    in a max-cut benchmark). Its graph has no small separators: a minimum-degree LU stores
    about half of ``n^2`` entries (0.65 n^2 for G51), whatever the few entries per row, and a
    mesh-fitted fill model misjudges it by an order of magnitude. Built as the union of
    ``degree / 2`` random perfect matchings and their transposes (loops and repeated edges
    dropped), so the degrees sit at or just below ``degree``."""
    rng = _rng(seed)
    rows, cols = [], []
    for _ in range(max(1, degree // 2)):
        p = rng.permutation(n)
        rows.append(np.arange(n))
        cols.append(p)
    i, j = np.concatenate(rows), np.concatenate(cols)
    keep = i != j
    i, j = i[keep], j[keep]
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    key = np.unique(lo.astype(np.int64) * n + hi)
    lo, hi = key // n, key % n
    w = rng.choice(np.array([-1.0, 1.0]), size=lo.size)
    A = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([lo, hi]), np.concatenate([hi, lo]))), shape=(n, n))
    return Generated(f"expander_d{degree}_n{n}",
                     f"signed adjacency of a random graph ({lo.size} edges, degree <= {degree}): symmetric indefinite, "
                     f"zero diagonal, no small separators, n={n}", _canonical(A), "expander",
                     {"n": n, "degree": degree, "seed": seed})


def badly_scaled(m: int = 25, *, decades: float = 8.0, columns: bool = True, seed: int = 0) -> Generated:
    """``D1 A D2``: ``A`` a well-conditioned non-symmetric matrix (mild convection-diffusion on
    an ``m x m`` grid, condition ~ a few hundred), ``D1`` (and ``D2`` when ``columns``) random
    diagonal matrices whose entries spread log-uniformly over ``10**-decades .. 10**decades``.
    Equilibration recovers ``A``; a method that judges pivots or convergence by unscaled sizes
    does not."""
    rng = _rng(seed)
    base = convection_diffusion(m, 5.0, scheme="upwind", seed=seed).matrix
    n = base.shape[0]
    d1 = 10.0 ** rng.uniform(-decades, decades, size=n)
    d2 = 10.0 ** rng.uniform(-decades, decades, size=n) if columns else np.ones(n)
    A = _canonical(sp.diags(d1) @ base @ sp.diags(d2))
    which = "rows and columns" if columns else "rows"
    return Generated(f"scaled_{'rc' if columns else 'r'}1e{decades:g}_n{n}",
                     f"well-conditioned convection-diffusion with {which} scaled by 1e-{decades:g}..1e{decades:g}, n={n}",
                     A, "badly_scaled", {"m": m, "decades": decades, "columns": columns, "seed": seed})


def near_singular(n: int = 400, sigma_min: float = 1e-10, *, kind: str = "nonsymmetric", seed: int = 0) -> Generated:
    """A matrix with largest singular value ~1 and smallest ``sigma_min``: nonsingular to
    working precision (SciPy's LU solves it) but a tiny pivot or a long Krylov stall away from
    singular.

    ``kind="nonsymmetric"``: ``Q1 diag(s) Q2`` as in :func:`random_conditioned`, with ``s`` all
    in [0.5, 1] except one ``sigma_min``. ``kind="spd"``: the 2-D Laplacian (side
    ``round(sqrt(n))``, divided by its largest eigenvalue) shifted by its smallest eigenvalue
    minus ``sigma_min`` (closed form), so its smallest eigenvalue is ``sigma_min``.
    """
    rng = _rng(seed)
    if kind == "nonsymmetric":
        s = rng.uniform(0.5, 1.0, size=n)
        s[int(rng.integers(n))] = sigma_min
        A = _canonical(_givens_layers(n, 2, rng) @ sp.diags(s) @ _givens_layers(n, 2, rng))
    elif kind == "spd":
        m = max(2, int(round(math.sqrt(n))))
        eigs = _laplacian_eigenvalues(m, 2)
        L = _laplacian(m, 2) / eigs[-1]
        A = _canonical(L - (eigs[0] / eigs[-1] - sigma_min) * sp.identity(m * m, format="csr"))
        n = m * m
    else:
        raise ValueError(f"kind must be 'nonsymmetric' or 'spd', got {kind!r}")
    return Generated(f"nearsing_{kind}_{sigma_min:.0e}_n{n}".replace("-", "m"),
                     f"{kind} matrix with smallest singular value {sigma_min:.0e} (largest ~1), n={n}",
                     A, "near_singular", {"n": n, "sigma_min": sigma_min, "kind": kind, "seed": seed})


def complex_symmetric(m: int = 30, k: float = 15.0, *, damping: float = 0.05, seed: int = 0) -> Generated:
    """``-Δ - (k² + i α) I`` on an ``m x m`` grid (times h², ``α = damping * k²``): a damped
    Helmholtz operator, complex symmetric (``A = Aᵀ``) and not Hermitian; ``seed`` jitters
    ``k`` by up to 5 %."""
    h = 1.0 / (m + 1)
    kk = k * (1.0 + 0.05 * float(_rng(seed).uniform(-1.0, 1.0)))
    k2 = (kk * h) ** 2
    A = _canonical(_laplacian(m, 2).astype(np.complex128) - (k2 + 1j * damping * k2) * sp.identity(m * m))
    return Generated(f"complexsym_k{k:g}_n{m * m}",
                     f"complex symmetric damped Helmholtz, k~{kk:.3g}, damping {damping:g}, {m}x{m} grid",
                     A, "complex_symmetric", {"m": m, "k": k, "damping": damping, "seed": seed})


def complex_hermitian(m: int = 30, *, coupling: float = 0.5, definite: bool = False, seed: int = 0) -> Generated:
    """``L + i c S - σ I`` on an ``m x m`` grid: ``L`` the Laplacian, ``S`` real antisymmetric
    (±1 on the grid couplings, random signs from ``seed``), so the matrix is Hermitian.
    ``definite=True``: ``σ`` below the smallest eigenvalue ``λ_1`` (``λ_1 / 2`` where ``λ_1 > 0``, else
    ``λ_1 - max(|λ_1| / 2, ρ / 1000)``, ρ the spectral radius): Hermitian positive definite whatever the
    coupling does to ``λ_1`` (the coupling can make ``λ_1`` negative, and ``σ = λ_1 / 2`` then left the
    matrix indefinite).
    ``definite=False``: ``σ`` in the middle of the widest gap of the middle of the spectrum
    (Hermitian indefinite); eigenvalues from a dense ``eigvalsh`` (keep ``m`` modest)."""
    rng = _rng(seed)
    n = m * m
    L = _laplacian(m, 2).tocoo()
    upper = L.row < L.col
    r, c = L.row[upper], L.col[upper]
    sgn = rng.choice([-1.0, 1.0], size=r.size)
    S = sp.csr_matrix((np.concatenate([sgn, -sgn]), (np.concatenate([r, c]), np.concatenate([c, r]))), shape=(n, n))
    H = (_laplacian(m, 2).astype(np.complex128) + 1j * coupling * S).tocsr()
    ev = np.linalg.eigvalsh(H.toarray())
    if definite:
        lam = float(ev[0])
        sigma = 0.5 * lam if lam > 0 else lam - max(0.5 * abs(lam), 1e-3 * float(abs(ev).max()))
    else:
        lo, hi = n // 4, 3 * n // 4
        gaps = ev[lo + 1: hi] - ev[lo: hi - 1]
        i = int(np.argmax(gaps)) + lo
        sigma = float((ev[i] + ev[i + 1]) / 2)
    A = _canonical(H - sigma * sp.identity(n))
    dist = float(np.min(np.abs(ev - sigma)))
    what = "positive definite" if definite else "indefinite"
    return Generated(f"complexherm_{'pd' if definite else 'indef'}_n{n}",
                     f"complex Hermitian {what} (Laplacian + {coupling:g}i antisymmetric coupling), distance of the "
                     f"shift to the spectrum {dist:.2e}, {m}x{m} grid",
                     A, "complex_hermitian", {"m": m, "coupling": coupling, "definite": definite, "seed": seed})


def poisson(m: int = 30, *, dim: int = 2, seed: int = 0) -> Generated:
    """The 5-point (``dim=2``) or 7-point (``dim=3``) Laplacian with ``m`` points a side: SPD.
    (``seed`` is accepted for a uniform signature; the matrix does not depend on it.)"""
    A = _canonical(_laplacian(m, dim))
    return Generated(f"poisson{dim}d_n{m**dim}", f"{dim}-D Poisson, {m}^{dim} grid", A, "poisson",
                     {"m": m, "dim": dim, "seed": seed})


def singular(n: int = 300, *, kind: str = "duplicate_row", seed: int = 0) -> Generated:
    """An exactly singular matrix built from a well-conditioned random sparse one (diagonally
    dominant, ~5 entries per row):

    - ``kind="zero_row"``: one row has no entries (structurally singular, and visibly so);
    - ``kind="structural"``: two rows keep a single entry each, in the same column (structural
      rank ``n - 1`` with no empty row or column);
    - ``kind="duplicate_row"``: one row is an exact copy of another (full structural rank,
      numerically singular: an LU meets an exact zero pivot).
    """
    rng = _rng(seed)
    nnz_row = 5
    rows = np.repeat(np.arange(n), nnz_row)
    cols = rng.integers(0, n, size=rows.size)
    vals = rng.standard_normal(rows.size)
    B = sp.csr_matrix((vals, (rows, cols)), shape=(n, n)).tolil()
    B.setdiag(0.0)
    B = B.tocsr()
    B = B + sp.diags(np.abs(B).sum(axis=1).A.ravel() + 1.0)
    B = _canonical(B).tolil()
    i, j = (int(v) for v in rng.choice(n, size=2, replace=False))
    if kind == "zero_row":
        B.rows[i], B.data[i] = [], []
        what = f"row {i} empty"
    elif kind == "structural":
        c = int(rng.integers(n))
        B.rows[i], B.data[i] = [c], [1.0]
        B.rows[j], B.data[j] = [c], [2.0]
        what = f"rows {i} and {j} hold one entry each, both in column {c}"
    elif kind == "duplicate_row":
        B.rows[i], B.data[i] = list(B.rows[j]), list(B.data[j])
        what = f"row {i} a copy of row {j}"
    else:
        raise ValueError(f"kind must be 'zero_row', 'structural' or 'duplicate_row', got {kind!r}")
    A = _canonical(B.tocsr())
    return Generated(f"singular_{kind}_n{n}", f"exactly singular random sparse matrix: {what}, n={n}", A, "singular",
                     {"n": n, "kind": kind, "seed": seed}, singular=True)


def block_diagonal(blocks: int = 40, size: int = 25, *, kind: str = "dense", shuffle: bool = True,
                   seed: int = 0) -> Generated:
    """Independent systems assembled into one matrix (a batch of small FEM problems, per-element or
    per-cell systems, a disconnected graph's operator): ``blocks`` diagonal blocks, nonsymmetric and
    well conditioned, with their unknowns interleaved by a random symmetric permutation when
    ``shuffle`` (the pieces are then not contiguous, as when fields are numbered node by node):

    - ``kind="dense"``: dense random blocks of ``size`` (Gaussian plus ``size`` on the diagonal);
    - ``kind="mesh"``: upwind convection-diffusion on a ``size`` x ``size`` grid per block (Peclet
      numbers drawn per block), ~5 entries per row;
    - ``kind="mixed"``: dense blocks of sizes drawn between ``size / 2`` and ``2 size``.

    Its LU factors piece by piece: the fill is the sum of the blocks' fills, far below that of one
    connected mesh of the same size and entries per row.
    """
    rng = _rng(seed)
    parts = []
    for _ in range(blocks):
        if kind == "dense" or kind == "mixed":
            b = size if kind == "dense" else int(rng.integers(max(1, size // 2), 2 * size + 1))
            parts.append(sp.csr_matrix(rng.standard_normal((b, b)) + b * np.eye(b)))
        elif kind == "mesh":
            parts.append(convection_diffusion(size, float(10.0 ** rng.uniform(-1, 2)), seed=int(rng.integers(1 << 30))).matrix)
        else:
            raise ValueError(f"kind must be 'dense', 'mesh' or 'mixed', got {kind!r}")
    A = sp.block_diag(parts, format="csr")
    if shuffle:
        p = rng.permutation(A.shape[0])
        A = A[p][:, p]
    A = _canonical(A)
    return Generated(f"block_diagonal_{kind}_n{A.shape[0]}", f"{blocks} independent {kind} blocks (size ~{size})"
                     + (", unknowns interleaved" if shuffle else ""), A, "block_diagonal",
                     {"blocks": blocks, "size": size, "kind": kind, "shuffle": shuffle, "seed": seed})


FAMILIES: dict[str, Callable[..., Generated]] = {
    "block_diagonal": block_diagonal,
    "convection_diffusion": convection_diffusion,
    "random_conditioned": random_conditioned,
    "helmholtz": helmholtz,
    "graph_laplacian": graph_laplacian,
    "badly_scaled": badly_scaled,
    "near_singular": near_singular,
    "complex_symmetric": complex_symmetric,
    "complex_hermitian": complex_hermitian,
    "poisson": poisson,
    "singular": singular,
    "expander": expander,
}


def collection(scale: float = 1.0, seed: int = 0) -> list[Generated]:
    """Every family at the parameter settings the collection benchmark and test use.

    ``scale`` multiplies the number of unknowns (about; grid sides scale by its square root
    in 2-D and cube root in 3-D); 1.0 gives a few hundred to a few thousand unknowns each.
    """
    def side(m: int, dim: int = 2) -> int:
        return max(4, int(round(m * scale ** (1.0 / dim))))

    def size(n: int) -> int:
        return max(16, int(round(n * scale)))

    out = []
    for pe in (0.1, 10.0, 1000.0):
        out.append(convection_diffusion(side(30), pe, scheme="upwind", seed=seed))
    out.append(convection_diffusion(side(30), 1000.0, scheme="central", seed=seed))
    for cond in (1e1, 1e3, 1e6):
        out.append(random_conditioned(size(500), cond, seed=seed))
    out.append(helmholtz(side(30), 20.0, seed=seed))
    out.append(helmholtz(side(12, 3), 10.0, dim=3, seed=seed))
    out.append(graph_laplacian(size(1000), graph="geometric", seed=seed))
    out.append(graph_laplacian(size(1000), graph="powerlaw", seed=seed))
    out.append(badly_scaled(side(25), columns=False, seed=seed))
    out.append(badly_scaled(side(25), columns=True, seed=seed))
    out.append(near_singular(size(400), 1e-10, kind="nonsymmetric", seed=seed))
    out.append(near_singular(size(400), 1e-10, kind="spd", seed=seed))
    out.append(complex_symmetric(side(30), seed=seed))
    out.append(complex_hermitian(side(20), definite=False, seed=seed))
    out.append(complex_hermitian(side(20), definite=True, seed=seed))
    out.append(poisson(side(40), dim=2, seed=seed))
    out.append(poisson(side(12, 3), dim=3, seed=seed))
    for kind in ("zero_row", "structural", "duplicate_row"):
        out.append(singular(size(300), kind=kind, seed=seed))
    out.append(expander(size(1000), degree=12, seed=seed))
    out.append(block_diagonal(max(2, int(round(40 * scale))), 25, kind="dense", seed=seed))
    out.append(block_diagonal(max(2, int(round(12 * scale))), 10, kind="mesh", seed=seed))
    return out
