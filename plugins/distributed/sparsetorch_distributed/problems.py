"""Model problems assembled per rank (for the example, the tests and the benchmark).

``poisson2d_rows(m, rows)``: the 5-point stencil of ``-div(kappa grad u)`` on an ``m x m`` grid of
unknowns (Dirichlet boundary), only for the global ``rows`` asked for: what a mesh code's rank
assembles. ``coefficient_values`` turns a coefficient per unknown into the matrix values of those
entries, differentiably: face coefficient ``(kappa_i + kappa_j) / 2`` between neighbours, ``kappa_i``
on a boundary face, the diagonal the sum of the row's faces.
"""

from __future__ import annotations

import torch

__all__ = ["poisson2d_rows", "coefficient_values", "grid_coords", "tridiag_rows"]


def poisson2d_rows(m: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, boundary_faces_of_row) of the 5-point stencil entries of the given global rows."""
    rows = rows.to(torch.int64)
    i, j = rows // m, rows % m
    r_list, c_list = [rows], [rows]
    nb = torch.zeros_like(rows)
    for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        ii, jj = i + di, j + dj
        ok = (ii >= 0) & (ii < m) & (jj >= 0) & (jj < m)
        nb += (~ok).to(torch.int64)
        r_list.append(rows[ok])
        c_list.append((ii * m + jj)[ok])
    r, c = torch.cat(r_list), torch.cat(c_list)
    order = torch.argsort(r * (m * m) + c)
    return r[order], c[order], nb


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
