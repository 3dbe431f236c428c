"""Row partitioners: which rank owns which row.

- :func:`contiguous_offsets`: rank ``r`` owns rows ``[r N // p, (r + 1) N // p)`` (the default);
- :func:`rcb_parts`: recursive coordinate bisection. Distributed: each rank passes the
  coordinates of the rows it holds now and gets the new owner of each; cut positions are found by
  bisection on reduced counts (O(levels x 50) small all_reduces, no coordinates leave their rank);
- :func:`spectral_parts`: recursive spectral bisection of the matrix graph (Fiedler vector of the
  graph Laplacian, median split), for the scatter path where one rank holds the graph;
- :func:`metis_parts`: pymetis (``pip install sparsetorch-distributed[metis]``) when importable.

``graph_parts(method, ...)`` picks one by name ("metis" falls back to "spectral" with a warning
when pymetis is not importable). All return an int64 tensor of owners, one per row.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from typing import Callable

import torch

import sparsetorch as st

__all__ = ["contiguous_offsets", "rcb_parts", "spectral_parts", "metis_parts", "graph_parts", "edge_cut", "have_pymetis"]

#: Spectral bisection uses a dense eigensolver on subgraphs up to this many vertices.
SPECTRAL_DENSE_MAX = 4096


def contiguous_offsets(n: int, parts: int) -> list[int]:
    """``parts + 1`` row offsets splitting ``n`` rows into nearly equal contiguous blocks."""
    return [(r * n) // parts for r in range(parts + 1)]


def have_pymetis() -> bool:
    return importlib.util.find_spec("pymetis") is not None


# Recursive coordinate bisection ------------------------------------------------------------------
def rcb_parts(coords: torch.Tensor, parts: int, *, reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
              iterations: int = 60) -> torch.Tensor:
    """Owner in ``range(parts)`` of each point (row) of ``coords`` ``(n_local, d)``.

    ``reduce(t, op)`` all-reduces a small tensor over the ranks ("sum"/"max"); ``None`` means the
    points are all here (one process). Each level splits every segment of ``k > 1`` parts into
    ``k // 2`` and ``k - k // 2`` along the axis of its largest extent, the cut placed where the
    point counts match that ratio (bisection on the cut value)."""
    if coords.dim() == 1:
        coords = coords[:, None]
    if coords.dim() != 2 or not coords.is_floating_point():
        raise st.InputError(f"coords must be a floating (n, d) tensor, got {tuple(coords.shape)} {coords.dtype}")
    if reduce is None:
        reduce = lambda t, op: t  # noqa: E731
    x = coords.detach().to(torch.float64)
    n, d = x.shape
    lo = torch.zeros(n, dtype=torch.int64, device=x.device)      # first part of each point's segment
    hi = torch.full((n,), parts, dtype=torch.int64, device=x.device)
    # Segments are identified by their first part; at most `parts` of them.
    for _level in range(max(1, math.ceil(math.log2(max(parts, 1)))) + 1):
        width = hi - lo
        active_mask = width > 1
        seg_any = torch.zeros(parts, dtype=torch.float64, device=x.device)
        seg_any.index_add_(0, lo[active_mask], torch.ones(int(active_mask.sum()), dtype=torch.float64, device=x.device))
        seg_width = torch.zeros(parts, dtype=torch.int64, device=x.device)
        seg_width[lo] = width  # every point of a segment carries the same width
        seg_width_f = reduce(seg_width.to(torch.float64), "max")
        if not bool((seg_width_f > 1).any()):
            break
        # extent of each segment along each axis
        big = torch.finfo(torch.float64).max
        mx = torch.full((parts, d), -big, dtype=torch.float64, device=x.device)
        mn = torch.full((parts, d), -big, dtype=torch.float64, device=x.device)  # holds -min
        if n:
            mx.scatter_reduce_(0, lo[:, None].expand(n, d), x, "amax")
            mn.scatter_reduce_(0, lo[:, None].expand(n, d), -x, "amax")
        both = reduce(torch.cat([mx, mn], 1), "max")
        mx, mn = both[:, :d], -both[:, d:]
        axis = (mx - mn).argmax(1)                      # per segment
        a, b = mn.gather(1, axis[:, None])[:, 0], mx.gather(1, axis[:, None])[:, 0]
        wid = seg_width_f.to(torch.int64)
        left_parts = wid // 2
        total = torch.zeros(parts, dtype=torch.float64, device=x.device)
        total.index_add_(0, lo, torch.ones(n, dtype=torch.float64, device=x.device))
        total = reduce(total, "sum")
        target = total * left_parts.to(torch.float64) / torch.clamp(wid, min=1).to(torch.float64)
        val = x.gather(1, axis[lo][:, None])[:, 0] if n else x.new_zeros(0)
        low, high = a.clone(), b.clone()
        for _ in range(iterations):
            cut = 0.5 * (low + high)
            left = torch.zeros(parts, dtype=torch.float64, device=x.device)
            if n:
                left.index_add_(0, lo, (val <= cut[lo]).to(torch.float64))
            left = reduce(left, "sum")
            too_many = left > target
            high = torch.where(too_many, cut, high)
            low = torch.where(too_many, low, cut)
        cut = low  # the largest tried cut with at most the target on the left
        if n:
            go_left = val <= cut[lo]
            mid = lo + left_parts[lo]
            split = active_mask
            new_lo = torch.where(split & ~go_left, mid, lo)
            new_hi = torch.where(split & go_left, mid, hi)
            lo, hi = new_lo, new_hi
    return lo


# Spectral bisection ------------------------------------------------------------------------------
def _fiedler(rows: torch.Tensor, cols: torch.Tensor, m: int) -> torch.Tensor:
    """Fiedler vector of the Laplacian of the graph on ``m`` vertices with edges (rows, cols)."""
    off = rows != cols
    r, c = rows[off], cols[off]
    w = torch.ones(r.numel(), dtype=torch.float64)
    deg = torch.zeros(m, dtype=torch.float64).index_add_(0, r, w)
    if m <= SPECTRAL_DENSE_MAX:
        L = torch.zeros(m, m, dtype=torch.float64)
        L.index_put_((r, c), -w, accumulate=True)
        L.diagonal().add_(deg)
        _, vecs = torch.linalg.eigh(L)
        return vecs[:, 1] if m > 1 else vecs[:, 0]
    idx = torch.cat([r, torch.arange(m)])
    jdx = torch.cat([c, torch.arange(m)])
    vals = torch.cat([-w, deg + 1e-8 * (1 + deg.max())])
    L = st.SparseTensor.from_coo(vals, idx, jdx, shape=(m, m), format=st.format.CSR)
    _, vecs = st.eigsh(L, k=2, which="SA")
    return vecs[:, 1]


def spectral_parts(rows: torch.Tensor, cols: torch.Tensor, n: int, parts: int) -> torch.Tensor:
    """Owner of each of the ``n`` vertices by recursive spectral bisection (the graph symmetrized)."""
    rows, cols = rows.to(torch.int64).cpu(), cols.to(torch.int64).cpu()
    r = torch.cat([rows, cols])
    c = torch.cat([cols, rows])
    owner = torch.zeros(n, dtype=torch.int64)

    def split(vertices: torch.Tensor, first: int, k: int) -> None:
        if k <= 1 or vertices.numel() == 0:
            owner[vertices] = first
            return
        local = torch.full((n,), -1, dtype=torch.int64)
        local[vertices] = torch.arange(vertices.numel())
        keep = (local[r] >= 0) & (local[c] >= 0)
        f = _fiedler(local[r[keep]], local[c[keep]], vertices.numel())
        order = torch.argsort(f, stable=True)
        kl = k // 2
        nl = (vertices.numel() * kl) // k
        split(vertices[order[:nl]], first, kl)
        split(vertices[order[nl:]], first + kl, k - kl)

    split(torch.arange(n), 0, parts)
    return owner


def metis_parts(rows: torch.Tensor, cols: torch.Tensor, n: int, parts: int) -> torch.Tensor:
    """Owner of each vertex from pymetis (k-way); raises ImportError when pymetis is absent."""
    import numpy as np
    import pymetis  # noqa: PLC0415 - optional

    rows, cols = rows.to(torch.int64).cpu(), cols.to(torch.int64).cpu()
    off = rows != cols
    r = torch.cat([rows[off], cols[off]])
    c = torch.cat([cols[off], rows[off]])
    key = torch.unique(r * n + c)
    r, c = key // n, key % n
    xadj = torch.zeros(n + 1, dtype=torch.int64)
    xadj[1:] = torch.cumsum(torch.bincount(r, minlength=n), 0)
    _, membership = pymetis.part_graph(parts, xadj=np.asarray(xadj), adjncy=np.asarray(c))
    return torch.as_tensor(np.asarray(membership), dtype=torch.int64)


def graph_parts(method: str, rows: torch.Tensor, cols: torch.Tensor, n: int, parts: int,
                coords: torch.Tensor | None = None) -> torch.Tensor:
    """Owners of the ``n`` rows by ``method`` ("contiguous", "rcb", "spectral", "metis", "graph")."""
    if method == "contiguous":
        off = contiguous_offsets(n, parts)
        return torch.bucketize(torch.arange(n), torch.tensor(off[1:-1]), right=True)
    if method == "rcb":
        if coords is None:
            raise st.InputError("partition='rcb' needs coords= (one row of coordinates per matrix row)")
        if coords.shape[0] != n:
            raise st.InputError(f"coords has {coords.shape[0]} rows for a matrix of {n} rows")
        return rcb_parts(coords, parts)
    if method in ("metis", "graph"):
        if have_pymetis():
            return metis_parts(rows, cols, n, parts)
        if method == "metis":
            warnings.warn("pymetis is not importable (pip install pymetis); partitioning by recursive spectral "
                          "bisection instead", st.FallbackWarning, stacklevel=3)
        return rcb_parts(coords, parts) if coords is not None else spectral_parts(rows, cols, n, parts)
    if method == "spectral":
        return spectral_parts(rows, cols, n, parts)
    raise st.InputError(f"unknown partition {method!r}; choose 'contiguous', 'rcb', 'spectral', 'metis' or 'graph'")


def edge_cut(rows: torch.Tensor, cols: torch.Tensor, owner: torch.Tensor) -> int:
    """Entries whose row and column have different owners (the halo traffic of one SpMV, roughly)."""
    return int((owner[rows] != owner[cols]).sum())
