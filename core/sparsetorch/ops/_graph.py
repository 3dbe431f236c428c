"""How a pattern's graph grows: the measure behind direct solvers' fill estimates.

The backends' fill-in models (``nnz(L + U)`` of a sparse LU, Cholesky, LDLᵀ) are fitted on meshes
and read the grid dimension from nonzeros per row (:func:`sparsity_dimension`). That misses a
whole kind of matrix: graphs without small separators (random graphs, expanders, the graphs of
Gset and of random sparse test matrices), whose minimum-degree factors are a large fraction of
the dense matrix however few nonzeros a row holds (measured with SuperLU: G51 at n = 1000,
11.8 per row, 0.65 n² factor entries against the mesh model's 0.07 n²; random symmetric
patterns 0.53-0.64 n²; a random 6-regular graph 0.22 n²).

A graph's *growth dimension* tells them apart: ``g = log(size) / log(diameter + 1)`` of the
largest piece of its symmetrized pattern. A d-dimensional mesh has diameter ~ size^(1/d), so g
is about d (about 1.7 for 2-D and 2.2 for 3-D grids of a few thousand nodes, where the pseudo
diameter below runs corner to corner); an expander's diameter grows like log(size), so g grows
with the size (G51: 3.85, random patterns 4.3-5). Hub rows (degree above 8 times the median: an
arrow matrix's dense row and column, the linking rows of circuit and LP bases) are left out
first: a minimum-degree ordering eliminates them last and they add little fill, yet they would
make every diameter 2.

The cost is O(nnz) compiled work (SciPy's csgraph), measured once per pattern: a
breadth-first search from a low-degree node that stops at depth ``size^(1/3) + 1`` (a mesh is
recognised there, having reached only a ball of it), and only for a graph it covers within that
depth two more sweeps for the pseudo diameter. It runs for CPU matrices of at least
:data:`MIN_SIZE` rows with at least :data:`MIN_PER_ROW` entries per row where SciPy is
importable; elsewhere (and for a mesh) it is ``None`` and the backends keep their mesh models.
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch.lru import LRU

__all__ = ["graph_dimension", "graph_components", "MIN_SIZE", "MIN_PER_ROW", "COMPONENTS_MAX_SHARE"]

#: smaller matrices factor in microseconds whatever their fill
MIN_SIZE = 256
#: sparser patterns (paths, trees, power networks) have small fill anyway
MIN_PER_ROW = 4.0
#: degree above HUB_FACTOR x the median (+ 2) marks a hub row
HUB_FACTOR = 8.0
#: a pattern whose largest connected piece (hubs left out) holds at most this share of its rows is
#: priced piece by piece (:func:`graph_components`); above it the whole-matrix models are close enough
COMPONENTS_MAX_SHARE = 0.5
#: piece sizes are grouped in geometric bins of 2^(1/_BINS_PER_OCTAVE) (~9 % wide)
_BINS_PER_OCTAVE = 8

_SHARED: "LRU[Any, Any]" = LRU("graph dimension by content", 64)
_SHARE_MAX_NNZ = 1 << 20
_KEY = ("graph", "dimension")


def graph_dimension(A: Any, *, symmetric: bool = False) -> float | None:
    """The growth dimension of square ``A``'s symmetrized pattern (module docstring), or None
    where it is not measured or the graph looks like a mesh (its breadth-first search from a
    low-degree node does not cover it within ``size^(1/3) + 1`` levels). ``symmetric``: A's
    pattern is known symmetric (its detected properties), so the search need not symmetrize
    it. Cached per pattern."""
    return _measured(A, symmetric)[0]


def graph_components(A: Any, *, symmetric: bool = False) -> "tuple[tuple[int, float, int], ...] | None":
    """How square ``A``'s symmetrized pattern falls apart into independent pieces (connected
    components, hub rows left out as for :func:`graph_dimension`), where it does: groups
    ``(size, entries per row, count)`` of pieces of about that size (geometric bins ~9 % wide; the
    size and the entries per row are the group's means, rounded), or None when the pattern is
    not measured or one piece holds more than :data:`COMPONENTS_MAX_SHARE` of the rows. A
    block-diagonal matrix (independent systems assembled into one, a disconnected graph's
    Laplacian) factors piece by piece, so its LU fill is the sum of its pieces' fills, not that
    of one connected mesh of the same size (``dispatch.helpers.lu_fill_flops``; 200 dense
    blocks of 50 at n = 10^4: 0.5M factor entries, where the mesh model read 4.5M and 150x the
    flops). Cached per pattern with the growth dimension, measured in the same pass."""
    return _measured(A, symmetric)[1]


def _measured(A: Any, symmetric: bool) -> "tuple[float | None, tuple[tuple[int, float, int], ...] | None]":
    cache = A._cache
    got = cache.get(_KEY)
    if got is None:
        got = _measure_cached(A, symmetric)
        cache[_KEY] = got
    return got  # type: ignore[no-any-return]


def _eligible(A: Any) -> bool:
    if A.device.type != "cpu" or len(A.shape) - len(A.batch_shape) != 2:
        return False
    n = int(A.shape[-1])
    if int(A.shape[-2]) != n or n < MIN_SIZE:
        return False
    nse = int(A.nse or 0)
    return nse >= MIN_PER_ROW * n


_NONE: "tuple[float | None, tuple[tuple[int, float, int], ...] | None]" = (None, None)


def _measure_cached(A: Any, symmetric: bool) -> "tuple[float | None, tuple[tuple[int, float, int], ...] | None]":
    if not _eligible(A):
        return _NONE
    key = A.pattern_fingerprint if (A.nse or 0) <= _SHARE_MAX_NNZ else None
    if key is not None:
        hit = _SHARED.peek(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
    try:
        got = _measure(A, symmetric)
    except ImportError:  # SciPy is optional for the core
        return _NONE
    if key is not None:
        _SHARED.put(key, got)
    return got


def _components(count: int, label: Any, rows: Any, n: int) -> "tuple[tuple[int, float, int], ...] | None":
    """:func:`graph_components`' groups for the hub-free pattern graph of ``count`` weakly connected
    components (``label``: each node's; ``rows``: the row of each of its entries)."""
    import numpy as np  # noqa: PLC0415

    if count < 2:
        return None
    size = np.bincount(label, minlength=count)
    if int(size.max()) > COMPONENTS_MAX_SHARE * n:
        return None
    entries = np.bincount(label[rows], minlength=count).astype(np.float64)
    bins = np.floor(np.log2(size) * _BINS_PER_OCTAVE).astype(np.int64)
    keys, inverse, per_bin = np.unique(bins, return_inverse=True, return_counts=True)
    mean_size = np.bincount(inverse, weights=size.astype(np.float64)) / per_bin
    mean_entries = np.bincount(inverse, weights=entries) / per_bin
    return tuple((max(1, int(round(s))), round(float(e / max(s, 1.0)), 3), int(c))
                 for s, e, c in zip(mean_size, mean_entries, per_bin))


def _measure(A: Any, symmetric: bool = False) -> "tuple[float | None, tuple[tuple[int, float, int], ...] | None]":
    import numpy as np  # noqa: PLC0415
    import scipy.sparse as sp  # noqa: PLC0415
    from scipy.sparse import csgraph  # noqa: PLC0415

    n = int(A.shape[-1])
    idx = A.entries()[0]  # (2, nnz) coordinates, pattern only (cached on the tensor)
    rows, cols = idx[-2].numpy(), idx[-1].numpy()
    # degree in the symmetrized graph, up to a factor 2 for symmetric pairs (only ratios to the
    # median are used)
    deg = np.bincount(rows, minlength=n) + np.bincount(cols, minlength=n)
    hub = deg > HUB_FACTOR * max(1.0, float(np.median(deg))) + 2
    if hub.any():  # a hub's edges are left out: it stays as an isolated node no search reaches
        keep = ~(hub[rows] | hub[cols])
        rows, cols = rows[keep], cols[keep]
        deg = np.bincount(rows, minlength=n) + np.bincount(cols, minlength=n)
    if rows.shape[0] > 1 and bool(np.all(rows[1:] >= rows[:-1])):  # row order (CSR and kin): no sort
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        P = sp.csr_matrix((np.ones(cols.shape[0], dtype=np.int8), cols, indptr), shape=(n, n))
    else:
        P = sp.csr_matrix((np.ones(rows.shape[0], dtype=np.int8), (rows, cols)), shape=(n, n))
    directed = bool(symmetric)  # a symmetric pattern is its own symmetrization
    count, label = csgraph.connected_components(P, directed=True, connection="weak")
    pieces = _components(count, label, rows, n)
    # the sweeps start in the largest component, from a node with an edge to another: a node whose only entry
    # is its diagonal (a decoupled unknown) has the lowest degree, and a sweep from it reached itself alone
    # (no dimension: the fill model then read a random pattern of dimension 4.8 as a 3-D mesh, ~1000x too
    # little fill, and the default solve took 25 s; session 26's sweep)
    off = rows != cols
    odeg = np.bincount(rows[off], minlength=n) + np.bincount(cols[off], minlength=n)
    sizes = np.bincount(label[odeg > 0], minlength=count) if count else np.zeros(0, dtype=np.int64)
    if not sizes.size or int(sizes.max()) < 2:
        return None, pieces
    live = np.flatnonzero((label == int(np.argmax(sizes))) & (odeg > 0))
    size = int(live.shape[0])
    deg = odeg
    depth = int(math.ceil(size ** (1.0 / 3.0))) + 1
    start = int(live[np.argmin(deg[live])])

    def search(source: int, limit: float) -> Any:
        return csgraph.dijkstra(P, directed=directed, indices=source, unweighted=True, limit=limit)

    # first sweep, depth-limited: a mesh shows nodes at the limit (and more beyond it)
    d = search(start, depth + 0.5)
    reached = np.isfinite(d)
    if float(d[reached].max()) >= depth:
        return None, pieces
    ecc = int(d[reached].max())
    component = int(reached.sum())
    for _ in range(2):  # pseudo-peripheral node: sweep from the farthest, lowest-degree node
        far = np.flatnonzero(d == ecc)
        start = int(far[np.argmin(deg[far])])
        d = search(start, np.inf)
        reached = np.isfinite(d)
        e = int(d[reached].max())
        if e <= ecc:
            break
        ecc = e
    if ecc < 1 or component < MIN_SIZE // 2:
        return None, pieces
    return math.log(component) / math.log(ecc + 1), pieces
