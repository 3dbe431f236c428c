"""Model problems assembled per rank (for the example, the tests and the benchmark).

``poisson2d_rows(m, rows)``: the 5-point stencil of ``-div(kappa grad u)`` on an ``m x m`` grid of
unknowns (Dirichlet boundary), only for the global ``rows`` asked for: what a mesh code's rank
assembles. ``coefficient_values`` turns a coefficient per unknown into the matrix values of those
entries, differentiably: face coefficient ``(kappa_i + kappa_j) / 2`` between neighbours, ``kappa_i``
on a boundary face, the diagonal the sum of the row's faces.
"""

from __future__ import annotations

import torch

__all__ = ["poisson2d_rows", "poisson3d_rows", "stencil_rows", "coefficient_values", "grid_coords", "tridiag_rows"]


def poisson2d_rows(m: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, boundary_faces_of_row) of the 5-point stencil entries of the given global rows,
    in row-major order (rows ascending, then columns)."""
    return stencil_rows(m, 2, rows)


def poisson3d_rows(m: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, boundary_faces_of_row) of the 7-point stencil on an ``m x m x m`` grid of unknowns
    (global id ``(i m + j) m + k``), in row-major order."""
    return stencil_rows(m, 3, rows)


def stencil_rows(m: int, dim: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``2 dim + 1``-point stencil on an ``m^dim`` grid (Dirichlet boundary) for the given rows,
    on their device. For ascending ``rows`` (a contiguous block, what a rank owns) the entries come
    out in row-major order without a sort: each row's neighbours are laid out by increasing column
    offset (``-m^(dim-1), ..., -1, 0, 1, ..., m^(dim-1)``) and the ones outside the grid dropped."""
    rows = rows.to(torch.int64)
    steps = [m ** (dim - 1 - a) for a in range(dim)]           # id stride of each axis, slowest first
    coord = [(rows // st) % m for st in steps]
    offsets = sorted([(-st, a, -1) for a, st in enumerate(steps)] + [(0, -1, 0)] + [(st, a, 1) for a, st in enumerate(steps)])
    cols, oks = [], []
    for off, axis, sign in offsets:
        if axis < 0:
            ok = torch.ones_like(rows, dtype=torch.bool)
        else:
            x = coord[axis] + sign
            ok = (x >= 0) & (x < m)
        cols.append(rows + off)
        oks.append(ok)
    C = torch.stack(cols, 1)                                   # (n, 2 dim + 1)
    OK = torch.stack(oks, 1)
    nb = (~OK).sum(1)
    R = rows.unsqueeze(1).expand_as(C)
    r, c = R[OK], C[OK]
    if rows.numel() > 1 and not bool((rows[1:] > rows[:-1]).all()):
        order = torch.argsort(r * (m ** dim) + c)
        r, c = r[order], c[order]
    return r, c, nb


def coefficient_values(row: torch.Tensor, col: torch.Tensor, kappa_row: torch.Tensor, kappa_col: torch.Tensor,
                       boundary_faces: torch.Tensor, row_local: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Values of the entries ``(row, col)`` (any numbering) given kappa at each entry's row and column.

    ``boundary_faces[row_local]`` counts a row's Dirichlet faces; ``row_local`` (0..n_rows-1) indexes
    the rows. Differentiable in both kappa tensors."""
    off = row != col
    face = 0.5 * (kappa_row + kappa_col)
    offv = torch.where(off, -face, torch.zeros_like(face))
    diag_sum = torch.zeros(n_rows, dtype=face.dtype, device=face.device).index_add(0, row_local, torch.where(off, face, torch.zeros_like(face)))
    diag = diag_sum + boundary_faces.to(face.dtype) * _per_row(kappa_row, row_local, n_rows, ~off)
    return torch.where(off, offv, diag[row_local])


def _per_row(kappa_row, row_local, n_rows, is_diag):
    out = torch.zeros(n_rows, dtype=kappa_row.dtype, device=kappa_row.device)
    return out.index_add(0, row_local[is_diag], kappa_row[is_diag])


def grid_coords(m: int, rows: torch.Tensor) -> torch.Tensor:
    rows = rows.to(torch.int64)
    return torch.stack([(rows // m).to(torch.float64), (rows % m).to(torch.float64)], 1)


def tridiag_rows(n: int, rows: torch.Tensor, *, diag: float = 2.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, value) of ``tridiag(-1, diag, -1)`` for the given global rows."""
    rows = rows.to(torch.int64)
    r = torch.cat([rows, rows, rows])
    c = torch.cat([rows - 1, rows, rows + 1])
    v = torch.cat([-torch.ones(rows.numel()), torch.full((rows.numel(),), diag), -torch.ones(rows.numel())]).to(torch.float64)
    ok = (c >= 0) & (c < n)
    return r[ok], c[ok], v[ok]
