"""Sparse Jacobians by coloring: a known pattern, a greedy distance-2 coloring, one AD pass per color.

Columns ``j`` and ``k`` of a matrix are *structurally orthogonal* when no row holds an entry in
both. Structurally orthogonal columns can share one probe: with the seed ``s_c = sum of e_j over
the columns j of color c``, the product ``J s_c`` holds ``J[i, j]`` at row ``i`` for the one
column ``j`` of color ``c`` that row ``i`` touches. So ``#colors`` forward-mode JVPs give every
entry of ``J``. Transposed, rows that share no column can share one VJP probe
``w_c^T J``: ``#colors`` reverse-mode VJPs. A coloring in which columns sharing a row get
different colors is a distance-2 coloring of the column graph (columns adjacent through a
row); :func:`greedy_coloring` builds one in natural order (for a band of half-width ``b`` it
uses ``2 b + 1`` colors, for the 5-point stencil 5 to 9, whatever ``n``).

The pattern must cover every entry of the true Jacobian: an entry outside the pattern is added
silently to another entry of its probe. :class:`ColoredJacobian` can check that with one extra
random probe (``check``).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import InputError
from ..format import CSR
from ..tensor import SparseTensor
from ..dispatch.lru import LRU

__all__ = ["greedy_coloring", "ColoredJacobian", "colored_jacobian", "pattern_from", "forward_ad"]

_CACHE_SIZE = 16
_cache: "LRU[object, ColoredJacobian]" = LRU("jacobian colorings", _CACHE_SIZE)


def forward_ad(fn: Callable, *args):
    """``fn(*args)`` where ``fn`` uses forward-mode AD; an op without a forward rule becomes an
    :class:`InputError` that says to use reverse mode."""
    try:
        return fn(*args)
    except NotImplementedError as exc:
        raise InputError(
            f"ad='forward' needs forward-mode AD through every op of F, and one has none ({exc}): use "
            f"ad='reverse' (the default), or give that op a jvp rule (sparsetorch's matmul and solve have one)"
        ) from exc


def greedy_coloring(rows: torch.Tensor, cols: torch.Tensor, n_rows: int, n_cols: int) -> tuple[torch.Tensor, int]:
    """Colors of the columns such that two columns with an entry in a common row differ.

    ``rows``/``cols`` are the coordinates of the pattern's entries (duplicates allowed). Returns
    ``(colors, ncolors)`` with ``colors`` an int64 tensor of length ``n_cols`` on the CPU. Greedy in
    natural column order: each column takes the smallest color none of its distance-2
    neighbours holds. Work is ``sum over rows of (entries in the row)^2`` Python steps; run once
    per pattern (the result is cached by :func:`colored_jacobian`).
    """
    r = rows.detach().to("cpu", torch.int64)
    c = cols.detach().to("cpu", torch.int64)
    # Row -> columns and column -> rows adjacency as Python lists (CSR and CSC of the pattern).
    row_order = torch.argsort(r * max(n_cols, 1) + c)
    r_sorted, c_by_row = r[row_order], c[row_order]
    row_ptr = torch.zeros(n_rows + 1, dtype=torch.int64)
    row_ptr[1:] = torch.cumsum(torch.bincount(r_sorted, minlength=n_rows), 0)
    col_order = torch.argsort(c * max(n_rows, 1) + r)
    c_sorted, r_by_col = c[col_order], r[col_order]
    col_ptr = torch.zeros(n_cols + 1, dtype=torch.int64)
    col_ptr[1:] = torch.cumsum(torch.bincount(c_sorted, minlength=n_cols), 0)
    rp, rc = row_ptr.tolist(), c_by_row.tolist()
    cp, cr = col_ptr.tolist(), r_by_col.tolist()
    color = [-1] * n_cols
    seen: list[int] = []  # seen[c] == j: color c is taken by a neighbour of column j
    for j in range(n_cols):
        for i in cr[cp[j]:cp[j + 1]]:
            for k in rc[rp[i]:rp[i + 1]]:
                ck = color[k]
                if ck >= 0:
                    seen[ck] = j
        cj = 0
        while cj < len(seen) and seen[cj] == j:
            cj += 1
        if cj == len(seen):
            seen.append(-1)
        color[j] = cj
    return torch.tensor(color, dtype=torch.int64), len(seen)


def pattern_from(pattern: object, n: int, device: torch.device, dtype: torch.dtype) -> SparseTensor:
    """A coalesced CSR ``(n, n)`` pattern (values zero) from a SparseTensor or a ``(rows, cols)`` pair."""
    if isinstance(pattern, SparseTensor):
        fs = pattern.format_shape
        if len(fs) != 2 or tuple(fs) != (n, n) or pattern.batch_shape:
            raise InputError(
                f"jac_pattern has shape {tuple(pattern.shape)}; for u with {n} entries it must be an unbatched ({n}, {n}) matrix"
            )
        coords, _ = pattern.entries()
        rows, cols = coords[0], coords[1]
    elif isinstance(pattern, (tuple, list)) and len(pattern) == 2 and all(isinstance(t, torch.Tensor) for t in pattern):
        rows, cols = pattern
        if rows.dim() != 1 or cols.dim() != 1 or rows.numel() != cols.numel():
            raise InputError(
                f"jac_pattern=(rows, cols) needs two 1-D index tensors of equal length, got shapes "
                f"{tuple(rows.shape)} and {tuple(cols.shape)}"
            )
        if rows.dtype.is_floating_point or rows.dtype.is_complex or cols.dtype.is_floating_point or cols.dtype.is_complex:
            raise InputError(f"jac_pattern indices must be integers, got {rows.dtype} and {cols.dtype}")
        if rows.numel() and (int(rows.min()) < 0 or int(cols.min()) < 0 or int(rows.max()) >= n or int(cols.max()) >= n):
            raise InputError(
                f"jac_pattern indices must lie in [0, {n}) for u with {n} entries; got rows in "
                f"[{int(rows.min())}, {int(rows.max())}], cols in [{int(cols.min())}, {int(cols.max())}]"
            )
    else:
        raise InputError(
            f"jac_pattern must be a SparseTensor of shape ({n}, {n}) or a (rows, cols) pair of index tensors, "
            f"got {type(pattern).__name__}"
        )
    rows = rows.to(device=device, dtype=torch.int64)
    cols = cols.to(device=device, dtype=torch.int64)
    vals = torch.zeros(rows.numel(), dtype=dtype, device=device)
    return SparseTensor.from_coo(vals, rows, cols, shape=(n, n), format=CSR)


class ColoredJacobian:
    """A Jacobian pattern with its colorings; ``jacobian(f, x, ad)`` assembles ``J`` at ``x``.

    ``ad="forward"``: column coloring, one ``torch.func.jvp`` per color (needs forward-mode AD
    through ``f``). ``ad="reverse"``: row coloring, one forward pass of ``f`` and one
    ``torch.autograd.grad`` (VJP) per color (any ``f`` autograd can differentiate, sparsetorch's
    own ops included).
    """

    def __init__(self, pattern: SparseTensor) -> None:
        self.pattern = pattern
        coords, slot = pattern.entries()
        self.rows, self.cols, self.slot = coords[0], coords[1], slot
        self.n = pattern.format_shape[0]
        self._colorings: dict[str, tuple[torch.Tensor, int]] = {}

    def coloring(self, ad: str) -> tuple[torch.Tensor, int]:
        """Colors (on the pattern's device) of the columns (``forward``) or rows (``reverse``)."""
        got = self._colorings.get(ad)
        if got is None:
            if ad == "forward":
                colors, k = greedy_coloring(self.rows, self.cols, self.n, self.n)
            else:
                colors, k = greedy_coloring(self.cols, self.rows, self.n, self.n)
            got = (colors.to(self.pattern.device), k)
            self._colorings[ad] = got
        return got

    def ncolors(self, ad: str) -> int | None:
        """Colors of the coloring for ``ad``, or None if it has not been computed."""
        got = self._colorings.get(ad)
        return None if got is None else got[1]

    def _seeds(self, ad: str, dtype: torch.dtype) -> torch.Tensor:
        colors, k = self.coloring(ad)
        S = torch.zeros(k, self.n, dtype=dtype, device=colors.device)
        S[colors, torch.arange(self.n, device=colors.device)] = 1
        return S

    def jacobian(self, f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, ad: str) -> SparseTensor:
        """``J(x)`` of ``f`` (flat ``(n,) -> (n,)``) on the pattern, as a CSR SparseTensor."""
        x = x.detach()
        S = self._seeds(ad, x.dtype)
        colors, _ = self.coloring(ad)
        if ad == "forward":
            probes = torch.stack([forward_ad(torch.func.jvp, f, (x,), (s,))[1] for s in S]) if len(S) else S
            per = probes[colors[self.cols], self.rows]  # J[i, j] = (J s_color(j))[i]
        else:
            with torch.enable_grad():
                xg = x.requires_grad_()
                r = f(xg)
                outs = []
                for s in S:
                    (g,) = torch.autograd.grad(r, xg, s, retain_graph=True, allow_unused=True)
                    outs.append(torch.zeros_like(x) if g is None else g)
            probes = torch.stack(outs) if outs else S
            per = probes[colors[self.rows], self.cols]  # J[i, j] = (w_color(i)^T J)[j]
        vals = torch.zeros(self.pattern.values.shape, dtype=x.dtype, device=x.device)
        vals = vals.index_put((self.slot,), per.detach(), accumulate=True)
        return self.pattern.with_values(vals)

    def check(self, f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, J: SparseTensor, ad: str) -> None:
        """One random probe: ``J v`` (forward) or ``w^T J`` (reverse) against AD of ``f``; raises
        :class:`InputError` when the pattern misses entries of the true Jacobian."""
        x = x.detach()
        gen = torch.Generator(device="cpu").manual_seed(1234)
        v = torch.rand(self.n, generator=gen, dtype=x.dtype).to(x.device) + 0.5
        vals = J.values[self.slot]
        if ad == "forward":
            exact = forward_ad(torch.func.jvp, f, (x,), (v,))[1]
            got = torch.zeros_like(exact).index_add(0, self.rows, vals * v[self.cols])
            what = "J v"
        else:
            with torch.enable_grad():
                xg = x.requires_grad_()
                (exact,) = torch.autograd.grad(f(xg), xg, v, allow_unused=True)
            exact = torch.zeros_like(x) if exact is None else exact
            got = torch.zeros_like(exact).index_add(0, self.cols, vals * v[self.rows])
            what = "w^T J"
        scale = float(torch.linalg.vector_norm(exact)) + float(torch.linalg.vector_norm(got))
        err = float(torch.linalg.vector_norm(got - exact))
        tol = 1e3 * torch.finfo(x.dtype).eps * max(scale, torch.finfo(x.dtype).tiny)
        if err > tol and err > 0:
            raise InputError(
                f"the Jacobian has entries outside jac_pattern: for a random probe, {what} from the colored "
                f"Jacobian differs from autograd by {err:.3g} (relative {err / max(scale, 1e-300):.3g}). Pass a "
                f"pattern holding every (i, j) where F_i depends on u_j (or check_pattern=False to skip this check)"
            )


def colored_jacobian(pattern: object, n: int, device: torch.device, dtype: torch.dtype) -> ColoredJacobian:
    """A :class:`ColoredJacobian` for ``pattern``, cached per SparseTensor pattern (colorings are
    pattern work, done once)."""
    key = None
    if isinstance(pattern, SparseTensor):
        key = (pattern.pattern_key, device, dtype)
        for k, _ in _cache.items():
            if not k[0].alive():  # the pattern's buffers were freed (their addresses may be reused)
                _cache.pop(k)
        got = _cache.get(key)
        if got is not None:
            return got
    cj = ColoredJacobian(pattern_from(pattern, n, device, dtype))
    if key is not None:
        _cache.put(key, cj)
    return cj
